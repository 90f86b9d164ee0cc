"""What both training loops share: torchrun/DDP setup, the run's context, AdamW and the schedules,
throughput and MFU, DDP/FSDP2 wrapping, and the bookkeeping around the steps (`Loop`).

train_lm.py and train_splade.py read top to bottom and write the step itself (gradient sync,
autocast, backward, clipping, the optimizer step); checkpoints, the run lock, pre-emption and the
non-finite guard are checkpoint.py's; the command line and user errors are cli.py's.
"""
import contextlib
import json
import math
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from checkpoint import Checkpoints, JsonlLog, NonFiniteGuard, Preemption, RunLock, set_rng_state
from cli import ConfigError  # noqa: F401 - the scripts' error for bad settings, also reachable as training.ConfigError

# ------------------------------------------------------------------------------------------------
# Distributed setup (torchrun) and device
# ------------------------------------------------------------------------------------------------


class Dist:
    """rank / world size / device from torchrun's environment; one process when not launched by it."""

    def __init__(self, device="auto"):
        self.enabled = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda"):
            device = f"cuda:{self.local_rank}" if self.enabled else device
            torch.cuda.set_device(device)
        self.device = torch.device(device)
        if self.enabled and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        self.master = self.rank == 0

    def barrier(self):
        if self.enabled:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank if it is True on some rank (pre-emption, non-finite loss, ...)."""
        if not self.enabled:
            return flag
        t = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def mean(self, value: float) -> float:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.world_size

    def ddp(self, module):
        """`module` wrapped in DistributedDataParallel under torchrun (gradients all-reduced in
        backward), `module` itself in one process."""
        if not self.enabled:
            return module
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(module, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def master_first(self, fn):
        """fn() on rank 0 first (downloads land in the shared cache once), then on the other ranks."""
        if not self.master:
            self.barrier()
        try:
            return fn()
        finally:
            if self.master:
                self.barrier()

    def close(self):
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


class Run:
    """What a training run holds from start to end, as a context manager:

        with Run(cfg) as run:          # run.dist, run.out, run.checkpoints, run.preemption
            ...

    On entry: torchrun/device setup (Dist), seeds, the exclusive lock on out_dir (RunLock: a second
    run on the same folder stops here), SIGTERM handling (Preemption) and the removal of unfinished
    saves of a killed run. On exit, however the run ends: the lock is released and the signal
    handlers restored. CPU runs use fp32: bf16 autocast on a CPU is slow and not what CPU runs
    (tests, quick starts) are for."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __enter__(self):
        cfg = self.cfg
        self.preemption = Preemption().__enter__()
        try:
            self.dist = proc = Dist(cfg["device"])
            if proc.device.type == "cpu" and cfg["dtype"] != "float32":
                cfg["dtype"] = "float32"
            seed_everything(cfg["seed"] + proc.rank)
            self.out = Path(cfg["out_dir"])
            self.lock = RunLock(self.out, proc)
        except BaseException:
            self.preemption.__exit__()
            raise
        self.checkpoints = Checkpoints(self.out, keep=cfg["keep_checkpoints"], dist_=proc)
        self.checkpoints.remove_stale_tmp()
        return self

    def __exit__(self, *exc):
        self.lock.release()
        self.preemption.__exit__()



def autocast(device, dtype: str):
    """bf16/fp16 autocast on the device, or nothing for fp32. Weights stay fp32 (master copy)."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, dtype))


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)



# ------------------------------------------------------------------------------------------------
# Optimizer and learning-rate schedules
# ------------------------------------------------------------------------------------------------


def adamw(model, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8, device=None):
    """AdamW with weight decay on weight matrices only: biases, norms and embedding tables (token,
    position, segment; a tied output head is the token table) are not decayed - decaying an
    embedding row shrinks rare tokens that are seldom updated. Dense projections are decayed,
    ALBERT's embedding projection e -> d among them: it is a matrix like any other layer's."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and id(p) not in tables else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device is not None and torch.device(device).type == "cuda"  # one kernel for all params
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)


