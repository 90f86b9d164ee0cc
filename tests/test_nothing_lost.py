"""Nothing lost, round 3 (issue 21), each fault reproduced on generated shards: a bad token id inside
a shard, config changes on resume, a shard that vanishes mid-run, zero intervals, a read-only
out_dir, the exit status after a signal, a NaN written into a checkpoint, and a checkpoint file
that would run code when loaded. None may lose a checkpointed step or end in a traceback."""
import errno
import json
import os
import shutil
import signal

import numpy as np
import pytest
import torch

import checkpoint
import cli
import procs
import train_lm
from data.shards import HEADER_BYTES, read_shard_header, write_shard
from test_faults import vouch
from test_train_lm import V, args, log, shards  # noqa: F401 - shards is a fixture


def run(argv, capsys):
    """train_lm.py as its command line runs it: (exit status, stderr)."""
    capsys.readouterr()
    try:
        cli.run_cli(train_lm.main, argv)
        status = 0
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err


def steps_saved(out):
    return [int(p.name[5:]) for p in checkpoint.Checkpoints(out).folders()]


@pytest.fixture
def own_shards(shards, tmp_path):  # noqa: F811
    """A copy of the shards this test may damage: the training data cut into three shards."""
    folder = tmp_path / "shards"
    folder.mkdir()
    shutil.copy(shards / "s_val_000000.bin", folder)
    from data.shards import read_shard
    tokens = np.asarray(read_shard(shards / "s_train_000001.bin"))
    for i, part in enumerate(np.array_split(tokens[:60_000], 3)):
        write_shard(folder / f"s_train_{i + 1:06d}.bin", part)
    return folder


# ---------------------------------------------------------------- 1. a bad id inside a shard


def test_a_token_id_beyond_the_vocabulary_stops_naming_file_and_offset_after_saving(own_shards, tmp_path, capsys):
    """A flipped value inside the data (the header still says all ids are < V): the batch that holds
    it stops the run with `error:`, its shard file and token offset, after saving the steps done;
    the resumed run stops at the same place without losing them."""
    shard = own_shards / "s_train_000001.bin"
    dtype = read_shard_header(shard)[1]
    data = np.memmap(shard, dtype=dtype, mode="r+", offset=HEADER_BYTES)
    data[12 * 513 + 7] = 65000  # in the 13th global batch of 8 x 64 (+1) tokens
    data.flush()
    del data
    a = args(own_shards, tmp_path / "out", max_steps=30, ckpt_interval=1000)
    status, err = run(a, capsys)
    assert status == 2 and err.splitlines()[-1].startswith("error: ") and "Traceback" not in err
    assert str(shard) in err and "65000" in err and f"offset {12 * 513 + 7}" in err
    assert steps_saved(tmp_path / "out") == [12], "the 12 finished steps were saved before stopping"
    status, err = run(a, capsys)
    assert status == 2 and str(shard) in err and steps_saved(tmp_path / "out") == [12]
    assert [r["step"] for r in log(tmp_path / "out") if "loss" in r] == list(range(1, 13))


# ---------------------------------------------------------------- 2. config changes on resume


@pytest.mark.parametrize("change, key", [("--batch_size=4", "batch_size"), ("--d_model=128", "d_model"),
                                         ("--seed=7", "seed"), ("--objective=mlm", "objective")])
def test_a_resume_refuses_settings_that_shape_the_model_or_the_data(shards, tmp_path, capsys, change, key):  # noqa: F811
    a = args(shards, tmp_path, max_steps=5, ckpt_interval=5)
    train_lm.main(a)
    config = (tmp_path / "config.json").read_text()
    status, err = run(a + ["--max_steps=8", change], capsys)
    assert status == 2 and f"{key}: saved " in err and "new out_dir" in err
    assert (tmp_path / "config.json").read_text() == config, "a config that was not used is never written"
    assert steps_saved(tmp_path) == [5]


def test_a_resume_takes_a_new_schedule_and_says_so(shards, tmp_path, capsys):  # noqa: F811
    a = args(shards, tmp_path, max_steps=5, ckpt_interval=5)
    train_lm.main(a)
    status, err = run(a + ["--max_steps=8", "--lr=1e-3"], capsys)
    assert status == 0 and "note: lr changed on resume: 0.003 -> 0.001" in err and "max_steps changed" in err
    changed = [r["resumed_with_changes"] for r in log(tmp_path) if "resumed_with_changes" in r]
    assert changed == [{"max_steps": [5, 8], "lr": [0.003, 0.001]}]
    assert json.loads((tmp_path / "config.json").read_text())["lr"] == 1e-3
    assert [r["step"] for r in log(tmp_path) if "loss" in r] == list(range(1, 9))


# ---------------------------------------------------------------- 3. shards vanishing mid-run


