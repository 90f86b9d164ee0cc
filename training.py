"""What both training loops share: torchrun/DDP setup, the run's context, AdamW and the schedules,
DDP/FSDP2 wrapping, and the bookkeeping around the steps (`Loop`). The step itself is written in
train_lm.py and train_splade.py; checkpoints, the run lock and the non-finite guard are checkpoint.py's.
"""
import contextlib
import datetime
import gc
import json
import math
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from checkpoint import Checkpoints, JsonlLog, NonFiniteGuard, Preemption, RunLock, set_rng_state
import cli
import fast_paths
from cli import ANY, ConfigError, UserError, count, fixed, free, interval, one_of
from throughput import Throughput, use_cpu_threads

# ---- Distributed setup (torchrun) and device -----------------------------------------------------


class Dist:
    """rank / world size / device from torchrun's environment; one process when not launched by it.

    Collectives of the loop's own decisions (a SIGTERM, a data error, the numbers of a log line) go
    through `host`, a gloo group on the CPU: agreeing on a flag never waits for the GPU. `timeout`
    (minutes) bounds every collective: rank 0 writing a large checkpoint to slow storage keeps the
    others waiting in the next one, so it must be longer than a save (NCCL's default is 10 min)."""

    def __init__(self, device="auto", timeout=60):
        self.enabled = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        self.rank = int(os.environ.get("RANK", 0))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        device = str(pick_device(device))
        if device.startswith("cuda"):
            device = f"cuda:{self.local_rank}" if self.enabled else device
            torch.cuda.set_device(device)
        self.device = torch.device(device)
        self.host = None
        if self.enabled and not dist.is_initialized():
            limit = datetime.timedelta(minutes=timeout)
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo", timeout=limit)
            if self.device.type == "cuda":
                self.host = dist.new_group(backend="gloo", timeout=limit)
        self.master = self.rank == 0

    def barrier(self):
        if self.enabled:
            dist.barrier()

    def any_of(self, flags):
        """For each flag: True on every rank if it is True on some rank (one all-reduce on the host)."""
        if not self.enabled:
            return [bool(f) for f in flags]
        t = torch.tensor([float(f) for f in flags])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.host)
        return [bool(v) for v in t.tolist()]

    def any(self, flag: bool) -> bool:
        """True on every rank if it is True on some rank (pre-emption, a refused lock, a failed save...)."""
        return self.any_of([flag])[0]

    def mean(self, value: float) -> float:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, group=self.host)
        return t.item() / self.world_size

    def gather(self, t):
        """Every rank's `t` (a CPU tensor, the same shape on every rank), concatenated in rank order."""
        if not self.enabled:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous(), group=self.host)
        return torch.cat(parts)

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
    """What a training run holds from start to end: `with Run(cfg) as run:` (run.dist, run.out,
    run.checkpoints, run.preemption). On entry: Dist, seeds, the lock on out_dir (a second run on
    it stops here), SIGTERM handling, unfinished saves removed; CPU runs use fp32 and the threads
    the machine has free (throughput.cpu_threads). On exit the lock and signal handlers are released."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __enter__(self):
        cfg = self.cfg
        self.preemption = Preemption().__enter__()
        try:
            self.dist = proc = Dist(cfg["device"], cfg.get("dist_timeout", 60))
            self.threads = torch.get_num_threads()  # restored on exit
            if proc.device.type == "cpu" and cfg["dtype"] != "float32":
                cfg["dtype"] = "float32"
            self.threads_line = use_cpu_threads(proc.local_world_size) if proc.device.type == "cpu" else None
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
        torch.set_num_threads(self.threads)
        if exc[0] is None:
            # the model and DDP's reducer go first, while the process group is registered: a reducer
            # that destroys the group with the GIL held hangs gloo's destructor at exit
            gc.collect()
            self.dist.close()

    say = staticmethod(cli.say)  # a note on stderr, from rank 0

    def exit_if_preempted(self):
        """After a run that a SIGTERM/SIGINT stopped (and saved): exit with 128 + the signal's number,
        so that a scheduler can tell it from a finished run (which exits with 0)."""
        if self.preemption.requested:  # SIGTERM 143, SIGINT 130
            raise SystemExit(128 + self.preemption.signum)


def missing_device(name):
    """None if device=`name` (auto | cpu | cuda | cuda:N) exists here, else the fix."""
    kind, _, index = name.partition(":")
    n = torch.cuda.device_count()
    found = name in ("auto", "cpu") or kind == "cuda" and (index or "0").isdigit() and int(index or 0) < n
    return None if found else f"use auto, cpu, cuda or cuda:N ({n} CUDA devices here)"


def pick_device(name="auto"):
    """The device `name` names (auto | cpu | cuda | cuda:N; None: auto): auto is a GPU if there is one."""
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name in (None, "auto") else name)


def default_dtype(device):
    """The autocast dtype where none is asked: bf16 on a GPU, fp32 on a CPU (bf16 autocast is slow there)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def autocast(device, dtype):
    """bf16/fp16 autocast on the device (`dtype`: a torch dtype or its name), or nothing for fp32."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def to_device(t, device):
    """A host tensor on the training device; from page-locked memory on a GPU (the copy overlaps compute)."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ---- Optimizer and learning-rate schedules -------------------------------------------------------


