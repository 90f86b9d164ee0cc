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

import pytest
import torch

import train_lm
import training
from data.safetensors_io import SafetensorsError, load_safetensors, read_header
from test_train_lm import args, log, shards  # noqa: F401  (the shards fixture)


def ckpt_steps(out):
    return [int(p.name[5:]) for p in training.Checkpoints(out).folders()]


def test_truncated_checkpoint_falls_back_to_the_previous_one(shards, tmp_path, capsys):
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    newest = tmp_path / "checkpoints" / "step_00000020"
    weights = newest / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a disk that filled up / a copy cut short
    assert "model.safetensors" in training.Checkpoints(tmp_path).problem(newest)
    train_lm.main(a + ["--max_steps=25"])
    err = capsys.readouterr().err
    assert f"skipping checkpoint {newest}" in err and "truncated" in err
    assert [r["step"] for r in log(tmp_path)] == list(range(1, 26)), "resumed from step 10, redid 11..25"


def test_checkpoint_without_manifest_is_never_trusted(shards, tmp_path):
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    (tmp_path / "checkpoints" / "step_00000020" / "MANIFEST.json").unlink()  # killed before the last write
    assert training.Checkpoints(tmp_path).latest().name == "step_00000010"


def test_corrupt_optimizer_file_falls_back(shards, tmp_path, capsys):
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    opt = tmp_path / "checkpoints" / "step_00000020" / "optimizer.pt"
    data = bytearray(opt.read_bytes())
    data[100:200] = b"\0" * 100  # same size, garbage inside: only reading it can tell
    opt.write_bytes(bytes(data))
    train_lm.main(a + ["--max_steps=22"])
    assert "falling back to an older checkpoint" in capsys.readouterr().err
    assert log(tmp_path)[-1]["step"] == 22 and [r["step"] for r in log(tmp_path)][10] == 11


def test_disk_full_during_a_save_leaves_the_previous_checkpoint_intact(shards, tmp_path, monkeypatch):
    a = args(shards, tmp_path, max_steps=20, ckpt_interval=10)
    real_save = training._torch_save
    calls = {"n": 0}

    def failing_save(obj, path):
        calls["n"] += 1
        if "step_00000020" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_save(obj, path)

    monkeypatch.setattr(training, "_torch_save", failing_save)
    with pytest.raises(OSError, match="No space left"):
        train_lm.main(a)
    assert ckpt_steps(tmp_path) == [10], "the failed save must not leave a step_20 that looks complete"
    monkeypatch.setattr(training, "_torch_save", real_save)
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
    import model
    with pytest.raises(SafetensorsError, match="truncated"):
        model.from_pretrained(tmp_path / "m")


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
