"""A result is reused only when everything it came from is the same (issue 26; data/manifest.py):
retrieval after the corpus changed, fine-tuning with other settings, two data preparations on one
folder and shards of mixed preparations, markers cut to 0 bytes by a kill, and a training run
resumed on another number of processes. Every input is generated here; each test takes seconds."""
import json
import os
import re
import shutil

import numpy as np
import pytest

import checkpoint
import cli
import train_lm
from data import shards as shards_cli
from data import manifest
from data.fineweb_edu import PreparationError, prepare
from data.ir_datasets import load_beir_folder
from eval import finetune as FT
from eval import retrieval as R
from experiments import simreg_sweep, splade_sweep
from test_finetune import quick_cfg, tiny_model, write_sc_folder  # noqa: F401 - tiny_model is a fixture
from test_repro_simreg import no_plots, text_file, tiny_args  # noqa: F401 - fixtures
from test_retrieval import tiny_dataset, tiny_splade, tiny_tokenizer, write_beir_folder
from test_shards import corpus, run_prepare, shards_of  # noqa: F401 - corpus is a fixture
from test_stamp_matrix import older
from test_train_lm import args, log, shards  # noqa: F401 - shards is a fixture

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- the stamp itself


def test_identity_is_content_not_path_or_mtime(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("the corpus")
    copy = tmp_path / "elsewhere" / "a.txt"
    copy.parent.mkdir()
    shutil.copy(a, copy)
    os.utime(copy, (1, 1))  # a copy or a `touch` is the same input ...
    assert manifest.identity(copy) == manifest.identity(a)
    copy.write_text("the c0rpus")  # ... an edit of the same size is not
    assert manifest.identity(copy) != manifest.identity(a)
    big = tmp_path / "big.bin"  # larger than the 64 MiB that were hashed whole before issue 35
    big.write_bytes(b"x" * (65 << 20))
    before = manifest.identity(big)
    with open(big, "r+b") as f:
        f.seek(32 << 20)
        f.write(b"y")
    assert manifest.identity(big) != before, "an edit in the middle of a large file is seen"


# ---------------------------------------------------------------- 1: retrieval after the corpus changed


@pytest.mark.parametrize("in_memory", [True, False], ids=["corpus in memory", "corpus streamed"])
def test_a_changed_corpus_is_encoded_again_and_gives_the_fresh_number(tmp_path, capsys, in_memory):
    """Same ids, other texts: the vectors and index under --out are not reused; the numbers are
    those of a fresh --out (today's code reported the old corpus's numbers)."""
    model, tok, ds = tiny_splade(), tiny_tokenizer(), tiny_dataset()
    folder = write_beir_folder(tmp_path / "coll", ds)

    def evaluate(out):
        bench = load_beir_folder(folder, name="coll", corpus_in_memory=in_memory)
        return R.evaluate_splade(model, tok, bench, out, progress=False, chunk_size=16)["mean"]["nDCG@10"]

    before = evaluate(tmp_path / "R")
    other = tiny_dataset(seed=7)
    changed = dict(zip(ds.corpus, other.corpus.values()))  # the same ids, other texts
    with open(folder / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps({"_id": d, "title": "", "text": t}) + "\n" for d, t in changed.items())
    capsys.readouterr()
    again = evaluate(tmp_path / "R")
    fresh = evaluate(tmp_path / "fresh")
    assert fresh != before, "the test needs a corpus change that changes the number"
    assert again == fresh, f"reused the old corpus's vectors: {again} (fresh --out: {fresh})"
    err = capsys.readouterr().err
    assert "the encoded corpus" in err and "corpus/" in err and "made from other inputs" in err
    assert [manifest.read(p) is not None for p in older(tmp_path / "R" / "coll" / "vectors")] == [True], \
        "the old vectors are kept beside"
    assert len(older(tmp_path / "R" / "coll" / "index")) == 1, "and the index built from them"


# ---------------------------------------------------------------- 2: fine-tuning with other settings


def test_finetuning_with_other_settings_runs_again(tiny_model, tmp_path, capsys):  # noqa: F811
    """--steps 4 then --steps 12, then another --max-train, then other training data: each reruns every
    run (today: "executed 0, skipped 4" and the old table printed as the new one)."""
    task = f"sc:kw={write_sc_folder(tmp_path / 'kw')}"
    out, grid = tmp_path / "F", dict(lrs=(1e-3,), seeds=(0, 1))

    def ran(**cfg):
        result = FT.run_grid([tiny_model], [task], out=out, cfg=quick_cfg(max_len=32, **cfg), **grid)
        runs = [json.loads(FT.run_path(out, tiny_model, "kw", 1e-3, s).read_text()) for s in (0, 1)]
        return result, runs

    first, _ = ran(steps=4)
    assert (first["executed"], first["skipped"]) == (2, 0)
    assert ran(steps=4)[0]["skipped"] == 2, "the same settings are reused"
    capsys.readouterr()
    longer, runs = ran(steps=12)
    assert (longer["executed"], longer["skipped"]) == (2, 0)
    assert [r["train"]["steps"] for r in runs] == [12, 12]
    assert "steps 4 -> 12" in capsys.readouterr().err
    assert list(FT.run_path(out, tiny_model, "kw", 1e-3, 0).parent.glob("lr0.001_seed0.json.*")), "the old run is kept"
    assert longer["rows"][0]["test_mean"] == pytest.approx(100 * np.mean([r["test"]["accuracy"] for r in runs]))
    assert ran(steps=12, max_train=50)[0]["executed"] == 2, "another --max-train"
    train = tmp_path / "kw" / "train.tsv"
    train.write_text(train.read_text().replace("good", "w1", 3))
    assert ran(steps=12, max_train=50)[0]["executed"] == 2, "other training data"


# ---------------------------------------------------------------- 3: one writer per data folder


def test_a_second_preparation_on_the_same_out_is_refused_while_the_first_runs(corpus, tmp_path):  # noqa: F811
    """The second preparation starts while the first is between shards (today both ran, mixing
    shards of both sizes in one folder); the first ends with the shards of an undisturbed run."""
    refused = []

    def second(i, path):  # after the first shard file, before its progress record: as if both had just started
        if i == 0:
            with pytest.raises(PreparationError, match=f"being written by another preparation \\(pid {os.getpid()}"):
                run_prepare(corpus, tmp_path / "out", shard_tokens=400)
            refused.append(i)

    run_prepare(corpus, tmp_path / "out", on_shard=second)
    run_prepare(corpus, tmp_path / "ref")
    assert refused == [0]
    out, ref = ([p.read_bytes() for p in shards_of(tmp_path / o)] for o in ("out", "ref"))
    assert out == ref, "the first preparation's shards are those of an undisturbed run"


def test_a_progress_record_of_other_settings_without_a_shard_is_refused(corpus, tmp_path):  # noqa: F811
    """A preparation killed before its first shard left its record; another --shard-tokens must not
    overwrite it (today it did, silently)."""
    run_prepare(corpus, tmp_path / "done")
    record = json.loads((tmp_path / "done" / "corpus_progress.json").read_text())
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "corpus_progress.json").write_text(json.dumps({**record, "shards": [], "done": False}))
    with pytest.raises(PreparationError, match="progress record \\(no shard yet\\).*differs in: shard_tokens"):
        run_prepare(corpus, tmp_path / "out", shard_tokens=400)
    assert json.loads((tmp_path / "out" / "corpus_progress.json").read_text())["settings"]["shard_tokens"] == 500


