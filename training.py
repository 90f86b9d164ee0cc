"""What both training scripts share: configuration, torchrun/DDP setup, optimizer and schedules,
checkpoints that resume exactly, pre-emption handling, the non-finite guard and the JSONL log.

train_lm.py and train_splade.py read top to bottom; everything here is plumbing they call.

Checkpoint layout (one folder per saved step; a folder exists only once it is complete):

    out_dir/checkpoints/step_00001000/
        model/             Hugging Face folder (config.json, model.safetensors, tokenizer.json)
        optimizer.pt       AdamW state (one file; optimizer_rank{r}.pt per rank under FSDP)
        rank{r}.pt         per-rank RNG states
        trainer.json       step, data position, schedule, metrics, the run's config
        MANIFEST.json      written last: every file with its size. No manifest = not a checkpoint.

A checkpoint is written to `step_N.tmp/`, fsynced, then renamed: a killed run can leave a
stale `.tmp` folder (removed on the next save) but never a half-written `step_N`. Resume picks
the newest folder whose manifest matches the files and falls back to older ones if it does not.
"""
import ast
import contextlib
import json
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

# ------------------------------------------------------------------------------------------------
# Configuration: module-level defaults, overridden by configs/*.py files and --key=value flags
# ------------------------------------------------------------------------------------------------


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word such as hf:org/name or cosine


