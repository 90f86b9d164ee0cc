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
import errno
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


class ConfigError(ValueError):
    """A configuration that cannot work; the message names the key, the value and the fix."""


class UnknownConfigKey(ConfigError, KeyError):
    def __str__(self):  # KeyError would print the message in quotes
        return self.args[0]


class ConfigTypeError(ConfigError, TypeError):
    pass


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
    raise ConfigTypeError(f"config key {key!r}: expected {type(default).__name__} (default {default!r}), "
                          f"got {type(value).__name__} {value!r}")


def parse_config(defaults: dict, argv: list[str], script=None) -> dict:
    """nanoGPT-style configurator, strict: `configs/x.py` files (executed, their top-level names
    become overrides) and `--key=value` / `--key value` / `--flag` arguments, applied in order.
    Dashes in keys mean underscores (--k-bias == --k_bias). Unknown keys and wrong types are errors
    that list the valid keys. `-h` / `--help` prints the usage of `script` (the training script's
    file) and every key with its default and comment, then exits."""
    if "-h" in argv or "--help" in argv:
        print(config_help(defaults, script))
        raise SystemExit(0)
    cfg = dict(defaults)

    def set_key(key, value, where):
        key = key.replace("-", "_")
        if key not in cfg:
            valid = ", ".join(sorted(cfg))
            raise UnknownConfigKey(f"unknown config key {key!r} (from {where}). Valid keys: {valid}; "
                                   "--help lists them with their defaults")
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
                raise FileNotFoundError(f"config file {arg!r} does not exist (arguments are config files or "
                                        "--key=value; --help lists the keys)")
            scope = {}
            exec(compile(path.read_text(), str(path), "exec"), scope)
            for key, value in scope.items():
                if not key.startswith("_") and not callable(value) and not isinstance(value, type(sys)):
                    set_key(key, value, str(path))
        i += 1
    return cfg


def config_help(defaults: dict, script=None) -> str:
    """The usage lines of `script`'s docstring, then the keys of its `DEFAULTS = dict(...)` as they
    stand in the file: comment lines as group titles, each line's keys with their defaults and the
    comment written beside them."""
    if script is None:
        return "keys (defaults):\n" + "\n".join(f"  --{k}={v!r}" for k, v in defaults.items())
    source = Path(script).read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    name = Path(script).name
    usage = [ln.strip() for ln in doc.splitlines() if ln.startswith("    ") and name in ln]
    call = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "DEFAULTS")
    lines = source.splitlines()
    keys_on = {}
    for kw in call.keywords:
        keys_on.setdefault(kw.lineno, []).append(kw.arg)
    out = [doc.split("\n\n")[0], "", "usage:"] + [f"  {u}" for u in usage]
    out += ["", "Every key can be set in a configs/*.py file or as --key=value (applied in order, later wins):"]
    for n in range(call.lineno + 1, call.end_lineno):
        text = lines[n - 1].strip()
        if text.startswith("#"):
            out += ["", text.lstrip("# ")]
        elif n in keys_on:
            comment = text.split("#", 1)[1].strip() if "#" in text else ""
            shown = ", ".join(f"--{k}={defaults[k]!r}" for k in keys_on[n])
            out.append(f"  {shown:<40} {comment}".rstrip())
    return "\n".join(out)


def user_errors():
    """The exceptions that mean bad input, not a bug: a CLI prints their message, no traceback."""
    from data.hub import HubError
    from data.ir_datasets import IRDataError
    from data.safetensors_io import SafetensorsError
    from data.shards import ShardError
    return (ConfigError, FileNotFoundError, FileExistsError, NotADirectoryError, CorruptCheckpoint, RunLocked,
            SaveFailed, FloatingPointError, HubError, IRDataError, SafetensorsError, ShardError)


