"""Train SPLADE from a masked-LM backbone, with the MLM-head rescaling of the SPLADE rescaling
paper: divide the vocabulary projection by k before the first step. 1 to N GPUs with torchrun.

    python train_splade.py --init hf:answerdotai/ModernBERT-base --k 16
    torchrun --nproc_per_node=8 train_splade.py --init hf:jhu-clsp/ettin-encoder-150m --k 16
    python train_splade.py configs/splade_tiny.py                          # CPU, a few minutes
    python train_splade.py --init hf:google-bert/bert-base-uncased --train_data=my_triplets.tsv

The method (SPLADE v2, Formal et al. 2021, and SPLADE++, Formal et al. 2022, "From Distillation
to Hard Negative Sampling"; their code is github.com/naver/splade; docs/splade_rescaling.md):

    w_j(text) = max_t log(1 + relu(z_tj))       over the text's real tokens (model.splade_pool)
    s(q, d)   = w(q) . w(d)                      a plain dot product
    L         = InfoNCE(s(q, its positive) against every other document of the global batch)
              + MarginMSE / KL to teacher scores (when the data has them and their weight > 0)
              + lambda_q(t) FLOPS(queries) + lambda_d(t) REG_d(documents)
    FLOPS(W)  = sum_j (mean_i |w_ij|)^2          (Paria et al., ICLR 2020)
    REG_d     = mean over the document sets S_0 (positives), S_1 (first negatives), ... of FLOPS(S_s)
    lambda(t) = lambda * min(1, t / T)^2
    W_head   <- W_head / k                       before the first step (the rescaling paper)

This file holds the loss, the rescaling, the recipe (SETTINGS: naver/splade's contrastive recipe
on BM25 triplets, shortened to 30k steps; the rescaling paper published none) and the loop. Data
formats and order: data/triplets.py; collapse monitor: eval/diagnostics.py; resume: checkpoint.py.

DDP and batch size. batch_size is the GLOBAL number of queries per optimizer step, so the same
config trains the same model on 1 or 8 GPUs. Every rank gathers all ranks' query and document
vectors, so the contrastive problem and the FLOPS batch means are those of the global micro-batch;
the local rows keep their gradient, the gathered copies do not, and every rank computes the same
global loss - so rank r's backward delivers exactly the gradient of the global loss through its own
rows, and DDP's averaging (scaled back by world size) sums those into the full gradient.
With grad_accum = A > 1, each micro-batch of batch_size / A queries is its own contrastive problem
and its own FLOPS batch mean: accumulation saves memory at the cost of in-batch negatives, and
lambda refers to the micro-batch (re-tune it when the batch changes).
"""
import functools
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import checkpoint
import cli
import fast_paths
import training
from data.tokenizer import encode_texts
from fast_paths import host_side
from hf.models import (from_pretrained, load_tokenizer, sparse_encoder_max_seq_length, supported_names,
                       write_sparse_encoder_files)
from data.triplets import EpochOrder, load_training_set, micro_batch_positions, training_set_identity
from throughput import check_auto_device, flops_per_token
from eval.diagnostics import CollapseMonitor, announce, batch_sparsity
from model import (K_TARGET, SPLADE_POOLINGS, auto_k, head_norms, mlm_head_weight, rescale_mlm_head, scale_problem,
                   splade_pool, untie_mlm_head)
from cli import ANY, ConfigError, checked, count, fixed, free, interval, one_of

# ---- The loss ----------------------------------------------------------------------------------


def lambda_at(step, lam, warmup):
    """lambda(t) = lambda * min(1, t/T)^2 (naver/splade): the regulariser starts at 0 and grows
    quadratically, so the ranking loss first shapes the vectors and sparsity comes after."""
    # λ(t) = λ · min(1, t / T)²
    return lam if warmup <= 0 else lam * min(1.0, step / warmup) ** 2


def flops_reg(w):
    """FLOPS(W) = sum_j (mean_i |w_ij|)^2: a smooth proxy of the expected number of multiplications
    per query-document pair; squaring the mean pushes down the dimensions many texts use."""
    # FLOPS(W) = Σ_j ( (1/N) Σ_i |w_ij| )²   (W: (..., N, V), a batch of N vectors per leading index)
    return (w.abs().mean(-2) ** 2).sum(-1)