DECAY_PARAMS = ("matrices", "matrices+embeddings", "all")  # which parameters adamw decays (its docstring)


def adamw(model, lr, weight_decay, betas=(0.9, 0.95), eps=1e-8, device=None, fused=None, decay_params="matrices",
          head_lr_scale=1.0):
    """AdamW with weight decay on weight matrices only (decay_params="matrices"): biases, norms and
    embedding tables (a tied head is the token table) are not decayed - decaying an embedding row
    shrinks rare tokens. "matrices+embeddings": every >= 2-D parameter (BERT's, ModernBERT's
    recipes); "all": every parameter (EuroBERT's). fused=True: torch's fused AdamW, the only one
    that takes `optimizer.found_inf` (a non-finite step skipped on the device: both loops); None:
    fused on CUDA only. head_lr_scale != 1: the head's own parameters learn at lr x head_lr_scale."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding) and decay_params == "matrices"}
    head = {id(p) for p in model.head.parameters()} - {id(p) for p in model.embed.parameters()} \
        if head_lr_scale != 1 else set()
    members = {(decays, in_head): [] for in_head in (False, True) for decays in (True, False)}
    for p in [p for p in model.parameters() if p.requires_grad]:   # a tied weight once
        members[((p.dim() >= 2 or decay_params == "all") and id(p) not in tables, id(p) in head)].append(p)
    # the decayed and the undecayed group first and always (a saved optimizer state maps onto groups
    # in order); the head's only where it has parameters
    groups = [{"params": ps, "weight_decay": weight_decay if decays else 0.0,
               "lr_scale": head_lr_scale if in_head else 1.0}
              for (decays, in_head), ps in members.items() if ps or not in_head]
    if fused is None:
        fused = device is not None and torch.device(device).type == "cuda"
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)


WSD_DECAY_FRACTION = 0.2   # schedule=wsd: the last fraction of the steps, which decays (train_lm's decay_fraction)


def lr_at(step, *, lr, warmup, total, schedule="cosine", min_lr_ratio=0.0, decay_fraction=WSD_DECAY_FRACTION):
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


SCHEDULES = ("linear", "cosine", "wsd")  # lr_at's formulas


# ---- Wrapping for data parallelism: DDP, or FSDP2 for models too large to replicate --------------


def parallelize(objective, blocks, cfg, proc, compile_blocks=False):
    """The module the loop calls: `objective` (whose forward computes the whole loss) in DDP under
    torchrun, or with cfg["fsdp"] sharded by FSDP2, each of `blocks` its own unit (hsdp: shard within
    a node, replicate across nodes). Then torch.compile if asked: the whole objective, or
    (compile_blocks) each block with dynamic shapes, for inputs whose length changes every batch."""
    if cfg.get("fsdp"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = None
        if cfg.get("hsdp") and proc.enabled:
            from torch.distributed.device_mesh import init_device_mesh
            nodes = proc.world_size // proc.local_world_size
            mesh = init_device_mesh(proc.device.type, (nodes, proc.local_world_size),
                                    mesh_dim_names=("replicate", "shard"))
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, cfg["dtype"]), reduce_dtype=torch.float32)
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=cfg.get("fsdp_reshard", True))
        fully_shard(objective, mesh=mesh, mp_policy=mp)
        wrapped = objective
    else:
        wrapped = proc.ddp(objective)
    if not cfg["compile"]:
        return wrapped
    fast_paths.compile_cache_per_cpu_kernels()
    if compile_blocks:
        for block in blocks:
            block.compile(dynamic=True)
        return wrapped
    return torch.compile(wrapped)


def sync_gradients(module, sync: bool):
    """Whether the next backward reduces gradients across ranks (DDP, FSDP): only on the last micro-step."""
    m = getattr(module, "_orig_mod", module)  # under torch.compile
    if hasattr(m, "set_requires_gradient_sync"):    # FSDP2
        m.set_requires_gradient_sync(sync)
    elif hasattr(m, "require_backward_grad_sync"):  # DDP (what its no_sync() sets)
        m.require_backward_grad_sync = sync


# ---- The bookkeeping around a training loop's steps ----------------------------------------------


# The keys both loops share, declared once; each script gives its defaults: shared(key=default, ...),
# or SHARED[key].given(default, help) where the key means more there.
SHARED = dict(
    out_dir=free(...),
    resume=free(..., ANY, "auto: continue from out_dir's newest valid checkpoint | never | a checkpoint folder"),
    accept_changed_data=free(..., ANY, "resume although the training data's content changed (refused otherwise)"),
    batch_size=fixed(..., count(1)),
    grad_accum=fixed(..., count(1), "micro-steps per optimizer step"),
    seed=fixed(...),
    # optimizer and schedule
    **free(..., interval("[0, inf)")).each(lr=..., weight_decay=..., adam_eps=..., grad_clip=...),
    **free(..., interval("[0, 1)")).each(beta1=..., beta2=...),
    min_lr_ratio=free(..., interval("[0, 1]")),
    warmup_steps=free(..., count(0)),
    max_steps=free(..., count(1)),
    schedule=free(..., one_of(SCHEDULES)),
    # system
    device=free(..., cli.Rule(missing_device, ("cuda:99", "gpu")), "auto | cpu | cuda | cuda:N (auto: a GPU if there is one)"),
    dtype=free(..., one_of(("bfloat16", "float16", "float32")), "autocast (weights stay fp32); CPU runs use float32"),
    compile=free(...),
    fused=free(...),
    dist_timeout=free(..., interval("(0, inf)"), "minutes a collective may wait (more than a large checkpoint's save)"),
    # logging, evaluation, checkpoints
    **free(..., count(0, "steps; 0 = never")).each(log_interval=..., eval_interval=..., ckpt_interval=...),
    **free(..., count(1)).each(keep_checkpoints=..., nonfinite_patience=...),
)


def shared(**defaults):
    """The SHARED keys with this script's defaults."""
    return {key: SHARED[key].given(value) for key, value in defaults.items()}