def test_verify_finds_shards_of_two_preparations_in_one_folder(corpus, tmp_path, capsys):  # noqa: F811
    """Shards of --shard-tokens 400 written over some of a 500-token preparation's (what two
    preparations at once left): --verify names them (today: every shard ok, 0 bad)."""
    run_prepare(corpus, tmp_path / "out")
    run_prepare(corpus, tmp_path / "other", shard_tokens=400)
    mine = shards_of(tmp_path / "out")
    for theirs in shards_of(tmp_path / "other")[2:]:
        shutil.copy(theirs, tmp_path / "out" / theirs.name)
    with pytest.raises(SystemExit) as e:
        shards_cli.main(["--verify", str(tmp_path / "out" / "*.bin")])
    assert e.value.code == 2
    captured = capsys.readouterr()
    bad = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(bad) == len(shards_of(tmp_path / "out")) - 2, captured.err
    assert "corpus_progress.json" in bad[0] and "one preparation per --out" in bad[0]
    assert all(f"ok: {p}" in captured.out for p in mine[:2]), "the shards of the preparation itself are good"


# ---------------------------------------------------------------- 4: markers cut to 0 bytes


def test_zero_byte_retrieval_markers_are_recomputed_not_a_crash(tmp_path):
    model, tok, ds = tiny_splade(), tiny_tokenizer(), tiny_dataset()
    first = R.evaluate_splade(model, tok, ds, tmp_path, progress=False, chunk_size=16)
    for marker in ("tiny/vectors/MANIFEST.json", "tiny/index/MANIFEST.json", "tiny/metrics.json", "metrics.json"):
        (tmp_path / marker).write_bytes(b"")  # what a kill during a plain write_text left
    again = R.evaluate_splade(model, tok, ds, tmp_path, progress=False, chunk_size=16)
    assert again["mean"] == first["mean"]
    for marker in ("tiny/vectors/MANIFEST.json", "tiny/index/MANIFEST.json", "tiny/metrics.json", "metrics.json"):
        assert manifest.read_json(tmp_path / marker) is not None, f"{marker} was not written again"