def lr_at(step, *, lr, warmup, total, schedule="cosine", min_lr_ratio=0.0, decay_fraction=0.2):
    """Learning rate at optimizer step `step` (0-based); every schedule ends at min_lr_ratio * lr.

    linear:  warm-up, then linear decay (BERT / SPLADE fine-tuning recipes use min_lr_ratio 0)
    cosine:  warm-up, then cosine decay (LLaMA pretraining)
    wsd:     warm-up, stable at lr, then linear decay over the last decay_fraction of training
             (warmup-stable-decay, used by EuroBERT-style pretraining)
    """
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    lo = lr * min_lr_ratio
    if schedule == "linear":
        return lo + (lr - lo) * max(0.0, (total - step) / max(1, total - warmup))
    if schedule == "cosine":
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * progress))
    if schedule == "wsd":
        decay_start = total - int(decay_fraction * total)
        if step < decay_start:
            return lr
        return lr - (lr - lo) * min(1.0, (step - decay_start) / max(1, total - decay_start))
    raise ValueError(f"unknown schedule {schedule!r}: use linear, cosine or wsd")


# Dense bf16 tensor-core peaks (no 2:4 sparsity), FLOP/s per GPU, matched against
# torch.cuda.get_device_name in this order: the more specific names first.
PEAK_FLOPS = (
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H200 NVL", 835e12),  # lower clocks / power than SXM
    ("GH200", 989e12), ("H200", 989e12), ("H100", 989e12),                # SXM (H100 "80GB HBM3")
    ("B200", 2250e12), ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12), ("A10", 125e12),
)


