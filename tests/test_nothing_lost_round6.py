"""Nothing lost, round 6 (issue 42), each case a test that failed on the code before it: a same-size
change to an index array or to a checkpoint's files, a full disk in every command that writes, a
driver's jobs and its exit status, a query with no text after tokenisation, a driver's stale copies,
the messages of a resume, a tied head and a pruned backbone, an error while a progress bar is open,
and the identity of texts held in memory. Every input is generated here."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import cli
import data.atomic
import model as M
from hf.models import save_pretrained
import train_lm
from eval import retrieval as R
from experiments.runner import Driver, Job, Report, run_jobs
from hf.safetensors_io import read_header
from test_config_rules import run as run_cli  # (exit status, stderr) of a main as its command line runs it
from test_shards import corpus  # noqa: F401 - a fixture
from test_retrieval import tiny_dataset, tiny_splade, tiny_tokenizer, write_beir_folder
from test_stamp_matrix import ndcg, refused_in_one_line, retrieval_command, steps_saved, with_out
from test_train_lm import args as lm_args
from test_train_lm import log, shards  # noqa: F401 - shards is a fixture

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")
FREE = 272 * 1024   # what a full disk shows as free: less than a megabyte


@pytest.fixture
def full_disk(monkeypatch):
    """full_disk(part): every write through data/atomic.py to a file whose path holds `part` fails as
    a full disk does (ENOSPC from write), and the disk shows FREE bytes free."""
    real_open = open

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    def fill(part):
        def failing_open(path, mode="r", *a, **kw):
            f = real_open(path, mode, *a, **kw)
            return Full(f) if "w" in mode and part in str(path) else f
        monkeypatch.setattr(data.atomic, "open", failing_open, raising=False)
        monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 40, (1 << 40) - FREE, FREE))
    return fill


def one_error_line(status, err):
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


# ---------------------------------------------------------------- 1. an index array changed in place


def test_case1_a_same_size_change_to_an_index_array_is_seen_and_the_index_built_again(tmp_path, capsys):
    """Bytes of index/postings_weights.npy changed, the size kept: the index is built again, with a
    line naming the file, and the number is the untouched index's (before: used without a word,
    another nDCG@10)."""
    s = retrieval_command().setup(tmp_path)
    assert run_cli(R.main, s["argv"], capsys)[0] == 0
    before = ndcg(s["out"])
    weights = s["out"] / "coll" / "index" / "postings_weights.npy"
    raw = bytearray(weights.read_bytes())
    values = np.frombuffer(raw, np.float32, offset=len(raw) - 4 * 64)
    values *= 5.0                                                 # the last 64 weights, five times larger
    weights.write_bytes(bytes(raw))
    status, err = run_cli(R.main, s["argv"], capsys)
    assert status == 0 and "postings_weights.npy" in err and "computing it again" in err, err
    assert ndcg(s["out"]) == before


# ---------------------------------------------------------------- 2. checkpoint files changed in place


def change_weights(path, n=256):
    """n values of the largest tensor of a safetensors file changed (finite, the size kept)."""
    header, start = read_header(path)
    begin, end = max((v["data_offsets"] for k, v in header.items() if k != "__metadata__"),
                     key=lambda o: o[1] - o[0])
    raw = bytearray(path.read_bytes())
    values = np.frombuffer(raw, np.float32, count=n, offset=start + begin)
    values += 0.5
    path.write_bytes(bytes(raw))


def test_case2_changed_checkpoint_weights_fall_back_to_the_checkpoint_before(shards, tmp_path, capsys):  # noqa: F811
    """256 weights changed in the newest checkpoint's model.safetensors: the resume skips it with a
    line naming the file and continues from the one before, which gives the losses of an untouched
    run (before: resumed from the changed weights without a word)."""
    a = lm_args(shards, tmp_path / "run", max_steps=20, ckpt_interval=10)
    train_lm.main(a)
    untouched = tmp_path / "untouched"
    shutil.copytree(tmp_path / "run", untouched)
    newest = tmp_path / "run" / "checkpoints" / "step_00000020"
    change_weights(newest / "model" / "model.safetensors")
    status, err = run_cli(train_lm.main, a + ["--max_steps=25"], capsys)
    assert status == 0 and f"skipping checkpoint {newest}" in err and "model/model.safetensors" in err, err
    assert [r["step"] for r in log(tmp_path / "run") if "loss" in r] == list(range(1, 26)), "resumed from step 10"
    b = [x.replace(str(tmp_path / "run"), str(untouched)) for x in a]
    older = untouched / "checkpoints" / "step_00000010"
    assert run_cli(train_lm.main, b + ["--max_steps=25", f"--resume={older}"], capsys)[0] == 0
    assert [r["loss"] for r in log(tmp_path / "run")] == [r["loss"] for r in log(untouched)]


def test_case2_a_changed_optimizer_state_named_by_resume_is_refused_in_one_line(shards, tmp_path, capsys):  # noqa: F811
    a = lm_args(shards, tmp_path, max_steps=10, ckpt_interval=10)
    train_lm.main(a)
    folder = tmp_path / "checkpoints" / "step_00000010"
    opt = folder / "optimizer.pt"
    raw = bytearray(opt.read_bytes())
    raw[len(raw) // 2] ^= 1
    opt.write_bytes(bytes(raw))
    status, err = run_cli(train_lm.main, a + ["--max_steps=12", f"--resume={folder}"], capsys)
    line = one_error_line(status, err)
    assert "optimizer.pt" in line and str(folder) in line
    status, err = run_cli(train_lm.main, a + ["--max_steps=12"], capsys)   # the only checkpoint: refused too
    assert status == 2 and "optimizer.pt" in err and "none is valid" in err
    assert steps_saved(tmp_path) == [10]


def test_case2_a_changed_checkpoint_model_given_as_init_from_is_refused_in_one_line(shards, tmp_path, capsys):  # noqa: F811
    a = lm_args(shards, tmp_path / "run", max_steps=4, ckpt_interval=4)
    train_lm.main(a)
    model = tmp_path / "run" / "checkpoints" / "step_00000004" / "model"
    change_weights(model / "model.safetensors")
    line = one_error_line(*run_cli(train_lm.main, lm_args(shards, tmp_path / "cpt", max_steps=2)
                                   + [f"--init_from={model}"], capsys))
    assert str(model) in line and "model/model.safetensors is not the file that was saved" in line


def test_case2_a_driver_s_step0_model_changed_in_place_is_saved_again(tmp_path, capsys, monkeypatch):
    """The starting model repro_splade_rescaling saves once and evaluates (step0/<digest>/model):
    before, its changed weights were reused because the file existed."""
    from test_driver_inputs import executed, splade
    module, argv = splade(tmp_path, monkeypatch)
    monkeypatch.setattr(module, "pyplot", lambda: None)
    module.main(argv)
    (weights,) = (tmp_path / "out" / "step0").glob("*/model/model.safetensors")
    original = weights.read_bytes()
    change_weights(weights)
    capsys.readouterr()
    module.main(argv)
    assert "is not the model its save wrote" in capsys.readouterr().err
    assert weights.read_bytes() == original and executed(tmp_path / "out") == []


# ---------------------------------------------------------------- 3. a full disk, one line everywhere


def test_case3_a_full_disk_in_a_driver_is_one_line_with_the_real_free_space(tmp_path, capsys, full_disk, monkeypatch):
    """repro_splade_rescaling saving its step-0 model on a full disk (before: an OSError traceback
    from splade_protocol.prepare_step0 -> save_safetensors)."""
    from experiments import repro_splade_rescaling
    from test_driver_inputs import splade
    module, argv = splade(tmp_path, monkeypatch)
    monkeypatch.setattr(module, "pyplot", lambda: None)
    full_disk("model.safetensors")
    line = one_error_line(*run_cli(repro_splade_rescaling.main, argv, capsys))
    assert "no space left on the device of" in line and "model.safetensors" in line and "272.0 KB" in line, line


def test_case3_a_full_disk_under_a_driver_s_out_dir_names_the_file_that_failed(tmp_path, capsys, full_disk,
                                                                                 monkeypatch):
    """Every write under out_dir fails: the line names pairs.tsv, the first file written (before: a
    pairs.tmp written outside data/atomic.py stayed, filling the disk, and the driver's timing.json,
    written on the way out, failed too and its line replaced pairs.tsv's)."""
    from experiments import repro_splade_rescaling
    from test_driver_inputs import splade
    module, argv = splade(tmp_path, monkeypatch)
    full_disk(str(tmp_path / "out"))
    line = one_error_line(*run_cli(repro_splade_rescaling.main, argv, capsys))
    assert "pairs.tsv" in line and "timing.json" not in line, line
    assert not list((tmp_path / "out").glob("pairs*")), "no temporary file left"


def test_case3_a_full_disk_in_an_export_is_one_line_and_leaves_nothing(tmp_path, capsys, full_disk):
    from hf.models import export_main
    model = tmp_path / "model"
    save_pretrained(tiny_splade(), model, tokenizer=tiny_tokenizer())
    full_disk("model.safetensors")
    out = tmp_path / "exported"
    line = one_error_line(*run_cli(export_main, ["--export", str(model), str(out)], capsys))
    assert str(out) in line and "272.0 KB" in line, line
    assert not list(tmp_path.glob("exported*")), "no folder and no lock left"


def test_case3_a_full_disk_in_data_preparation_is_one_line(tmp_path, capsys, full_disk, corpus):  # noqa: F811
    from test_shards import run_prepare
    full_disk("corpus_train_000002")
    line = one_error_line(*run_cli(lambda argv: run_prepare(corpus, tmp_path / "out"), [], capsys))
    assert "corpus_train_000002.bin" in line and "272.0 KB" in line and "run the same command again" in line, line


def test_case3_a_retrieval_on_a_full_disk_says_the_real_free_space_and_leaves_no_older_number(tmp_path, capsys,
                                                                                              full_disk):
    """With 272 KB free the message said "0 MB are free", and the metrics.json of an earlier run stayed,
    so that its number looked like this run's."""
    s = retrieval_command().setup(tmp_path)
    assert run_cli(R.main, s["argv"], capsys)[0] == 0
    full_disk("chunk-000001")
    line = one_error_line(*run_cli(R.main, s["argv"] + ["--max-len", "16"], capsys))
    assert "272.0 KB are free" in line, line
    assert not (s["out"] / "metrics.json").exists() and not (s["out"] / "coll" / "metrics.json").exists()


def test_case3_a_full_disk_that_no_command_explains_is_still_one_line_naming_the_file(tmp_path, capsys, full_disk):
    """A write outside data/atomic.py (a log appended to): the line names the file and the space free."""
    full_disk("nothing")

    def main(argv):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "log.jsonl"))
    line = one_error_line(*run_cli(main, [], capsys))
    assert str(tmp_path / "log.jsonl") in line and "272.0 KB free" in line, line


