"""A new user's first hour (issue 15): --help, validation before step 1, user errors without
tracebacks. Data: small generated token shards."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train_lm
import cli
import training
from data.shards import write_shard

ROOT = Path(__file__).resolve().parents[1]
V = 64


@pytest.fixture(scope="module")
def bert_like_shards(tmp_path_factory):
    """Shards as data/fineweb_edu.py writes them with a BERT tokenizer: every document starts with
    [SEP] = 102, ids below 30 522, the header records all three facts."""
    folder = tmp_path_factory.mktemp("bert_shards")
    rng = np.random.default_rng(0)
    for name, n in (("c_val_000000.bin", 4_000), ("c_train_000001.bin", 20_000)):
        tokens = rng.integers(1000, 30_000, size=n)
        tokens[::50] = 102
        write_shard(folder / name, tokens, delimiter=102, vocab_size=30_522)
    return folder


def lm_args(shards, out, *extra, config="tiny_lm.py", **over):
    base = dict(train_shards=f"{shards}/c_train_*.bin", val_shards=f"{shards}/c_val_*.bin", out_dir=str(out),
                max_steps=2, eval_interval=0)
    base.update(over)
    return [str(ROOT / "configs" / config)] + [f"--{k}={v}" for k, v in base.items()] + list(extra)


def run(script, *argv, env=None):
    import os
    return subprocess.run([sys.executable, str(ROOT / script), *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=120)


# ---------------------------------------------------------------- --help


@pytest.mark.parametrize("script", ["train_lm", "train_splade"])
def test_help_lists_every_key_with_its_default_and_comment(script, capsys):
    import importlib
    module = importlib.import_module(script)
    for flag in ("--help", "-h"):
        with pytest.raises(SystemExit) as e:
            module.main([flag])
        assert e.value.code == 0
        out = capsys.readouterr().out
        for key, value in module.DEFAULTS.items():
            assert f"--{key}={value!r}" in out, f"{key} missing from {script} {flag}"
        assert f"python {script}.py" in out, "the usage lines of the docstring"
        assert "auto: continue from out_dir's newest valid checkpoint" in out, "the comment beside the key"


DATA_SCRIPTS = ["data/fineweb_edu.py", "data/ir_datasets.py", "data/shards.py", "data/text_corpus.py"]


@pytest.mark.parametrize("script", DATA_SCRIPTS)
def test_data_scripts_run_by_path_and_as_modules(script):
    """`python data/x.py` put data/ (not the repo root) on sys.path: ModuleNotFoundError: No module named 'data'."""
    by_path = run(script, "--help")
    assert by_path.returncode == 0 and "usage:" in by_path.stdout, f"python {script} --help: {by_path.stderr}"
    module = subprocess.run([sys.executable, "-m", script[:-3].replace("/", "."), "--help"], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert module.returncode == 0 and module.stdout == by_path.stdout, f"python -m ... --help: {module.stderr}"


def test_ir_datasets_cli_has_help_and_loads_a_folder(tmp_path, capsys):
    """--help used to be taken for a benchmark name and end in an IRDataError."""
    from data.ir_datasets import main
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "nanobeir/<name>" in capsys.readouterr().out
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "heat flow"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "heat"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    main([str(tmp_path)])
    assert "1 docs, 1 queries, 1 judgments" in capsys.readouterr().out


# ---------------------------------------------------------------- user errors: message, status 2


def test_user_errors_exit_2_with_the_message_and_no_traceback(bert_like_shards, tmp_path, capsys, monkeypatch):
    cases = {
        "missing shards": lm_args(tmp_path / "nowhere", tmp_path / "a"),
        "unknown key": lm_args(bert_like_shards, tmp_path / "b", "--learning_rate=1"),
        "wrong type": lm_args(bert_like_shards, tmp_path / "c", "--max_steps=many"),
        "bad value": lm_args(bert_like_shards, tmp_path / "d", "--objective=mlx"),
        "corrupt shard": lm_args(tmp_path, tmp_path / "e"),
    }
    (tmp_path / "c_train_000001.bin").write_bytes(b"\0" * 100)
    for what, argv in cases.items():
        with pytest.raises(SystemExit) as e:
            cli.run_cli(lambda: train_lm.main(argv))
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, f"{what}: {err}"
    monkeypatch.setenv("REPRLAB_TRACEBACK", "1")
    with pytest.raises(training.ConfigError):  # raised as is, for debugging
        cli.run_cli(lambda: train_lm.main(cases["bad value"]))
    p = run("train_lm.py", *cases["bad value"], env={"REPRLAB_TRACEBACK": ""})  # the script itself
    assert p.returncode == 2 and p.stderr.startswith("error: objective='mlx'") and "Traceback" not in p.stderr


# ---------------------------------------------------------------- validated before step 1


def test_mask_id_outside_the_vocabulary_is_caught_before_the_clm_phase(bert_like_shards, tmp_path):
    """The README's override: a CLM -> MLM encoder on BERT shards with the config's GPT-2 mask id
    used to train 50 CLM steps and crash at the switch to MLM."""
    a = lm_args(bert_like_shards, tmp_path / "o", "--clm_fraction=0.25", "--vocab_size=30528", "--eos_id=102",
                config="tiny_encoder.py")
    with pytest.raises(training.ConfigError, match=r"mask_id=50257 is outside the vocabulary \(vocab_size=30528\)"):
        train_lm.main(a)
    assert not (tmp_path / "o").exists(), "nothing is created before the check"
    train_lm.main(a + ["--mask_id=103"])  # the fix the message names


def test_shards_of_another_tokenizer_are_refused(bert_like_shards, tmp_path):
    """tiny_lm.py (GPT-2 ids: eos 50256) on BERT shards (delimiter 102) used to train silently."""
    with pytest.raises(training.ConfigError, match=r"start every document with token 102, but eos_id=50256.*"
                                                   r"--eos_id=102"):
        train_lm.main(lm_args(bert_like_shards, tmp_path / "o"))
    with pytest.raises(training.ConfigError, match=r"hold token id 29\d\d\d, but vocab_size=1000"):
        train_lm.main(lm_args(bert_like_shards, tmp_path / "o", "--vocab_size=1000", "--eos_id=102"))
    with pytest.raises(training.ConfigError, match=r"tokenizer of 30522 ids, but vocab_size=30000"):
        train_lm.main(lm_args(bert_like_shards, tmp_path / "o", "--vocab_size=30000", "--eos_id=102"))
    assert not (tmp_path / "o").exists()
    train_lm.main(lm_args(bert_like_shards, tmp_path / "o", "--vocab_size=30528", "--eos_id=102"))


def test_mlm_without_a_mask_id_and_mask_equal_to_the_delimiter(bert_like_shards, tmp_path):
    a = lm_args(bert_like_shards, tmp_path / "o", "--vocab_size=30528", "--eos_id=102", config="tiny_encoder.py")
    with pytest.raises(training.ConfigError, match="needs a mask token id: set --mask_id"):
        train_lm.main(a + ["--mask_id=-1"])
    with pytest.raises(training.ConfigError, match="mask_id=102 is also the document delimiter"):
        train_lm.main(a + ["--mask_id=102"])


def test_a_tokenizer_that_did_not_write_the_shards_is_refused(bert_like_shards, tmp_path, shared_data):
    tok = shared_data / "models" / "splade-tiny" / "tokenizer.json"  # bert-base-uncased: 30 522 ids
    ok = lm_args(bert_like_shards, tmp_path / "o", "--vocab_size=30528", "--eos_id=102", f"--tokenizer={tok}")
    train_lm.main(ok)
    small = tmp_path / "small"
    small.mkdir()
    for name in ("c_val_000000.bin", "c_train_000001.bin"):
        write_shard(small / name, np.r_[[102], np.arange(1000, 6000)] % 30_000, delimiter=102, vocab_size=30_000)
    with pytest.raises(training.ConfigError, match="has 30522 ids, but the shards were written with a tokenizer of "
                                                   "30000"):
        train_lm.main(lm_args(small, tmp_path / "p", "--vocab_size=30528", "--eos_id=102", f"--tokenizer={tok}"))


def test_validation_shards_are_checked_before_the_first_step(bert_like_shards, tmp_path):
    """A bad validation shard used to surface at the first evaluation, losing the steps before it."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "c_train_000001.bin").write_bytes((bert_like_shards / "c_train_000001.bin").read_bytes())
    (bad / "c_val_000000.bin").write_bytes(b"\0" * 2000)  # not a shard
    common = ("--vocab_size=30528", "--eos_id=102", "--eval_interval=100")
    with pytest.raises(Exception, match="c_val_000000.bin: bad magic"):
        train_lm.main(lm_args(bad, tmp_path / "o", *common))
    with pytest.raises(training.ConfigError, match="eval_batches=500: lower eval_batches"):
        train_lm.main(lm_args(bert_like_shards, tmp_path / "o", *common, "--eval_batches=500"))
    assert not (tmp_path / "o").exists()