def test_a_zero_byte_metrics_json_is_no_finished_evaluation(tmp_path, capsys):
    """splade_sweep's evaluation counted as done when metrics.json existed: a 0-byte one was
    skipped forever, and the table showed no number."""
    root = tmp_path / "sweep"
    model = root / "b_k1" / "model"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    dest = root / "b_k1" / "eval" / "nanobeir"
    dest.mkdir(parents=True)
    (dest / "metrics.json").write_bytes(b"")
    C = cli.parse_config(splade_sweep.DEFAULTS, [f"--root={root}", "--backbones={'b': 'hf:x/y'}", "--ks=[1]",
                                                 "--benchmarks=['nanobeir']", "--action=eval", "--dry_run=True"])
    splade_sweep.run_sweep(C)
    assert "1 job(s) to run" in capsys.readouterr().out


@pytest.mark.usefixtures("no_plots")
def test_zero_byte_results_of_a_sweep_are_computed_again(text_file, tmp_path, capsys):  # noqa: F811
    """simreg_sweep: a 0-byte result.json was a finished run to the runner and a JSONDecodeError to
    the table, forever; a 0-byte results.json is written again."""
    argv = [*tiny_args(tmp_path, text_file, "--mode=compare", "--d_model=16", "--seeds=[0]"),
            "--conditions={'baseline': {'simreg': False}}"]
    first = simreg_sweep.main(argv)
    result = tmp_path / "runs" / "baseline_s0" / "result.json"
    result.write_bytes(b"")
    (tmp_path / "results.json").write_bytes(b"")
    again = simreg_sweep.main(argv)
    assert not again["missing"] and manifest.read_json(result) is not None and manifest.read_json(tmp_path / "results.json")
    assert [r["final_val_loss"] for r in again["runs"]] == [r["final_val_loss"] for r in first["runs"]]


# ---------------------------------------------------------------- 8: another number of processes on resume


def steps_of(out):
    return [(r["step"], r["tokens"], r["loss"]) for r in log(out) if "loss" in r]