def check_length(arch, key, length):
    """A learned position table bounds the length (ModelConfig.position_limit); RoPE does not."""
    limit = arch.position_limit
    if limit is not None and length > limit:
        raise ConfigError(f"{key}={length}: the {arch.family} model has learned positions for {limit} tokens: "
                          f"set {key} <= {limit}")


ASSUMED_MFU = 0.4  # a budget line's GPU-hours, before the run has measured its own (the log's mfu)


def budget_line(steps, per_step, unique, unit, flops_per_unit=None, peak=None, note=""):
    """(the line, passes): the `unit`s (tokens, examples) that `steps` steps of `per_step` see, the
    `unique` ones the data holds (one pass), the passes that makes, and with a GPU's `peak` FLOP/s the
    GPU-hours at ASSUMED_MFU (`flops_per_unit`: training FLOPs per unit; `note`: how they were counted)."""
    seen = steps * per_step
    # passes = steps · per_step / unique; GPU-hours = seen · FLOPs per unit / (MFU · peak) / 3600
    line = (f"budget: {steps:,} steps x {per_step:,} {unit} = {seen:,} {unit}; the data holds {unique:,} (one "
            f"pass): {seen / unique:.2f} passes")
    if peak and flops_per_unit:
        hours = seen * flops_per_unit / (ASSUMED_MFU * peak) / 3600
        line += f"; {hours:,.1f} GPU-hours at an assumed {ASSUMED_MFU:.0%} MFU{note} (the log's mfu is measured)"
    return line, seen / unique