def _coerce(key, value, default):
    """Check that `value` fits the type of the default; ints are accepted where floats are expected."""
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif isinstance(default, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif isinstance(default, int) and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(default)(value)
    elif isinstance(default, str) and isinstance(value, (str, int, float)):
        return str(value)
    elif isinstance(value, type(default)):
        return value
    raise TypeError(f"config key {key!r}: expected {type(default).__name__} (default {default!r}), "
                    f"got {type(value).__name__} {value!r}")


def parse_config(defaults: dict, argv: list[str]) -> dict:
    """nanoGPT-style configurator, strict: `configs/x.py` files (executed, their top-level names
    become overrides) and `--key=value` / `--key value` / `--flag` arguments, applied in order.
    Dashes in keys mean underscores (--k-bias == --k_bias). Unknown keys and wrong types are errors
    that list the valid keys."""
    cfg = dict(defaults)

    def set_key(key, value, where):
        key = key.replace("-", "_")
        if key not in cfg:
            valid = ", ".join(sorted(cfg))
            raise KeyError(f"unknown config key {key!r} (from {where}). Valid keys: {valid}")
        cfg[key] = _coerce(key, value, defaults[key])

    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            if "=" in arg:
                key, text = arg[2:].split("=", 1)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                key, text = arg[2:], argv[i + 1]
                i += 1
            else:
                key, text = arg[2:], "True"  # a bare flag
            set_key(key, _literal(text), f"command line {arg}")
        else:
            path = Path(arg)
            if not path.is_file():
                raise FileNotFoundError(f"config file {arg!r} does not exist (arguments are config files or --key=value)")
            scope = {}
            exec(compile(path.read_text(), str(path), "exec"), scope)
            for key, value in scope.items():
                if not key.startswith("_") and not callable(value) and not isinstance(value, type(sys)):
                    set_key(key, value, str(path))
        i += 1
    return cfg


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

    def close(self):
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def start_run(C):
    """(Dist, output folder, Checkpoints) of a training run. CPU runs use fp32: bf16 autocast on a
    CPU is slow and not what CPU runs (tests, quick starts) are for."""
    D = Dist(C["device"])
    if D.device.type == "cpu" and C["dtype"] != "float32":
        C["dtype"] = "float32"
    seed_everything(C["seed"] + D.rank)
    out = Path(C["out_dir"])
    return D, out, Checkpoints(out, keep=C["keep_checkpoints"], dist_=D)


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
    """AdamW with weight decay on matrices only: biases, norms and embeddings are not decayed
    (decaying an embedding row shrinks rare tokens that are seldom updated)."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = "embed." in name or name.endswith(("tok.weight", "pos.weight", "typ.weight"))
        (decay if p.dim() >= 2 and not is_embedding else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device is not None and torch.device(device).type == "cuda"  # one kernel for all params
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)


def lr_at(step, *, lr, warmup, total, schedule="cosine", min_lr_ratio=0.1, decay_fraction=0.2):
    """Learning rate at optimizer step `step` (0-based).

    linear:  warm-up, then linear decay to 0 (BERT / SPLADE fine-tuning recipes)
    cosine:  warm-up, then cosine decay to min_lr_ratio * lr (LLaMA pretraining)
    wsd:     warm-up, stable at lr, then linear decay to min_lr_ratio * lr over the last
             decay_fraction of training (warmup-stable-decay, used by EuroBERT-style pretraining)
    """
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "linear":
        return lr * max(0.0, (total - step) / max(1, total - warmup))
    lo = lr * min_lr_ratio
    if schedule == "cosine":
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * progress))
    if schedule == "wsd":
        decay_start = total - int(decay_fraction * total)
        if step < decay_start:
            return lr
        return lr - (lr - lo) * min(1.0, (step - decay_start) / max(1, total - decay_start))
    raise ValueError(f"unknown schedule {schedule!r}: use linear, cosine or wsd")


PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def peak_flops(device):
    """Dense bf16 peak of the GPU (for MFU), or None when unknown / on CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


# ------------------------------------------------------------------------------------------------
# Pre-emption and numerics
# ------------------------------------------------------------------------------------------------


class Preemption:
    """While active (`with Preemption() as p:`), SIGTERM (what schedulers send before killing a job)
    and SIGINT only set a flag; the loop checks it at the next step boundary, saves a checkpoint and
    exits cleanly. The previous handlers come back on exit, so a training run called from other
    Python code (the tests) does not leave a process - or the workers it later forks - deaf to SIGTERM."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested, self.signal, self._previous = False, None, {}

    def __enter__(self):
        self._previous = {sig: signal.signal(sig, self._handler) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handler(self, signum, frame):
        self.requested, self.signal = True, signal.Signals(signum).name

    def saved_message(self, step):
        return (f"{self.signal or 'pre-emption'} received: checkpoint saved at step {step}; "
                "run the same command again to resume")


class NonFiniteGuard:
    """Skip optimizer steps whose loss or gradient norm is not finite; stop after `patience` in a row.

    The gradient norm is the same on every rank after DDP's all-reduce (a NaN anywhere spreads),
    so all ranks take the same decision without extra communication."""

    def __init__(self, patience=5):
        self.patience, self.in_a_row, self.skipped = patience, 0, 0

    def optimizer_step(self, model, optimizer, loss, step, grad_clip=None, hint=""):
        """Clip the gradients to `grad_clip` (None or 0: no clipping, the norm is still measured),
        step the optimizer unless the loss or the norm is non-finite, zero the gradients. Returns
        the gradient norm before clipping."""
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or float("inf")).item()
        if self.check(loss, grad_norm, step, hint):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def check(self, loss, grad_norm, step, hint=""):
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        self.skipped += 1
        print(f"warning: step {step}: non-finite loss ({loss}) or gradient norm ({grad_norm}); "
              f"step skipped ({self.in_a_row} in a row)", file=sys.stderr)
        if self.in_a_row >= self.patience:
            raise FloatingPointError(
                f"{self.in_a_row} non-finite steps in a row at step {step}; stopping with the last good "
                f"checkpoint kept. Likely causes: learning rate too high, {hint}bf16 overflow (try "
                "dtype=float32 to confirm), or corrupt input data.")
        return False


# ------------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------------


def rng_state():
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path):
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(folder):
    for root, _, files in os.walk(folder):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(root)


def _torch_save(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class CorruptCheckpoint(RuntimeError):
    pass


class Checkpoints:
    """Save, validate, list and prune checkpoints of one run (see the module docstring)."""

    def __init__(self, out_dir, keep=3, dist_=None):
        self.root = Path(out_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.dist = dist_ or Dist("cpu")

    def folders(self):
        """Complete-looking checkpoint folders, newest first (by step)."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and p.name.startswith("step_") and "." not in p.name]
        return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)

    def save(self, step, model, optimizer, trainer_state, tokenizer=None, extra=None, sharded_optimizer=False,
             model_state=None):
        """Collective under torchrun: every rank calls it. `extra(folder)` may add files (rank 0)."""
        from model import save_pretrained
        d = self.dist
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f"step_{step:08d}.tmp"  # one writer per out_dir, so a fixed name is enough
        if d.master:
            for stale in self.root.glob("*.tmp") if self.root.is_dir() else []:
                shutil.rmtree(stale, ignore_errors=True)  # left by a killed run
            tmp.mkdir(parents=True, exist_ok=True)
        d.barrier()
        tmp.mkdir(parents=True, exist_ok=True)
        _torch_save({"rng": rng_state(), "world_size": d.world_size}, tmp / f"rank{d.rank}.pt")
        if sharded_optimizer:
            _torch_save(optimizer, tmp / f"optimizer_rank{d.rank}.pt")
        if d.master:
            if model_state is not None:  # FSDP: a gathered full state dict, loaded into a CPU copy
                model = model_state
            save_pretrained(model, tmp / "model", tokenizer=tokenizer)
            if not sharded_optimizer:
                _torch_save(optimizer, tmp / "optimizer.pt")
            (tmp / "trainer.json").write_text(json.dumps({**trainer_state, "step": step}, indent=1, default=str))
            if extra:
                extra(tmp)
        d.barrier()
        if d.master:
            files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
            (tmp / "MANIFEST.json").write_text(json.dumps({"step": step, "files": files}, indent=1))
            _fsync_tree(tmp)
            if final.exists():  # re-saving the same step (e.g. SIGTERM right after a periodic save)
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.root)
            self._prune()
        d.barrier()
        return final

    def _prune(self):
        """Keep the newest `keep` valid checkpoints; never delete the only valid one."""
        valid = [p for p in self.folders() if self.problem(p) is None]
        for old in valid[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)

    def problem(self, folder):
        """None if `folder` is a complete checkpoint, else what is wrong with it."""
        from data.safetensors_io import SafetensorsError, read_header
        manifest = folder / "MANIFEST.json"
        if not manifest.exists():
            return "no MANIFEST.json (the save did not finish)"
        try:
            files = json.loads(manifest.read_text())["files"]
        except (json.JSONDecodeError, KeyError) as e:
            return f"unreadable MANIFEST.json ({e})"
        for name, size in files.items():
            p = folder / name
            if not p.exists():
                return f"{name} is missing"
            if p.stat().st_size != size:
                return f"{name} has {p.stat().st_size} bytes, the manifest says {size} (truncated or overwritten)"
            if name.endswith(".safetensors"):
                try:
                    read_header(p)
                except SafetensorsError as e:
                    return str(e)
        return None

    def latest(self):
        """The newest valid checkpoint folder, warning about every newer one that is broken."""
        for folder in self.folders():
            why = self.problem(folder)
            if why is None:
                return folder
            if self.dist.master:
                print(f"warning: skipping checkpoint {folder}: {why}; trying an older one", file=sys.stderr)
        return None

    def load(self, folder, sharded_optimizer=False):
        """(trainer state dict, optimizer state, this rank's RNG state). Raises CorruptCheckpoint."""
        try:
            state = json.loads((folder / "trainer.json").read_text())
            opt_file = folder / (f"optimizer_rank{self.dist.rank}.pt" if sharded_optimizer else "optimizer.pt")
            optimizer = torch.load(opt_file, map_location="cpu", weights_only=False)
            rank_file = folder / f"rank{self.dist.rank}.pt"
            rng = torch.load(rank_file, map_location="cpu", weights_only=False)["rng"] if rank_file.exists() else None
        except Exception as e:  # noqa: BLE001 - any unreadable file makes the checkpoint unusable
            raise CorruptCheckpoint(f"checkpoint {folder} cannot be read: {type(e).__name__}: {e}") from e
        return state, optimizer, rng


