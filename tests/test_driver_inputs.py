"""Every input of every driver's jobs is in their keys, by content (issue 35, case 3; the rule of
experiments/runner.py), or by the key of the job that made it: for each driver, a tiny experiment
runs once; then, for each input its jobs' job.json keys name (read from the keys, so a new input is
covered without a new test), one of its files is changed, keeping its name and size, and the driver
runs again: every job that read it must run again, and no other job may (but those that read what a
job that ran again made, and new jobs). A file of a checkpoint, which its run checks by content (MANIFEST.json), is instead refused
in one line naming it (then put back), or saved again as it was by the run that made it (resumed
from the checkpoint before). And one writer per output folder: a second invocation on a driver's out_dir is refused,
naming the holder. Generated data, in this process (jobs=0), a few seconds per input."""
import importlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cli

from checkpoint import RunLock, RunLocked
from data import manifest
from experiments import repro_heads, repro_mlm_clm, repro_splade_rescaling, simreg_sweep, splade_protocol, splade_sweep
from test_repro_simreg import generated_text
from test_repro_splade import write_beir
from test_splade import make_corpus, write_tiny_model, write_tokenizer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")

SPLADE_TRAIN = ["--max_steps=2", "--batch_size=8", "--query_max_len=16", "--doc_max_len=32", "--lambda_warmup=1",
                "--warmup_steps=1", "--ckpt_interval=2", "--log_interval=1"]
EVAL = ["--eval_max_len=32", "--eval_query_max_len=16"]


def copy_config(name, tmp_path):
    """A committed config copied out of the repository: the test edits the copy."""
    path = tmp_path / "configs" / name
    path.parent.mkdir(exist_ok=True)
    shutil.copy(ROOT / "configs" / name, path)
    return path


def beir_data(tmp_path):
    rng = random.Random(0)
    docs, titles = make_corpus(rng, 30)
    test_docs, test_queries = make_corpus(rng, 16)
    return (write_beir(tmp_path / "train", docs, titles=titles),
            write_beir(tmp_path / "heldout", test_docs, test_queries))


# ---------------------------------------------------------------- each driver at a tiny size


def splade(tmp_path, monkeypatch):
    train, heldout = beir_data(tmp_path)
    model = write_tiny_model(tmp_path / "bert", "bert", type_vocab_size=2)
    return repro_splade_rescaling, [
        f"--out_dir={tmp_path / 'out'}", f"--init={model}", f"--train_beir={train}", f"--eval_beir={heldout}",
        f"--train_config={copy_config('repro_splade_train.py', tmp_path)}", "--conditions={'large_k4': (4, 4)}",
        "--untie=[False]", "--jobs=0", *EVAL, f"--train_args={SPLADE_TRAIN}"]


def heads(tmp_path, monkeypatch):
    train, heldout = beir_data(tmp_path)
    tok = tmp_path / "tok"
    tok.mkdir()
    V = write_tokenizer(tok)
    docs, _ = make_corpus(random.Random(1), 200)
    (tmp_path / "text.txt").write_text("\n\n".join(docs) + "\n")
    tiny = [f"--vocab_size={V}", "--bos_id=2", "--mask_id=4", "--pad_id=0", "--d_model=16", "--n_heads=2",
            "--d_ff=32", "--n_layers=2", "--seq_len=16", "--max_seq_len=64", "--batch_size=2", "--max_steps=2",
            "--ckpt_interval=2", "--eval_interval=2", "--eval_batches=1", "--log_interval=1", "--warmup_steps=1"]
    return repro_heads, [
        str(ROOT / "configs" / "repro_heads.py"), f"--out_dir={tmp_path / 'out'}", f"--text={tmp_path / 'text.txt'}",
        f"--tokenizer={tok}", "--shard_tokens=1500", f"--pretrain_args={tiny}", "--ablations={}",
        f"--recipes={{'bert': '{copy_config('repro_heads_bert.py', tmp_path)}'}}", "--splade_backbones=['bert']",
        "--heads_tokens=64", f"--train_beir={train}", f"--eval_beir={heldout}", "--ks=[1]", "--jobs=0", *EVAL,
        f"--train_config={copy_config('repro_splade_train.py', tmp_path)}",
        f"--train_args={[*SPLADE_TRAIN, '--k_target=0.5']}"]


