"""The loaders' faults as a user meets them (issue 26.6-26.7): a bad Hub spec, a truncated or
incomplete config.json, a corrupt safetensors header (missing keys, a list, offsets that overlap,
are negative or fall outside the data), a pytorch_model.bin that will not unpickle, a truncated
tokenizer.json and a symlinked out_dir/model each end in one `error:` line naming the file and the
fix (cli.run_cli, exit status 2), never a traceback and never a model that loads wrong."""
import json
import os
import struct
from pathlib import Path

import pytest
import torch

import checkpoint
import cli
import model as M
import train_splade as S
from hf import hub
from hf import models as hf_models
from hf.models import from_pretrained, load_tokenizer
from hf.safetensors_io import SafetensorsError, load_safetensors, save_safetensors
from test_splade import run_args, tiny, write_tiny_model  # noqa: F401 - tiny is a fixture

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def user_error(capsys, fn, *args):
    """The one `error:` line that run_cli prints for fn(*args) (exit status 2, no traceback)."""
    with pytest.raises(SystemExit) as e:
        cli.run_cli(fn, *args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


def read_raw(path):
    """(header dict, data bytes) of a safetensors file."""
    blob = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def write_raw(path, header, data):
    """A safetensors file with exactly this header (any JSON) before `data`."""
    head = json.dumps(header).encode()
    Path(path).write_bytes(struct.pack("<Q", len(head)) + head + data)


@pytest.fixture
def folder(tmp_path):
    """A tiny BERT checkpoint in Hugging Face form (config.json, model.safetensors, tokenizer)."""
    return write_tiny_model(tmp_path / "model", family="bert")


# ---------------------------------------------------------------- the Hub spec


def test_a_hub_spec_that_leaves_the_hub_is_a_user_error(capsys):
    for bad in ["hf:../../etc", "hf:../etc", "hf:org/name@../../refs", "hf:a--b/c", "hf:org/.x"]:
        with pytest.raises(hub.BadSpec):
            hub.parse_spec(bad)
    err = user_error(capsys, from_pretrained, "hf:../../etc")
    assert "hf:../../etc" in err and "without hf:" in err
    # and the usual names still parse
    assert hub.parse_spec("hf:answerdotai/ModernBERT-base@refs/pr/3") == ("answerdotai/ModernBERT-base", "refs/pr/3")
    assert hub.parse_spec("hf:naver/splade_v2.max") == ("naver/splade_v2.max", "main")


# ---------------------------------------------------------------- config.json


def test_a_truncated_config_json_names_the_file(folder, capsys):
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text[:len(text) // 2])
    err = user_error(capsys, from_pretrained, folder)
    assert str(folder / "config.json") in err and "not valid JSON" in err and "download it again" in err


def test_a_config_json_without_model_type_lists_the_supported_ones(folder, capsys):
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["model_type"]
    (folder / "config.json").write_text(json.dumps(cfg))
    err = user_error(capsys, from_pretrained, folder)
    assert "has no model_type" in err and str(folder / "config.json") in err
    assert all(t in err for t in hf_models.HF_FAMILIES), err
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "camembert"}))
    assert "'camembert', which this project does not read" in user_error(capsys, from_pretrained, folder)