def run_cli(main, extra_errors=()):
    """Run a script's main(): a user error (user_errors(), bad config, missing or malformed file,
    unreachable Hub...) prints `error: message` and exits with status 2, without a traceback, which
    is for bugs; REPRLAB_TRACEBACK=1 shows it anyway."""
    try:
        return main()
    except (*user_errors(), *extra_errors) as e:
        if os.environ.get("REPRLAB_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


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


class RunLocked(RuntimeError):
    """Another live process is training in the same out_dir."""


class RunLock:
    """An exclusive lock on out_dir for the life of a run (rank 0 holds it under torchrun).

    fcntl.flock locks belong to an open file: the OS drops them when the process ends, however it
    ends, so a SIGKILLed run never leaves a stale lock behind. The holder writes its pid into the
    file so that the refusal can name it."""

    def __init__(self, out_dir, dist_=None):
        import fcntl
        self.path, self.fd = Path(out_dir) / "RUN.lock", None
        d = dist_ or Dist("cpu")
        refused = None
        if d.master:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                refused = (f"{out_dir} is in use by another training run (pid {holder}, lock file {self.path}); "
                           "wait for it to finish, stop it, or choose another out_dir")
            else:
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode())
                self.fd = fd
        if d.any(refused is not None):  # every rank stops, not only rank 0
            self.release()
            raise RunLocked(refused or f"{out_dir} is in use by another training run (see rank 0)")

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # closing the file releases the lock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


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
    so all ranks take the same decision without extra communication.

    While a streak of non-finite steps is open (`healthy` is False) nothing may be saved: the
    weights that produced the non-finite loss would be checkpointed and resumed from. A streak
    that reaches `patience` stops the run; the checkpoint saved at the streak's first step holds
    exactly the weights that gave the first non-finite loss, so it is set aside (renamed
    step_N.nonfinite) and the one before it is named as the last good one."""

    def __init__(self, patience=5, checkpoints=None):
        self.patience, self.in_a_row, self.skipped = patience, 0, 0
        self.checkpoints, self.streak_start = checkpoints, None

    @property
    def healthy(self):
        return self.in_a_row == 0

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
        """True if optimizer step `step` (0-based: the weights of checkpoint `step` gave this loss) is
        finite. A finite step vouches for the newest checkpoint, so older ones may now be pruned."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.in_a_row, self.streak_start = 0, None
            if self.checkpoints is not None:
                self.checkpoints.confirmed(step)
            return True
        if self.in_a_row == 0:
            self.streak_start = step
        self.in_a_row += 1
        self.skipped += 1
        print(f"warning: step {step}: non-finite loss ({loss}) or gradient norm ({grad_norm}); "
              f"step skipped ({self.in_a_row} in a row; no checkpoint is saved until a finite step)", file=sys.stderr)
        if self.in_a_row >= self.patience:
            kept = self.checkpoints.set_aside_from(self.streak_start) if self.checkpoints is not None else None
            raise FloatingPointError(
                f"{self.in_a_row} non-finite steps in a row from step {self.streak_start}; stopping. {kept or ''}"
                f"Likely causes: learning rate too high, {hint}bf16 overflow (try dtype=float32 to confirm), "
                "or corrupt input data.")
        return False

    def unsaved_message(self, step):
        return (f"warning: step {step} was not saved: a streak of non-finite steps is open (since step "
                f"{self.streak_start}); resume continues from the last checkpoint saved before it")


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


def _fsync_tree(folder):
    from data.atomic import fsync_dir
    for root, _, files in os.walk(folder):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(root)


