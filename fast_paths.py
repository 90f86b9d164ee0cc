"""Fast paths beside the plain formulas of model.py, each equal to its formula (tests/test_fast_paths.py):

    pack_batch          attention without padding (attn_impl): the real tokens of a padded batch packed
                        into one row; packed SDPA, flex attention or FlashAttention varlen
    fused_lm_losses     head projection + cross-entropy chunk by chunk, never the N x V logits (ce only)
    fused_splade_pool   head projection + SPLADE max pooling chunk by chunk, never the B x T x V logits (max only)
    grouped_experts     the experts of a mixture of experts as one grouped matmul, not one call each

A fused path says which variants it computes (`covering`); its callers ask `covers` and run model.py's
plain formula for the others. Also here: `outside_compile`, `host_side` and `compile_cache_per_cpu_kernels`.
"""
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTN_IMPLS = ("auto", "dense", "packed", "flex", "varlen")
# the label of positions that take no part in a loss (cross-entropy's ignore_index); the one
# definition, which model.py, simreg.py, train_lm.py and eval/finetune.py import
IGNORE_INDEX = -100

# ---------------- Attention without padding. "dense" (model.py) pads every sequence to T and masks the
# padding in one SDPA call. These paths remove it instead: after the embeddings, the real tokens of the
# batch are packed into one row of N tokens, so norms, MLPs and projections never see padding.

@functools.cache
def varlen_kernel():
    """FlashAttention's variable-length kernel (torch >= 2.10, with window and GQA support; runs on
    CUDA in bf16/fp16), or None. Looked up on first use: importing it imports torch._dynamo (seconds)."""
    try:
        import inspect

        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn if {"window_size", "enable_gqa"} <= set(inspect.signature(varlen_attn).parameters) else None


def outside_compile(fn):
    """Decorator: `fn` runs eagerly even inside torch.compile (torch.compiler.disable, applied only while
    compiling: applying it imports torch._dynamo, which costs seconds)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        return torch.compiler.disable(fn)(*args, **kwargs)
    return call


def host_side(fn):
    """Decorator: `fn` is batch preparation on the host and may read the values of the (host) tensors it is
    given without waiting for the GPU; tests/test_gpu_path.py exempts these functions, and only these."""
    fn.host_side = True
    return fn


@dataclass
class Packing:
    """Where the real tokens of a padded (B, T) batch go once the padding is removed: all N of them
    in one row, (1, N, ...), in their original order (sequence by sequence, left to right)."""
    B: int
    T: int
    index: torch.Tensor   # (N,) flat position b * T + t of each real token (all of them: no padding)
    lengths: torch.Tensor  # (B,) real tokens per sequence

    def __post_init__(self):
        self.positions = self.index % self.T   # each token's column in the padded layout, as on the dense path
        self.sequence = self.index // self.T   # which sequence it belongs to
        # FlashAttention's offsets: sequence b holds the packed tokens cu_seqlens[b]:cu_seqlens[b + 1]
        self.cu_seqlens = F.pad(self.lengths.cumsum(0), (1, 0)).to(torch.int32)

    def pack(self, x):
        """(B, T, ...) -> (1, N, ...)."""
        return x.flatten(0, 1).index_select(0, self.index)[None]

    def unpack(self, x):
        """(1, N, ...) -> (B, T, ...), zeros at the padding."""
        out = x.new_zeros(self.B * self.T, *x.shape[2:])
        return out.index_copy(0, self.index, x[0]).view(self.B, self.T, *x.shape[2:])


@outside_compile
@host_side
def find_padding(attention_mask):
    """(flat indices of the real tokens, tokens per sequence), or None when nothing is padding.

    The one data-dependent step of a forward pass: eager even inside torch.compile (a graph break; the
    rest compiles with N dynamic), one GPU -> CPU sync when the mask lives on the GPU (none on the CPU).
    Batches without padding (train_lm.py's token shards) pass no mask and skip it."""
    mask = attention_mask.bool()
    index = mask.flatten().nonzero().squeeze(1).clone()  # not a view: compiled blocks guard on a view's base
    return None if index.numel() == mask.numel() else (index, mask.sum(1))


def compile_cache_per_cpu_kernels():
    """torch.compile's cache (inductor's, TMPDIR/torchinductor_USER, shared by all of a user's
    processes) does not tell kernels compiled under ATEN_CPU_CAPABILITY=avx2 from those of the CPU's
    own kind: a process of the other kind that reads them aborts (torch 2.13: `free(): invalid
    pointer` after an AVX2 run, on an AVX-512 CPU). So a process that forces a capability gets a
    cache of its own, beside the default one, unless TORCHINDUCTOR_CACHE_DIR names one."""
    import os
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}-{capability}"