# ---------------------------------------------------------------- 4. a driver's jobs and its exit status


SLEEPER = """import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""

DRIVER = """import sys
sys.path.insert(0, {root!r})
from experiments.runner import Job, run_jobs
run_jobs([Job("sleep", {script!r}, [{pid_file!r}])], slots=1, threads=1)
"""


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped by its new parent) is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_case4_a_driver_killed_with_sigkill_takes_its_jobs_with_it(tmp_path):
    """Before: the job kept running, and the rerun's job failed, its out_dir "in use by another
    training run"."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pid_file = tmp_path / "job.pid"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(root=str(ROOT), script=str(tmp_path / "sleeper.py"),
                                                                    pid_file=str(pid_file))])
    job = None
    try:
        for _ in range(300):
            if pid_file.exists() and pid_file.read_text():
                job = int(pid_file.read_text())
                break
            time.sleep(0.1)
        assert job is not None, "the job did not start"
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        for _ in range(100):
            if not alive(job):
                break
            time.sleep(0.1)
        assert not alive(job), "the job outlived its driver"
    finally:
        driver.kill()
        if job is not None and alive(job):
            os.kill(job, signal.SIGKILL)


HOLDER = """import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
open(sys.argv[2], "w").write("locked")
time.sleep(float(sys.argv[3]))
"""
LOCKING_JOB = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    print("error: in use by another training run", file=sys.stderr)
    sys.exit(2)