def mlm_clm(tmp_path, monkeypatch):
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    monkeypatch.setattr(repro_mlm_clm, "CONFIGS", configs)
    rng = np.random.default_rng(0)
    words = "good bad film the a plot dull fun".split()
    (tmp_path / "reviews.txt").write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(80)) + "\n")
    sst = tmp_path / "sst2"
    sst.mkdir()
    for split, n in (("train", 60), ("dev", 20)):
        (sst / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(
            f"{' '.join(rng.choice(words, 5))}\t{i % 2}\n" for i in range(n)))
    tiny = ["--d_model=16", "--n_layers=1", "--n_heads=2", "--n_kv_heads=2", "--d_ff=32", "--batch_size=2",
            "--seq_len=16", "--max_seq_len=32", "--eval_batches=1", "--eval_interval=2", "--log_interval=1"]
    return repro_mlm_clm, [
        f"--text={tmp_path / 'reviews.txt'}", f"--sst2={sst}", f"--out_dir={tmp_path / 'out'}", "--vocab_size=300",
        "--steps=2", f"--pretrain_args={tiny}", "--lrs=[1e-2]", "--seeds=[0]", "--ft_steps=2", "--ft_batch_size=8",
        "--max_train=32", "--max_eval=16", "--jobs=0", "--runs=mlm30,clm,cpt_clm"]


def simreg(tmp_path, monkeypatch):
    (tmp_path / "play.txt").write_text(generated_text(120))
    train = ["--max_steps=4", "--eval_interval=2", "--eval_batches=1", "--seq_len=16", "--max_seq_len=16",
             "--batch_size=2", "--warmup_steps=1", "--log_interval=2"]
    return simreg_sweep, [
        f"--root={tmp_path / 'out'}", f"--text={tmp_path / 'play.txt'}", "--vocab_size=320", "--head_dim=8",
        "--mode=compare", "--d_model=16", "--seeds=[0]", "--conditions={'baseline': {'simreg': False}}",
        "--parallel=0", f"--train_config={copy_config('repro_simreg_lm.py', tmp_path)}", f"--train_args={train}"]


def sweep(tmp_path, monkeypatch):
    train, heldout = beir_data(tmp_path)
    pairs = tmp_path / "pairs.tsv"
    splade_protocol.write_pairs([train], pairs)
    model = write_tiny_model(tmp_path / "bert", "bert", type_vocab_size=2)
    return splade_sweep, [
        f"--root={tmp_path / 'out'}", f"--backbones={{'tiny': '{model}'}}", "--ks=[4]",
        f"--benchmarks=['{heldout}']", f"--train_config={copy_config('repro_splade_train.py', tmp_path)}",
        f"--train_args={[*SPLADE_TRAIN, '--train_data=' + str(pairs)]}",
        "--eval_args=['--max-len', '32', '--query-max-len', '16', '--no-progress']", "--jobs=0"]


def driver_of(module):
    """The runner.Driver whose main is the module's (`main = Driver(...).main`), or None."""
    from experiments.runner import Driver
    driver = getattr(getattr(module, "main", None), "__self__", None)
    return driver if isinstance(driver, Driver) else None


def driver_modules():
    """{name: module} of the experiment drivers: the modules of experiments/ whose main is a Driver's."""
    modules = {p.stem: importlib.import_module(f"experiments.{p.stem}") for p in (ROOT / "experiments").glob("*.py")}
    return {name: m for name, m in sorted(modules.items()) if driver_of(m) is not None}


DRIVERS = driver_modules()
assert len(DRIVERS) >= 5, f"the drivers were not found: {sorted(DRIVERS)}"
# each driver's tiny experiment, (its module, its command line): a new driver needs its entry
TINY = {"repro_splade_rescaling": splade, "repro_heads": heads, "repro_mlm_clm": mlm_clm, "simreg_sweep": simreg,
        "splade_sweep": sweep}


@pytest.fixture
def no_plots(monkeypatch):
    """Drawing takes longer than the tiny runs (tests/test_repro_*.py draw them)."""
    for module in DRIVERS.values():
        monkeypatch.setattr(module, "pyplot", lambda: None)