def test_a_shard_deleted_mid_run_saves_first_and_the_resume_names_it(own_shards, tmp_path, capsys, monkeypatch):
    """The third training shard is deleted while the run reads the first: the run stops when it
    reaches it, after saving; the resume says which shard is missing; restored, the run finishes."""
    third = own_shards / "s_train_000003.bin"
    backup = tmp_path / "backup.bin"
    shutil.copy(third, backup)
    import training
    finish = training.Loop.finish_step

    def deleting(self, *a, **k):
        if self.step == 3:
            third.unlink()
        return finish(self, *a, **k)

    monkeypatch.setattr(training.Loop, "finish_step", deleting)
    a = args(own_shards, tmp_path / "out", max_steps=120, ckpt_interval=1000, eval_interval=0)
    status, err = run(a, capsys)
    monkeypatch.setattr(training.Loop, "finish_step", finish)
    assert status == 2 and "s_train_000003.bin" in err and "Traceback" not in err
    (saved,) = steps_saved(tmp_path / "out")
    assert saved == 2 * ((20_000 - 1) // 512), "saved at the step that needed the lost shard (2 shards of 39 batches)"
    status, err = run(a, capsys)
    assert status == 2 and "missing" in err and "s_train_000003.bin" in err and "new out_dir" in err
    shutil.copy(backup, third)
    status, _ = run(a, capsys)
    assert status == 0 and steps_saved(tmp_path / "out")[0] == 120


# ---------------------------------------------------------------- 4. intervals


def test_ckpt_interval_zero_means_only_the_final_checkpoint(shards, tmp_path):  # noqa: F811
    train_lm.main(args(shards, tmp_path, max_steps=6, ckpt_interval=0, log_interval=0))
    assert steps_saved(tmp_path) == [6] and not (tmp_path / "log.jsonl").exists(), "0: never"


@pytest.mark.parametrize("key", ["ckpt_interval", "log_interval", "eval_interval"])
def test_a_negative_interval_is_refused_before_anything_starts(shards, tmp_path, capsys, key):  # noqa: F811
    status, err = run(args(shards, tmp_path, **{key: -1}), capsys)
    assert status == 2 and f"{key}=-1" in err and not (tmp_path / "RUN.lock").exists()


# ---------------------------------------------------------------- 5. a read-only out_dir


def test_an_out_dir_that_cannot_be_written_is_an_error_not_a_traceback(shards, tmp_path, capsys, monkeypatch):  # noqa: F811
    real_open = os.open

    def read_only(path, *a, **k):
        if str(path).endswith("RUN.lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(checkpoint.os, "open", read_only)
    status, err = run(args(shards, tmp_path), capsys)
    assert status == 2 and err.startswith(f"error: cannot write to out_dir {tmp_path}: Read-only file system")


# ---------------------------------------------------------------- 6. the exit status after a signal


def test_sigint_saves_then_exits_with_130(shards, tmp_path):  # noqa: F811
    p = procs.run_script("train_lm.py", args(shards, tmp_path, max_steps=2000, ckpt_interval=1000))
    assert procs.kill_after(p, tmp_path / "log.jsonl", 5, sig=signal.SIGINT) == 128 + signal.SIGINT
    assert "SIGINT received: checkpoint saved" in p.stdout.read() and steps_saved(tmp_path)


# ---------------------------------------------------------------- 7. a NaN written into a checkpoint


def test_a_nan_in_the_newest_checkpoint_falls_back_to_the_one_before(shards, tmp_path, capsys):  # noqa: F811
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    weights = tmp_path / "checkpoints" / "step_00000020" / "model" / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-4:] = np.float32(np.nan).tobytes()  # the last value of the last tensor; the size is unchanged
    weights.write_bytes(bytes(raw))
    vouch(weights.parents[1])  # a copy from elsewhere, whose manifest vouches for the NaN
    status, err = run(a + ["--max_steps=25"], capsys)
    assert status == 0 and "non-finite" in err and "falling back" in err
    assert [r["step"] for r in log(tmp_path) if "loss" in r] == list(range(1, 26)), "resumed from step 10"


# ---------------------------------------------------------------- 8. a checkpoint that would run code


class RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {RunsCode.marker}",))


def test_an_optimizer_file_that_would_run_code_is_refused_without_running_it(shards, tmp_path, capsys):  # noqa: F811
    """A checkpoint folder from elsewhere whose optimizer.pt unpickles into a shell command (with a
    manifest that vouches for it): loading it refuses the pickle, nothing runs, the older checkpoint
    is used."""
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    RunsCode.marker = tmp_path / "pwned"
    folder = tmp_path / "checkpoints" / "step_00000020"
    with open(folder / "optimizer.pt", "wb") as f:
        torch.save({"state": RunsCode()}, f)
    vouch(folder)
    status, err = run(a + ["--max_steps=25"], capsys)
    assert not RunsCode.marker.exists(), "the pickle ran"
    assert status == 0 and "optimizer.pt" in err and "falling back" in err
    assert [r["step"] for r in log(tmp_path) if "loss" in r] == list(range(1, 26))