print("ran")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="/proc tells a job's driver")
@pytest.mark.parametrize("driver_gone", [True, False])
def test_case4_a_rerun_waits_for_the_killed_driver_s_job_to_let_go_of_its_folder(tmp_path, capsys, driver_gone):
    """Before: a driver run again right after SIGKILL started its job while the old one was still
    saving (after its SIGTERM), and the job failed "in use". A job of a gone driver is waited for;
    a lock of another run (its driver alive: here, this test) is refused at once, as before."""
    from experiments import runner
    folder = tmp_path / "run"
    folder.mkdir()
    (tmp_path / "holder.py").write_text(HOLDER)
    (tmp_path / "job.py").write_text(LOCKING_JOB)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()                                   # a driver pid that has ended
    env = {**os.environ, runner.DRIVER_PID: str(gone.pid if driver_gone else os.getpid())}
    holder = subprocess.Popen([sys.executable, str(tmp_path / "holder.py"), str(folder / "RUN.lock"),
                               str(tmp_path / "locked"), "3"], env=env)
    try:
        for _ in range(200):
            if (tmp_path / "locked").exists():
                break
            time.sleep(0.05)
        t0 = time.time()
        outcome = run_jobs([Job("train", str(tmp_path / "job.py"), [str(folder / "RUN.lock")], output=folder,
                                log=tmp_path / "job.log")], slots=1, threads=1)
        waited = time.time() - t0
    finally:
        holder.kill()
        holder.wait()
    out = capsys.readouterr().out
    if driver_gone:
        assert not outcome.failed and "ran" in (tmp_path / "job.log").read_text()
        assert f"waiting for pid {holder.pid}" in out and "its driver is gone" in out and waited > 1.5
    else:
        assert list(outcome.failed) == ["train"] and "waiting" not in out and waited < 2.5


