"""A new user's first hour (issue 15): --help, validation before step 1, user errors without
tracebacks. Data: small generated token shards."""
import os
import re
import shutil
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
                "--mask_id=50257", config="tiny_encoder.py")  # a GPT-2 mask id (tiny_encoder.py's own is 1)
    with pytest.raises(training.ConfigError, match=r"mask_id=50257 is outside the vocabulary \(vocab_size=30528\)"):
        train_lm.main(a)
    assert not (tmp_path / "o").exists(), "nothing is created before the check"
    train_lm.main(a + ["--mask_id=103"])  # the fix the message names


def test_shards_of_another_tokenizer_are_refused(bert_like_shards, tmp_path):
    """tiny_lm.py (GPT-2 ids: eos 50256) on BERT shards (delimiter 102) used to train silently."""
    with pytest.raises(training.ConfigError, match=r"start every document with token 102, but eos_id=50256.*"
                                                   r"--eos_id=102"):
        train_lm.main(lm_args(bert_like_shards, tmp_path / "o", "--vocab_size=50304", "--eos_id=50256"))
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
    root_cause = summary.split("Root Cause (first observed failure):")[1]
    assert "rank      : 0 (local_rank: 0)" in root_cause, "rank 0's failure, whose line was printed, is the root cause"


def test_a_number_key_may_also_take_the_words_its_script_names():
    defaults = {"k": 1.0}
    assert cli.parse_config(defaults, ["--k=auto"], words={"k": ("auto",)})["k"] == "auto"
    assert cli.parse_config(defaults, ["--k=4"], words={"k": ("auto",)})["k"] == 4.0
    with pytest.raises(cli.ConfigTypeError, match="or one of: auto"):
        cli.parse_config(defaults, ["--k=automatic"], words={"k": ("auto",)})
    with pytest.raises(cli.ConfigTypeError):  # a word only where the script names it
        cli.parse_config(defaults, ["--k=auto"])


# ---------------------------------------------------------------- issue 30: CPU threads


def test_cpu_threads_are_the_free_cores_unless_the_user_chose():
    """The rule (throughput.cpu_threads): the cores minus the 1-minute load, shared by the
    processes, rounded, at least 1; OMP_NUM_THREADS / MKL_NUM_THREADS or a torch.set_num_threads
    of this process win. torch's default (every core) on a busy 2-core machine ran 20x slower."""
    from throughput import cpu_threads
    assert cpu_threads(2, 0.0, {}, current=2, default=2)[0] == 2, "idle: every core"
    assert cpu_threads(2, 0.3, {}, current=2, default=2)[0] == 2, "noise is not a taken core"
    assert cpu_threads(2, 0.7, {}, current=2, default=2)[0] == 1
    assert cpu_threads(2, 2.6, {}, current=2, default=2)[0] == 1, "busy: at least one"
    assert cpu_threads(16, 3.8, {}, current=16, default=16)[0] == 12
    assert cpu_threads(16, 40.0, {}, current=16, default=16)[0] == 1
    assert cpu_threads(16, 0.0, {}, current=16, default=16, processes=4)[0] == 4, "torchrun's ranks share them"
    threads, why = cpu_threads(16, 0.0, {"OMP_NUM_THREADS": "3"}, current=3, default=3)
    assert (threads, why) == (3, "from OMP_NUM_THREADS=3")
    assert cpu_threads(16, 9.0, {"MKL_NUM_THREADS": "8"}, current=8, default=8) == (8, "from MKL_NUM_THREADS=8")
    assert cpu_threads(2, 2.6, {"OMP_NUM_THREADS": ""}, current=2, default=2)[0] == 1, "an empty variable is unset"
    assert cpu_threads(2, 0.0, {}, current=1, default=2) == (1, None), "torch.set_num_threads(1) was called"
    threads, why = cpu_threads(2, 1.3, {}, current=2, default=2)
    assert threads == 1 and why == "2 cores, 1-minute load 1.3; OMP_NUM_THREADS=N chooses"