def l1_reg(w):
    """L1(W) = (1/N) Σ_i Σ_j |w_ij| (Efficient-SPLADE regularises queries this way)."""
    return w.abs().sum(-1).mean(-1)


REGS = {"flops": flops_reg, "l1": l1_reg}  # the regularisers of the queries (query_reg) and documents (doc_reg)
# The batches of the document regulariser `reg` over documents d (N * n, V) laid out per query
# [positive, negatives...] (doc_reg_batch). per_set: the mean over the n sets (positives, first
# negatives, ...) of each set's regulariser: naver/splade's trainer (splade/tasks/transformer_trainer.py,
# positives and negatives as two batches, averaged); FLOPS is a squared batch mean, so this is not
# FLOPS of all documents as one batch (by Jensen that is smaller, up to 2x), and naver's lambda_d
# refers to this form. concat: all N * n documents as one batch (naver's newer splade/hf/trainers.py).
DOC_REG_BATCHES = {
    # REG_d = (1/n) Σ_s reg(S_s), S_s = the s-th document of every query
    "per_set": lambda reg, d, n: reg(d.view(-1, n, d.shape[1]).transpose(0, 1)).mean(),
    "concat": lambda reg, d, n: reg(d),
}


def gather_keep_grad(x, world, rank):
    """All ranks' rows of x, in rank order. The local rows stay in the autograd graph; the others
    are copies without gradient (module docstring: why that gives the exact global gradient)."""
    if world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.detach().contiguous())
    parts[rank] = x
    return torch.cat(parts)


def ranking_losses(q, d, teacher, kl_temperature=1.0):
    """(InfoNCE, MarginMSE, KL) of queries q (N, V) against documents d (N * n, V) laid out per
    query [positive, negatives...]; teacher (N, n) scores or None (then the distillation terms are 0).

    InfoNCE: query i's positive against every document of the batch - its own negatives and the
    positives and negatives of the other queries - with the plain dot product as the logit."""
    N = q.shape[0]
    n = d.shape[0] // N
    scores = q @ d.T                                                  # (N, N * n)
    positive = torch.arange(N, device=q.device) * n
    # InfoNCE_i = -log( exp s(q_i, d_i+) / Σ_{d in batch} exp s(q_i, d) )
    infonce = F.cross_entropy(scores, positive)
    zero = scores.new_zeros(())
    if teacher is None or n < 2:
        return infonce, zero, zero
    own = scores.view(N, N, n)[torch.arange(N), torch.arange(N)]     # (N, n): [s(q, pos), s(q, negs)]
    # MarginMSE = mean ( (s+ - s-) - (t+ - t-) )²; KL(teacher softmax || student softmax) over [pos, negs]
    margin_mse = F.mse_loss(own[:, :1] - own[:, 1:], teacher[:, :1] - teacher[:, 1:])
    kl = F.kl_div(F.log_softmax(own / kl_temperature, -1), F.log_softmax(teacher / kl_temperature, -1),
                  reduction="batchmean", log_target=True)
    return infonce, margin_mse, kl