def as_saved_by_two_processes(out, step):
    """Make the checkpoint of a 1-process run with grad_accum=2 the one a 2-process run with
    grad_accum=1 saves: the same global batch and data position, two RNG files, trainer.json saying
    so (and the manifest its new size and hash)."""
    folder = out / "checkpoints" / f"step_{step:08d}"
    shutil.copy(folder / "rank0.pt", folder / "rank1.pt")
    trainer = json.loads((folder / "trainer.json").read_text())
    trainer.update(world_size=2, grad_accum=1, config={**trainer["config"], "grad_accum": 1})
    (folder / "trainer.json").write_text(json.dumps(trainer))
    record = json.loads((folder / "MANIFEST.json").read_text())
    record["files"] = manifest.hashes(folder, record["files"])
    (folder / "MANIFEST.json").write_text(json.dumps(record))


def test_resumed_on_one_process_the_global_batch_and_token_count_go_on(shards, tmp_path, capsys):  # noqa: F811
    """A 2-process run (batch 4 per process) resumed by 1 process: grad_accum 1 -> 2 keeps 8 rows per
    step, so the resumed run is the 1-process grad_accum=2 run step for step, and the log's tokens go
    on from the checkpoint (today: grad_accum 1, half the batch, tokens 20 480 -> 10 752 style)."""
    common = dict(batch_size=4, ckpt_interval=4)
    for out in ("ref", "two"):
        train_lm.main(args(shards, tmp_path / out, grad_accum=2, max_steps=4, **common))
    train_lm.main(args(shards, tmp_path / "ref", grad_accum=2, max_steps=8, **common))  # 1 process throughout
    resumed = tmp_path / "two"
    as_saved_by_two_processes(resumed, 4)
    capsys.readouterr()
    train_lm.main(args(shards, resumed, grad_accum=1, max_steps=8, **common))  # the 2-process run's own command
    err = capsys.readouterr().err
    ref, got = (steps_of(o) for o in (tmp_path / "ref", resumed))
    assert [t for _, t, _ in got] == [t for _, t, _ in ref] == [s * 8 * 64 for s in range(1, 9)]
    assert got == ref, "the resumed run trains on the same global batches"
    assert "grad_accum 1 -> 2" in err, "and says how it keeps them"
    trainer = json.loads((resumed / "checkpoints" / "step_00000008" / "trainer.json").read_text())
    assert (trainer["tokens"], trainer["world_size"], trainer["grad_accum"]) == (8 * 8 * 64, 1, 2)


def test_a_global_batch_no_process_count_can_keep_is_refused():
    cfg = {"out_dir": "out/x", "grad_accum": 1, "batch_size": 4, "seq_len": 64}
    state = {"step": 4, "tokens": 4 * 2 * 4 * 64, "world_size": 2, "grad_accum": 1, "config": cfg}
    with pytest.raises(cli.ConfigError, match="saved by 2 process.*resume with 1 or 2 process"):
        checkpoint.global_batch(state, cfg, 4, print)
    accum, tokens_at = checkpoint.global_batch(state, cfg, 2, print)
    assert accum == 1 and tokens_at(5) == 5 * 2 * 4 * 64


@pytest.mark.slow
def test_a_two_process_run_resumed_by_one_process_continues_it(shards, tmp_path):  # noqa: F811
    """The same with real processes: torchrun with 2 ranks to step 4, then 1 process to step 8,
    against 2 ranks throughout. Tokens are exact; the losses agree to float rounding (DDP averages
    the ranks' gradients where 1 process accumulates the same micro-batches). The first 4 steps are
    warm-up (warmup_steps=5), whose learning rate does not depend on max_steps."""
    import procs
    common = dict(batch_size=4, ckpt_interval=4, max_steps=8)
    for out, stop in (("ref", 8), ("resumed", 4)):
        p = procs.run_script("train_lm.py", args(shards, tmp_path / out, **{**common, "max_steps": stop}), torchrun=2)
        assert p.wait(timeout=600) == 0, p.stdout.read()
    p = procs.run_script("train_lm.py", args(shards, tmp_path / "resumed", **common))
    assert p.wait(timeout=600) == 0
    assert "grad_accum 1 -> 2" in p.stdout.read()
    ref, got = (steps_of(tmp_path / o) for o in ("ref", "resumed"))
    assert [t for _, t, _ in got] == [t for _, t, _ in ref] == [s * 2 * 4 * 64 for s in range(1, 9)]
    assert [l for _, _, l in got] == pytest.approx([l for _, _, l in ref], rel=1e-4)