def peak_flops(device):
    """Dense bf16 peak of the GPU (for MFU), or None when unknown / on CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS if k in name), None)


class Throughput:
    """Tokens/s and model-FLOPs utilisation over the optimizer steps since the last log line.

    It divides by the steps it actually timed (a resumed run or the last window may hold fewer than
    log_interval) and leaves out evaluation and checkpoint time (`with throughput.paused():`).
    MFU = FLOPs the model needs for those tokens / elapsed seconds / (peak FLOP/s x GPUs), with
    the FLOPs per token of model.flops_per_token (PaLM's convention: rematerialisation and padding
    do not count as useful work)."""

    def __init__(self, dist_, flops_per_token=None):
        self.dist, self.flops_per_token = dist_, flops_per_token
        self.peak = peak_flops(dist_.device)
        self.reset()

    def reset(self):
        self.start, self.excluded, self.steps, self.tokens = time.perf_counter(), 0.0, 0, 0

    def step(self, tokens):
        """One optimizer step done, with `tokens` tokens on this rank."""
        self.steps, self.tokens = self.steps + 1, self.tokens + tokens

    @contextlib.contextmanager
    def paused(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - t

    def report(self):
        """{tokens_per_s, step_ms[, mfu]} of the window (collective under torchrun), then a new window."""
        seconds = max(time.perf_counter() - self.start - self.excluded, 1e-9)
        tokens = self.dist.mean(self.tokens) * self.dist.world_size  # all ranks
        rec = {"tokens_per_s": tokens / seconds, "step_ms": 1000 * seconds / max(self.steps, 1)}
        if self.peak and self.flops_per_token:
            rec["mfu"] = tokens * self.flops_per_token / seconds / (self.peak * self.dist.world_size)
        self.reset()
        return rec



# ------------------------------------------------------------------------------------------------
# Wrapping for data parallelism: DDP, or FSDP2 for models too large to replicate
# ------------------------------------------------------------------------------------------------


def parallelize(objective, blocks, cfg, proc, dynamic=None):
    """The module the loop calls: `objective` (whose forward computes the loss, so that the whole loss
    runs inside the wrapped and compiled forward) wrapped in DDP under torchrun, or, with cfg["fsdp"],
    sharded with FSDP2: every block in `blocks` is its own unit (parameters gathered just before
    its forward, freed after), the objective holds the rest; then torch.compile if asked."""
    if cfg.get("fsdp"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, cfg["dtype"]), reduce_dtype=torch.float32)
        for block in blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(objective, mp_policy=mp)
        wrapped = objective
    else:
        wrapped = proc.ddp(objective)
    return torch.compile(wrapped, dynamic=dynamic) if cfg["compile"] else wrapped



def sync_gradients(module, sync: bool):
    """Whether the next backward reduces gradients across ranks (DDP all-reduce, FSDP
    reduce-scatter). Accumulating micro-steps keep their gradients local and reduce once, on the
    last micro-step of the optimizer step. One process: nothing to do."""
    m = getattr(module, "_orig_mod", module)  # under torch.compile
    if hasattr(m, "set_requires_gradient_sync"):    # FSDP2
        m.set_requires_gradient_sync(sync)
    elif hasattr(m, "require_backward_grad_sync"):  # DDP (what its no_sync() sets)
        m.require_backward_grad_sync = sync


# ------------------------------------------------------------------------------------------------
# The bookkeeping around a training loop's steps
# ------------------------------------------------------------------------------------------------


class Loop:
    """What train_lm.py and train_splade.py keep around their steps, so that the loops show the step:

        loop = Loop(cfg, run, state, rng, resume, flops_per_token, save)
        while loop.running():
            lr = loop.set_lr(optimizer)
            ... micro-steps, clipping, the optimizer step (written in the loop)
            loop.finish_step(tokens)
            if loop.log_due(): loop.log.write(...)
            if loop.eval_due(): with loop.paused(): ...
            if loop.checkpoint(): break      # saved on a SIGTERM: stop
        loop.close()

    It restores the RNG state of a resumed run, opens the JSONL log (trimmed to the resume step),
    writes config.json, shows the progress bar, keeps the throughput window (MFU), holds the
    non-finite guard and applies the checkpoint policy: every ckpt_interval steps, at the end and on
    SIGTERM - never while a non-finite streak is open, and a periodic save on a full disk only warns."""

    def __init__(self, cfg, run, state, rng, resume, flops_per_token, save):
        from tqdm import tqdm
        self.cfg, self.dist, self.preemption, self.save = cfg, run.dist, run.preemption, save
        self.step = state.get("step", 0)
        self.guard = NonFiniteGuard(cfg["nonfinite_patience"], run.checkpoints)
        self.guard.skipped = state.get("skipped_steps", 0)
        self.throughput = Throughput(run.dist, flops_per_token)
        self.log = JsonlLog(run.out / "log.jsonl", enabled=run.dist.master,
                            resume_step=self.step if resume else None)
        if resume and rng is not None:
            set_rng_state(rng)
        if run.dist.master:
            run.out.mkdir(parents=True, exist_ok=True)
            (run.out / "config.json").write_text(json.dumps(cfg, indent=1))
            if resume:
                print(f"resumed from {resume} at step {self.step}")
        self.bar = tqdm(total=cfg["max_steps"], initial=self.step, disable=not run.dist.master, dynamic_ncols=True,
                        desc="train")
        self.save_due = False

    def running(self):
        return self.step < self.cfg["max_steps"]

    def set_lr(self, optimizer):
        cfg = self.cfg
        lr = lr_at(self.step, lr=cfg["lr"], warmup=cfg["warmup_steps"], total=cfg["max_steps"],
                   schedule=cfg["schedule"], min_lr_ratio=cfg["min_lr_ratio"],
                   decay_fraction=cfg.get("decay_fraction", 0.2))
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    def finish_step(self, tokens):
        """The optimizer step is done; `tokens`: the tokens this rank trained on in it."""
        self.step += 1
        self.bar.update(1)
        self.throughput.step(tokens)

    def _due(self, interval):
        return bool(interval) and (self.step % interval == 0 or self.step == self.cfg["max_steps"])

    def log_due(self):
        return self._due(self.cfg["log_interval"])

    def eval_due(self):
        return self._due(self.cfg["eval_interval"])

    def paused(self):
        """Time spent here (evaluation, saving) is left out of tokens/s and MFU."""
        return self.throughput.paused()

    def say(self, text):
        if self.dist.master:
            self.bar.write(text)

    def checkpoint(self):
        """Save when due and safe; True when a SIGTERM asks the run to stop (after its save)."""
        cfg, step = self.cfg, self.step
        stop = self.dist.any(self.preemption.requested)
        final = step == cfg["max_steps"]
        self.save_due = self.save_due or step % cfg["ckpt_interval"] == 0 or final or stop
        if self.save_due and not self.guard.healthy:  # never checkpoint weights that gave a non-finite loss
            if stop or final:
                self.say(self.guard.unsaved_message(step))
        elif self.save_due:
            self.save_due = False
            with self.paused():
                self.save(step, final=final, periodic=not (stop or final))
            if stop:
                self.say(self.preemption.saved_message(step))
        return stop

    def close(self):
        self.bar.close()
        self.dist.close()