def test_a_flag_before_a_config_file_that_sets_the_same_key_is_refused():
    """`train_lm.py --max_steps=5 configs/tiny_lm.py`: the file would override the flag silently."""
    tiny = str(ROOT / "configs" / "tiny_lm.py")
    with pytest.raises(cli.ConfigError, match=r"--max_steps=5 comes before .*tiny_lm\.py, which sets max_steps again"):
        cli.parse_config(train_lm.DEFAULTS, ["--max_steps=5", tiny], script=str(ROOT / "train_lm.py"))
    assert cli.parse_config(train_lm.DEFAULTS, ["--fused=False", tiny])["fused"] is False, "a key the file leaves"
    assert cli.parse_config(train_lm.DEFAULTS, [tiny, "--max_steps=5"])["max_steps"] == 5


def test_under_torchrun_a_user_error_is_printed_once_and_named_in_torchrun_summary(bert_like_shards, tmp_path):
    """Every rank meets the bad value: rank 0 prints `error: ...`, the others do not; each rank exits
    with 2, which torchrun's summary shows (torchrun itself exits with 1), with the message as the
    failure's cause instead of a Python traceback."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(ROOT / "train_lm.py"),
           *lm_args(bert_like_shards, tmp_path, objective="mlx")]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = (p.stdout + p.stderr).splitlines()
    assert p.returncode == 1 and [ln for ln in lines if ln.startswith("error:")] == [
        "error: objective='mlx': use 'clm' or 'mlm' (with clm_fraction for CLM -> MLM)"]
    summary = "\n".join(lines)
    assert "exitcode  : 2" in summary and "traceback : error: objective='mlx'" in summary


def test_a_number_key_may_also_take_the_words_its_script_names():
    defaults = {"k": 1.0}
    assert cli.parse_config(defaults, ["--k=auto"], words={"k": ("auto",)})["k"] == "auto"
    assert cli.parse_config(defaults, ["--k=4"], words={"k": ("auto",)})["k"] == 4.0
    with pytest.raises(cli.ConfigTypeError, match="or one of: auto"):
        cli.parse_config(defaults, ["--k=automatic"], words={"k": ("auto",)})
    with pytest.raises(cli.ConfigTypeError):  # a word only where the script names it
        cli.parse_config(defaults, ["--k=auto"])
