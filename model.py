"""Every Transformer this project trains, in one file: BERT-family encoders, ModernBERT/Ettin,
GTE, EuroBERT and the LLaMA decoder (dense or Mixtral-style MoE), plus SPLADE pooling.

One `Transformer` covers all of them: the families differ in a handful of switches (pre- or
post-norm, LayerNorm or RMSNorm, learned positions or RoPE, gated MLP or not...), side by side in
`FAMILY_TRAITS`. Beside the architecture, the methods' model-side pieces as their plain formulas:
the LM loss, SPLADE pooling, MLM-head rescaling; their fast paths are fast_paths.py's. Hugging Face
checkpoints and tokenizers are read and written by hf/models.py (`from_pretrained`, `save_pretrained`).

    python model.py --inspect hf:answerdotai/ModernBERT-base   # architecture, size, MLM-head norms
    python model.py --inspect out/tiny_encoder/checkpoints/step_00000200/model   # offline, after
                                                 # python train_lm.py configs/tiny_encoder.py
"""
import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

import fast_paths
from fast_paths import ATTN_IMPLS

# ---------------- Configuration


@dataclass
class ModelConfig:
    family: str = "llama"
    vocab_size: int = 50304
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int | None = None   # grouped-query attention (None: = n_heads)
    head_dim: int | None = None     # None: d_model // n_heads
    d_ff: int = 2048                # hidden width of the MLP (of each half, for a gated MLP)
    max_seq_len: int = 2048         # rows of a learned position table; RoPE models are not bound by it
    # embeddings
    embed_dim: int | None = None    # ALBERT factorises embeddings: V x e, then a Linear e -> d
    abs_positions: bool = False     # learned absolute positions (BERT family)
    roberta_positions: bool = False  # fairseq position ids: padding_idx + 1 + index of real tokens
    type_vocab_size: int = 0        # token-type (segment) embeddings
    embed_norm: bool = False        # normalise the embeddings (BERT, ModernBERT)
    # blocks
    norm: str = "rmsnorm"           # "rmsnorm" | "layernorm"
    norm_eps: float = 1e-5
    norm_bias: bool = False         # LayerNorm with a bias
    prenorm: bool = True            # x + f(norm(x)) (LLaMA, ModernBERT) vs norm(x + f(x)) (BERT)
    first_attn_norm: bool = True    # ModernBERT's layer 0 has no attention norm (embeddings are normed)
    final_norm: bool = True         # a norm after the last block (pre-norm models need it)
    attn_bias: bool = False
    mlp_in_bias: bool = False
    mlp_out_bias: bool = False
    glu: bool = True                # gated MLP: act(x A) * (x B), A and B stored as one [A; B] matrix
    act: str = "silu"               # "gelu" (exact erf) | "gelu_tanh" | "silu" | "relu"
    rope_theta: float | None = 10000.0   # None: no rotary embeddings
    rope_theta_local: float | None = None  # ModernBERT: another theta on sliding-window layers
    rope_scaling: dict | None = None     # {"type": "llama3"|"linear"|"ntk", ...}; see rope_frequencies
    window: int | None = None       # sliding-window half width w: |i - j| <= w (ModernBERT: 64)
    local_layers: tuple = ()        # indices of the layers that use the window
    albert_groups: int = 0          # ALBERT: number of distinct layer groups (0: no sharing)
    albert_inner: int = 1           # ALBERT: layers inside one group
    causal: bool = False            # default attention: causal (decoders) or bidirectional (encoders)
    # how attention runs (a runtime choice, never saved): see `attend` and Transformer.attention_plans
    attn_impl: str = "auto"         # "auto" | "dense" (the reference) | "packed" | "flex" | "varlen"
    # MoE (Mixtral-style): n_experts > 0 replaces every MLP by top-k routed SwiGLU experts
    n_experts: int = 0
    expert_top_k: int = 2
    # language-modelling head
    head_transform: bool = False    # BERT-style MLM head: dense -> act -> norm before the projection
    head_act: str = "gelu"
    head_dense_bias: bool = True
    decoder_bias: bool = False      # bias of the vocabulary projection
    tie_embeddings: bool = False    # vocabulary projection shares the input embedding matrix
    dropout: float = 0.0            # embedding/residual/attention dropout (fine-tuning); 0 for pretraining
    # special token ids (None when the family has no such token)
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    cls_id: int | None = None
    sep_id: int | None = None
    mask_id: int | None = None
    # Two names: `family` is the architecture built (FAMILY_TRAITS: XLM-R's and ELECTRA's block is
    # "roberta"'s and "bert"'s), `variant` the config.json model_type of a checkpoint that is a variant
    # of that family and is saved back as such ("xlm-roberta"; None: the family's own). What a model
    # is called, for a reader: model_type
    variant: str | None = None
    # the config.json it was read from: saving writes back what we read and do not use (dropout,
    # labels...); never used to build or train the model, and no part of its identity
    hf_config: dict | None = field(default=None, compare=False, repr=False)

    @property
    def model_type(self):
        """config.json's model_type: the variant's, else the family's."""
        return self.variant or self.family

    def __post_init__(self):
        self.n_kv_heads = self.n_kv_heads or self.n_heads
        self.head_dim = self.head_dim or self.d_model // self.n_heads
        self.local_layers = tuple(self.local_layers)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl={self.attn_impl!r}: choose one of {', '.join(ATTN_IMPLS)}")

    @property
    def position_limit(self) -> int | None:
        """The longest input a learned position table reads (None: no table, RoPE): its rows, less
        RoBERTa's pad_id + 1, since fairseq ids count real tokens from padding_idx + 1 (514 rows, 512 tokens)."""
        if not self.abs_positions:
            return None
        return self.max_seq_len - (self.pad_id + 1 if self.roberta_positions else 0)


