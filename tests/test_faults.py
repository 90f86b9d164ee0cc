"""Fault injection across the entry points (issue 7): corrupt checkpoints, full disks during a save,
non-finite losses, refusing to overwrite a run, truncated weight files.

Faults covered in other modules, listed here so that the whole picture is in one place:
  killed training (SIGTERM, SIGKILL; 1 process, DDP, FSDP)  tests/test_train_lm.py, tests/test_splade.py
  killed data preparation, truncated shards                 tests/test_shards.py
  cut downloads, wrong checksums, full disk, 401/404, offline tests/test_hub.py
  malformed/empty/duplicate/non-UTF-8 dataset rows          tests/test_ir_datasets.py, tests/test_finetune.py,
                                                            tests/test_splade.py
  killed corpus encoding (resume by chunk)                  tests/test_retrieval.py
  unknown config keys, wrong types                           tests/test_train_lm.py
"""
import errno
import shutil
import signal
import time

import numpy as np

import pytest
import torch

import train_lm
import checkpoint
import training
from hf.safetensors_io import SafetensorsError, load_safetensors, read_header
from test_train_lm import args, log, shards  # noqa: F401  (the shards fixture)


def ckpt_steps(out):
    return [int(p.name[5:]) for p in checkpoint.Checkpoints(out).folders()]


def vouch(folder):
    """A checkpoint folder as a copy from elsewhere would come: its MANIFEST.json written again for the
    files as they are now (their hashes), so that only reading them can tell what is wrong."""
    import json
    from data import manifest
    record = json.loads((folder / "MANIFEST.json").read_text())
    record["files"] = manifest.hashes(folder, record["files"])
    (folder / "MANIFEST.json").write_text(json.dumps(record))


def test_truncated_checkpoint_falls_back_to_the_previous_one(shards, tmp_path, capsys):
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    newest = tmp_path / "checkpoints" / "step_00000020"
    weights = newest / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a disk that filled up / a copy cut short
    assert "model.safetensors" in checkpoint.Checkpoints(tmp_path).problem(newest)
    train_lm.main(a + ["--max_steps=25"])
    err = capsys.readouterr().err
    assert f"skipping checkpoint {newest}" in err and "truncated" in err
    assert [r["step"] for r in log(tmp_path) if "loss" in r] == list(range(1, 26)), "resumed from step 10, redid 11..25"


def test_checkpoint_without_manifest_is_never_trusted(shards, tmp_path):
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    (tmp_path / "checkpoints" / "step_00000020" / "MANIFEST.json").unlink()  # killed before the last write
    assert checkpoint.Checkpoints(tmp_path).latest().name == "step_00000010"


def test_corrupt_optimizer_file_falls_back(shards, tmp_path, capsys):
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    opt = tmp_path / "checkpoints" / "step_00000020" / "optimizer.pt"
    data = bytearray(opt.read_bytes())
    data[100:200] = b"\0" * 100  # same size, garbage inside, and a manifest that vouches for it
    opt.write_bytes(bytes(data))
    vouch(opt.parent)
    train_lm.main(a + ["--max_steps=22"])
    assert "falling back to an older checkpoint" in capsys.readouterr().err
    assert log(tmp_path)[-1]["step"] == 22 and [r["step"] for r in log(tmp_path)][10] == 11


def test_disk_full_during_a_save_leaves_the_previous_checkpoint_intact(shards, tmp_path, monkeypatch):
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    real_save = checkpoint._torch_save
    calls = {"n": 0}

    def failing_save(obj, path):
        calls["n"] += 1
        if "step_00000020" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_save(obj, path)

    monkeypatch.setattr(checkpoint, "_torch_save", failing_save)
    with pytest.raises(OSError, match="No space left"):
        train_lm.main(a)
    assert ckpt_steps(tmp_path) == [10], "the failed save must not leave a step_20 that looks complete"
    monkeypatch.setattr(checkpoint, "_torch_save", real_save)
    train_lm.main(a)  # space freed: the same command resumes from step 10 and finishes
    assert ckpt_steps(tmp_path)[0] == 20 and not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_keep_last_n_checkpoints(shards, tmp_path):
    train_lm.main(args(shards, tmp_path, max_steps=25, ckpt_interval=5, keep_checkpoints=2))
    assert ckpt_steps(tmp_path) == [25, 20]


def test_non_finite_loss_skips_steps_then_stops_with_a_named_cause(shards, tmp_path, capsys):
    """An absurd learning rate turns the weights to inf after one step: every following step is
    non-finite; they are skipped, then the run stops and the last good checkpoint survives."""
    good = args(shards, tmp_path, max_steps=10, ckpt_interval=10)
    train_lm.main(good)
    with pytest.raises(FloatingPointError, match="learning rate"):
        train_lm.main(good + ["--max_steps=40", "--lr=1e30", "--warmup_steps=0", "--nonfinite_patience=3"])
    err = capsys.readouterr().err
    assert err.count("step skipped") == 3
    assert 10 in ckpt_steps(tmp_path)
    sd = load_safetensors(tmp_path / "checkpoints" / "step_00000010" / "model" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in sd.values()), "the kept checkpoint is the good one"