def test_a_config_json_that_is_a_list_or_lacks_a_size_names_the_file(folder, capsys):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps([cfg]))
    assert "holds a JSON list" in user_error(capsys, from_pretrained, folder)
    del cfg["hidden_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    err = user_error(capsys, from_pretrained, folder)
    assert "'hidden_size'" in err and "BERT config.json" in err


# ---------------------------------------------------------------- safetensors headers


def test_a_header_entry_without_data_offsets_names_the_tensor(folder, capsys):
    path = folder / "model.safetensors"
    header, data = read_raw(path)
    name = next(k for k in header if k != "__metadata__")
    del header[name]["data_offsets"]
    write_raw(path, header, data)
    err = user_error(capsys, from_pretrained, folder)
    assert str(path) in err and name in err and "data_offsets" in err


def test_a_header_that_is_a_json_list_is_refused(folder, capsys):
    path = folder / "model.safetensors"
    header, data = read_raw(path)
    write_raw(path, [header], data)
    assert "header is a JSON list" in user_error(capsys, from_pretrained, folder)


def two_tensors(tmp_path):
    path = tmp_path / "t.safetensors"
    save_safetensors({"a": torch.arange(4.0), "b": torch.arange(4.0) + 10}, path)
    return path, *read_raw(path)


def test_two_tensors_at_the_same_offsets_are_refused(tmp_path):
    """Trusted, b loads as a copy of a (a model of shared weights: nDCG@10 0.065 instead of 0.564)."""
    path, header, data = two_tensors(tmp_path)
    header["b"]["data_offsets"] = header["a"]["data_offsets"]
    write_raw(path, header, data)
    with pytest.raises(SafetensorsError, match="'a' and 'b' share bytes"):
        load_safetensors(path)
    header["b"]["data_offsets"] = [8, 24]  # half of a's bytes
    write_raw(path, header, data)
    with pytest.raises(SafetensorsError, match="share bytes"):
        load_safetensors(path)


def test_a_negative_begin_is_refused(tmp_path):
    """Trusted, [-16, 0) reads the last 16 bytes of the JSON header as a's values."""
    path, header, data = two_tensors(tmp_path)
    header["a"]["data_offsets"] = [-16, 0]
    write_raw(path, header, data)
    with pytest.raises(SafetensorsError, match="non-negative"):
        load_safetensors(path)


@pytest.mark.parametrize("change, message", [
    (lambda h: h["a"].update(data_offsets=[16, 48]), "expected 16 bytes"),   # past the end
    (lambda h: h["a"].update(data_offsets=[16, 8]), "needs bytes"),          # end before begin
    (lambda h: h["a"].update(shape=[3]), "expected 12 bytes"),               # size != dtype x shape
    (lambda h: h["a"].update(dtype="F8_E4M3"), "unsupported dtype"),
    (lambda h: h["a"].update(shape=[-4]), "shape"),
    (lambda h: h["a"].update(data_offsets=[0.0, 16.0]), "two non-negative integers"),
    (lambda h: h.update(a=[1, 2]), "lacks dtype, shape or data_offsets"),
])
def test_every_header_entry_is_checked(tmp_path, change, message):
    path, header, data = two_tensors(tmp_path)
    change(header)
    write_raw(path, header, data)
    with pytest.raises(SafetensorsError, match=message):
        load_safetensors(path)


def test_valid_files_with_empty_tensors_and_gaps_still_load(tmp_path):
    path = tmp_path / "t.safetensors"
    save_safetensors({"a": torch.arange(4.0), "e": torch.zeros(0, 3), "z": torch.ones(2, dtype=torch.int64)}, path)
    header, data = read_raw(path)
    header["e"]["data_offsets"] = header["a"]["data_offsets"][:1] * 2  # an empty tensor shares no byte
    write_raw(path, header, data + b"\0" * 8)  # and trailing padding is not a tensor's
    t = load_safetensors(path)
    assert t["a"].tolist() == [0, 1, 2, 3] and t["e"].shape == (0, 3) and t["z"].tolist() == [1, 1]


# ---------------------------------------------------------------- pytorch_model.bin


class RunsCode:
    """Unpickling this calls os.system: a payload a weights-only loader must refuse."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_bin_that_would_run_code_is_refused_and_never_runs(folder, tmp_path, capsys):
    marker = tmp_path / "payload-ran"
    sd = hf_models.state_dict_to_hf(from_pretrained(folder))
    (folder / "model.safetensors").unlink()
    torch.save({**sd, "extra": RunsCode(marker)}, folder / "pytorch_model.bin")
    err = user_error(capsys, from_pretrained, folder)
    assert "refused" in err and "pytorch_model.bin" in err and "nothing in it was run" in err
    assert not marker.exists()


def test_a_truncated_bin_names_the_file(folder, capsys):
    sd = hf_models.state_dict_to_hf(from_pretrained(folder))
    (folder / "model.safetensors").unlink()
    torch.save(sd, folder / "pytorch_model.bin")
    blob = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(blob[:len(blob) // 2])
    err = user_error(capsys, from_pretrained, folder)
    assert str(folder / "pytorch_model.bin") in err and "download it again" in err


def test_a_bin_of_the_legacy_format_loads(folder):
    """Pre-zip files cannot be memory-mapped; they are read without the map."""
    ours = from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    torch.save(hf_models.state_dict_to_hf(ours), folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert torch.equal(from_pretrained(folder).embed.tok.weight, ours.embed.tok.weight)


# ---------------------------------------------------------------- tokenizer.json


def test_a_truncated_tokenizer_json_names_the_file(folder, capsys):
    text = (folder / "tokenizer.json").read_text()
    (folder / "tokenizer.json").write_text(text[:len(text) // 2])
    err = user_error(capsys, load_tokenizer, folder)
    assert str(folder / "tokenizer.json") in err and "not a readable tokenizer.json" in err
    (folder / "tokenizer.json").write_text(text)
    (folder / "tokenizer_config.json").write_text('{"pad_token": "[PA')
    assert str(folder / "tokenizer_config.json") in user_error(capsys, load_tokenizer, folder)


# ---------------------------------------------------------------- out_dir/model


def test_a_symlinked_out_dir_model_is_refused_before_the_first_step(tiny, tmp_path, capsys):
    """Followed, the run would replace a folder outside out_dir at its end; refused, nothing is
    trained (today: an OSError from rmtree after the whole run)."""
    model, data, _, _ = tiny
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not the run's")
    out = tmp_path / "run"
    out.mkdir()
    (out / "model").symlink_to(elsewhere)
    err = user_error(capsys, S.main, run_args(model, data / "train.tsv", out, max_steps=2))
    assert "symbolic link" in err and str(out / "model") in err
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    assert (elsewhere / "keep.txt").read_text() == "not the run's"
    (out / "model").unlink()
    (out / "model").write_text("a file")
    with pytest.raises(checkpoint.ExportBlocked, match="a file, not a folder"):
        checkpoint.export_final(tmp_path, out)
