"""Checkpoints that resume exactly, and everything that keeps a run from losing work: the run lock,
pre-emption, the non-finite guard, atomic saves, full disks, resume with fallback, the JSONL log.
train_lm.py and train_splade.py call `loop.checkpoint()` and `checkpoint.resume_or_build(...)`.

    out_dir/checkpoints/step_00001000/
        model/             Hugging Face folder (config.json, model.safetensors, tokenizer.json)
        optimizer.pt       AdamW state (optimizer_rank{r}.pt per rank under FSDP)
        rank{r}.pt         per-rank RNG states
        trainer.json       step, data position, schedule, metrics, the run's config
        MANIFEST.json      written last: every file's SHA-256. No manifest = not a checkpoint.

A checkpoint is written as a data/manifest.py output (step_N.tmp/, its manifest last, one rename):
a kill leaves a stale .tmp (removed at the next start), never a half-written step_N. Resume takes
the newest folder whose files are those its manifest records, falling back to older ones, saying why.
"""
import contextlib
import errno
import json
import math
import os
import random
import re
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import torch

import cli
from cli import ConfigError, UserError
from data import manifest
from data.atomic import ExclusiveLock, disk_full, free_space, size_text, write_text
from hf.models import manifest_problem, save_pretrained


class OneProcess:
    """training.Dist's interface for a single process: the default where no Dist is passed."""
    enabled, rank, world_size, master = False, 0, 1, True

    def any(self, flag):
        return flag

    def any_of(self, flags):
        return [bool(f) for f in flags]

    def barrier(self):
        pass


# ----- One writer per out_dir, pre-emption, non-finite steps
class RunLocked(UserError, RuntimeError):
    """Another live process is training in the same out_dir."""


class OutDirUnwritable(UserError, OSError):
    """out_dir cannot be created or written (a read-only file system, no permission)."""