def _torch_save(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class CorruptCheckpoint(RuntimeError):
    pass


class SaveFailed(OSError):
    """A checkpoint could not be written (most often: the disk is full). The partial folder is gone
    and the checkpoints saved before are untouched."""


def _disk_full(error):
    """Whether `error` or an exception it was raised from is 'no space left' / 'quota exceeded'.
    torch.save reports a failed write as RuntimeError('[enforce fail at inline_container.cc...]')
    with the OSError as its context."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False


def _folder_bytes(folder):
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def _state_bytes(obj):
    """Bytes of the tensors in a (nested) state dict or module: the size a checkpoint will need."""
    if isinstance(obj, torch.nn.Module):
        return sum(t.numel() * t.element_size() for t in obj.state_dict().values())
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_state_bytes(v) for v in obj)
    return 0


class Checkpoints:
    """Save, validate, list and prune checkpoints of one run (see the module docstring)."""

    def __init__(self, out_dir, keep=3, dist_=None):
        self.root = Path(out_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.dist = dist_ or Dist("cpu")
        self.unconfirmed = None  # the newest checkpoint, until a finite step vouches for its weights

    def folders(self):
        """Complete-looking checkpoint folders, newest first (by step)."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and p.name.startswith("step_") and "." not in p.name]
        return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)

    def remove_stale_tmp(self):
        """Delete `step_N.tmp` folders left by a run killed while saving (they can be large)."""
        if self.dist.master and self.root.is_dir():
            for stale in self.root.glob("*.tmp"):
                print(f"removing {stale}: an unfinished save of a killed run", file=sys.stderr)
                shutil.rmtree(stale, ignore_errors=True)

    def _agree(self, error, step, tmp, estimate):
        """Collective: if any rank failed, every rank raises (rank 0 removes the partial folder)."""
        if not self.dist.any(error is not None):
            return
        if self.dist.master:
            shutil.rmtree(tmp, ignore_errors=True)
        if error is None:
            raise SaveFailed(f"saving step {step} to {tmp.with_suffix('')} failed on another rank (see its error)")
        if _disk_full(error):
            free = shutil.disk_usage(self.root).free if self.root.exists() else 0
            raise SaveFailed(errno.ENOSPC, f"No space left on device while saving step {step} to "
                             f"{tmp.with_suffix('')} (needs ~{estimate / 2**20:,.0f} MB, {free / 2**20:,.0f} MB "
                             "free); the partial folder was deleted and the earlier checkpoints are intact: free "
                             "some space and run the same command again to resume") from error
        raise SaveFailed(f"saving step {step} to {tmp.with_suffix('')} failed: {type(error).__name__}: "
                         f"{error}") from error

    def save(self, step, model, optimizer, trainer_state, *, final=False, periodic=False, **kw):
        """Collective under torchrun: every rank calls it; returns the checkpoint folder.
        `final`: the last save of the run, pruned at once (no later step will vouch for it).
        `periodic`: a routine save that may fail for lack of space without ending the run (a
        warning, and the next one retries); a final or pre-emption save raises SaveFailed."""
        try:
            return self._save(step, model, optimizer, trainer_state, final=final, **kw)
        except SaveFailed as e:
            if not (periodic and _disk_full(e)):
                raise
            if self.dist.master:
                print(f"warning: {e}. Training continues; the next checkpoint tries again.", file=sys.stderr)
            return None

    def _save(self, step, model, optimizer, trainer_state, tokenizer=None, extra=None, sharded_optimizer=False,
              model_state=None, final=False):
        from data.atomic import fsync_dir
        from model import save_pretrained
        d = self.dist
        final_dir = self.root / f"step_{step:08d}"
        tmp = self.root / f"step_{step:08d}.tmp"  # one writer per out_dir (RunLock): a fixed name is enough
        newest = self.folders()
        estimate = _folder_bytes(newest[0]) if newest else _state_bytes(model) + _state_bytes(optimizer)
        error = None
        try:
            if d.master:
                tmp.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            error = e
        self._agree(error, step, tmp, estimate)
        try:
            _torch_save({"rng": rng_state(), "world_size": d.world_size}, tmp / f"rank{d.rank}.pt")
            if sharded_optimizer:
                _torch_save(optimizer, tmp / f"optimizer_rank{d.rank}.pt")
            if d.master:
                save_pretrained(model_state if model_state is not None else model, tmp / "model", tokenizer=tokenizer)
                if not sharded_optimizer:
                    _torch_save(optimizer, tmp / "optimizer.pt")
                (tmp / "trainer.json").write_text(json.dumps({**trainer_state, "step": step}, indent=1, default=str))
                if extra:
                    extra(tmp)
        except (OSError, RuntimeError) as e:
            error = e
        self._agree(error, step, tmp, estimate)
        try:
            if d.master:
                files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
                (tmp / "MANIFEST.json").write_text(json.dumps({"step": step, "files": files}, indent=1))
                _fsync_tree(tmp)
                if final_dir.exists():  # re-saving the same step (e.g. SIGTERM right after a periodic save)
                    shutil.rmtree(final_dir)
                os.replace(tmp, final_dir)
                fsync_dir(self.root)
        except OSError as e:
            error = e
        self._agree(error, step, tmp, estimate)
        self.unconfirmed = step
        if final:
            self.confirmed(step)
        d.barrier()
        return final_dir

    def confirmed(self, step):
        """Optimizer step `step` was finite: the weights of checkpoint `step` (if it was just saved)
        are good, so the checkpoints beyond the newest `keep` can go. Pruning waits for this, so
        that a non-finite streak starting right after a save never leaves only a bad checkpoint."""
        if self.unconfirmed is not None and step >= self.unconfirmed:
            self.unconfirmed = None
            if self.dist.master:
                self._prune()

    def _prune(self):
        """Keep the newest `keep` valid checkpoints; never delete the only valid one."""
        valid = [p for p in self.folders() if self.problem(p) is None]
        for old in valid[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)

    def set_aside_from(self, step):
        """After a non-finite streak that began at optimizer step `step`: rename the checkpoints of
        step >= `step` (their weights gave the non-finite loss) to step_N.nonfinite, which resume
        ignores, and name the newest one left. Returns that sentence."""
        if self.dist.master:
            for folder in self.folders():
                if int(folder.name[5:]) >= step:
                    folder.rename(folder.with_name(folder.name + ".nonfinite"))
                    print(f"set aside {folder} as {folder.name}.nonfinite: its weights gave the first non-finite "
                          "loss", file=sys.stderr)
        good = next((f for f in self.folders() if self.problem(f) is None), None)
        if good is None:
            return "No checkpoint was saved before the streak. "
        return f"The last good checkpoint is {good} (step {int(good.name[5:])}); resume continues from it. "

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
        """(trainer state dict, optimizer state, this rank's RNG state). Raises CorruptCheckpoint, or
        ConfigError when the checkpoint's optimizer is sharded over another number of processes."""
        saved_world = len(list(folder.glob("rank*.pt")))  # every rank saved its RNG state
        if saved_world and saved_world != self.dist.world_size:
            if sharded_optimizer:
                raise ConfigError(f"{folder} was saved by {saved_world} processes and this run has "
                                  f"{self.dist.world_size}: its FSDP optimizer state is sharded per rank; resume with "
                                  f"{saved_world} processes (torchrun --nnodes x --nproc_per_node = {saved_world})")
            if self.dist.master:
                print(f"warning: {folder} was saved by {saved_world} processes, this run has "
                      f"{self.dist.world_size}: training continues, but the data order and RNG streams differ from "
                      "an uninterrupted run's (not an exact resume)", file=sys.stderr)
        try:
            state = json.loads((folder / "trainer.json").read_text())
            opt_file = folder / (f"optimizer_rank{self.dist.rank}.pt" if sharded_optimizer else "optimizer.pt")
            optimizer = torch.load(opt_file, map_location="cpu", weights_only=False)
            rank_file = folder / f"rank{self.dist.rank}.pt"
            rng = torch.load(rank_file, map_location="cpu", weights_only=False)["rng"] if rank_file.exists() else None
        except Exception as e:  # noqa: BLE001 - any unreadable file makes the checkpoint unusable
            raise CorruptCheckpoint(f"checkpoint {folder} cannot be read: {type(e).__name__}: {e}") from e
        return state, optimizer, rng