FAILING = """import sys
print("working")
print("error: the input is bad: fix it", file=sys.stderr)
sys.exit(2)
"""


def tiny_driver(tmp_path, slots):
    (tmp_path / "failing.py").write_text(FAILING)
    (tmp_path / "fine.py").write_text("print('fine')\n")

    def plan(C, out):
        return [Job("good", str(tmp_path / "fine.py"), [], log=out / "good.log",
                    done=lambda: (out / "good.log").exists()),
                Job("bad", str(tmp_path / "failing.py"), [], log=out / "bad.log")]
    return Driver(__file__, dict(out_dir=str(tmp_path / "out"), jobs=slots, threads=1, action="all"), plan,
                  lambda C, out, outcome: Report("# the table\n", {"failed": sorted(outcome.failed)}))


def test_case4_a_driver_whose_job_failed_exits_non_zero_naming_it_and_its_log_s_last_line(tmp_path, capsys):
    """Before: the table said the job failed, and the driver exited 0."""
    driver = tiny_driver(tmp_path, 1)
    status, err = run_cli(driver.main, [], capsys)
    line = one_error_line(status, err)
    assert "bad" in line and "error: the input is bad: fix it" in line and str(tmp_path / "out" / "bad.log") in line
    assert json.loads((tmp_path / "out" / "results.json").read_text())["failed"] == ["bad"], "the report is written"
    assert run_cli(driver.main, ["--action=table"], capsys)[0] == 0, "a table runs nothing: nothing failed"


# ---------------------------------------------------------------- 5. a query with no text after tokenisation


def normalising_setup(tmp_path, queries):
    """retrieval_command's inputs, with a tokenizer that drops control and zero-width characters
    (as BERT's does) and the queries' texts of `queries`."""
    from tokenizers import normalizers
    tok = tiny_tokenizer()
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=False,
                                                lowercase=False)
    model = tmp_path / "model"
    save_pretrained(tiny_splade(), model, tokenizer=tok)
    ds = tiny_dataset()
    ds.queries.update(queries)
    write_beir_folder(tmp_path / "coll", ds)
    return ["--model", str(model), "--bench", str(tmp_path / "coll"), "--out", str(tmp_path / "R"), "--chunk-size",
            "16", "--no-progress"], ds