# ---------------------------------------------------------------- issue 49: a killed export, a replaced validation shard


def test_a_run_that_finished_its_steps_but_not_its_export_writes_it_at_the_next_start(tmp_path, capsys):
    """train_splade.py killed while it copies its final model to out_dir/model (model.tmp left, no
    model): the same command again writes out_dir/model, the final checkpoint's weights (before: it
    removed model.tmp, said "done at step 2" and never wrote the export)."""
    import train_splade
    from hf.safetensors_io import load_safetensors
    from test_config_rules import run as run_cli
    from test_splade import run_args as splade_args
    from test_splade import write_data, write_tiny_model
    model = write_tiny_model(tmp_path / "model")
    data = write_data(tmp_path / "data", n_train=48, n_test=4)[0] / "train.tsv"
    a = splade_args(model, data, tmp_path / "out", max_steps=2, ckpt_interval=2, batch_size=8)
    assert run_cli(train_splade.main, a, capsys)[0] == 0
    export = tmp_path / "out" / "model"
    shutil.rmtree(export)
    (tmp_path / "out" / "model.tmp").mkdir()   # the copy a kill cut short
    (tmp_path / "out" / "model.tmp" / "model.safetensors").write_bytes(b"half")
    status, err = run_cli(train_splade.main, a, capsys)
    assert status == 0, err
    saved = tmp_path / "out" / "checkpoints" / "step_00000002" / "model" / "model.safetensors"
    assert (export / "model.safetensors").read_bytes() == saved.read_bytes(), "the export is written again"
    assert not (tmp_path / "out" / "model.tmp").exists() and manifest.problem(export) is None
    before = (export / "model.safetensors").stat().st_mtime_ns
    assert run_cli(train_splade.main, a, capsys)[0] == 0
    assert (export / "model.safetensors").stat().st_mtime_ns == before, "a finished export is not copied again"