# How the families differ. Everything not listed takes the ModelConfig default: the LLaMA block
# (pre-norm RMSNorm, RoPE, SwiGLU, no biases, a bare untied head) with bidirectional attention
# (causal=False), i.e. EuroBERT; the decoders (llama, mixtral) set causal=True.
FAMILY_TRAITS = {
    # BERT (2018): post-norm, learned absolute positions + segments, plain GELU MLP, biases
    # everywhere, MLM head = dense -> GELU -> LayerNorm -> tied projection + bias.
    "bert": dict(norm="layernorm", norm_bias=True, prenorm=False, final_norm=False, embed_norm=True,
                 abs_positions=True, rope_theta=None, attn_bias=True, mlp_in_bias=True,
                 mlp_out_bias=True, glu=False, act="gelu", head_transform=True, decoder_bias=True,
                 tie_embeddings=True),
    # RoBERTa (and XLM-R): BERT's block with fairseq position ids (padding_idx + 1 + index).
    "roberta": dict(roberta_positions=True),
    # DistilBERT and ALBERT: BERT's block. What else differs is read from their config.json
    # (hf/models.py): sizes, ALBERT's factorised, shared layers; DistilBERT's eps has no key there.
    "distilbert": dict(norm_eps=1e-12),
    "albert": dict(),
    # GTE-MLM: BERT-like post-norm, but RoPE instead of learned positions and a GeGLU MLP.
    "gte": dict(abs_positions=False, rope_theta=10000.0, glu=True, mlp_in_bias=False),
    # ModernBERT / Ettin (2024): pre-norm, RoPE (two thetas), every 3rd layer global and the rest
    # a +-64-token window, GeGLU, no biases, LayerNorm without bias, final norm.
    "modernbert": dict(norm="layernorm", norm_bias=False, prenorm=True, first_attn_norm=False,
                       final_norm=True, embed_norm=True, glu=True, act="gelu", head_transform=True,
                       head_dense_bias=False, decoder_bias=True, tie_embeddings=True),
    # LLaMA: pre-norm RMSNorm, RoPE, SwiGLU, GQA, no biases, causal.
    "llama": dict(causal=True),
    "mixtral": dict(causal=True),
    # EuroBERT: the LLaMA block with bidirectional attention and an MLM head that is a bare projection.
    "eurobert": dict(causal=False),
}
for _f in ("roberta", "distilbert", "albert", "gte"):
    FAMILY_TRAITS[_f] = {**FAMILY_TRAITS["bert"], **FAMILY_TRAITS[_f]}