def test_a_cpu_run_says_its_threads_and_gives_them_back(bert_like_shards, tmp_path, capsys, monkeypatch):
    import throughput
    import torch
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(throughput, "TORCH_DEFAULT_THREADS", before)  # as if untouched since import
    monkeypatch.setattr(throughput.os, "getloadavg", lambda: (99.0, 0.0, 0.0))
    seen = []
    monkeypatch.setattr(train_lm, "train", lambda cfg, run, shards: seen.append(torch.get_num_threads()))
    train_lm.main(lm_args(bert_like_shards, tmp_path / "o", "--vocab_size=30528", "--eos_id=102"))
    assert seen == [1] and torch.get_num_threads() == before, "one thread on a loaded machine, then restored"
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("CPU threads")]
    assert len(lines) == 1 and lines[0].startswith("CPU threads: 1 (") and "load 99.0" in lines[0]


# ---------------------------------------------------------------- issue 30: a GPU config on a CPU machine


def test_a_gpu_config_with_device_auto_on_a_cpu_machine_is_refused_before_the_data(tmp_path, monkeypatch):
    """llama_350m_simreg.py (device=auto) on a machine without CUDA: one process of a 405M model, or
    torchrun's 8 ranks of anything, stop on the first line, saying what --device=cpu would do;
    the missing shards (the next check) are never reached."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpu = [str(ROOT / "configs" / "llama_350m_simreg.py"), f"--out_dir={tmp_path / 'o'}",
           f"--train_shards={tmp_path}/none_*.bin"]
    with pytest.raises(cli.ConfigError, match=r"device=auto found no CUDA GPU: a 405M-parameter model would train on "
                                              r"the CPU \(~6\.5 GB with AdamW, slowly\).*pass --device=cpu"):
        train_lm.main(gpu)
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(cli.ConfigError, match=r"8 processes would each train a 405M-parameter model on the CPU "
                                              r"\(gloo\), ~6\.5 GB each with AdamW, 52 GB in all"):
        train_lm.main(gpu)
    tiny = [str(ROOT / "configs" / "tiny_lm.py"), "--device=auto", f"--train_shards={tmp_path}/none_*.bin"]
    with pytest.raises(cli.ConfigError, match="8 processes would each train a 0M-parameter model"):
        train_lm.main(tiny)
    import train_splade
    with pytest.raises(cli.ConfigError, match="8 processes would each train the model on the CPU"):
        train_splade.main([str(ROOT / "configs" / "splade_modernbert_k16.py"), f"--out_dir={tmp_path / 's'}"])
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(cli.MissingInput, match="no token shards match"):  # explicit: the CPU it is
        train_lm.main(gpu + ["--device=cpu"])
    with pytest.raises(cli.MissingInput, match="no token shards match"):  # a small model in one process
        train_lm.main(tiny)


@pytest.mark.slow
def test_under_torchrun_the_device_refusal_is_rank_0s_first_line_and_torchrun_root_cause(tmp_path):
    """torchrun stops every worker when the first one ends and names the earliest error file the
    root cause; the other ranks wait (cli.RANK_EXIT_DELAY_S), so rank 0 prints the line before
    anything else of the job and torchrun's summary ends with rank 0's copy of it."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}  # unset: torchrun's banner comes first
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(ROOT / "train_lm.py"),
           str(ROOT / "configs" / "llama_350m_simreg.py"), f"--out_dir={tmp_path}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    lines = (p.stdout + p.stderr).splitlines()
    assert p.returncode == 1 and lines[0].startswith("error: device=auto found no CUDA GPU: 2 processes"), p.stderr
    assert [ln for ln in lines if ln.startswith("error:")] == [lines[0]], "printed once"
    root_cause = p.stderr.split("Root Cause (first observed failure):")[1]
    assert "rank      : 0 (local_rank: 0)" in root_cause and "exitcode  : 2" in root_cause
    assert root_cause.strip().splitlines()[-2].strip() == f"traceback : {lines[0]}", "the summary ends with it"
    assert not (tmp_path / "log.jsonl").exists()