def export_final(folder, out):
    """Copy the final checkpoint's model folder to out_dir/model (atomically: copy, then rename)."""
    final, tmp = Path(out) / "model", Path(out) / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def find_resume_point(ckpts: Checkpoints, resume: str):
    """Which checkpoint to resume from: resume='auto' (newest valid, if any), 'never' (start
    fresh; refuses to overwrite an existing run), or a checkpoint folder path. An out_dir whose
    checkpoints are all invalid is never silently started over: that would later overwrite them."""
    if resume == "auto":
        found = ckpts.latest()
        if found is None and ckpts.folders():
            raise CorruptCheckpoint(
                f"{ckpts.root} holds checkpoints but none is valid:\n"
                + "".join(f"  {f.name}: {ckpts.problem(f)}\n" for f in ckpts.folders())
                + "Nothing was changed. To recover, point resume= at a checkpoint folder you have repaired "
                  "(--resume=PATH); to start fresh, use a new out_dir with --resume=never.")
        return found
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
    a tensor with the right size but the wrong shape, say) is reported and the next older one is
    tried; with none left the run stops rather than silently starting over."""
    folder = find_resume_point(ckpts, resume)
    while True:
        try:
            try:
                model = build(folder)
            except (RuntimeError, ValueError, KeyError) as e:
                if folder is None:
                    raise
                raise CorruptCheckpoint(f"checkpoint {folder} cannot be loaded: {e}") from e
            state, optimizer, rng = ckpts.load(folder, sharded_optimizer) if folder else ({}, None, None)
            return model, state, optimizer, rng, folder
        except (CorruptCheckpoint, OSError) as e:
            if folder is None or resume != "auto":
                raise
            print(f"warning: {e}; falling back to an older checkpoint", file=sys.stderr)
            step = int(folder.name[5:])
            older = [f for f in ckpts.folders() if int(f.name[5:]) < step and ckpts.problem(f) is None]
            if not older:
                raise CorruptCheckpoint(f"no readable checkpoint left in {ckpts.root}; to recover, point resume= "
                                        "at a good checkpoint folder; to start fresh, use a new out_dir with "
                                        "--resume=never") from e
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
                records = [(ln, _json_or_none(ln)) for ln in self.path.read_text().splitlines() if ln.strip()]
                kept = [ln for ln, rec in records if rec is not None and rec.get("step", 0) <= resume_step]
                from data.atomic import write_text
                write_text(self.path, "".join(ln + "\n" for ln in kept))

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


def load_optimizer_state(objective, optimizer, state, fsdp=False):
    if state is None:
        return
    if fsdp:  # this rank's shard, saved by checkpoint_state
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
        set_optimizer_state_dict(objective, optimizer, state)
    else:
        optimizer.load_state_dict(state)


def checkpoint_state(model, objective, optimizer, proc, fsdp=False):
    """(model to save, optimizer state) of a run. Under FSDP (collective: every rank calls it) the
    full weights are gathered to rank 0's CPU into an unsharded copy, and each rank keeps its own
    optimizer shard (saved as optimizer_rank{r}.pt)."""
    if not fsdp:
        return model, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    opt_state = get_optimizer_state_dict(objective, optimizer)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    copy = None
    if proc.master:
        with torch.device("meta"):
            copy = type(model)(model.config)
        copy.load_state_dict(full, assign=True)
        copy.tie_weights()
    return copy, opt_state


# ------------------------------------------------------------------------------------------------
# The bookkeeping around a training loop's steps
# ------------------------------------------------------------------------------------------------


class Loop:
    """What train_lm.py and train_splade.py do around each step, so that their loops show the method:

        loop = Loop(cfg, run, state, rng, resume, flops_per_token, save)
        while loop.running():
            lr = loop.set_lr(optimizer)
            for ctx in loop.micro_steps(train_obj):
                with ctx:
                    ... forward, backward
            loop.guard.optimizer_step(...)
            loop.finish_step(tokens)
            if loop.log_due(): loop.log.write(...)
            if loop.eval_due(): with loop.paused(): ...
            if loop.checkpoint(): break      # saved on a SIGTERM: stop
        loop.close()

    It restores the RNG state of a resumed run, opens the JSONL log (trimmed to the resume step),
    writes config.json, shows the progress bar, keeps the throughput window (MFU), and owns the
    checkpoint policy: every ckpt_interval steps, at the end and on SIGTERM - but never while a
    non-finite streak is open (NonFiniteGuard), and a periodic save on a full disk only warns."""

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

    def micro_steps(self, train_obj):
        """One context per micro-step of gradient accumulation: bf16 autocast, and under DDP no
        gradient all-reduce but on the last one (FSDP reduces in every backward)."""
        n = self.cfg["grad_accum"]
        for micro in range(n):
            last = micro == n - 1
            ddp = self.dist.enabled and not self.cfg.get("fsdp")
            no_sync = train_obj.no_sync() if ddp and not last else contextlib.nullcontext()
            ctx = contextlib.ExitStack()
            ctx.enter_context(no_sync)
            ctx.enter_context(autocast(self.dist.device, self.cfg["dtype"]))
            yield ctx

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