class SpladeObjective(nn.Module):
    """The loss of one micro-batch. DDP and torch.compile wrap this module, so the whole loss (both
    encoders, the gathering, the regularisers) runs inside forward. Returns (the loss to
    backpropagate, its terms and the batch's sparsity statistics by name, for the log)."""

    def __init__(self, model, cfg, world, rank):
        super().__init__()
        self.model, self.world, self.rank = model, world, rank
        chunk = cfg["pool_chunk"] or None
        # the fused pooling where it covers the model's (fast_paths.covers says so once if not), else model.py's formula
        fused = cfg["fused"] and fast_paths.covers(fast_paths.fused_splade_pool, model.splade.pooling)
        self.pool = functools.partial(fast_paths.fused_splade_pool, chunk_size=chunk) if fused else splade_pool
        self.w = (cfg["infonce_weight"], cfg["margin_mse_weight"], cfg["kl_weight"])
        self.kl_temperature = cfg["kl_temperature"]
        self.query_reg, self.doc_reg = REGS[cfg["query_reg"]], REGS[cfg["doc_reg"]]
        self.doc_batches = DOC_REG_BATCHES[cfg["doc_reg_batch"]]

    def forward(self, q_ids, q_mask, d_ids, d_mask, teacher, lam_q, lam_d):
        q = self.pool(self.model, q_ids, q_mask)   # fp32 (B, V)
        d = self.pool(self.model, d_ids, d_mask)
        queries = gather_keep_grad(q, self.world, self.rank)                 # the global micro-batch
        docs = gather_keep_grad(d, self.world, self.rank)
        if teacher is not None and self.world > 1:
            teacher = gather_keep_grad(teacher, self.world, self.rank)
        # scores of unnormalised vectors reach 1e5 when the head is too large: never in bf16
        with torch.autocast(q.device.type, enabled=False):
            infonce, margin_mse, kl = ranking_losses(queries, docs, teacher, self.kl_temperature)
            reg_q = self.query_reg(queries)
            reg_d = self.doc_batches(self.doc_reg, docs, docs.shape[0] // queries.shape[0])
            # L = InfoNCE (+ MarginMSE + KL) + λ_q(t) reg(queries) + λ_d(t) REG_d(documents)
            loss = (self.w[0] * infonce + self.w[1] * margin_mse + self.w[2] * kl
                    + lam_q * reg_q + lam_d * reg_d)
        terms = dict(loss=loss, infonce=infonce, margin_mse=margin_mse, kl=kl, reg_q=reg_q, reg_d=reg_d)
        stats = {name: value.detach() for name, value in terms.items()} | batch_sparsity(queries, docs)
        # every rank holds the same global loss; DDP averages gradients, so scale by world size
        return loss * self.world, stats


# ---- Backbone: load, check, rescale (the paper's intervention) ---------------------------------


MLM_BACKBONES = supported_names(mlm_only=True, last="or")  # the masked-LM families of hf/models.py


def load_backbone(spec):
    """An MLM encoder from `spec`; a clear error for checkpoints without an MLM head."""
    try:
        model = from_pretrained(spec)
    except KeyError as e:
        if "no masked-LM" not in str(e):
            raise
        raise ConfigError(f"--init {spec}: the checkpoint has no MLM head, and SPLADE reads its term weights "
                          f"from the MLM head's vocabulary logits. Use the masked-LM checkpoint of the model "
                          f"(saved as *ForMaskedLM), not the bare encoder. ({e})") from None
    if model.config.causal:
        raise ConfigError(f"--init {spec}: a {model.config.family} model is a causal decoder; its head predicts "
                          f"the next token, not the token at each position, so it is not an MLM head. SPLADE "
                          f"needs a masked-LM encoder: {MLM_BACKBONES}.")
    return model


@torch.no_grad()
def embedding_outputs(model, ids):
    """The embedding layer's output (word + position + segment embeddings, norm, projection)."""
    was_training = model.training
    model.eval()  # no dropout: the same ids must give the same output
    out = model.embed(ids).float()
    model.train(was_training)
    return out


def rescale_backbone(model, k, bias, head_scale=1.0, untie=False, probe=None, k_target=None):
    """The paper's intervention, W_head <- W_head / k, with the head norms before and after.

    Before it, two options of the small-scale experiments: `untie` gives a tied decoder its own
    matrix, and `head_scale` multiplies W_head by m, emulating a backbone with an m times larger
    head (the bias is left, like k leaves it by default; so k = m undoes head_scale = m exactly).

    A tied head shares W_head with the input word embeddings, so scaling it scales them too. A
    LayerNorm right after the word embeddings (ModernBERT) absorbs that; BERT adds the position and
    segment embeddings before its LayerNorm, so its embedding output changes. `probe` (token ids,
    mask) measures it: the mean cosine, over the real tokens, between the embedding layer's output
    before and after (1 when the input embeddings are untouched)."""
    before = head_norms(model)
    emb0 = embedding_outputs(model, probe[0]) if probe is not None else None
    if untie:
        untie_mlm_head(model)
    if head_scale != 1:
        with torch.no_grad():
            mlm_head_weight(model).mul_(head_scale)
    scaled = head_norms(model)
    k, rule = (auto_k(model, k_target), True) if k == "auto" else (k, False)  # --k=auto: W_head's row L2 / k_target
    # W_head <- W_head / k: the paper's whole intervention
    rescale_mlm_head(model, k, bias=bias)
    cosine = None
    if probe is not None:
        real = probe[1].bool()
        cosine = F.cosine_similarity(embedding_outputs(model, probe[0]), emb0, dim=-1)[real].mean().item()
    return {"k": k, "k_target": k_target if rule else None, "k_bias": bias, "head_scale": head_scale,
            "untie_head": untie, "before": before, "scaled": scaled, "after": head_norms(model),
            "embedding_cosine": cosine, "embedding_probe_tokens": int(probe[1].sum()) if probe is not None else 0}


# ---- The recipe: per key its default, what it accepts, whether a resumed run keeps it (fixed) or may
# change it (free), its help; training.shared: the keys both loops share, with this script's defaults


SETTINGS = cli.Settings(
    training.shared(out_dir="out/splade", resume="auto", accept_changed_data=False),
    "backbone and the paper's rescaling", dict(
        init=fixed("hf:answerdotai/ModernBERT-base", ANY, "hf:org/name[@rev] or a local HF folder with an MLM head"),
        k=fixed(1.0, checked(0.0, 1e-30), "W_head <- W_head / k before the first step; 1 = standard SPLADE; auto: the rule "
                "below", words=("auto",)),
        k_target=fixed(K_TARGET, checked(0.0), "k=auto: k = W_head's mean row L2 / this; splade-tiny's "
                       '(docs/splade_rescaling.md, "k")'),
        k_bias=fixed(False, ANY, "also divide the decoder bias by k (the paper does not say; default: leave it)"),
        head_scale=fixed(1.0, checked(0.0, 1e30), "multiply W_head by this before dividing by k (a large head)"),
        untie_head=fixed(False, ANY, "first give a tied decoder its own matrix (then k leaves the embeddings)"),
        pooling=fixed("", cli.Rule(lambda v: None if v == "" else one_of(SPLADE_POOLINGS).problem(v), bad=("?",),
                                   choices=SPLADE_POOLINGS), "max: SPLADE v2; sum: SPLADE v1; '': the init folder's "
                      "own (max for an MLM backbone); saved in every checkpoint's folder")),
    "training data (data/triplets.py)", dict(
        train_data=fixed("msmarco-bm25-50"),
        train_subset=fixed("", ANY, "folder of a hf: dataset repo holding the files (named sets set their own)"),
        max_train_examples=fixed(0, count(0), "0: every example; N: the first N (quick runs download less)"),
        n_negatives=fixed(1, count(0), "hard negatives per query; 0: in-batch negatives only"),
        data_strict=free(True, ANY, "a malformed row stops the run (False: skip up to 10 per file, with a warning)"),
        **fixed(..., count(2)).each(query_max_len=256, doc_max_len=256)),
    "loss", dict(
        infonce_weight=free(1.0, interval("[0, inf)"), "InfoNCE over the global batch's documents (dot products)"),
        margin_mse_weight=free(0.0, interval("[0, inf)"), "MarginMSE to teacher margins (needs teacher scores)"),
        kl_weight=free(0.0, interval("[0, inf)"), "KL(teacher || student) over [positive, negatives] (needs them)"),
        kl_temperature=free(1.0, interval("(0, inf)")),
        **free(..., interval("[0, inf)")).each(lambda_q=3e-4, lambda_d=1e-4),
        lambda_warmup=free(10000, count(0), "T of the quadratic warm-up lambda * min(1, t/T)^2; 0: constant"),
        query_reg=free("flops", one_of(REGS), "Efficient-SPLADE regularises queries with L1"),
        doc_reg=free("flops", one_of(REGS)),
        doc_reg_batch=free("per_set", one_of(DOC_REG_BATCHES), "per_set: the mean over each document set (naver)")),
    "optimizer and schedule", dict(
        batch_size=training.SHARED["batch_size"].given(128, "GLOBAL queries per optimizer step (all ranks together)"),
        grad_accum=training.SHARED["grad_accum"].given(1, "micro-steps per step (each its own contrastive problem)"),
        **training.shared(lr=2e-5, warmup_steps=3000, max_steps=30000, schedule="linear", min_lr_ratio=0.0,
                          weight_decay=0.01, beta1=0.9, beta2=0.999, adam_eps=1e-8, grad_clip=1.0),
        fused=training.SHARED["fused"].given(True, "fused max pooling (fast_paths.py; another pooling runs the "
                                             "formula); False: model.splade_pool's plain B x T x V formula"),
        pool_chunk=free(0, count(0), "tokens per chunk of the fused SPLADE pooling; 0: automatic (~64M logits)")),
    "system", dict(
        **training.shared(device="auto", dtype="bfloat16"),
        compile=training.SHARED["compile"].given(True, "torch.compile each encoder block with dynamic shapes"),
        **training.shared(dist_timeout=60, seed=1337)),
    "logging, evaluation, checkpoints", dict(
        log_interval=training.SHARED["log_interval"].given(50),
        eval_interval=training.SHARED["eval_interval"].given(5000, "0: no periodic evaluation"),
        eval_benchmark=free("nanobeir", ANY, "nanobeir, nanobeir/NFCorpus, a BEIR folder... (eval/retrieval.py)"),
        eval_max_len=free(256, count(2), "tokens per document and query: the checkpoints' length"),
        eval_batch_size=free(64, count(1), "texts per batch of the evaluation's encoder"),
        **training.shared(ckpt_interval=5000, keep_checkpoints=3, nonfinite_patience=5),
        collapse_patience=free(0, count(0), "stop after this many collapsed steps in a row; 0: warn only")))
DEFAULTS = SETTINGS.defaults  # {key: default}, for callers that need only these


def check_config(cfg, world=1):
    """Every key (its rule in SETTINGS), then the keys together, before anything is read or created."""
    cli.check_values(cfg, SETTINGS.rules)
    for key in ("k", "head_scale", "k_target"):  # W_head is multiplied by head_scale, then divided by k
        if cfg[key] != "auto" and (why := scale_problem(cfg[key])):
            raise ConfigError(f"--{key} {cfg[key]!r}: {why}")
    if not (cfg["infonce_weight"] or cfg["margin_mse_weight"] or cfg["kl_weight"]):
        raise ConfigError("infonce_weight, margin_mse_weight, kl_weight are all 0: set at least one > 0")
    if (cfg["margin_mse_weight"] or cfg["kl_weight"]) and cfg["n_negatives"] < 1:
        raise ConfigError("MarginMSE/KL compare a positive with its hard negatives: n_negatives must be >= 1")
    if cfg["batch_size"] % (world * cfg["grad_accum"]):
        raise ConfigError(f"batch_size={cfg['batch_size']} (global queries per step) must be divisible by "
                          f"world size x grad_accum = {world} x {cfg['grad_accum']}")


def check_model(cfg, arch):  # once the backbone is loaded, before step 1
    for key in ("query_max_len", "doc_max_len") + (("eval_max_len",) if cfg["eval_interval"] else ()):
        training.check_length(arch, key, cfg[key])


def check_data(cfg, data):
    if (cfg["margin_mse_weight"] or cfg["kl_weight"]) and not data.has_teacher:
        raise ConfigError(f"margin_mse_weight/kl_weight > 0 need teacher scores, and {data.source} has none "
                          "(fields scores / margin / score). Use train_data=msmarco-margin-mse, or set them to 0.")


# ---- Training ----------------------------------------------------------------------------------


@host_side
def make_batch(data, order, positions, cfg, tokenizer, device):
    """Tokenised (query ids, query mask, doc ids, doc mask, teacher or None) of the examples at
    `positions` (masks on the host, the rest on `device`), and their number of real tokens;
    documents are laid out per example: [pos_0, negs_0..., pos_1, negs_1..., ...]."""
    queries, docs, teacher = [], [], []
    for p in positions:
        epoch, i = order(p)
        q, d, t = data.example(i, cfg["n_negatives"], cfg["seed"], epoch)
        queries.append(q)
        docs += d
        teacher.append(t)
    q_ids, q_mask = encode_texts(tokenizer, queries, cfg["query_max_len"])
    d_ids, d_mask = encode_texts(tokenizer, docs, cfg["doc_max_len"])
    t = torch.tensor(teacher, dtype=torch.float32, device=device) if data.has_teacher else None
    n_tokens = int(q_mask.sum() + d_mask.sum())  # counted on the host
    # the masks stay on the host: the encoder finds the padding there without a device sync
    return (training.to_device(q_ids, device), q_mask, training.to_device(d_ids, device), d_mask, t), n_tokens


def evaluate(cfg, proc, model, tokenizer, bench, length):
    """Periodic evaluation (eval/retrieval.py): nDCG@10 and FLOPS of the current model, documents and
    queries cut at `length`, the one length its checkpoints' SparseEncoder files say."""
    from eval.retrieval import evaluate_splade
    summary = evaluate_splade(model, tokenizer, bench, None, max_len=length, query_max_len=length,
                              batch_size=cfg["eval_batch_size"], device=proc.device,
                              dtype=getattr(torch, cfg["dtype"]), progress=False)  # float32 on a CPU (training.Run)
    rec = {f"eval_{k}": v for k, v in summary["mean"].items()}
    rec["eval_ndcg10_per_dataset"] = {n: r.get("nDCG@10") for n, r in summary["datasets"].items()}
    return rec


def main(argv=None):
    cfg = cli.parse_config(SETTINGS, sys.argv[1:] if argv is None else argv, __file__)
    check_config(cfg, int(os.environ.get("WORLD_SIZE", 1)))
    check_auto_device(cfg)  # several processes without a GPU: refused before the backbone is fetched
    with training.Run(cfg) as run:
        step = train(cfg, run)
    run.exit_if_preempted()  # a SIGTERM saved and stopped the run: exit 128 + 15, not 0
    return step


def train(cfg, run):
    """The training run for a parsed, checked config, inside its `training.Run`."""
    proc, out, ckpts = run.dist, run.out, run.checkpoints
    checkpoint.check_export_target(out)  # the final model's folder, before any work

    # ---- the backbone (or the checkpoint of a resumed run), its tokenizer, the training data
    def build(folder):
        return from_pretrained(folder / "model") if folder else proc.master_first(lambda: load_backbone(cfg["init"]))
    model, state, opt_state, rng, resume = checkpoint.resume_or_build(ckpts, cfg["resume"], build, device=proc.device)
    changes = resume and checkpoint.check_resumed_config(state["config"], cfg, SETTINGS, run.say)
    check_model(cfg, model.config)
    if cfg["pooling"]:   # a resumed checkpoint has it already (pooling is fixed)
        model.splade.pooling = cfg["pooling"]
    tokenizer = load_tokenizer(model.source)  # its files travel with the model (model.tokenizer_files)
    model.source = None
    data = proc.master_first(lambda: load_training_set(cfg))
    check_data(cfg, data)
    data_key = training_set_identity(data)  # by content: a resume on other examples is refused
    if resume:
        checkpoint.check_resumed_data(state.get("train_data"), data_key, cfg, f"train_data {cfg['train_data']}",
                                      run.say)
    order = EpochOrder(len(data), cfg["seed"])
    # W_head <- W_head / k (rescale_backbone; 16 documents measure the embedding output): now, once,
    # before the first step. A resumed run's head is already scaled and is never scaled again (a
    # resumed run may not change k, k_bias, head_scale or untie_head: they are fixed in SETTINGS)
    if resume is None:
        probe = make_batch(data, order, range(min(16, len(data))), cfg, tokenizer, "cpu")[0][2:4]
        rescaling = rescale_backbone(model, cfg["k"], cfg["k_bias"], cfg["head_scale"], cfg["untie_head"], probe,
                                     cfg["k_target"])
        if cfg["k"] == 1 and (rule := auto_k(model, cfg["k_target"])) >= 2:  # a head the rule divides, left whole
            run.say(f"warning: k=1 leaves the MLM head whole (mean row L2 {rescaling['after']['mean_row_l2']:.3f}); "
                    f"--k=auto would divide it by {rule:.1f} (k_target {cfg['k_target']:g}). An undivided large head "
                    "is the setting of the paper's SPLADE collapse (ModernBERT at k = 1): pass --k=auto or the "
                    "paper's k (16 for ModernBERT and Ettin), or keep k=1 if that is the experiment")
    else:
        rescaling = state["rescaling"]
    model.to(proc.device).train()
    arch = model.config
    eval_len = min(cfg["eval_max_len"], sparse_encoder_max_seq_length(arch))  # the checkpoints' SparseEncoder length

    # ---- the loss module (DDP, compile), the optimizer, the loop's bookkeeping
    objective = SpladeObjective(model, cfg, proc.world_size, proc.rank)
    train_obj = training.parallelize(objective, model.layers, cfg, proc, compile_blocks=True)  # lengths vary
    optimizer = training.adamw(model, cfg["lr"], cfg["weight_decay"], (cfg["beta1"], cfg["beta2"]), cfg["adam_eps"],
                               proc.device, fused=True)
    checkpoint.load_optimizer_state(objective, optimizer, opt_state)

    def save(step, final, periodic):
        trainer = {"config": cfg, "rescaling": rescaling, "skipped_steps": loop.guard.skipped,
                   "train_examples": len(data), "examples_seen": step * cfg["batch_size"], "train_data": data_key}

        def extra(folder):  # the files that make it a sentence-transformers SparseEncoder (its pooling too)
            write_sparse_encoder_files(folder / "model", model, eval_len)
        folder = ckpts.save(step, model, optimizer.state_dict(), trainer, extra=extra, final=final, periodic=periodic)
        if final and proc.master:
            loop.say(f"final model: {checkpoint.export_final(folder / 'model', out)} (as a sentence-transformers "
                     f"SparseEncoder it reads {eval_len} tokens per text, as its evaluations did)")

    candidates = cfg["batch_size"] // cfg["grad_accum"] * (1 + cfg["n_negatives"]) if cfg["infonce_weight"] else None
    monitor = CollapseMonitor(arch.vocab_size, cfg["collapse_patience"], rescaling["after"]["mean_row_l2"],
                              out=sys.stderr if proc.master else None, candidates=candidates)

    def lambdas(step):  # [λ_q(t), λ_d(t)]
        return [lambda_at(step, cfg[key], cfg["lambda_warmup"]) for key in ("lambda_q", "lambda_d")]

    loop = training.Loop(cfg, run, state, rng, resume, flops_per_token(arch, cfg["doc_max_len"]), save, changes,
                         hint="an MLM head too large for SPLADE (try --k 16), lambda_q/lambda_d too high, ",
                         on_step=lambda step, stats: monitor.check(step, stats, lambdas(step - 1)))
    if resume and loop.step == cfg["max_steps"] and proc.master:  # finished, but its export may have been killed
        checkpoint.export_final(resume / "model", out)
    if proc.master:
        announce(cfg, proc, model, data, rescaling, resume, state, loop.log, out)
    text_tokens = cfg["query_max_len"] + (1 + cfg["n_negatives"]) * cfg["doc_max_len"]  # per example, at most
    loop.budget(cfg["batch_size"], len(data), "examples", text_tokens * flops_per_token(arch, cfg["doc_max_len"]),
                " (texts at their max lengths: an upper bound)")
    bench = None
    if cfg["eval_interval"]:
        from data.ir_datasets import load_benchmark
        bench = proc.master_first(lambda: load_benchmark(cfg["eval_benchmark"]))

    while loop.running():
        step = loop.step
        lr = loop.set_lr(optimizer)
        lam = [torch.tensor(x, device=proc.device) for x in lambdas(step)]  # tensors: no re-trace per value
        batches = loop.read(make_batch(data, order, micro_batch_positions(cfg, step, micro, proc.rank, proc.world_size),
                                       cfg, tokenizer, proc.device) for micro in range(cfg["grad_accum"]))
        totals = {}
        for micro, (batch, _) in enumerate(batches):
            training.sync_gradients(train_obj, micro == cfg["grad_accum"] - 1)  # reduce after the last micro-step
            with training.autocast(proc.device, cfg["dtype"]):
                loss, stats = train_obj(*batch, *lam)
            (loss / cfg["grad_accum"]).backward()
            totals = {name: totals.get(name, 0) + value / cfg["grad_accum"] for name, value in stats.items()}
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"] or math.inf)
        optimizer.found_inf = loop.guard.found_inf(totals["loss"], grad_norm)  # a non-finite step: skipped on the device
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loop.finish_step(sum(n for _, n in batches), grad_norm=grad_norm, **totals)  # statistics of the global batch

        if loop.log_due():
            stats = loop.sync()  # the collapse monitor has now seen every step up to this one
            if not data.has_teacher:
                stats = {k: v for k, v in stats.items() if k not in ("margin_mse", "kl")}
            lam_q, lam_d = lambdas(step)
            loop.log.write(step=loop.step, **stats, lambda_q=lam_q, lambda_d=lam_d, lr=lr,
                           examples=loop.step * cfg["batch_size"], skipped_steps=loop.guard.skipped,
                           collapse=monitor.state, **loop.throughput.report())
            loop.bar.set_postfix(loss=f"{stats['loss']:.3f}", q=f"{stats['q_active_dims']:.0f}",
                                 d=f"{stats['d_active_dims']:.0f}", lr=f"{lr:.2e}")
        if bench is not None and loop.eval_due():
            loop.evaluate(lambda: evaluate(cfg, proc, model, tokenizer, bench, eval_len))
        if loop.checkpoint():
            break
    loop.close()
    return loop.step


if __name__ == "__main__":
    cli.run_cli(main)