def test_case5_a_query_with_no_text_after_tokenisation_is_warned_about_and_counted_empty(tmp_path, capsys):
    """Before: "\\u200b\\u200b \\u0001" was scored from the special tokens alone, without a warning,
    the `empty` column 0, also under --strict."""
    argv, ds = normalising_setup(tmp_path, {"q1": "\u200b\u200b \u0001"})
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        status, err = run_cli(R.main, argv, capsys)
    assert status == 0, err
    record = json.loads((tmp_path / "R" / "metrics.json").read_text())["datasets"]["coll"]
    assert record["num_queries"] == len(ds.qrels) and record["num_empty_queries"] >= 1
    assert record["per_query"]["q1"]["nDCG@10"] == 0
    run = (tmp_path / "R" / "coll" / "run.trec").read_text().splitlines()
    assert not [line for line in run if line.split()[0] == "q1"], "nothing retrieved for it"
    assert any("q1" in str(w.message) and "no text after tokenisation" in str(w.message) for w in said)
    status, err = run_cli(R.main, argv + ["--strict"], capsys)
    line = one_error_line(status, err)
    assert "q1" in line and "no text after tokenisation" in line


# ---------------------------------------------------------------- 6. a driver's stale copies


VALUE_JOB = """import sys
from pathlib import Path
out, value = sys.argv[1].split("=", 1)[1], sys.argv[2]
Path(out).mkdir(parents=True, exist_ok=True)
(Path(out) / "result.txt").write_text(value)
with open(Path(out).parent / "ran.txt", "a") as f:  # not an argument: not in the job's key
    f.write(value + "\\n")
"""


def older(out):
    """The outputs of other keys kept beside `out` (data/manifest.py aside)."""
    return [p for p in out.parent.glob(out.name + ".*") if p.is_dir()]


def test_case6_a_driver_takes_a_matching_stale_copy_back_and_keeps_at_most_two(tmp_path, capsys):
    """Three changes of a job's arguments left three stale copies of its output, and going back to an
    earlier value computed it again (retrieval took it back)."""
    script = tmp_path / "value_job.py"
    script.write_text(VALUE_JOB)
    out, ran = tmp_path / "run", tmp_path / "ran.txt"

    def job(value):
        return Job("job", str(script), [f"--out_dir={out}", value], output=out,
                   done=lambda: (out / "result.txt").exists())
    for value in ("1", "2", "3", "4"):
        run_jobs([job(value)], slots=1, threads=1)
    assert ran.read_text().split() == ["1", "2", "3", "4"]
    assert len(older(out)) == 2, "at most two older outputs"
    capsys.readouterr()
    outcome = run_jobs([job("3")], slots=1, threads=1)
    assert ran.read_text().split() == ["1", "2", "3", "4"], "value 3's output was taken back, not computed again"
    assert outcome.skipped == ["job"] and (out / "result.txt").read_text() == "3"
    assert "took it back" in capsys.readouterr().err
    assert len(older(out)) == 2


# ---------------------------------------------------------------- 7. messages that say what happened


def test_case7_a_resume_says_the_run_s_saved_value_differs_from_this_command_s(shards, tmp_path, capsys):  # noqa: F811
    """Before: "saved 2.0, now 1.0 ... drop those overrides", though this command gave no override."""
    a = lm_args(shards, tmp_path, max_steps=4, ckpt_interval=4)
    assert run_cli(train_lm.main, a + ["--head_lr_scale=2", "--seed=3"], capsys)[0] == 0
    line = one_error_line(*run_cli(train_lm.main, a + ["--max_steps=6"], capsys))
    assert "head_lr_scale: saved 2.0, this command 1.0" in line and "seed: saved 3, this command 1337" in line, line
    assert "--head_lr_scale=2.0 --seed=3" in line and "override" not in line


def test_case7_a_head_learning_rate_scale_on_a_tied_head_says_what_it_scales(shards, tmp_path, capsys):  # noqa: F811
    a = lm_args(shards, tmp_path, max_steps=2, ckpt_interval=2)
    status, err = run_cli(train_lm.main, a + ["--head_lr_scale=8", "--tie_embeddings=True"], capsys)
    assert status == 0 and "head_lr_scale=8" in err and "tied" in err, err
    status, err = run_cli(train_lm.main, lm_args(shards, tmp_path / "untied", max_steps=2, ckpt_interval=2)
                          + ["--head_lr_scale=8"], capsys)
    assert status == 0 and "tied" not in err