# ---------------- Building blocks

ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "relu": F.relu}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalise in fp32 (bf16 sums of squares lose precision), scale in the input dtype
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def make_norm(cfg, dim):
    if cfg.norm == "rmsnorm":
        return RMSNorm(dim, cfg.norm_eps)
    return nn.LayerNorm(dim, eps=cfg.norm_eps, bias=cfg.norm_bias)


def rope_frequencies(cfg, theta, device):
    """Inverse frequencies theta^(-2i/d), i = 0..d/2-1, with the checkpoint's scaling rule."""
    d = cfg.head_dim
    exponent = torch.arange(0, d, 2, device=device, dtype=torch.float32) / d
    s = cfg.rope_scaling or {}
    kind = s.get("type")
    if kind == "ntk" and "mixed_b" in s:  # GTE: per-frequency NTK mix, inv / exp(a k^b)
        f, b = s["factor"], s["mixed_b"]
        k = torch.arange(1, d // 2 + 1, device=device, dtype=torch.float32)
        return theta ** -exponent / torch.exp(math.log(f) / (d / 2) ** b * k ** b)
    if kind == "ntk":  # GTE static NTK: base theta*f, and every frequency scaled by f^(-2/d)
        f = s["factor"]
        return (theta * f) ** -exponent * f ** (-2 / d)
    inv = theta ** -exponent
    if kind == "linear":  # position interpolation
        return inv / s["factor"]
    if kind == "llama3":
        # Llama 3.1: long wavelengths are slowed down by `factor`, short ones are kept, and the
        # band in between is interpolated smoothly.
        f, lo, hi, L = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (L / wavelen - lo) / (hi - lo)
        mixed = (1 - smooth) * inv / f + smooth * inv
        return torch.where(wavelen < L / hi, inv, torch.where(wavelen > L / lo, inv / f, mixed))
    if kind is not None:
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: llama3, linear, ntk)")
    return inv