def test_a_resume_on_a_replaced_validation_shard_refuses(shards, tmp_path, capsys):  # noqa: F811
    """The validation shard written again with other tokens (same name and size): the resume refuses
    in one line naming val_shards and the flag (before: no word, and another validation loss)."""
    from data.shards import read_shard, write_shard
    from test_config_rules import run as run_cli
    own = tmp_path / "shards"
    shutil.copytree(shards, own)
    a = args(own, tmp_path / "out", max_steps=4, ckpt_interval=4, eval_interval=4, eval_batches=2)
    assert run_cli(train_lm.main, a, capsys)[0] == 0
    val = own / "s_val_000000.bin"
    tokens = np.asarray(read_shard(val))
    write_shard(val, np.random.default_rng(1).permutation(tokens), tokens.dtype)
    status, err = run_cli(train_lm.main, a + ["--max_steps=8"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert status == 2 and len(lines) == 1 and "val_shards" in lines[0] and "--accept_changed_data=True" in lines[0], err
    status, err = run_cli(train_lm.main, a + ["--max_steps=8", "--accept_changed_data=True"], capsys)
    assert status == 0 and "continuing on it" in err


# ---------------------------------------------------------------- issue 50: runs that carry across sessions


VALUE_JOB = """import sys
from pathlib import Path
out, value = Path(sys.argv[1].split("=", 1)[1]), sys.argv[2]
if value == "fails":
    sys.exit(3)
out.mkdir(parents=True, exist_ok=True)
(out / "result.txt").write_text(value)
with open(out.parent.parent / "ran.txt", "a") as f:
    f.write(value + "\\n")
"""


def value_driver(tmp_path, every_row=False):
    """A driver of one job per value, each writing its value; its rows are the values found (every_row:
    a row per value, "-" where it has none, as a report lists the runs it has not finished)."""
    from experiments.runner import Driver, Job, Report
    script = tmp_path / "value_job.py"
    script.write_text(VALUE_JOB)

    def plan(C, out):
        return [Job(v, str(script), [f"--out_dir={out / v}", v], done=lambda v=v: (out / v / "result.txt").exists())
                for v in C["values"]]

    def report(C, out, outcome):
        rows = [{"run": v, "value": (out / v / "result.txt").read_text() if (out / v / "result.txt").exists() else "-"}
                for v in C["values"] if every_row or (out / v / "result.txt").exists()]
        return Report("", {"rows": rows}, rows="rows",
                      tables=lambda record: {"values": " ".join(r["value"] for r in record["rows"])})
    return Driver(__file__, dict(out_dir=str(tmp_path / "session" / "out"), jobs=1, threads=1, action="all",
                                 values=["a", "b"]), plan, report)


def test_a_job_whose_row_is_committed_with_the_same_key_is_not_run_again(tmp_path, monkeypatch):
    """Issue 50: the rows published by one session carry their jobs' keys; the next session, on a
    fresh clone (no out/), runs only the jobs whose rows are not committed, and its publish keeps
    the committed rows. A job whose key changed runs again."""
    from experiments import runner
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    driver, ran = value_driver(tmp_path), tmp_path / "session" / "ran.txt"
    driver.main(["--action=all"])
    driver.main(["--action=publish"])
    rows = [json.loads(line) for line in (tmp_path / "results" / "out" / "runs.jsonl").read_text().splitlines()]
    assert [r["run"] for r in rows] == ["a", "b"] and all(len(r["keys"]) == 1 for r in rows)
    shutil.rmtree(tmp_path / "session")                          # the next session: a fresh clone
    driver.main(["--values=['a', 'b', 'c']"])
    assert ran.read_text().split() == ["c"], "the committed jobs did not run again"
    driver.main(["--values=['a', 'b', 'c']", "--action=publish"])
    tables = (tmp_path / "results" / "out" / "tables.md").read_text()
    assert "a b c" in tables, tables
    shutil.rmtree(tmp_path / "session")
    driver.main(["--values=['a', 'b', 'c', 'd']"])
    assert ran.read_text().split() == ["d"]


def test_the_keys_of_a_plan_read_each_command_line_a_bounded_number_of_times(tmp_path, monkeypatch):
    """Issue 50: publish computes every job's key each time a job ends, and each key looks for the job
    that makes each path it names. The plan's output folders were parsed again for every argument of
    every job (jobs x arguments x jobs): 12 s of CPU per job end on the 386 jobs of repro_heads_cpt, while
    one of the two job slots stood idle. Now each command line is parsed a bounded number of times."""
    from experiments import runner
    n = 60
    jobs = [runner.Job(f"j{i}", "x.py", [f"--out_dir={tmp_path / f'j{i}'}", "--a=1", "--b", "2",
                                         *([f"--init={tmp_path / 'j0' / 'model'}"] if i else [])]) for i in range(n)]
    for job in jobs:
        job.plan = jobs
    parsed, real = [], runner._arguments
    monkeypatch.setattr(runner, "_arguments", lambda argv: parsed.append(1) or real(argv))
    keys = [job.key() for job in jobs]
    assert all(keys) and len({manifest.digest(k) for k in keys}) == n
    assert keys[1]["made by j0"] == manifest.digest(keys[0])   # the input's maker found, by its key
    assert len(parsed) <= 3 * n, len(parsed)


def test_publish_with_no_rows_says_so_and_fails(tmp_path, monkeypatch):
    """Issue 48 item 5: --action=publish of a driver with nothing run wrote an empty table without a word."""
    from experiments import runner
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    with pytest.raises(cli.UserError, match="nothing to publish"):
        value_driver(tmp_path).main(["--values=['fails']", "--action=publish"])
    assert not (tmp_path / "results").exists()


def test_publish_writes_each_job_s_row_as_the_job_ends(tmp_path, monkeypatch):
    """Issue 50: --action=publish runs what is missing and writes the rows each time a job ends, so that
    a session commits each job's row as it comes (a killed session keeps the rows of its ended jobs)."""
    from experiments import runner
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    seen, publish = [], runner.publish
    monkeypatch.setattr(runner, "publish", lambda report, record, *a: (seen.append([r["run"] for r in record["rows"]]),
                                                                     publish(report, record, *a)))
    value_driver(tmp_path).main(["--values=['a', 'b']", "--action=publish"])
    assert seen[:2] == [["a"], ["a", "b"]], seen


# ---------------------------------------------------------------- issue 49: an index and the encoding it reuses


def retrieval_run(tmp_path):
    from test_stamp_matrix import retrieval_command
    return retrieval_command().setup(tmp_path)


def test_an_index_whose_record_is_gone_and_an_array_changed_is_built_again(tmp_path, capsys):
    """index/files.json (now MANIFEST.json) deleted and an array changed: the index is built again and
    its record is of the rebuilt arrays (before: used, 0.4387, and files.json written from the
    damaged array)."""
    from test_stamp_matrix import ndcg, run_cli
    s = retrieval_run(tmp_path)
    assert run_cli(R.main, s["argv"], capsys)[0] == 0
    before, index = ndcg(s["out"]), s["out"] / "coll" / "index"
    for record in ("files.json", "MANIFEST.json"):
        (index / record).unlink(missing_ok=True)
    weights = index / "postings_weights.npy"
    raw = bytearray(weights.read_bytes())
    np.frombuffer(raw, np.float32, offset=len(raw) - 4 * 64)[:] *= 5.0
    weights.write_bytes(bytes(raw))
    damaged = manifest.sha256(weights)
    assert run_cli(R.main, s["argv"], capsys)[0] == 0
    assert ndcg(s["out"]) == before and manifest.sha256(weights) != damaged
    assert manifest.problem(index) is None


def test_a_full_disk_while_the_index_is_built_is_one_line_and_leaves_no_partial_index(tmp_path, capsys, monkeypatch):
    """The scratch postings hit a full disk (numpy's tofile raised an OSError without errno: a
    traceback, and a partial postings file left): one `error:` line naming the index's folder, a
    size it needs larger than the space said to be free, no index left; then the run finishes."""
    import eval.sparse_index as SI
    from test_stamp_matrix import ndcg, run_cli, with_out
    s = retrieval_run(tmp_path)
    real_open, free = open, 1000

    def full(path, mode="r", *a, **kw):   # the scratch file of the postings on a full device
        return real_open("/dev/full" if str(path).endswith("docs.bin") else path, mode, *a, **kw)
    monkeypatch.setattr(SI, "open", full, raising=False)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 40, (1 << 40) - free, free))
    status, err = run_cli(R.main, s["argv"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "the index" in lines[0] and str(s["out"] / "coll") in lines[0]
    assert re.search(r"about ([\d.]+) KB in all\): 1000 bytes are free", lines[0]), lines[0]
    coll = s["out"] / "coll"
    assert not (coll / "index").exists() and not list(coll.glob("index.*")), "no partial index"
    monkeypatch.undo()
    assert run_cli(R.main, s["argv"], capsys)[0] == 0
    assert run_cli(R.main, with_out(s["argv"], tmp_path / "fresh"), capsys)[0] == 0
    assert ndcg(s["out"]) == ndcg(tmp_path / "fresh")


def test_a_chunk_encoded_at_another_max_len_is_not_reused(tmp_path, capsys):
    """The chunks of a --max-len 8 run under --out, then --max-len 32: encoded again (every setting
    that shapes the chunks is in their key), the number a fresh --out's, metrics.json's length 32."""
    from test_stamp_matrix import ndcg, run_cli, with_out
    s = retrieval_run(tmp_path)
    assert run_cli(R.main, s["argv"] + ["--max-len", "8"], capsys)[0] == 0
    short = ndcg(s["out"])
    assert run_cli(R.main, with_out(s["argv"], tmp_path / "fresh", "--max-len", "32"), capsys)[0] == 0
    assert run_cli(R.main, s["argv"] + ["--max-len", "32"], capsys)[0] == 0
    assert manifest.read(s["out"] / "coll" / "vectors")["key"]["max_len"] == 32
    assert ndcg(s["out"]) == ndcg(tmp_path / "fresh") != short
    assert json.loads((s["out"] / "metrics.json").read_text())["max_len"] == 32


def test_a_row_whose_job_did_not_finish_commits_no_key_for_it(tmp_path, monkeypatch):
    """Issue 50: a report lists the runs it has not finished too; their rows were published with the keys
    of jobs that never ran, and the next session would have skipped those jobs for good."""
    from experiments import runner
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    with pytest.raises(runner.JobsFailed):
        value_driver(tmp_path, every_row=True).main(["--values=['a', 'fails']", "--action=publish"])
    rows = {r["run"]: r for r in map(json.loads, (tmp_path / "results" / "out" / "runs.jsonl").read_text().splitlines())}
    assert list(rows["a"]["keys"]) == ["a"] and rows["fails"]["keys"] == {}, rows
    assert [r["keys"] for r in runner._published_rows(tmp_path / "results" / "out") if r["keys"]] == [rows["a"]["keys"]]


def test_a_committed_row_that_gains_a_job_is_made_again_by_all_of_its_jobs(tmp_path, monkeypatch):
    """Issue 50: a row committed with two jobs (a and its stage a2); a later plan adds a third (a3, as a chosen k
    adds an evaluation). Its row-mates run again with it, so the row is made whole here and published with all
    three keys; before, a2 stayed committed, the row kept its two keys, and every later session ran a and a3 again."""
    from experiments.runner import Driver, Job, Report
    from experiments import runner
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    script = tmp_path / "value_job.py"
    script.write_text(VALUE_JOB)

    def plan(C, out):
        stages = ["a", "a2", *(["a3"] if C["third"] else [])]
        return [Job(s if s == "a" else f"a {s}", str(script), [f"--out_dir={out / s}", s], needs=[] if s == "a" else ["a"],
                    done=lambda s=s: (out / s / "result.txt").exists()) for s in stages]

    def report(C, out, outcome):
        rows = [{"run": "a", "stages": sorted(p.parent.name for p in out.glob("*/result.txt"))}]
        return Report("", {"rows": rows}, rows="rows", tables=lambda record: {"rows": str(record["rows"])})
    driver = Driver(__file__, dict(out_dir=str(tmp_path / "session" / "out"), jobs=1, threads=1, action="all",
                                   third=False), plan, report)
    ran, committed = tmp_path / "session" / "ran.txt", tmp_path / "results" / "out" / "runs.jsonl"
    driver.main(["--action=publish"])
    assert sorted(json.loads(committed.read_text())["keys"]) == ["a", "a a2"]
    shutil.rmtree(tmp_path / "session")                          # the next session, which plans a third job
    driver.main(["--third=True", "--action=publish"])
    assert sorted(ran.read_text().split()) == ["a", "a2", "a3"], "a2 ran again with its row-mates"
    row = json.loads(committed.read_text())
    assert sorted(row["keys"]) == ["a", "a a2", "a a3"] and row["stages"] == ["a", "a2", "a3"], row
    shutil.rmtree(tmp_path / "session")
    driver.main(["--third=True"])
    assert not ran.exists(), "the row is committed whole: nothing runs again"

    # a session that ran the third job without publishing, then lost a2's output: publishing makes the row whole
    # (before: the committed row was kept with two keys, so a fresh clone ran a and a3 once more)
    row = json.loads(committed.read_text())
    del row["keys"]["a a3"]
    committed.write_text(json.dumps(row) + "\n")                  # the row as committed before a3
    driver.main(["--third=True"])
    shutil.rmtree(tmp_path / "session" / "out" / "a2")
    ran.unlink()
    driver.main(["--third=True", "--action=publish"])
    assert "a2" in ran.read_text().split()
    assert sorted(json.loads(committed.read_text())["keys"]) == ["a", "a a2", "a a3"]