@functools.cache
def _compiled_flex_attention():
    """Compiled once, on first use (flex is only fast compiled); N changes per batch: dynamic after the 2nd."""
    from torch.nn.attention.flex_attention import flex_attention
    compile_cache_per_cpu_kernels()
    return torch.compile(flex_attention)


def packed_sdpa(packing, mask, is_causal, q, k, v, dropout_p=0.0):
    """"packed": the projections ran on the real tokens only; SDPA runs on the padded layout."""
    q, k, v = (packing.unpack(t).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout_p,
                                       enable_gqa=q.shape[1] != k.shape[1])
    return packing.pack(y.transpose(1, 2))


def varlen_attention(packing, window, q, k, v, dropout_p=0.0):
    """FlashAttention over the packed sequences, the window in the kernel (it counts the window in
    packed positions: the dense path's columns as long as each sequence's real tokens are
    contiguous, i.e. right or left padding, as tokenizers give)."""
    p = packing
    return varlen_kernel()(q[0], k[0], v[0], p.cu_seqlens, p.cu_seqlens, p.T, p.T, window_size=window,
                           enable_gqa=q.shape[2] != k.shape[2])[None]


def flex(block_mask, q, k, v, dropout_p=0.0):
    """One kernel that skips every block the block mask rules out."""
    from torch.nn.attention.flex_attention import flex_attention
    # eager flex materialises all N x N scores: on a GPU, outside torch.compile, use the compiled kernel
    kernel = _compiled_flex_attention() if q.is_cuda and not torch.compiler.is_compiling() else flex_attention
    y = kernel(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask,
               enable_gqa=q.shape[2] != k.shape[2])
    return y.transpose(1, 2)


FLEX_BLOCK = 128  # flex attention's sparse block: the mask says, per 128 x 128 tile, skip / mask / run as is