def test_resume_never_refuses_to_overwrite_an_existing_run(shards, tmp_path):
    train_lm.main(args(shards, tmp_path, max_steps=5, ckpt_interval=5))
    before = (tmp_path / "log.jsonl").read_text()
    with pytest.raises(FileExistsError, match="resume='never'"):
        train_lm.main(args(shards, tmp_path, max_steps=5, resume="never"))
    assert (tmp_path / "log.jsonl").read_text() == before and ckpt_steps(tmp_path) == [5]


def test_truncated_weights_name_the_file(tmp_path, shared_data):
    src = shared_data / "models" / "splade-tiny"
    shutil.copytree(src, tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(SafetensorsError, match=str(f)):
        read_header(f)
    from hf.models import from_pretrained
    with pytest.raises(SafetensorsError, match="truncated"):
        from_pretrained(tmp_path / "m")


def test_garbage_header_is_reported_not_crashed(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes((12).to_bytes(8, "little") + b"{not json!!}" + b"\0" * 64)
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        load_safetensors(f)
    f.write_bytes(b"\xff" * 16)
    with pytest.raises(SafetensorsError, match="does not fit"):
        load_safetensors(f)


def test_config_file_with_unknown_key_names_the_file(tmp_path, shards):
    bad = tmp_path / "bad.py"
    bad.write_text("lr = 1e-3\nlearning_rate = 3\n")
    with pytest.raises(KeyError, match=f"learning_rate.*{bad}"):
        train_lm.main(args(shards, tmp_path / "o") + [str(bad)])
    assert not (tmp_path / "o").exists(), "a rejected config must not create or touch the run folder"


# ---------------------------------------------------------------- nothing lost (issue 16)


def test_a_non_finite_streak_never_checkpoints_poisoned_weights(shards, tmp_path, capsys):
    """lr=1e30: the first step's update is finite but makes the weights ~1e30, every later step is
    non-finite. The checkpoint saved right after that update holds the poisoned weights: it is set
    aside, nothing is saved during the streak, and the one before - kept although keep_checkpoints=1
    - is named as the last good one and resumes."""
    good = args(shards, tmp_path, max_steps=10, ckpt_interval=10)
    train_lm.main(good)
    bad = good + ["--max_steps=40", "--lr=1e30", "--warmup_steps=0", "--nonfinite_patience=4",
                  "--ckpt_interval=1", "--keep_checkpoints=1"]
    with pytest.raises(FloatingPointError, match=r"last good checkpoint is .*step_00000010"):
        train_lm.main(bad)
    assert ckpt_steps(tmp_path) == [10], "no checkpoint may be saved during a non-finite streak"
    assert (tmp_path / "checkpoints" / "step_00000011.nonfinite").is_dir(), "the poisoned one is set aside"
    sd = load_safetensors(tmp_path / "checkpoints" / "step_00000010" / "model" / "model.safetensors")
    assert all(t.abs().max() < 100 for t in sd.values()), "the kept checkpoint holds sane weights"
    train_lm.main(good + ["--max_steps=15"])  # the same run with a sane lr recovers from it
    assert all(np.isfinite(r["loss"]) for r in log(tmp_path)) and log(tmp_path)[-1]["step"] == 15


def test_a_second_run_on_the_same_out_dir_is_refused_naming_the_holder(shards, tmp_path):
    """A live run holds an fcntl lock on out_dir; a second writer stops before touching anything,
    naming the holder's pid; a SIGKILLed holder leaves no stale lock."""
    import procs
    first = procs.run_script("train_lm.py", args(shards, tmp_path, max_steps=100_000, ckpt_interval=5))
    logfile = tmp_path / "log.jsonl"
    try:
        for _ in range(1200):
            if logfile.exists() and len(logfile.read_text().splitlines()) >= 3:
                break
            assert first.poll() is None, first.stdout.read()
            time.sleep(0.05)
        before = logfile.read_text()
        with pytest.raises(checkpoint.RunLocked, match=f"pid {first.pid}"):
            train_lm.main(args(shards, tmp_path, max_steps=20))
        assert logfile.read_text().startswith(before), "the refused run must not touch the log"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    reached = log(tmp_path)[-1]["step"]   # on a loaded machine the first run may get far before its kill
    train_lm.main(args(shards, tmp_path, max_steps=reached + 10, ckpt_interval=5))  # the lock died with its holder
    assert log(tmp_path)[-1]["step"] == reached + 10


def test_out_dir_whose_checkpoints_are_all_invalid_is_not_started_over(shards, tmp_path):
    train_lm.main(args(shards, tmp_path, max_steps=20, ckpt_interval=10))
    for folder in checkpoint.Checkpoints(tmp_path).folders():
        (folder / "MANIFEST.json").unlink()
    weights = tmp_path / "checkpoints" / "step_00000020" / "model" / "model.safetensors"
    before = weights.read_bytes()
    with pytest.raises(checkpoint.CorruptCheckpoint, match=r"(?s)none is valid.*step_00000020: no MANIFEST"
                                                         r".*step_00000010: no MANIFEST.*--resume=never"):
        train_lm.main(args(shards, tmp_path, max_steps=40, ckpt_interval=10))
    assert weights.read_bytes() == before and len(log(tmp_path)) == 20, "nothing may be overwritten"


def test_a_tensor_with_the_right_size_but_the_wrong_shape_falls_back(shards, tmp_path, capsys):
    """The safetensors header of step_20 claims [172, 64] for a [64, 172] matrix: same byte count,
    and a manifest that vouches for it; loading names the file's tensor and resume takes step_10."""
    import json
    import struct
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    f = tmp_path / "checkpoints" / "step_00000020" / "model" / "model.safetensors"
    raw = bytearray(f.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    name = "model.layers.0.mlp.down_proj.weight"
    rows, cols = header[name]["shape"]
    text = raw[8:8 + n].decode()
    at = text.index(f'"{name}"')
    shape = text.index(f"[{rows},{cols}]", at)
    text = text[:shape] + f"[{cols},{rows}]" + text[shape + len(f"[{rows},{cols}]"):]
    raw[8:8 + n] = text.encode()
    f.write_bytes(bytes(raw))
    vouch(tmp_path / "checkpoints" / "step_00000020")
    train_lm.main(a + ["--max_steps=25"])
    err = capsys.readouterr().err
    assert f"tensor {name} has shape [{cols}, {rows}]" in err and "falling back" in err
    assert [r["step"] for r in log(tmp_path)] == list(range(1, 26)), "resumed from step 10"


def test_full_disk_says_so_cleans_up_and_periodic_saves_do_not_end_the_run(shards, tmp_path, monkeypatch, capsys):
    """A periodic save on a full disk warns and training goes on; the final save on a full disk
    stops with the size needed, never leaving a partial folder; a stale .tmp folder of a killed
    save is removed at start."""
    real_save = checkpoint._torch_save

    def full_disk(obj, path):
        if "step_00000010" in str(path) or "step_00000020" in str(path):
            with open(path, "wb") as f:  # what torch.save does on a full disk: the OSError is the context
                try:
                    raise OSError(errno.ENOSPC, "No space left on device", str(path))
                except OSError:
                    raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter "
                                       "failed writing file data/0: file write failed") from None
        real_save(obj, path)

    stale = tmp_path / "checkpoints" / "step_00000005.tmp"
    stale.mkdir(parents=True)
    (stale / "optimizer.pt").write_bytes(b"\0" * 1000)
    monkeypatch.setattr(checkpoint, "_torch_save", full_disk)
    with pytest.raises(checkpoint.SaveFailed, match=r"No space left on device while saving step 20 to .*step_00000020"
                                                  r" \(needs ~[\d.,]+ [KMG]B") as failed:
        train_lm.main(args(shards, tmp_path, max_steps=20, ckpt_interval=5))
    assert str(failed.value).startswith("No space left"), "the error: line is ours, without the OS's [Errno 28]"
    assert failed.value.errno == errno.ENOSPC
    err = capsys.readouterr().err
    assert "step 10" in err and "Training continues" in err, "the periodic save warned and training went on"
    assert not stale.exists(), "the stale .tmp folder of a killed save is removed at start"
    assert ckpt_steps(tmp_path) == [15, 5] and not list((tmp_path / "checkpoints").glob("*.tmp"))
    monkeypatch.setattr(checkpoint, "_torch_save", real_save)
    train_lm.main(args(shards, tmp_path, max_steps=20, ckpt_interval=5))  # space freed: resumes from 15
    assert ckpt_steps(tmp_path)[0] == 20 and [r["step"] for r in log(tmp_path)] == list(range(1, 21))


def test_resuming_with_another_number_of_processes(shards, tmp_path, capsys):
    """A checkpoint saved by 2 ranks (two rank*.pt files) resumed by 1 process: FSDP's per-rank
    optimizer shards cannot be, and say how to resume; a replicated optimizer can, with a warning."""
    train_lm.main(args(shards, tmp_path, max_steps=4, ckpt_interval=4))
    folder = checkpoint.Checkpoints(tmp_path).latest()
    shutil.copy(folder / "rank0.pt", folder / "rank1.pt")
    with pytest.raises(training.ConfigError, match="saved by 2 processes and this run has 1.*resume with 2 processes"):
        checkpoint.Checkpoints(tmp_path).load(folder, sharded_optimizer=True)
    state, optimizer, _ = checkpoint.Checkpoints(tmp_path).load(folder)
    assert state["step"] == 4 and optimizer is not None
    assert "not an exact resume" in capsys.readouterr().err