def rope_cos_sin(cfg, theta, positions):
    """cos and sin (P, 1, head_dim) of the rotation angles at `positions` (P,), for q and k laid out
    (B, P, H, head_dim). Packed batches pass each real token's column in the padded batch."""
    inv = rope_frequencies(cfg, theta, positions.device)
    angles = torch.outer(positions.float(), inv)
    angles = torch.cat((angles, angles), dim=-1)  # half-split layout: dims i and i + d/2 form a pair
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rope(x, cos, sin):
    """Rotate (x_i, x_{i+d/2}) pairs by position-dependent angles (RoFormer eq. 34, half-split)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)


# ---------------- Attention: softmax(q kᵀ / √d + mask) v as one SDPA call (the reference, attn_impl="dense").
# Batches with padding may run a padding-free kernel instead (attn_impl, fast_paths.py), equal to it.
class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        # q, k and v as one matrix [Wq; Wk; Wv]: one matmul instead of three
        self.qkv = nn.Linear(cfg.d_model, (self.n_heads + 2 * self.n_kv) * self.hd, bias=cfg.attn_bias)
        self.out = nn.Linear(self.n_heads * self.hd, cfg.d_model, bias=cfg.attn_bias)
        self.dropout = cfg.dropout

    def forward(self, x, rope, plan):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], -1)
        q, k, v = (t.view(B, T, -1, self.hd) for t in (q, k, v))   # (B, T, heads, head_dim)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        dropout = self.dropout if self.training else 0.0
        if isinstance(plan, tuple):  # one SDPA call; grouped-query heads share their k and v (enable_gqa)
            mask, is_causal = plan
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               attn_mask=mask, is_causal=is_causal, dropout_p=dropout,
                                               enable_gqa=self.n_heads != self.n_kv).transpose(1, 2)
        else:  # a padding-free kernel (fast_paths.pack_batch): B = 1, T = the N real tokens
            y = plan(q, k, v, dropout)
        return self.out(y.reshape(B, T, self.n_heads * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.glu, self.act = cfg.glu, ACTIVATIONS[cfg.act]
        self.w_in = nn.Linear(cfg.d_model, cfg.d_ff * (2 if cfg.glu else 1), bias=cfg.mlp_in_bias)
        self.w_out = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.mlp_out_bias)

    def forward(self, x):
        h = self.w_in(x)
        if self.glu:  # GLU variants (Shazeer 2020): the first half is activated, the second gates it
            a, b = h.chunk(2, dim=-1)
            h = self.act(a) * b
        else:
            h = self.act(h)
        return self.w_out(h), None


def routed_experts(x, chosen, weight, w_in, w_out, act):
    """The k experts each token chose, weighted: x (N, d); chosen, weight (N, k); expert e's SwiGLU
    weights w_in[e] = [A; B] (2 d_ff x d) and w_out[e] (d x d_ff). fast_paths.grouped_experts
    computes the same as one grouped matmul, without one GPU sync per expert."""
    y = torch.zeros_like(x)
    for e in range(w_in.shape[0]):
        token, slot = torch.where(chosen == e)
        # y_i += weight_ie · w_out[e] (act(a) * b), [a; b] = w_in[e] x_i, for each token i that chose e
        a, b = F.linear(x[token], w_in[e]).chunk(2, dim=-1)
        y.index_add_(0, token, F.linear(act(a) * b, w_out[e]) * weight[token, slot, None])
    return y


class MoE(nn.Module):
    """Mixtral-style sparse MLP: each token goes to its top-k of n SwiGLU experts (routed_experts;
    `grouped`, True unless set otherwise, runs them as fast_paths.grouped_experts)."""

    def __init__(self, cfg):
        super().__init__()
        self.n, self.k, self.act = cfg.n_experts, cfg.expert_top_k, ACTIVATIONS[cfg.act]
        self.router = nn.Linear(cfg.d_model, self.n, bias=False)
        self.w_in = nn.Parameter(torch.empty(self.n, 2 * cfg.d_ff, cfg.d_model))
        self.w_out = nn.Parameter(torch.empty(self.n, cfg.d_model, cfg.d_ff))
        self.grouped = True

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.router(x).float(), dim=-1)                  # (N, n)
        weight, chosen = probs.topk(self.k, dim=-1)                        # (N, k)
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
        experts = fast_paths.grouped_experts if self.grouped else routed_experts
        y = experts(x, chosen, weight, self.w_in, self.w_out, self.act)
        # Switch-Transformer load balancing (Fedus et al. 2021, eq. 4): n * sum_e f_e P_e, where f_e
        # is the fraction of routed slots that went to expert e and P_e its mean router probability;
        # equals 1 when balanced. transformers' Mixtral loss counts k slots per token (k times this)
        # and pools all layers before multiplying, where the body sums this loss per layer (tested).
        f = F.one_hot(chosen, self.n).float().mean(dim=(0, 1))
        aux = self.n * (f * probs.mean(0)).sum()
        return y.reshape(shape), aux


class Block(nn.Module):
    def __init__(self, cfg, index):
        super().__init__()
        self.prenorm = cfg.prenorm
        first = index == 0 and not cfg.first_attn_norm
        self.attn_norm = nn.Identity() if first else make_norm(cfg, cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp_norm = make_norm(cfg, cfg.d_model)
        self.mlp = MoE(cfg) if cfg.n_experts else MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, rope, plan):
        if self.prenorm:
            x = x + self.drop(self.attn(self.attn_norm(x), rope, plan))
            h, aux = self.mlp(self.mlp_norm(x))
            return x + self.drop(h), aux
        x = self.attn_norm(x + self.drop(self.attn(x, rope, plan)))
        h, aux = self.mlp(x)
        return self.mlp_norm(x + self.drop(h)), aux


class Embeddings(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        e = cfg.embed_dim or cfg.d_model
        self.roberta_positions, self.pad_id = cfg.roberta_positions, cfg.pad_id
        self.tok = nn.Embedding(cfg.vocab_size, e)
        self.pos = nn.Embedding(cfg.max_seq_len, e) if cfg.abs_positions else None
        self.typ = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size else None
        self.norm = make_norm(cfg, e) if cfg.embed_norm else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)
        self.proj = nn.Linear(e, cfg.d_model) if e != cfg.d_model else nn.Identity()

    def forward(self, input_ids, token_type_ids=None):
        x = self.tok(input_ids)
        if self.pos is not None:
            T = input_ids.shape[1]
            if self.roberta_positions:  # fairseq: real tokens count up from pad_id + 1, pads sit at pad_id
                real = (input_ids != self.pad_id).long()
                positions = torch.cumsum(real, dim=1) * real + self.pad_id
            else:
                positions = torch.arange(T, device=input_ids.device)
            x = x + self.pos(positions)
        if self.typ is not None:
            x = x + self.typ(token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids))
        return self.proj(self.drop(self.norm(x)))


class LMHead(nn.Module):
    """Vocabulary logits. BERT-style MLM heads first apply dense -> act -> norm ("transform")."""

    def __init__(self, cfg):
        super().__init__()
        e = cfg.embed_dim or cfg.d_model
        self.transform = nn.Sequential(nn.Linear(cfg.d_model, e, bias=cfg.head_dense_bias), _Act(cfg.head_act),
                                       make_norm(cfg, e)) if cfg.head_transform else nn.Identity()
        self.decoder = nn.Linear(e, cfg.vocab_size, bias=cfg.decoder_bias)

    def forward(self, h):
        return self.decoder(self.transform(h))


class _Act(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.fn = ACTIVATIONS[name]

    def forward(self, x):
        return self.fn(x)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed = Embeddings(cfg)
        n_unique = cfg.albert_groups * cfg.albert_inner if cfg.albert_groups else cfg.n_layers
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(n_unique))
        self.final_norm = make_norm(cfg, cfg.d_model) if cfg.final_norm else nn.Identity()
        self.head = LMHead(cfg)
        self.tie_weights()
        self.init_weights()
        self.source = None  # where the weights came from (set by from_pretrained)
        self.splade = SpladeSettings()  # what it computes as a SPLADE model (read from its folder by from_pretrained)

    def tie_weights(self):
        if self.config.tie_embeddings:
            self.head.decoder.weight = self.embed.tok.weight

    @torch.no_grad()
    def init_weights(self, generator=None):
        """GPT-2 style initialisation: N(0, 0.02), the residual output projections N(0, 0.02/√(2L))
        so that the residual stream's variance does not grow with depth, norms 1, biases 0.

        Each parameter is drawn whole on the CPU from `generator`, in a fixed order, then copied in: an
        FSDP shard (a DTensor) gets its slice of that tensor, so the weights do not depend on the number
        of processes. Meta parameters are left."""
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.config.n_layers)
        seen = set()
        for module_name, m in self.named_modules():
            for name, p in m.named_parameters(recurse=False):
                if p.is_meta or id(p) in seen:
                    continue
                seen.add(id(p))
                full = torch.empty(p.shape, dtype=torch.float32)
                if isinstance(m, (nn.LayerNorm, RMSNorm)):
                    full.fill_(1.0 if name == "weight" else 0.0)
                elif name == "bias":
                    full.zero_()
                else:  # nn.Linear, nn.Embedding, MoE experts and router
                    residual = module_name.endswith((".attn.out", ".mlp.w_out")) or (isinstance(m, MoE) and name == "w_out")
                    full.normal_(0.0, out_std if residual else std, generator=generator)
                if hasattr(p, "device_mesh"):  # an FSDP shard: this rank's slice of the whole tensor
                    from torch.distributed.tensor import distribute_tensor
                    full = distribute_tensor(full.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
                    p.to_local().copy_(full.to_local())
                else:
                    p.copy_(full)

    def layer_order(self):
        """Which stored block runs at each depth (ALBERT reuses its blocks)."""
        cfg = self.config
        if not cfg.albert_groups:
            return list(range(cfg.n_layers))
        per_group = cfg.n_layers / cfg.albert_groups
        return [int(i / per_group) * cfg.albert_inner + j
                for i in range(cfg.n_layers) for j in range(cfg.albert_inner)]

    def attention_masks(self, key, T, causal, device):
        """SDPA's (mask, is_causal) for global and for sliding-window layers; True = may attend.
        `key` (B, T) marks the real tokens, None when nothing is padding.

        Without padding the global layers get no mask at all, so that SDPA can use its flash kernels.
        Every query row always keeps at least itself: a row with no allowed key would give NaN,
        and NaN at a padding position would leak into real positions through 0 * NaN.
        """
        cfg = self.config
        if key is not None:
            key = key.bool()
            key = key | ~key.any(-1, keepdim=True)  # an all-padding row attends everywhere (finite)
            key = key[:, None, None, :]              # (B, 1, 1, T): padding masks keys only
        i = torch.arange(T, device=device)
        eye = i[:, None] == i[None, :]
        if key is None:
            glob = (None, causal)
        elif causal:
            glob = ((i[:, None] >= i[None, :]) & key | eye, False)
        else:
            glob = (key, False)
        local = glob
        if cfg.window is not None and cfg.local_layers:
            band = (i[:, None] - i[None, :]).abs() <= cfg.window
            if causal:
                band = band & (i[:, None] >= i[None, :])
            m = band if key is None else band & key
            local = (m | eye, False)
        return glob, local

    def body(self, input_ids, attention_mask=None, *, causal=None, token_type_ids=None, keep_layer=None):
        """Final hidden states (B, T, d) after the final norm, the output of block `keep_layer` (None
        when not asked) and the summed MoE load-balancing loss (0. for dense models). `causal`
        overrides the config (one model can train causally, then bidirectionally).

        attention_mask (B, T): 1 for real tokens, 0 for padding; None when there is none (on the CPU it
        costs no GPU sync). Only real positions mean anything: padding-free paths (attn_impl) leave
        zeros at the padding, the dense path values that depend on it (and counts it in the MoE loss)."""
        cfg = self.config
        causal = cfg.causal if causal is None else causal
        T, device = input_ids.shape[1], input_ids.device
        x = self.embed(input_ids, token_type_ids)
        packed = fast_paths.pack_batch(self, input_ids, attention_mask, causal)   # attn_impl's kernel; None: dense
        if packed is None:  # every sequence padded to T; the padding is masked out of the keys
            positions = torch.arange(T, device=device)
            padded = attention_mask is not None and fast_paths.find_padding(attention_mask) is not None
            glob, local = self.attention_masks(attention_mask.to(device) if padded else None, T, causal, device)
        else:  # fast_paths.py: the N real tokens of the batch in one row (1, N, d); no layer sees padding
            packing, glob, local = packed
            positions, x = packing.positions, packing.pack(x)
        rope_g = rope_cos_sin(cfg, cfg.rope_theta, positions) if cfg.rope_theta else None
        rope_l = rope_g
        if cfg.rope_theta_local and cfg.rope_theta_local != cfg.rope_theta:
            rope_l = rope_cos_sin(cfg, cfg.rope_theta_local, positions)
        aux, kept = 0.0, None
        for depth, index in enumerate(self.layer_order()):
            is_local = index in cfg.local_layers
            x, a = self.layers[index](x, rope_l if is_local else rope_g, local if is_local else glob)
            if a is not None:
                aux = aux + a
            if depth == keep_layer:
                kept = x
        x = self.final_norm(x)
        if packed is not None:
            x = packing.unpack(x)
            kept = packing.unpack(kept) if kept is not None else None
        return x, kept, aux

    def encode(self, input_ids, attention_mask=None, **kw):
        return self.body(input_ids, attention_mask, **kw)[0]

    def forward(self, input_ids, attention_mask=None, **kw):
        """Vocabulary logits (B, T, V): MLM logits for encoders, next-token logits for decoders."""
        return self.head(self.encode(input_ids, attention_mask, **kw))

    def num_params(self, embeddings=True):
        n = sum(p.numel() for p in self.parameters())
        if not embeddings:
            n -= self.embed.tok.weight.numel()
        return n


# ---------------- Language-modelling loss without the B x T x V logits


IGNORE_INDEX = fast_paths.IGNORE_INDEX  # -100: the label of positions that take no part in the loss


LM_TERMS = {  # (z (N, V) fp32 logits, y (N,) labels) -> each row's term; lm_losses averages it over the labelled rows
    # cross-entropy −log softmax(z)[y]: the language-modelling loss itself
    "ce": lambda z, y: F.cross_entropy(z, y, reduction="none"),
    # PaLM's z-loss (Chowdhery et al. 2022): (log Σ_v exp z_v)², keeps the softmax's normaliser near 1
    "z": lambda z, y: torch.logsumexp(z, dim=-1).square(),
}


def lm_losses(model, h, labels, terms=("ce",)):
    """{name: mean of LM_TERMS[name]} over the labelled positions (IGNORE_INDEX elsewhere) of the
    vocabulary logits model.head(h); 0, not NaN, when nothing is labelled. h (..., d), labels (...):
    (B, T, d) and (B, T), or the rows of a few positions (masked LM asks for its masked ones only).
    fast_paths.fused_lm_losses computes the same for the terms it covers (ce) without the N x V logits."""
    h, labels = h.reshape(-1, h.shape[-1]), labels.reshape(-1)
    z = model.head(h).float()                                         # (N, V), fp32
    keep = labels != IGNORE_INDEX
    y, n = torch.where(keep, labels, 0), keep.sum().clamp(min=1)
    # term = (1/n) Σ_{labelled t} term(z_t, y_t); CE's: (1/n) Σ −log softmax(z_t)[y_t]
    return {name: torch.where(keep, LM_TERMS[name](z, y), 0.0).sum() / n for name in terms}


# ---------------- SPLADE pooling: the activations a_tj = log(1 + relu(logit_tj)) of a text's real tokens t,
# pooled into one weight per vocabulary term j

SPLADE_POOLINGS = {  # (a (B, T, V), the padding already 0; mask (B, T), 1 at the real tokens) -> w (B, V)
    # w_j = max_t a_tj: SPLADE v2 (Formal et al. 2021, "SPLADE v2"), what SPLADE models use since.
    # Masking with 0 is safe under the max: every a_tj >= 0
    "max": lambda a, mask: a.max(dim=1).values,
    # w_j = Σ_t a_tj: SPLADE v1 (Formal et al. 2021, SIGIR), longer texts weigh more
    "sum": lambda a, mask: a.sum(dim=1),
}


@dataclass
class SpladeSettings:
    """What a masked-LM computes as a SPLADE model besides its weights. Saved in its folder where
    sentence-transformers reads it (hf/models.py: the pooling in 1_SpladePooling/config.json, the
    length in sentence_bert_config.json) and read back by every encoder through the model."""
    pooling: str = "max"   # SPLADE_POOLINGS
    k: float = 1.0         # the k its head has been divided by (rescale_mlm_head); 1: as pretrained
    k_bias: bool = False   # the bias divided too


def splade_pool(model, input_ids, attention_mask, token_type_ids=None):
    """SPLADE vectors (B, V) in fp32 from a masked-LM `Transformer`: the activations
    log(1 + relu(logit)) of the text's real tokens, pooled per vocabulary term by the model's
    pooling (model.splade.pooling, SPLADE_POOLINGS). fast_paths.fused_splade_pool computes the same
    for the poolings it covers (max) without the B x T x V logits."""
    logits = model(input_ids, attention_mask, token_type_ids=token_type_ids).float()   # (B, T, V)
    mask = attention_mask.to(logits.device, non_blocking=True)
    # a_tj = log(1 + relu(z_tj)) · mask_t, then the pooling over t
    return SPLADE_POOLINGS[model.splade.pooling](torch.log1p(torch.relu(logits)) * mask[:, :, None], mask)


# ---------------- MLM-head rescaling (the SPLADE rescaling paper): W_head <- W_head / k


def mlm_head_weight(model):
    """The vocabulary projection W_head (V x e). For tied heads this *is* the input embedding matrix."""
    return model.head.decoder.weight


def scale_problem(factor):
    """What is wrong with a factor the MLM head is divided (k) or multiplied (head_scale) by, or None."""
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and 2 ** -10 <= factor <= 2 ** 10:
        return None
    return ("must be a finite number > 0, from 1/1024 to 1024 (1 leaves the head as pretrained; the paper divides by "
            "1 to 32, e.g. 16 for ModernBERT; far beyond, the head's scores overflow or vanish)")


@torch.no_grad()
def rescale_mlm_head(model, k, bias=False):
    """Divide the MLM-head projection by k in place, keeping its direction (and any tie).

    For a tied head the shared matrix is divided, so the input word embeddings shrink too (the
    paper keeps the tie). ModernBERT normalises the word embeddings right away, so its embedding
    LayerNorm absorbs the division (up to its eps). BERT-style models (BERT, RoBERTa, ALBERT...)
    add the position and segment embeddings before that LayerNorm, which therefore sees a
    different mixture: the embedding output changes (train_splade.py measures and reports how
    much)."""
    if why := scale_problem(k):
        raise ValueError(f"k={k!r}: {why}")
    # W_head <- W_head / k (the rescaling paper's whole intervention)
    mlm_head_weight(model).div_(k)
    if bias and model.head.decoder.bias is not None:
        model.head.decoder.bias.div_(k)
    model.splade.k, model.splade.k_bias = model.splade.k * k, model.splade.k_bias or bias   # saved with it
    return model


def untie_mlm_head(model):
    """Give a tied decoder its own copy of the shared matrix (and say so in the config, so that
    checkpoints save the decoder separately with tie_word_embeddings=false)."""
    if model.head.decoder.weight is model.embed.tok.weight:
        model.head.decoder.weight = nn.Parameter(model.embed.tok.weight.detach().clone())
    model.config = dataclasses.replace(model.config, tie_embeddings=False)
    return model


K_TARGET = 0.682  # --k=auto's default target: splade-tiny's mean row L2 (train_splade.py's k_target says why)


def auto_k(model, target=K_TARGET):
    """The rule for k (train_splade.py --k=auto): the k that brings W_head's mean row L2 norm to `target`."""
    # k = mean_j ‖W_head[j]‖₂ / target
    return head_norms(model)["mean_row_l2"] / target


@torch.no_grad()
def head_norms(model):
    w = mlm_head_weight(model).float()
    b = model.head.decoder.bias
    return {"frobenius": w.norm().item(), "mean_row_l2": w.norm(dim=1).mean().item(),
            "bias_l2": b.float().norm().item() if b is not None else None,
            "tied": model.head.decoder.weight is model.embed.tok.weight}


if __name__ == "__main__":  # python model.py --inspect SPEC [--k K]: architecture, size, MLM-head norms
    from cli import run_cli
    from hf.models import inspect_main
    run_cli(inspect_main)