# ---------------------------------------------------------------- reading the stamps


def stamps_of(out):
    """{job name: its key, marker and needs} of the jobs of the driver's last plan (the markers under
    out of the jobs it ran or found finished; outputs set aside under an older key left out)."""
    last = json.loads((Path(out) / "timing.json").read_text())["invocations"][-1]
    found = {}
    for path in sorted(Path(out).rglob("job.json")):
        record = manifest.read_json(path)
        aside = any(re.search(r"\.[0-9a-f]{12}$", part) for part in path.parts)
        if not aside and record and record.get("job") in {*last["executed"], *last["skipped"]}:
            found[record["job"]] = dict(record["key"], marker=path, needs=record["needs"])
    return found


def inputs_of(stamp):
    """The paths a key holds by content: its config files and its other inputs."""
    return {*stamp.get("configs", {}), *(k.removeprefix("input ") for k in stamp if k.startswith("input "))}


def editable_inputs(out, found):
    """The inputs a user or a job makes, in a stable order: those outside out, and those inside a
    job's output folder; not what the driver writes itself from its own inputs (pairs.tsv from
    train_beir, a corpus from text), which it writes again."""
    outputs = [s["marker"].parent for s in found.values()]
    paths = sorted({p for s in found.values() for p in inputs_of(s)})
    return [p for p in paths if not Path(p).is_relative_to(out) or any(Path(p).is_relative_to(o) for o in outputs)]


# ---------------------------------------------------------------- a change that keeps the name and the size