class Loop:
    """What train_lm.py and train_splade.py keep around their steps, so that the loops show the step
    (`while loop.running(): ... loop.finish_step(...); ... if loop.checkpoint(): break`).

    Nothing is read back from the device between log steps: each step's values stay there
    (`finish_step`) until `sync` reads them in one transfer and checks them in order (the non-finite
    guard, then `on_step`, e.g. SPLADE's collapse monitor): at log steps, saves, and every
    SYNC_EVERY steps. It also restores a resumed run's RNG, keeps the JSONL log, config.json, the
    progress bar and the throughput window, and saves every ckpt_interval steps, at the end, on
    SIGTERM and on a data error - never while a non-finite streak is open."""

    SYNC_EVERY = 100

    def __init__(self, cfg, run, state, rng, resume, flops_per_token, save, changes=None, hint="", on_step=None):
        self.cfg, self.dist, self.preemption, self.save = cfg, run.dist, run.preemption, save
        self.out, self.checkpoint_root = run.out, run.checkpoints.root
        self.step = state.get("step", 0)
        self.guard = NonFiniteGuard(cfg["nonfinite_patience"], run.checkpoints)
        self.guard.skipped = state.get("skipped_steps", 0)
        self.hint, self.on_step = hint, on_step
        self.pending, self.last, self.stop_requested, self.saved_step = [], {}, False, self.step if resume else None
        self.throughput = Throughput(run.dist, flops_per_token)
        self.paused = self.throughput.paused  # time spent there (evaluation, saving) is left out of tokens/s and MFU
        self.log = JsonlLog(run.out / "log.jsonl", enabled=run.dist.master,
                            resume_step=self.step if resume else None)
        if changes:
            self.log.note(resumed_with_changes=changes)
        if resume and rng is not None:
            set_rng_state(rng)
        if run.dist.master:
            run.out.mkdir(parents=True, exist_ok=True)
            (run.out / "config.json").write_text(json.dumps(cfg, indent=1))
            if resume:
                print(f"resumed from {resume} at step {self.step}")
            if run.threads_line:  # said here, once the run is sure to start (after the model and the data)
                print(run.threads_line, file=sys.stderr)
        self.bar = None  # drawn when the steps start: what the script prints before stays on lines of its own
        self.save_due, self.unique = False, 0  # unique: budget()

    def budget(self, per_step, unique, unit, flops_per_unit=None, note=""):
        """Say the run's budget before step 1 (budget_line); more than one pass is a warning, here
        and when each new pass begins (running)."""
        line, self.passes = budget_line(self.cfg["max_steps"], per_step, unique, unit, flops_per_unit,
                                        self.throughput.peak, note)
        self.say(line)
        if self.passes > 1:
            cli.say(f"warning: this run makes {self.passes:.2f} passes over its data, so it repeats what it has "
                    f"seen; prepare more data or lower max_steps, unless the config means to repeat it")
        self.per_step, self.unique = per_step, unique

    def running(self):
        if self.unique and self.step < self.cfg["max_steps"]:  # the pass of this step's last unit, and before it
            now, before = (((self.step + d) * self.per_step - 1) // self.unique for d in (1, 0))
            if now > max(0, before):
                cli.say(f"warning: step {self.step + 1:,}: pass {now + 1} over the training data begins "
                        f"({self.passes:.2f} passes in all)")
        if self.bar is None:
            from tqdm import tqdm
            self.bar = tqdm(total=self.cfg["max_steps"], initial=self.step, disable=not self.dist.master,
                            dynamic_ncols=True, desc="train")
        return self.step < self.cfg["max_steps"]

    def set_lr(self, optimizer):
        cfg = self.cfg
        lr = lr_at(self.step, lr=cfg["lr"], warmup=cfg["warmup_steps"], total=cfg["max_steps"],
                   schedule=cfg["schedule"], min_lr_ratio=cfg["min_lr_ratio"],
                   decay_fraction=cfg.get("decay_fraction", WSD_DECAY_FRACTION))
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        return lr

    def read(self, batches):
        """The micro-batches of one step, read on the host. A data error (UserError) on any rank saves
        the steps finished so far and stops every rank; the same all-reduce agrees on a SIGTERM."""
        error, out = None, []
        try:
            out = list(batches)
        except UserError as e:
            error = e
        failed, self.stop_requested = self.dist.any_of([error is not None, self.preemption.requested])
        if failed:
            self.save_now(periodic=False)
            self.bar.close()  # the error line goes below the progress bar, not onto it
            raise error or UserError("a data error on another rank stopped the run (see its message above); the "
                                     "steps finished so far were saved")
        return out

    def finish_step(self, tokens, **values):
        """The optimizer step is done; `tokens`: the tokens this rank trained on in it; `values`:
        its 0-dim tensors (loss, grad_norm, ...), read at the next sync point, not now."""
        self.pending.append((self.step, {k: v.full_tensor() if hasattr(v, "full_tensor") else v
                                         for k, v in values.items()}))
        self.step += 1
        self.bar.update(1)
        self.throughput.step(tokens)

    def sync(self):
        """Read the pending steps' values from the device in one transfer and check them in order
        (the non-finite guard, then on_step(step, values)); the newest step's values as floats."""
        if self.pending:
            names = list(self.pending[-1][1])
            rows = torch.stack([torch.stack([v[n].detach().float() for n in names]) for _, v in self.pending])
            try:
                for (step, _), row in zip(self.pending, rows.tolist()):
                    self.last = dict(zip(names, row))
                    self.guard.check(self.last["loss"], self.last["grad_norm"], step, self.hint)
                    if self.on_step is not None:
                        self.on_step(step + 1, self.last)
            except UserError:  # the run stops (non-finite streak, collapse): below the progress bar
                self.bar.close()
                raise
            self.pending = []
        return self.last

    def _due(self, interval):
        return bool(interval) and (self.step % interval == 0 or self.step == self.cfg["max_steps"])

    def log_due(self):
        return self._due(self.cfg["log_interval"])

    def eval_due(self):
        return self._due(self.cfg["eval_interval"])

    def evaluate(self, run):
        """`run()`'s metrics (the evaluation), timed apart from training, logged and said."""
        with self.paused():
            metrics = run()
        self.log.write(step=self.step, **metrics)
        self.say(f"step {self.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, float)))

    def say(self, text):
        cli.say(text, file=sys.stdout)   # from rank 0, on a line of its own, the bar drawn again below it

    def save_now(self, periodic):
        """Save this step, unless it is saved already or a non-finite streak is open."""
        self.sync()
        if self.guard.in_a_row:  # a non-finite streak is open: never checkpoint weights that gave a non-finite loss
            if not periodic:
                self.say(f"warning: step {self.step} was not saved: a streak of non-finite steps is open (since "
                         f"step {self.guard.streak_start}); resume continues from the last checkpoint saved before it")
        elif self.saved_step != self.step and self.step > 0:
            with self.paused():
                self.save(self.step, final=self.step == self.cfg["max_steps"], periodic=periodic)
            self.saved_step, self.save_due = self.step, False

    def checkpoint(self):
        """Save when due and safe; True when a SIGTERM asks the run to stop (after its save)."""
        cfg, step, stop = self.cfg, self.step, self.stop_requested
        final = step == cfg["max_steps"]
        self.save_due = self.save_due or self._due(cfg["ckpt_interval"]) or final or stop
        if self.save_due:
            self.save_now(periodic=not (stop or final))
        elif len(self.pending) >= self.SYNC_EVERY:
            self.sync()
        if stop and self.saved_step == step:
            self.say(f"{self.preemption.signal or 'pre-emption'} received: checkpoint saved at step {step}; run the "
                     "same command again to resume")
        return stop

    def close(self):
        """The end of the run: the last values read, and where its files are."""
        self.sync()
        self.bar.close()
        if self.dist.master and self.saved_step:
            print(f"done at step {self.step}: the log is {self.out / 'log.jsonl'}, the newest checkpoint "
                  f"{self.checkpoint_root / f'step_{self.saved_step:08d}'}")
