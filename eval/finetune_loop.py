"""The parts of fine-tuning that every task kind shares - sequence and token classification and QA
(eval/finetune.py), retrieval (eval/finetune_ir.py): the configuration with the paper's protocol,
the device and bf16 autocast, the order of the batches, the training loop, the forward pass over
many sequences, and mean pooling. eval/finetune.py's docstring describes the protocol."""
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from data.tokenizer import pad_batch
from training import adamw, autocast, default_dtype, lr_at, pick_device


@dataclass
class FinetuneConfig:
    lr: float = 5e-5
    seed: int = 0
    batch_size: int = 32
    steps: int = 1000             # SC, QA, IR
    tc_epochs: float = 1.0        # TC trains for epochs instead of steps
    warmup_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-5
    grad_clip: float = 1.0
    max_len: int = 512
    pooling: str = "mean"         # mean | bos | late (SC)
    causal: bool = False          # keep the causal mask (ablation); default bidirectional
    bucket: bool = False          # length-bucketed training batches
    pad_to: int | None = None     # pad every batch to this length (benchmark); None = dynamic
    eval_batch_size: int = 64
    doc_stride: int = 128         # QA window overlap in tokens
    max_question_tokens: int = 64
    n_best: int = 20
    max_answer_tokens: int = 30
    max_train: int | None = None  # use only the first N training examples (quick runs)
    max_eval: int | None = None   # and the first N validation / test examples
    device: str = "auto"
    bf16: bool | None = None      # None: bf16 autocast on CUDA only
    progress: bool = True


def model_max_len(encoder, cfg):
    """cfg.max_len, capped by a learned position table (ModelConfig.position_limit: BERT-style
    models cannot go past it, RoBERTa's holds pad_id + 1 rows fewer tokens)."""
    limit = encoder.config.position_limit
    return cfg.max_len if limit is None else min(cfg.max_len, limit)


def pad_id_of(tokenizer, encoder=None) -> int:
    special = getattr(tokenizer, "special", None)
    for pid in (special and special.pad, encoder and encoder.config.pad_id, special and special.eos):
        if pid is not None:
            return int(pid)
    return 0


def mean_pool(h, mask):
    """Mean of the hidden states of the real (non-padding) tokens, in fp32."""
    m = mask.to(torch.float32).unsqueeze(-1)
    return (h.float() * m).sum(1) / m.sum(1).clamp(min=1.0)


# ----------------------------------------------------------------------------- batches


def train_order(lengths, batch_size, steps, seed, bucket=False):
    """`steps` batches of example indices, epoch after epoch, each epoch a fresh seeded
    permutation cut into batches (its last batch may be smaller, as a DataLoader without
    drop_last gives). With bucket=True, each window of 64 batches is sorted by length before it
    is cut and its batches are shuffled: a batch holds similar lengths, the order stays random."""
    rng = np.random.default_rng(seed)
    batches = []
    while len(batches) < steps:
        order = rng.permutation(len(lengths))
        if not bucket:
            batches += [order[k:k + batch_size].tolist() for k in range(0, len(order), batch_size)]
            continue
        window = 64 * batch_size
        for s in range(0, len(order), window):
            part = order[s:s + window]
            part = part[np.argsort([lengths[i] for i in part], kind="stable")]
            groups = [part[k:k + batch_size].tolist() for k in range(0, len(part), batch_size)]
            rng.shuffle(groups)
            batches += groups
    return batches[:steps]


def eval_order(lengths, batch_size):
    """Batches of indices sorted by length (longest first), so padding is minimal at inference."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[k:k + batch_size] for k in range(0, len(order), batch_size)]


# ----------------------------------------------------------------------------- training


def resolve_device(cfg: FinetuneConfig) -> torch.device:
    return pick_device(cfg.device)


def amp(device, cfg: FinetuneConfig):
    """bf16 autocast as cfg.bf16 says (None: training.default_dtype, bf16 on CUDA only)."""
    dtype = default_dtype(device) if cfg.bf16 is None else torch.bfloat16 if cfg.bf16 else torch.float32
    return autocast(device, dtype)


def train_loop(model, loss_of_batch, batches, cfg: FinetuneConfig, device, desc="fine-tune"):
    """Plain AdamW loop over pre-drawn batches (lists of indices). Returns timing and losses."""
    model.train()
    opt = adamw(model, cfg.lr, cfg.weight_decay, betas=cfg.betas, eps=cfg.eps, device=device)
    total = len(batches)
    warmup = math.ceil(cfg.warmup_ratio * total)
    losses, seen = [], 0
    start = time.perf_counter()
    for step, idx in enumerate(tqdm(batches, desc=desc, disable=not cfg.progress, leave=False)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, lr=cfg.lr, warmup=warmup, total=total, schedule="linear")
        with amp(device, cfg):
            loss = loss_of_batch(idx)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())  # no .item() here: it would wait for the GPU every step
        seen += len(idx)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    losses = torch.stack(losses).float().cpu().tolist() if losses else []
    return {"steps": total, "examples": seen, "seconds": seconds, "examples_per_s": seen / max(seconds, 1e-9),
            "first_loss": losses[0] if losses else None,
            "last_loss": float(np.mean(losses[-10:])) if losses else None}


@torch.no_grad()
def forward_all(model, seqs, pad_id, cfg, device, per_token=False, types=None):
    """Model outputs for every sequence (in input order) as tuples of numpy arrays, batched by
    length; per_token outputs are cut back to the sequence's own length. `types`: token type
    (segment) ids per sequence, for models that have segment embeddings."""
    model.eval()
    outs = [None] * len(seqs)
    batches = eval_order([len(s) for s in seqs], cfg.eval_batch_size)
    for idx in tqdm(batches, desc="evaluate", disable=not cfg.progress or len(batches) < 10, leave=False):
        ids, mask = pad_batch([seqs[i] for i in idx], pad_id, device=device)
        kw = {} if types is None else {"token_type_ids": pad_batch([types[i] for i in idx], 0, device=device)[0]}
        with amp(device, cfg):
            y = model(ids, mask, **kw)
        ys = [t.float().cpu().numpy() for t in (y if isinstance(y, tuple) else (y,))]
        for row, i in enumerate(idx):
            n = len(seqs[i])
            outs[i] = tuple(t[row, :n] if per_token else t[row] for t in ys)
    return outs