def test_case7_a_backbone_at_a_step_pruning_removes_is_refused_before_pretraining(tmp_path, monkeypatch):
    """Before: bert@2 with keep_checkpoints=1 pretrained, then failed with a raw [Errno 2]."""
    from experiments import repro_heads
    from test_driver_inputs import heads
    module, argv = heads(tmp_path, monkeypatch)
    argv = [a.replace("'--max_steps=2'", "'--max_steps=4', '--keep_checkpoints=1'") if a.startswith("--pretrain_args")
            else a.replace("['bert']", "['bert', 'bert@2']") if a.startswith("--splade_backbones") else a for a in argv]
    with pytest.raises(cli.ConfigError, match=r"bert@2.*pruned while it pretrains.*keep_checkpoints=1: steps 4"
                                              r".*keep_checkpoints=2"):
        module.main(argv)
    assert not (tmp_path / "out" / "pretrain").exists(), "nothing was trained"


def test_case7_a_backbone_at_a_step_whose_checkpoint_is_gone_is_refused_naming_it(tmp_path, monkeypatch):
    """The run pretrained with every checkpoint kept, then its step-2 folder deleted by hand: bert@2 is
    refused before anything runs, saying the checkpoint is gone and how to get it back."""
    from test_driver_inputs import heads
    module, argv = heads(tmp_path, monkeypatch)
    argv = [a.replace("'--max_steps=2'", "'--max_steps=4'") if a.startswith("--pretrain_args") else a for a in argv]
    module.main(argv)
    step2 = tmp_path / "out" / "pretrain" / "bert" / "checkpoints" / "step_00000002"
    assert step2.is_dir()
    shutil.rmtree(step2)
    argv = [a.replace("['bert']", "['bert', 'bert@2']") if a.startswith("--splade_backbones") else a for a in argv]
    before = sorted(p.name for p in (tmp_path / "out" / "splade").iterdir())
    with pytest.raises(cli.ConfigError, match=r"bert@2.*step 2 is pruned \(it is gone from its out_dir\).*"
                                              r"pretrain it again \(a new out_dir\)"):
        module.main(argv)
    assert sorted(p.name for p in (tmp_path / "out" / "splade").iterdir()) == before, "nothing ran"


def test_case7_an_error_while_a_progress_bar_is_open_starts_a_line_of_its_own(capsys):
    from tqdm import tqdm

    def main(argv):
        bar = tqdm(total=10, desc="encode")
        bar.update(3)
        raise cli.UserError("the input is bad")
    status, err = run_cli(main, [], capsys)
    assert status == 2 and err.split("\n")[-2] == "error: the input is bad", repr(err)


# ---------------------------------------------------------------- 8. the identity of texts in memory


def test_case8_texts_in_memory_with_the_same_ids_and_another_text_are_another_input(tmp_path, capsys):
    """retrieval's corpus_identity of corpora held in memory: the same ids with another text are another
    input, for the key and for a retrieval."""
    def identity(pairs):
        return R.corpus_identity(dict(pairs))
    assert identity([("d1", "a b c"), ("d2", "d e")]) != identity([("d1", "a b c"), ("d2", "d f")])
    assert identity([("d1", "a b c"), ("d2", "d e")]) != identity([("d1", "a b"), ("d2", "c d e")])
    model, tok, ds = tiny_splade(), tiny_tokenizer(), tiny_dataset()
    out = tmp_path / "R"
    R.evaluate_splade(model, tok, ds, out, max_len=32, chunk_size=16, progress=False)
    ds.corpus["d0"] = ds.queries["q0"]                       # the same ids, another text
    capsys.readouterr()
    again = R.evaluate_splade(model, tok, ds, out, max_len=32, chunk_size=16, progress=False)
    assert "made from other inputs (corpus/texts" in capsys.readouterr().err
    fresh = R.evaluate_splade(model, tok, ds, tmp_path / "fresh", max_len=32, chunk_size=16, progress=False)
    assert again["datasets"] == fresh["datasets"]