class RunLock:
    """FOLDER/RUN.lock for the life of the command that writes FOLDER (rank 0's under torchrun); a refusal
    names the holder's pid and `what` it is; option: how the user names the folder, for the fix."""
    def __init__(self, out_dir, dist_=None, what="training run", option="out_dir"):
        self.path, self.lock, refused = Path(out_dir) / "RUN.lock", None, None
        d = dist_ or OneProcess()
        if d.master:
            lock = ExclusiveLock(self.path, label=what)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                if lock.acquire():
                    self.lock = lock
                else:
                    refused = RunLocked(f"{out_dir} is in use by another {lock.holder_label or 'process'} (pid "
                                        f"{lock.holder}, lock file {self.path}); wait for it to finish, stop it, or "
                                        f"choose another {option}")
            except OSError as e:  # a read-only file system, no permission, a file in the way...
                refused = OutDirUnwritable(f"cannot write to {option} {out_dir}: {e.strerror or e} ({self.path}); "
                                           f"choose an {option} on a writable file system")
        if d.any(refused is not None):  # every rank stops, not only rank 0
            raise refused or RunLocked(f"{out_dir}: rank 0 could not lock it (see its message)")

    def release(self):
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Preemption:
    """While active, SIGTERM (a scheduler's notice) and SIGINT only set a flag: the loop saves at the next
    step boundary and exits with 128 + the signal's number. The previous handlers come back on exit."""
    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested, self.signal, self.signum, self._previous = False, None, None, {}

    def __enter__(self):
        self._previous = {sig: signal.signal(sig, self._handler) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handler(self, signum, frame):
        self.requested, self.signal, self.signum = True, signal.Signals(signum).name, signum


class NonFiniteLoss(UserError, FloatingPointError):
    """Training stopped after `nonfinite_patience` non-finite steps in a row."""


class NonFiniteGuard:
    """Skip optimizer steps whose loss or gradient norm is not finite; stop after `patience` in a row.

    The skip needs no read from the device: `found_inf` is 1.0 for such a step, and the fused AdamW
    step given it as `optimizer.found_inf` leaves weights and moments untouched; `check` counts the
    values later, at a sync point. The norm is the same on every rank after DDP's all-reduce, so all
    ranks decide alike. While a streak is open (`in_a_row` > 0) nothing is saved; a streak reaching
    `patience` stops the run and sets aside (step_N.nonfinite) the checkpoints from its first step."""
    def __init__(self, patience, checkpoints):
        self.patience, self.in_a_row, self.skipped = patience, 0, 0
        self.checkpoints, self.streak_start = checkpoints, None

    @staticmethod
    def found_inf(loss, grad_norm):
        """1.0 (a 0-dim fp32 tensor on the device) if the step must be skipped, else 0.0."""
        if hasattr(grad_norm, "full_tensor"):  # FSDP: the norm is a DTensor
            grad_norm = grad_norm.full_tensor()
        return (~(torch.isfinite(loss.detach()) & torch.isfinite(grad_norm))).float()

    def check(self, loss, grad_norm, step, hint=""):
        """True if optimizer step `step` (0-based: the weights of checkpoint `step` gave this loss) is
        finite; it vouches for the newest checkpoint, so older ones may now be pruned."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.in_a_row, self.streak_start = 0, None
            self.checkpoints.confirmed(step)
            return True
        if self.in_a_row == 0:
            self.streak_start = step
        self.in_a_row += 1
        self.skipped += 1
        cli.say(f"warning: step {step}: non-finite loss ({loss}) or gradient norm ({grad_norm}); "
                f"step skipped ({self.in_a_row} in a row; no checkpoint is saved until a finite step)")
        if self.in_a_row >= self.patience:
            kept = self.checkpoints.set_aside_from(self.streak_start)
            raise NonFiniteLoss(
                f"{self.in_a_row} non-finite steps in a row from step {self.streak_start}; stopping. {kept}"
                f"Likely causes: learning rate too high, {hint}bf16 overflow (try dtype=float32 to confirm), "
                "or corrupt input data.")
        return False


# ----- Saving and resuming
def rng_state():
    """This process's RNG states as tensors and plain values: their file loads with weights_only=True."""
    version, keys, gauss = random.getstate()
    name, mt, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(keys), gauss], "torch": torch.get_rng_state(),
             "numpy": [name, torch.from_numpy(mt.astype(np.int64)), pos, has_gauss, cached]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    name, mt, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(mt, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_tensors(path, device="cpu"):
    """torch.load(weights_only=True): a file that would run code when unpickled is refused, not executed."""
    with contextlib.suppress(ImportError):  # registers DTensor and its mesh with the weights-only loader (FSDP)
        import torch.distributed.tensor  # noqa: F401
    return torch.load(path, map_location=device, weights_only=True)


def _torch_save(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class CorruptCheckpoint(UserError, RuntimeError):
    """No checkpoint this run may resume from: the message says what is wrong with each and what to do."""


class RunExists(UserError, FileExistsError):
    """resume=never on an out_dir that already holds checkpoints."""


class SaveFailed(UserError, OSError):
    """A checkpoint could not be written (a full disk, most often); the partial folder is gone."""
    def __str__(self):
        return self.strerror if self.errno is not None else super().__str__()


def _state_bytes(obj):
    """Bytes of the tensors in a (nested) state dict or module: the size a checkpoint will need."""
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, (dict, list, tuple)):
        return sum(_state_bytes(v) for v in (obj.values() if isinstance(obj, dict) else obj))
    return obj.numel() * obj.element_size() if torch.is_tensor(obj) else 0


class Checkpoints:
    """Save, validate, list and prune checkpoints of one run (see the module docstring)."""
    def __init__(self, out_dir, keep=3, dist_=None):
        self.root = Path(out_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.dist = dist_ or OneProcess()
        self.unconfirmed = None  # the newest checkpoint, until a finite step vouches for its weights

    def folders(self):
        """Complete-looking checkpoint folders, newest first (by step)."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and p.name.startswith("step_") and "." not in p.name]
        return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)

    def remove_stale_tmp(self):
        """Delete `step_N.tmp` folders left by a run killed while saving: they can be large."""
        if not self.dist.master:
            return
        for stale in list(self.root.glob("*.tmp")) if self.root.is_dir() else []:
            cli.say(f"removing {stale}: an unfinished save of a killed run")
            shutil.rmtree(stale, ignore_errors=True)

    def _agree(self, error, step, tmp, estimate):
        """Collective: if any rank failed, every rank raises (rank 0 removes the partial folder), and the same
        error kind on every rank: where only full disks failed, a periodic save's warning lets all ranks go on."""
        failed, other = self.dist.any_of([error is not None, error is not None and not disk_full(error)])
        if not failed:
            return
        if self.dist.master:
            shutil.rmtree(tmp, ignore_errors=True)
        if not other:
            raise SaveFailed(errno.ENOSPC, f"No space left on device while saving step {step} to "
                             f"{tmp.with_suffix('')} (needs ~{size_text(estimate)}, {free_space(self.root)} "
                             "free); the partial folder was deleted and the earlier checkpoints are intact: free "
                             "some space and run the same command again to resume") from error
        if error is None or disk_full(error):
            raise SaveFailed(f"saving step {step} to {tmp.with_suffix('')} failed on another rank (see its error)")
        raise SaveFailed(f"saving step {step} to {tmp.with_suffix('')} failed: {type(error).__name__}: "
                         f"{error}") from error

    def save(self, step, model, optimizer, trainer_state, *, final=False, periodic=False, **kw):
        """Collective under torchrun; returns the checkpoint folder. `final`: the run's last save,
        pruned at once. `periodic`: a full disk is a warning (the next save retries), not SaveFailed."""
        try:
            return self._save(step, model, optimizer, trainer_state, final=final, **kw)
        except SaveFailed as e:
            if not (periodic and disk_full(e)):
                raise
            if self.dist.master:
                cli.say(f"warning: {e}. Training continues; the next checkpoint tries again.")  # a bar is open
            return None

    def _save(self, step, model, optimizer, trainer_state, tokenizer=None, extra=None, sharded_optimizer=False,
              model_state=None, final=False):
        d = self.dist
        final_dir = self.root / f"step_{step:08d}"
        tmp = self.root / f"step_{step:08d}.tmp"  # one writer per out_dir (RunLock): a fixed name is enough
        files = [p for newest in self.folders()[:1] for p in newest.rglob("*") if p.is_file()]
        estimate = sum(p.stat().st_size for p in files) if files else _state_bytes(model) + _state_bytes(optimizer)
        error = None
        try:
            tmp.mkdir(parents=True, exist_ok=True)   # by every rank: its own files go there
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
            if d.master:  # the same step saved again (SIGTERM right after a periodic save) replaces it
                manifest.finish(tmp, final_dir, {"step": step})
        except OSError as e:
            error = e
        self._agree(error, step, tmp, estimate)
        self.unconfirmed = step
        if final:
            self.confirmed(step)
        d.barrier()
        return final_dir

    def confirmed(self, step):
        """Optimizer step `step` was finite: the checkpoints beyond the newest `keep` can go. Pruning
        waits for this, so a non-finite streak right after a save never leaves only a bad checkpoint."""
        if self.unconfirmed is not None and step >= self.unconfirmed:
            self.unconfirmed = None
            if self.dist.master:  # keep the newest `keep` valid checkpoints; never delete the only valid one
                for old in [p for p in self.folders() if self.problem(p) is None][self.keep:]:
                    shutil.rmtree(old, ignore_errors=True)

    def set_aside_from(self, step):
        """After a non-finite streak from optimizer step `step`: rename the checkpoints of step >= `step`
        to step_N.nonfinite (resume ignores them); returns a sentence naming the newest one left."""
        if self.dist.master:
            for folder in self.folders():
                if int(folder.name[5:]) >= step:
                    folder.rename(folder.with_name(folder.name + ".nonfinite"))
                    cli.say(f"set aside {folder} as {folder.name}.nonfinite: its weights gave the first non-finite "
                            "loss")
        good = next((f for f in self.folders() if self.problem(f) is None), None)
        if good is None:
            return "No checkpoint was saved before the streak. "
        return f"The last good checkpoint is {good} (step {int(good.name[5:])}); resume continues from it. "

    def problem(self, folder):
        """None if `folder` is a complete checkpoint as far as this rank reads it, else what is wrong."""
        def reads(name):
            other = re.fullmatch(r"(?:optimizer_)?rank(\d+)\.pt", name)
            return not (other and int(other[1]) != self.dist.rank)
        return manifest_problem(folder, reads)

    def latest(self):
        """The newest valid checkpoint folder, warning about every newer one that is broken."""
        for folder in self.folders():
            why = self.problem(folder)
            if why is None:
                return folder
            if self.dist.master:
                cli.say(f"warning: skipping checkpoint {folder}: {why}; trying an older one")
        return None

    def load(self, folder, sharded_optimizer=False, device="cpu"):
        """(trainer state, optimizer state on `device`, this rank's RNG state). CorruptCheckpoint: a file
        unreadable, running code when loaded, or non-finite; ConfigError: FSDP state of another world size."""
        saved_world = len(list(folder.glob("rank*.pt")))  # every rank saved its RNG state
        if saved_world and saved_world != self.dist.world_size:
            if sharded_optimizer:
                raise ConfigError(f"{folder} was saved by {saved_world} processes and this run has "
                                  f"{self.dist.world_size}: its FSDP optimizer state is sharded per rank; resume with "
                                  f"{saved_world} processes (torchrun --nnodes x --nproc_per_node = {saved_world})")
            if self.dist.master:
                cli.say(f"warning: {folder} was saved by {saved_world} processes, this run has "
                        f"{self.dist.world_size}: training continues, but the ranks' RNG streams (dropout, masks) "
                        "differ from an uninterrupted run's (not an exact resume)")
        opt_file = folder / (f"optimizer_rank{self.dist.rank}.pt" if sharded_optimizer else "optimizer.pt")
        rank_file = folder / f"rank{self.dist.rank}.pt"
        name = "trainer.json"
        try:
            state = json.loads((folder / name).read_text())
            name = opt_file.name
            optimizer = load_tensors(opt_file, device)
            name = rank_file.name
            rng = load_tensors(rank_file)["rng"] if rank_file.exists() else None
        except Exception as e:  # noqa: BLE001 - any unreadable file makes the checkpoint unusable
            raise CorruptCheckpoint(f"checkpoint {folder}: {name} cannot be read: {type(e).__name__}: {e}") from e
        if bad := first_nonfinite(optimizer.get("state", {})):
            raise CorruptCheckpoint(f"checkpoint {folder}: {opt_file.name} holds non-finite values ({bad})")
        return state, optimizer, rng


def check_resumed_config(saved, cfg, settings, say):
    """A resumed run against the saved one's config: a change of a key `settings` fixes on resume (it shapes
    the model or the data) is refused with both values; any other change (max_steps, the device...) is said."""
    def same(a, b):  # trainer.json went through JSON: tuples are lists there
        return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)

    changed = [k for k in cfg if k in saved and not same(saved[k], cfg[k])]
    refused = [k for k in changed if k in settings.fixed]
    if refused:  # this command's value may be a default it did not give: say what differs, and what continues
        pairs = "; ".join(f"{k}: saved {saved[k]!r}, this command {cfg[k]!r}" for k in refused)
        flags = " ".join(f"--{k}={saved[k] if isinstance(saved[k], str) else repr(saved[k])}" for k in refused)
        raise ConfigError(f"the run in {cfg['out_dir']} was saved with settings that a resumed run keeps, other "
                          f"than this command's ({pairs}). Give the run's values ({flags}) to continue it, or start "
                          "a new run in a new out_dir (--out_dir=...) with this command's")
    for k in changed:
        say(f"note: {k} changed on resume: {saved[k]!r} -> {cfg[k]!r}")
    return {k: [saved[k], cfg[k]] for k in changed}


def check_resumed_data(saved, now, cfg, what, say):
    """The data of a resumed run against its checkpoint's key: a change is refused (accept_changed_data: warned)."""
    if saved == now:
        return
    changed = manifest.differences(saved, now)
    if cfg.get("accept_changed_data"):
        say(f"warning: {what} changed since the run was saved ({changed}); continuing on it (accept_changed_data=True)")
        return
    raise ConfigError(f"{what} changed since the run in {cfg['out_dir']} was saved ({changed}): resuming would "
                      "train on other examples from the saved position. Restore it, start a new run (a new "
                      "out_dir), or pass --accept_changed_data=True to continue on it")


def global_batch(state, cfg, world_size, say):
    """(grad_accum, tokens_at) of a train_lm.py run on `world_size` processes. The global batch
    (grad_accum x world size micro-batches per step) is part of the run: resumed on another number of
    processes, grad_accum changes to keep it (said in a note), or the resume is refused naming the
    process counts that can. The data walk is the same; the ranks' RNG streams are not.
    tokens_at(step): the tokens trained on up to `step`, continued from the checkpoint's count."""
    accum = cfg["grad_accum"]
    if state:
        saved_world = state["world_size"]
        micro = state["grad_accum"] * saved_world  # per step, all ranks
        if micro % world_size:
            fits = [n for n in range(1, micro + 1) if micro % n == 0]
            raise ConfigError(f"the run in {cfg['out_dir']} was saved by {saved_world} process(es) with grad_accum "
                              f"{micro // saved_world}: {micro} micro-batches of batch_size x seq_len per step, which "
                              f"{world_size} processes cannot split evenly; resume with {' or '.join(map(str, fits))} "
                              "process(es), or start a new run (a new out_dir)")
        accum = micro // world_size
        if saved_world != world_size:
            say(f"note: the run was saved by {saved_world} process(es) and continues on {world_size}: grad_accum "
                f"{micro // saved_world} -> {accum}, so that each step still trains on {micro} micro-batches "
                f"(the global batch of the run)")
    tokens_per_step = accum * cfg["batch_size"] * cfg["seq_len"] * world_size
    step0, tokens0 = state.get("step", 0), state.get("tokens", 0)
    return accum, lambda step: tokens0 + (step - step0) * tokens_per_step


def first_nonfinite(tensors, prefix=""):
    """The name of the first floating-point tensor in a (nested) dict holding a NaN or an infinity, or None."""
    for name, t in tensors.items():
        key = f"{prefix}{name}"
        if isinstance(t, dict):
            if found := first_nonfinite(t, f"{key}."):
                return found
        elif torch.is_tensor(t) and t.is_floating_point():
            local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard
            if not torch.isfinite(local).all():
                return key
    return None


class ExportBlocked(UserError, FileExistsError):
    """out_dir/model, where the final model goes, is a symlink or a file."""


def check_export_target(out):
    """out_dir/model, which export_final replaces, must be absent or a folder (checked before step 1):
    a symlink is refused, not followed: replacing its target would delete files outside out_dir."""
    final = Path(out) / "model"
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        what = f"a symbolic link (to {os.readlink(final)})" if final.is_symlink() else "a file, not a folder"
        raise ExportBlocked(f"{final} is {what}; the run writes its final model there, replacing what is there, "
                            "so it refuses to follow a link. Remove it (and link to out_dir/model after the run "
                            "if you want the model elsewhere), or choose another out_dir")


def export_final(folder, out):
    """Copy a checkpoint's model folder to out_dir/model (a data/manifest.py output), unless it is there."""
    check_export_target(out)
    final, tmp = Path(out) / "model", Path(out) / "model.tmp"
    key = {"model": manifest.identity(folder)}   # the checkpoint's manifest records it: nothing is read
    if manifest.problem(final, key) is None:
        return final
    if tmp.is_symlink():
        tmp.unlink()  # a leftover of ours is a folder; a link is removed, never what it points to
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    if final.exists():
        shutil.rmtree(final)   # the model of another step of this run (its checkpoint keeps it)
    return manifest.finish(tmp, final, key)


def find_resume_point(ckpts: Checkpoints, resume: str):
    """Which checkpoint to resume from: resume='auto' (newest valid, if any), 'never' (start fresh;
    refused over an existing run), or a folder. Checkpoints all invalid are never silently started over."""
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
            raise RunExists(f"{ckpts.root} already holds checkpoints and resume='never': choose another "
                                  "out_dir, or resume='auto' to continue that run (nothing was overwritten)")
        return None
    folder = Path(resume)
    why = ckpts.problem(folder) if folder.is_dir() else "not a folder"
    if why:
        raise CorruptCheckpoint(f"cannot resume from {folder}: {why}")
    return folder


def resume_or_build(ckpts: Checkpoints, resume: str, build, sharded_optimizer=False, device="cpu"):
    """(model, trainer state, optimizer state on `device`, RNG state, checkpoint folder or None); `build(folder)`
    makes the model (None: fresh). A checkpoint that cannot be used (a corrupt file, a wrong shape, a NaN, a
    pickle that would run code) is reported and the next older one tried; with none left the run stops."""
    folder = find_resume_point(ckpts, resume)
    if folder is None:
        return build(None), {}, None, None, None
    while True:
        try:
            try:
                model = build(folder)
            except (RuntimeError, ValueError, KeyError) as e:
                raise CorruptCheckpoint(f"checkpoint {folder} cannot be loaded: {e}") from e
            if bad := first_nonfinite(model.state_dict()):
                raise CorruptCheckpoint(f"checkpoint {folder}: the model's {bad} holds non-finite values")
            return (model, *ckpts.load(folder, sharded_optimizer, device), folder)
        except (CorruptCheckpoint, OSError) as e:
            if resume != "auto":
                raise
            cli.say(f"warning: {e}; falling back to an older checkpoint")
            step = int(folder.name[5:])
            older = [f for f in ckpts.folders() if int(f.name[5:]) < step and ckpts.problem(f) is None]
            if not older:
                raise CorruptCheckpoint(f"no readable checkpoint left in {ckpts.root}; to recover, point resume= "
                                        "at a good checkpoint folder; to start fresh, use a new out_dir with "
                                        "--resume=never") from e
            folder = older[0]


def load_optimizer_state(objective, optimizer, state, fsdp=False):
    if state is None:
        return
    if fsdp:  # this rank's shard, saved by checkpoint_state
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
        set_optimizer_state_dict(objective, optimizer, state)
    else:
        optimizer.load_state_dict(state)


def checkpoint_state(model, objective, optimizer, proc, fsdp=False):
    """(model to save, optimizer state). Under FSDP (collective) the full weights are gathered to rank
    0's CPU into an unsharded copy; each rank keeps its optimizer shard (optimizer_rank{r}.pt)."""
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
        copy.tokenizer_files = getattr(model, "tokenizer_files", None)  # what save_pretrained ships with it
    return copy, opt_state


class JsonlLog:
    """Append-only JSONL log (rank 0); a resume from step S first drops the killed run's entries after S."""
    def __init__(self, path, enabled=True, resume_step=None):
        self.path, self.enabled, self.notes = Path(path), enabled, {}
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            if resume_step is None:
                self.path.rename(self.path.with_suffix(f".{int(time.time())}.jsonl"))  # keep, never overwrite
            else:
                kept = [r for r in read_log(self.path) if r.get("step", 0) <= resume_step]
                write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def note(self, **fields):
        """Fields added to the next record (e.g. the settings a resumed run changed)."""
        self.notes.update(fields)

    def write(self, **record):
        if self.enabled:
            record, self.notes = {**record, **self.notes}, {}
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def read_log(path):
    records = []
    for line in Path(path).read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut by a kill
            records.append(json.loads(line))
    return [r for r in records if r]