def find_resume_point(ckpts: Checkpoints, resume: str):
    """Which checkpoint to resume from: resume='auto' (newest valid, if any), 'never' (start
    fresh; refuses to overwrite an existing run), or a checkpoint folder path."""
    if resume == "auto":
        return ckpts.latest()
    if resume == "never":
        if ckpts.folders():
            raise FileExistsError(f"{ckpts.root} already holds checkpoints and resume='never': choose another "
                                  "out_dir, or resume='auto' to continue that run (nothing was overwritten)")
        return None
    folder = Path(resume)
    why = ckpts.problem(folder) if folder.is_dir() else "not a folder"
    if why:
        raise CorruptCheckpoint(f"cannot resume from {folder}: {why}")
    return folder


def resume_or_build(ckpts: Checkpoints, resume: str, build, sharded_optimizer=False):
    """(model, trainer state, optimizer state, RNG state, checkpoint folder or None).

    `build(folder)` makes the model: from the checkpoint folder, or (None) fresh for a new run. A
    checkpoint that passes the manifest check but still cannot be read (a corrupt optimizer file,
    say) is reported and the next older one is tried; with none left the run stops rather than
    silently starting over."""
    folder = find_resume_point(ckpts, resume)
    while True:
        try:
            model = build(folder)
            state, optimizer, rng = ckpts.load(folder, sharded_optimizer) if folder else ({}, None, None)
            return model, state, optimizer, rng, folder
        except (CorruptCheckpoint, OSError, ValueError, KeyError) as e:
            if folder is None or resume != "auto":
                raise
            print(f"warning: {e}; falling back to an older checkpoint", file=sys.stderr)
            step = int(folder.name[5:])
            older = [f for f in ckpts.folders() if int(f.name[5:]) < step and ckpts.problem(f) is None]
            if not older:
                raise CorruptCheckpoint(f"no readable checkpoint left in {ckpts.root}; move it aside to start "
                                        "over, or point resume= at a good checkpoint folder") from e
            folder = older[0]


# ------------------------------------------------------------------------------------------------
# Logging
# ------------------------------------------------------------------------------------------------


class JsonlLog:
    """Append-only JSONL log (rank 0). On resume from step S, entries after S written by the killed
    run are dropped first, so the file describes one consistent run that can be plotted."""

    def __init__(self, path, enabled=True, resume_step=None):
        self.path, self.enabled = Path(path), enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            if resume_step is None:
                self.path.rename(self.path.with_suffix(f".{int(time.time())}.jsonl"))  # keep, never overwrite
            else:
                kept = [ln for ln in self.path.read_text().splitlines()
                        if ln.strip() and _json_or_none(ln) is not None and _json_or_none(ln).get("step", 0) <= resume_step]
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text("".join(ln + "\n" for ln in kept))
                os.replace(tmp, self.path)

    def write(self, **record):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def _json_or_none(line):
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None  # a line cut by a kill


def read_log(path):
    return [r for r in (_json_or_none(ln) for ln in Path(path).read_text().splitlines() if ln.strip()) if r]