@outside_compile
def flex_block_mask(packing, causal, window):
    """flex attention's BlockMask for a packed batch: a token attends to the tokens of its own
    sequence (before it, if causal; at most `window` positions away, if given).

    = create_block_mask(may_attend, None, None, N, N) (tested), built from the first and last token
    of each block instead of the N x N mask: memory O((N / 128)^2), not O(N^2) (~17 bytes per token
    pair, 40 GB at N = 50 000). Tokens are packed sequence by sequence with increasing positions, so
    two different blocks share at most one sequence (the one running from the earlier block's last
    token to the later block's first token), and in that sequence the closest pair of tokens is that
    boundary pair and the farthest pair the blocks' outer ends. A tile is "partial" when some pair
    may attend (flex applies may_attend inside it) and "full" when every pair may (flex skips the
    mask); a block cut short by the end of the row is never full, as in create_block_mask."""
    from torch.nn.attention.flex_attention import BlockMask
    seq, pos = packing.sequence, packing.positions

    def may_attend(b, h, q, k):
        ok = seq[q] == seq[k]
        if causal:
            ok = ok & (pos[q] >= pos[k])
        if window is not None:
            ok = ok & ((pos[q] - pos[k]).abs() <= window)
        return ok
    n = pos.numel()
    blocks = torch.arange(-(-n // FLEX_BLOCK), device=pos.device)
    first = blocks * FLEX_BLOCK
    last = (first + FLEX_BLOCK - 1).clamp(max=n - 1)
    whole = last - first + 1 == FLEX_BLOCK
    qb, kb = blocks[:, None], blocks[None, :]                   # query block (row), key block (column)
    lo, hi = torch.minimum(qb, kb), torch.maximum(qb, kb)       # the earlier and the later block
    diagonal = qb == kb
    some = diagonal | (seq[last][lo] == seq[first][hi])         # a shared sequence (every token sees itself)
    every = (seq[first][lo] == seq[last][hi]) & whole[qb] & whole[kb]   # both blocks in one sequence
    if causal:
        some = some & (qb >= kb)
        every = every & (qb > kb)
    if window is not None:
        some = some & (diagonal | (pos[first][hi] - pos[last][lo] <= window))   # closest pair
        every = every & (pos[last][hi] - pos[first][lo] <= window)             # farthest pair
    return BlockMask.from_kv_blocks(*_block_rows(some & ~every), *_block_rows(every), BLOCK_SIZE=FLEX_BLOCK,
                                    mask_mod=may_attend, seq_lengths=(n, n))


def _block_rows(dense):
    """(n_q_blocks, n_kv_blocks) bool -> BlockMask's (1, 1, n_q_blocks) counts and (1, 1, n_q_blocks,
    n_kv_blocks) int32 indices: each row's key blocks first, ascending (create_block_mask's layout)."""
    dense = dense.to(torch.int32)
    indices = dense.argsort(dim=-1, descending=True, stable=True).to(torch.int32)
    return dense.sum(-1, dtype=torch.int32)[None, None], indices[None, None]


def choose_attn_impl(model, masked, device):
    """What attn_impl="auto" runs for a batch with (`masked`) or without an attention mask.

    Without a mask (token shards: no padding) and without a window: dense SDPA with no mask (on
    CUDA, its flash kernels). A batch with a mask takes a padding-free kernel whether or not this
    one has padding, so that every batch of a run traces the same graph under torch.compile:
    CUDA: FlashAttention varlen in bf16/fp16, flex attention else; CPU: "packed" (measured
    faster than dense on padded batches, README)."""
    cfg = model.config
    if cfg.attn_impl != "auto":
        return cfg.attn_impl
    windowed = cfg.window is not None and bool(cfg.local_layers)
    if not masked and not windowed:
        return "dense"
    if device.type != "cuda":
        return "packed" if masked else "dense"
    if model.training and cfg.dropout > 0:
        return "packed"  # the varlen and flex kernels have no attention dropout
    half = (torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda")
            else model.embed.tok.weight.dtype) in (torch.bfloat16, torch.float16)
    return "varlen" if half and varlen_kernel() is not None else "flex"


def pack_batch(model, input_ids, attention_mask, causal):
    """(Packing, global kernel, windowed kernel): input_ids (B, T) with its padding removed, and the kernels
    of `model`'s global and windowed layers (choose_attn_impl); None where that is "dense", model.py's path."""
    cfg, (B, T), device = model.config, input_ids.shape, input_ids.device
    impl = choose_attn_impl(model, attention_mask is not None, device)
    if impl == "dense":
        return None
    padding = None if attention_mask is None else find_padding(attention_mask)
    # a batch without padding is packed like any other (every token kept): one traced graph for all
    index, lengths = padding if padding is not None else (torch.arange(B * T), torch.full((B,), T))
    packing = Packing(B, T, index.to(device), lengths.to(device))
    if impl == "packed":  # SDPA on the padded layout, with model.py's masks (even without padding: one graph)
        key = None if attention_mask is None else attention_mask.to(device, non_blocking=True)
        (gm, gc), (lm, lc) = model.attention_masks(key, T, causal, device)
        return packing, functools.partial(packed_sdpa, packing, gm, gc), functools.partial(packed_sdpa, packing, lm, lc)
    if model.training and cfg.dropout > 0:
        raise ValueError(f"attn_impl={impl!r} has no attention dropout: use 'packed' or 'dense' to train "
                         f"with dropout={cfg.dropout}")
    w = cfg.window if cfg.window is not None and cfg.local_layers else None
    if impl == "varlen":
        if varlen_kernel() is None:
            raise ValueError("attn_impl='varlen' needs torch.nn.attention.varlen (torch >= 2.10, CUDA); "
                             "use 'flex' or 'packed'")
        full = (-1, 0) if causal else (-1, -1)
        band = full if w is None else ((w, 0) if causal else (w, w))
        return packing, *(functools.partial(varlen_attention, packing, window) for window in (full, band))
    glob = functools.partial(flex, flex_block_mask(packing, causal, None))
    local = glob if w is None else functools.partial(flex, flex_block_mask(packing, causal, w))
    return packing, glob, local


# ---------------- What a fast path covers: the variants of model.py's formula it computes (others: the plain one)
def covering(*variants):
    """Mark a fast path with the variants of its formula it computes (callers ask `covers` first)."""
    def mark(fn):
        fn.covers = frozenset(variants)
        return fn
    return mark


_SAID = set()


def covers(fast_path, variant):
    """Whether `fast_path` computes `variant`; if not, says once per process that the plain formula
    runs instead (a new variant needs its table entry in model.py, not a kernel here)."""
    if variant in fast_path.covers:
        return True
    if (fast_path.__name__, variant) not in _SAID:
        _SAID.add((fast_path.__name__, variant))
        from cli import say
        say(f"note: {fast_path.__name__} covers {', '.join(sorted(fast_path.covers))}; {variant} runs model.py's "
            "plain formula (it holds every position's logits: more memory)")
    return False


# ---------------- Language-modelling loss without the N x V logits (model.lm_losses' formula for ce)
class _LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of the logits F.linear(h, weight, bias) (N, V), made and dropped chunk
    by chunk of rows: memory O(chunk * V) instead of the N x V fp32 logits (Liger-Kernel's idea).

    d CE_i / d z_i = softmax(z_i) - onehot(y_i), so the gradients w.r.t. h, weight and bias are
    computed in the forward pass, while each chunk's logits exist; backward only scales them by the
    incoming gradient. Same matmuls as autograd would run, no recomputation."""
    @staticmethod
    def forward(ctx, h, weight, bias, labels, chunk, with_grad):
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grads = (torch.empty_like(h), torch.zeros(weight.shape, dtype=torch.float32, device=h.device),
                 torch.zeros(weight.shape[0], dtype=torch.float32, device=h.device) if bias is not None else None
                 ) if with_grad else (None, None, None)
        grad_h, grad_w, grad_b = grads
        for s in range(0, h.shape[0], chunk):
            hc, y = h[s:s + chunk], labels[s:s + chunk]
            logits = F.linear(hc, weight, bias)          # bf16 under autocast, like the plain head
            z = logits.float()
            lse = torch.logsumexp(z, dim=-1)
            keep = y != IGNORE_INDEX
            y = torch.where(keep, y, 0)
            total = total + torch.where(keep, lse - z.gather(1, y[:, None]).squeeze(1), 0.0).sum()
            if with_grad:
                g = z.sub_(lse[:, None]).exp_()              # softmax, in place of z
                g.scatter_add_(1, y[:, None], torch.full_like(lse[:, None], -1.0))
                g = g.mul_(keep[:, None]).to(logits.dtype)   # the dtype autograd would use
                grad_h[s:s + chunk] = g @ weight.to(g.dtype)
                grad_w += (g.t() @ hc.to(g.dtype)).float()
                if grad_b is not None:
                    grad_b += g.float().sum(0)
        ctx.save_for_backward(*grads)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        return (grad_h * grad.to(grad_h.dtype), (grad_w * grad).to(ctx.weight_dtype),
                None if grad_b is None else (grad_b * grad).to(ctx.weight_dtype), None, None, None)


@covering("ce")
def fused_lm_losses(model, h, labels, terms=("ce",), chunk_size=None):
    """= model.lm_losses for ce, the mean cross-entropy of model.head(h) over the labelled positions of h (..., d)
    against labels (...), fused chunk by chunk (`_LinearCrossEntropy`) without ever holding the N x V logits.
    No data-dependent shapes: it compiles into the step's graph."""
    h, labels = model.head.transform(h.reshape(-1, h.shape[-1])), labels.reshape(-1)
    dec = model.head.decoder
    if chunk_size is None:  # ~64M logits per chunk: large matmuls, ~0.5 GB of temporaries at most
        chunk_size = max(1, (1 << 26) // dec.weight.shape[0])
    with_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, dec.weight, dec.bias))
    total = _LinearCrossEntropy.apply(h, dec.weight, dec.bias, labels, chunk_size, with_grad)
    return {"ce": total / (labels != IGNORE_INDEX).sum().clamp(min=1)}


# ---------------- SPLADE pooling without the B x T x V logits (model.splade_pool's formula)
class _SpladeMaxPool(torch.autograd.Function):
    """Fused head projection + SPLADE max pooling that never holds more than one (B, t, V) chunk.

    The max picks one token per (text, vocabulary term), so the gradient w.r.t. the logits is
    non-zero only at that token: d/dz log(1 + z) = 1/(1 + z) = exp(-w) at the winning logit z,
    where w = log(1 + z) is the pooled value itself. The backward pass therefore needs only the
    winners' positions and values, not the B x T x V activations that autograd would keep.
    """
    @staticmethod
    def forward(ctx, h, weight, bias, mask, chunk):
        B, T, _ = h.shape
        # log(1 + relu(z)) never decreases in z, so the max can be taken over the raw logits and the
        # activation applied once to the (B, V) result: one pass over each (B, t, V) chunk.
        top = h.new_full((B, weight.shape[0]), float("-inf"), dtype=torch.float32)
        where = torch.zeros(B, weight.shape[0], dtype=torch.long, device=h.device)
        compute_dtype = h.dtype
        for s in range(0, T, chunk):
            logits = F.linear(h[:, s:s + chunk], weight, bias)
            compute_dtype = logits.dtype  # bf16 under autocast
            # in place: a copy of a (B, t, V) chunk costs as much memory traffic as the max itself
            value, index = logits.masked_fill_(~mask[:, s:s + chunk, None], float("-inf")).max(dim=1)
            value = value.float()
            better = value > top
            top = torch.where(better, value, top)
            where = torch.where(better, index + s, where)
        best = torch.log1p(torch.relu(top))
        ctx.save_for_backward(h, weight, best, where)
        ctx.has_bias, ctx.chunk, ctx.compute_dtype = bias is not None, chunk, compute_dtype
        return best

    @staticmethod
    def backward(ctx, grad):
        h, weight, best, where = ctx.saved_tensors
        B, T, _ = h.shape
        cd = ctx.compute_dtype
        g_logit = grad * torch.exp(-best) * (best > 0)                    # (B, V), at the winners
        w = weight.to(cd)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for s in range(0, T, ctx.chunk):
            t = min(ctx.chunk, T - s)
            # g (B, t, V): g_logit at each winner of this chunk, 0 elsewhere. Written by one scatter
            # into zeros, every (text, term) once - a winner outside the chunk writes a 0 - instead
            # of comparing the whole chunk with `where` and multiplying (two more passes over it)
            inside = (where >= s) & (where < s + t)
            g = torch.zeros(B, t, weight.shape[0], dtype=cd, device=h.device)
            g.scatter_(1, (where - s).clamp_(0, t - 1)[:, None], torch.where(inside, g_logit, 0).to(cd)[:, None])
            grad_h[:, s:s + t] = (g @ w).to(h.dtype)
            grad_w += (g.flatten(0, 1).T @ h[:, s:s + t].flatten(0, 1).to(cd)).float()
        grad_b = g_logit.sum(0).to(weight.dtype) if ctx.has_bias else None
        return grad_h, grad_w.to(weight.dtype), grad_b, None, None


@covering("max")
def fused_splade_pool(model, input_ids, attention_mask, token_type_ids=None, chunk_size=None):
    """= model.splade_pool for max pooling: the SPLADE vectors (B, V) in fp32, memory O(B * chunk * V)
    instead of the B x T x V logits. The chunk size changes the order of the sums of the weight's
    gradient only (on this project's CPU the vectors and the gradient of h were bitwise the same for
    every chunk). On the CPU the automatic chunk is as fast as the best fixed one (README, Performance)."""
    h = model.head.transform(model.encode(input_ids, attention_mask, token_type_ids=token_type_ids))
    decoder = model.head.decoder
    if chunk_size is None:  # ~64M logits per chunk: big matmuls, bounded memory (a GPU's bound)
        chunk_size = max(1, (1 << 26) // (h.shape[0] * decoder.weight.shape[0]))
    mask = attention_mask.to(h.device, non_blocking=True).bool()
    return _SpladeMaxPool.apply(h, decoder.weight, decoder.bias, mask, chunk_size)


# ---------------- Mixture of experts without a loop over the experts (model.routed_experts' formula)
def grouped_experts(x, chosen, weight, w_in, w_out, act, use_grouped_mm=None):
    """= model.routed_experts, the per-expert loop: y_i = sum_j weight[i, j] * E_chosen[i, j](x_i), where expert
    E_e(x) = w_out[e] (act(a) * b) with [a; b] = w_in[e] x. x (N, d); chosen, weight (N, k).

    The loop asks "which tokens chose expert e?" once per expert: a GPU -> CPU sync each, 192 per forward
    pass of an 8-expert, 24-layer model. Here the N * k (token, slot) pairs are sorted by expert once, so
    every expert's tokens form one contiguous slice, and the experts run as one grouped matmul:
    torch._grouped_mm where its fast kernel runs (grouped_mm_applies: no sync, no data-dependent shape),
    else a loop over the slices. The inverse permutation (a gather: deterministic) puts the outputs back
    in (token, slot) order. Same matmuls, same sums: equal to the loop to float rounding (tested)."""
    N, k = chosen.shape
    n, d = w_in.shape[0], x.shape[-1]
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    if use_grouped_mm is None:
        use_grouped_mm = grouped_mm_applies(x.device, dtype, d)
    expert = chosen.flatten()                          # pair p = (token p // k, slot p % k)
    order = expert.argsort(stable=True)                # the pairs grouped by expert, token order within
    # ends[e] = pairs sent to experts 0..e: expert e's rows are ends[e - 1]:ends[e] ("offs" of _grouped_mm)
    ends = torch.searchsorted(expert[order], torch.arange(1, n + 1, device=x.device), out_int32=True)
    # k copies of each token by expand, so that backward sums them in a fixed order (not by atomics)
    rows = x[:, None].expand(N, k, d).reshape(N * k, d).index_select(0, order)
    if use_grouped_mm:
        out = _grouped_mm_experts(rows, ends, w_in, w_out, act, dtype)
    else:  # split and unbind: their backward is one cat / stack, not one zero-filled buffer per expert
        counts = torch.diff(ends, prepend=ends.new_zeros(1)).tolist()
        out = []
        for rows_e, w_in_e, w_out_e in zip(rows.split(counts), w_in.unbind(0), w_out.unbind(0)):
            a, b = F.linear(rows_e, w_in_e).chunk(2, dim=-1)
            out.append(F.linear(act(a) * b, w_out_e))
        out = torch.cat(out)
    out = out.index_select(0, order.argsort())         # back to (token, slot) order
    return (out.view(N, k, -1) * weight[..., None]).sum(1)


def grouped_mm_applies(device, dtype, d_model):
    """Whether torch._grouped_mm runs its fast kernel: CUDA, bf16, a Hopper GPU (sm90), rows of
    d_model a multiple of 16 bytes. Elsewhere it falls back to a loop over the groups that reads the
    offsets on the host, as grouped_experts' own loop does; on sm100 (Blackwell) its backward has
    given non-zero gradients to experts that received no token (pytorch/pytorch#172439)."""
    if device.type != "cuda" or dtype != torch.bfloat16 or not hasattr(torch, "_grouped_mm"):
        return False
    props = torch.cuda.get_device_properties(device)  # constant-folded by torch.compile
    return (props.major, props.minor) == (9, 0) and d_model % 8 == 0


def _grouped_mm_experts(rows, ends, w_in, w_out, act, dtype):
    """The experts on their slices of rows by torch._grouped_mm, in `dtype` (F.linear casts to the
    autocast dtype by itself; _grouped_mm does not). Its kernel wants every row of every operand,
    and of the gradients, on a 16-byte boundary: d_ff is padded with zeros to a multiple of 8
    (LLaMA-1B's 5461 is not), which changes nothing: zero rows of w_in give a = b = 0, so
    act(a) * b = 0, and zero columns of w_out add nothing."""
    n, d = w_in.shape[0], w_in.shape[2]
    d_ff = w_out.shape[2]
    pad = -d_ff % 8
    w_in, w_out = w_in.to(dtype), w_out.to(dtype)
    if pad:
        w_in = F.pad(w_in.view(n, 2, d_ff, d), (0, 0, 0, pad)).view(n, 2 * (d_ff + pad), d)
        w_out = F.pad(w_out, (0, pad))
    a, b = torch._grouped_mm(rows.to(dtype), w_in.transpose(1, 2), offs=ends).chunk(2, dim=-1)
    return torch._grouped_mm(act(a) * b, w_out.transpose(1, 2), offs=ends)