def same_size_edit(path):
    """Change one file of `path` (a folder: its first model, data or text file), keeping its name and
    size and keeping it readable; returns the file."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        rank = [".safetensors", ".jsonl", ".tsv", ".txt", ".bin", ".json"]
        path = min(files, key=lambda p: rank.index(p.suffix) if p.suffix in rank else len(rank))
    data = path.read_bytes()
    if path.suffix == ".safetensors":  # the lowest mantissa byte of the first stored value
        i = 8 + int.from_bytes(data[:8], "little")
        new = data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]
    elif path.suffix == ".bin":  # token shard: two neighbouring tokens swapped (after the 256 x int32 header)
        body = data[1024:]
        j = next(j for j in range(0, len(body) - 4, 2) if body[j:j + 2] != body[j + 2:j + 4])
        new = data[:1024] + body[:j] + body[j + 2:j + 4] + body[j:j + 2] + body[j + 4:]
    elif path.suffix == ".py":  # a setting: the first digit of the seed or the learning rate, else the
        text = path.read_text()  # last letter of out_dir (which the drivers' --out_dir overrides)
        m = re.search(r"^(?:seed|lr)\s*=\s*(\d)", text, re.M) or re.search(r"^out_dir\s*=\s*\".*(\w)\"", text, re.M)
        assert m, f"{path}: no seed, lr or out_dir line to change"
        old = m.group(1)
        value = str((int(old) + 1) % 10 or 2) if old.isdigit() else ("x" if old != "x" else "y")
        new = (text[:m.start(1)] + value + text[m.end(1):]).encode()
    elif path.suffix == ".json":  # the keys in reverse order, in the file's own layout
        value = json.loads(data)
        for kw in (dict(indent=2, ensure_ascii=False), dict(), dict(separators=(",", ":")), dict(indent=2)):
            if json.dumps(value, **kw).encode() == data.rstrip(b"\n"):
                new = json.dumps(dict(reversed(list(value.items()))), **kw).encode() + data[len(data.rstrip(b"\n")):]
                break
        else:
            raise AssertionError(f"{path}: no layout of json.dumps gives its bytes back")
    else:  # lines: two different ones swapped, a header line kept first
        lines = data.splitlines(keepends=True)
        i = 1 if len(lines) > 2 else 0
        j = next(j for j in range(i + 1, len(lines)) if lines[j] != lines[i] and lines[j].endswith(b"\n"))
        lines[i], lines[j] = lines[j], lines[i]
        new = b"".join(lines)
    assert len(new) == len(data) and new != data, path
    path.write_bytes(new)
    return path


def executed(out):
    return json.loads((Path(out) / "timing.json").read_text())["invocations"][-1]["executed"]


def check_reruns(before, ran, changed):
    """Every job whose stamp named `changed` ran again; every other job that ran is new, or needs a
    job that ran again, or reads what one made."""
    direct = {name for name, s in before.items() if changed in inputs_of(s)}
    assert direct, f"{changed}: no stamp names it"
    assert direct <= set(ran), f"{changed} changed, but {sorted(direct - set(ran))} did not run again"
    explained = set()
    for name in ran:
        s = before.get(name)
        reads = inputs_of(s) if s else set()
        made = [before[n]["marker"].parent for n in explained if n in before]
        makers = {k.removeprefix("made by ") for k in s or {} if k.startswith("made by ")}
        ok = (s is None or name in direct or set(s["needs"]) & explained or makers & explained
              or any(Path(p).is_relative_to(o) for p in reads for o in made))
        assert ok, f"{changed} changed, and {name} ran again, which neither reads it nor what a job that ran made"
        explained.add(name)


# ---------------------------------------------------------------- the matrix


@pytest.mark.usefixtures("no_plots")
@pytest.mark.parametrize("driver", DRIVERS)
def test_changing_any_input_of_a_driver_s_jobs_reruns_those_that_read_it(driver, tmp_path, monkeypatch):
    module, argv = TINY[driver](tmp_path, monkeypatch)
    out = tmp_path / "out"
    module.main(argv)
    found = stamps_of(out)
    assert found and set(executed(out)) == set(found), "every job that ran left its stamp"
    module.main(argv)
    assert executed(out) == [], "nothing changed: nothing runs"
    inputs = editable_inputs(out, found)
    for changed in inputs:
        before = stamps_of(out)
        kept = tmp_path / "kept"   # a checkpoint's file: the jobs that read it refuse it (its MANIFEST.json)
        shutil.copytree(changed, kept) if Path(changed).is_dir() else shutil.copy(changed, kept)
        edited = same_size_edit(Path(changed))
        try:
            module.main(argv)
        except (cli.UserError, SystemExit) as e:
            assert "checkpoints" in Path(changed).parts and f"{edited.name} is not the file that was saved" in str(e)
            shutil.copy(kept / edited.relative_to(changed) if kept.is_dir() else kept, edited)  # put back
            module.main(argv)
            readers = {name for name, s in before.items() if changed in inputs_of(s)}
            assert set(executed(out)) <= readers, f"{edited} put back: only the jobs that read it may run again"
        else:
            original = (kept / edited.relative_to(changed) if kept.is_dir() else kept).read_bytes()
            if edited.read_bytes() != original:  # not saved again as it was by the run that made it
                check_reruns(before, executed(out), changed)
        shutil.rmtree(kept) if kept.is_dir() else kept.unlink()
    names = {Path(p).name for p in inputs}
    expected = {"repro_splade_rescaling": {"bert", "heldout", "repro_splade_train.py"},
                "repro_heads": {"text.txt", "tok", "repro_heads_bert.py", "heldout", "repro_splade_train.py"},
                "repro_mlm_clm": {"repro_mlm_clm_mlm30.py", "repro_mlm_clm_clm.py", "repro_mlm_clm_cpt_clm.py",
                                  "sst2"},
                "simreg_sweep": {"repro_simreg_lm.py"},
                "splade_sweep": {"bert", "pairs.tsv", "repro_splade_train.py", "heldout"}}[driver]
    assert expected <= names, f"the keys name {sorted(names)}: {sorted(expected - names)} missing"
    # what a job reads of another job's output (a trained model, prepared shards) is in its key by that job's key
    made = {k for s in stamps_of(out).values() for k in s if k.startswith("made by ")}
    assert made or driver == "simreg_sweep", "no job's key names the job that made its input"


@pytest.mark.usefixtures("no_plots")
def test_an_edited_recipe_reruns_its_training_and_the_results_never_mix_two_recipes(tmp_path, monkeypatch):
    """The issue's case: lr edited in the train config (same path, same size) gave "0 job(s) to run"
    and results.json recorded the new recipe beside numbers trained with the old one."""
    module, argv = splade(tmp_path, monkeypatch)
    first = module.main(argv)
    config = tmp_path / "configs" / "repro_splade_train.py"
    config.write_text(config.read_text().replace("lr = 3e-4", "lr = 9e-4"))
    again = module.main(argv)
    assert executed(tmp_path / "out") == ["large_k4_tied train", "large_k4_tied eval"]
    assert "lr = 9e-4" in again["train_recipe"] and again["rows"][0]["final_loss"] != first["rows"][0]["final_loss"]
    logged = json.loads((tmp_path / "out" / "large_k4_tied" / "config.json").read_text())
    assert logged["lr"] == 9e-4, "the row's run was trained with the recipe results.json records"


def test_a_config_s_stamp_is_its_settings_those_it_imports_included(tmp_path):
    """A config that imports another (configs/repro_heads_*.py) changes its job's stamp when the
    other changes; a comment does not."""
    from experiments.runner import Job
    (tmp_path / "base_cfg.py").write_text("lr = 1e-3\nseed = 1\n")
    (tmp_path / "recipe.py").write_text("from base_cfg import *  # noqa\nd_model = 8\n")
    job = Job("train", "train_lm.py", [str(tmp_path / "recipe.py"), f"--out_dir={tmp_path / 'run'}"])
    sys.path.insert(0, str(tmp_path))
    try:
        first = job.key()
        assert first["configs"][str(tmp_path / "recipe.py")] == {"lr": 1e-3, "seed": 1, "d_model": 8}
        (tmp_path / "recipe.py").write_text("from base_cfg import *  # noqa\nd_model = 8  # the width\n")
        assert first == job.key(), "a comment is no other recipe"
        (tmp_path / "base_cfg.py").write_text("lr = 2e-3\nseed = 1\n")
        sys.modules.pop("base_cfg", None)  # a driver's process reads it once; this one again
        assert first != job.key()
        assert "lr 0.001 -> 0.002" in manifest.differences(first, job.key())
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("base_cfg", None)


def test_a_job_s_own_output_folder_is_no_input(tmp_path):
    from experiments.runner import Job
    (tmp_path / "data.tsv").write_text("a\tb\n")
    (tmp_path / "run").mkdir()
    job = Job("train", "train_splade.py", [f"--out_dir={tmp_path / 'run'}", f"--train_data={tmp_path / 'data.tsv'}",
                                           "--tasks", f"sst2={tmp_path}/data.tsv"])
    assert job.marker == tmp_path / "run" / "job.json"
    assert job.named_inputs() == ([], [tmp_path / "data.tsv"])
    (tmp_path / "run" / "log.jsonl").write_text("{}\n")
    assert job.key() == job.key() and not any("run" in k for k in job.key() if k.startswith("input"))


# ---------------------------------------------------------------- one writer per output folder


def minimal_argv(driver, tmp_path):
    """A command line of the driver that runs nothing (action=table); its paths exist."""
    (tmp_path / "text.txt").write_text("some text\n")
    return {"repro_splade_rescaling": [f"--init={tmp_path}", f"--eval_beir={tmp_path}"],
            "repro_heads": [f"--tokenizer={tmp_path}", f"--text={tmp_path / 'text.txt'}"],
            "repro_mlm_clm": [f"--text={tmp_path / 'text.txt'}", f"--sst2={tmp_path}"]}.get(driver, []) + [
        f"--{driver_of(DRIVERS[driver]).out_key}={tmp_path / 'out'}", "--action=table"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_second_writer_on_a_driver_s_out_dir_is_refused_naming_the_holder(driver, tmp_path):
    module = DRIVERS[driver]
    argv = minimal_argv(driver, tmp_path)
    with RunLock(tmp_path / "out"):
        with pytest.raises(RunLocked, match=f"pid {os.getpid()}"):
            module.main(argv)
        assert not (tmp_path / "out" / "results.md").exists() and not (tmp_path / "out" / "timing.json").exists()


def test_a_driver_running_in_another_process_holds_its_out_dir(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                               "from checkpoint import RunLock; lock = RunLock(sys.argv[2]); print('held', flush=True); "
                               "time.sleep(60)", str(ROOT), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = subprocess.run([sys.executable, "experiments/simreg_sweep.py", f"--root={out}", "--action=table"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and f"pid {holder.pid}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    r = subprocess.run([sys.executable, "experiments/simreg_sweep.py", f"--root={out}", "--action=table"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "the lock goes with the process that held it"
