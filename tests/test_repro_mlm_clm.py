"""experiments/repro_mlm_clm.py (the MLM-vs-CLM reproduction) end to end in a few seconds: generated reviews and
SST-2-like phrases, a tiny encoder, a handful of steps; then a resume. And data/text_corpus.py."""
import json
import statistics

import numpy as np
import pytest

import cli
from data import text_corpus
from data.shards import read_shard
from experiments import repro_mlm_clm as R

pytestmark = pytest.mark.usefixtures("one_thread")

POS = "good great superb moving charming fun".split()
NEG = "bad awful dull boring weak silly".split()
NEUTRAL = "the film movie a story plot it is and of actor scene".split()


def sentence(rng, label, n):
    words = list(rng.choice(NEUTRAL, n - 2)) + list(rng.choice(POS if label else NEG, 2))
    rng.shuffle(words)
    return " ".join(words)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repro_data")
    rng = np.random.default_rng(0)
    reviews = [" . ".join(sentence(rng, i % 2, 8) for _ in range(6)) for i in range(120)]
    (folder / "reviews.txt").write_text("\n".join(reviews) + "\n")
    sst = folder / "sst2"
    sst.mkdir()
    for split, n in (("train", 200), ("dev", 40)):
        rows = [f"{sentence(rng, i % 2, 6)} \t{i % 2}" for i in range(n)]
        (sst / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return folder


def test_prepare_text_corpus(data, tmp_path):
    """Whole documents split between validation and training shards, the delimiter before each,
    a tokenizer with the specials first and no truncation or padding."""
    out = tmp_path / "corpus"
    facts = text_corpus.prepare_text_corpus(data / "reviews.txt", out, vocab_size=300, **R.CORPUS)
    assert facts["special_ids"] == {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, "<|mask|>": 2, "<|pad|>": 3}
    saved = json.loads((out / "tokenizer.json").read_text())
    assert saved["truncation"] is None and saved["padding"] is None
    val = read_shard(out / "corpus_val_000000.bin")
    train = np.concatenate([read_shard(p) for p in sorted(out.glob("corpus_train_*.bin"))])
    assert (val == 0).sum() == 12 and (train == 0).sum() == 108, "120 lines: 12 validation, 108 training documents"
    assert val[0] == 0 and train[0] == 0, "each split starts at a document boundary"
    assert facts["tokens"] == {"train": len(train), "validation": len(val)}
    assert not np.isin([1, 2, 3], np.concatenate([val, train])).any(), "EOS, mask and pad never occur in the text"
    # the validation documents are exactly 12 of the file's lines, in full
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    lines = set((data / "reviews.txt").read_text().splitlines())
    docs = np.split(val, np.flatnonzero(val == 0)[1:])
    assert all(tok.decode(d[1:].tolist()) in lines for d in docs)
    assert tok.encode("good film").ids[0] == 0, "encoded texts start with the delimiter, as documents do"
    # a second call with the same settings reuses the folder; other settings are refused
    assert text_corpus.prepare_text_corpus(data / "reviews.txt", out, vocab_size=300, **R.CORPUS) == facts
    with pytest.raises(text_corpus.PreparationError, match="vocab_size"):
        text_corpus.prepare_text_corpus(data / "reviews.txt", out, vocab_size=400, **R.CORPUS)


TINY = ["d_model=16", "n_layers=1", "n_heads=2", "n_kv_heads=2", "d_ff=32", "batch_size=2", "seq_len=16",
        "max_seq_len=32", "eval_batches=2", "eval_interval=2", "log_interval=1"]


def test_smoke_and_resume(data, tmp_path, capsys):
    out = tmp_path / "repro"
    argv = [f"--text={data / 'reviews.txt'}", f"--sst2={data / 'sst2'}", f"--out_dir={out}",
            "--vocab_size=300", "--steps=4", f"--pretrain_args={['--' + kv for kv in TINY]}", "--lrs=[1e-3, 1e-2]",
            "--seeds=[0, 1]", "--ft_steps=3", "--ft_batch_size=8", "--max_train=64", "--max_eval=32", "--jobs=0"]
    results = R.main(argv)
    runs = results["runs"]
    assert list(runs) == [r.name for r in R.RUNS]
    ft = out / "finetune"
    final_step = {"init": 1, "cpt_clm": 2, "cpt_mlm": 2}
    for name, r in runs.items():
        f = r["final"]
        assert f is not None and f["best_lr"] in (1e-3, 1e-2) and f["n_seeds"] == 2
        # independent of the driver's arithmetic: the per-run JSONs of eval/finetune.py
        files = list((ft / name / "runs").glob(f"step_{final_step.get(name, 4):08d}--model-*/sst2/*.json"))
        acc = {}
        for p in files:
            j = json.loads(p.read_text())
            acc.setdefault(j["lr"], []).append(100 * j["test"]["accuracy"])
        assert sorted(acc) == [1e-3, 1e-2] and all(len(v) == 2 for v in acc.values())
        means = {lr: statistics.mean(v) for lr, v in acc.items()}
        assert f["lr_spread"] == pytest.approx(max(means.values()) - min(means.values()))
        assert f["test_mean"] == pytest.approx(means[f["best_lr"]])
    assert runs["cpt_clm"]["pretrain_steps"] == 6 and runs["mlm30"]["pretrain_steps"] == 4
    assert list(runs["clm"]["curve"]) == ["1", "2"] and list(runs["mlm30"]["curve"]) == ["1", "2"]
    assert runs["clm"]["objective"] == "clm" and runs["clm25_mlm75"]["clm_fraction"] == 0.25

    # same initialisation and batches: CLM -> MLM's first (causal) step is the CLM run's first step
    def first_loss(name):
        return json.loads((out / "pretrain" / name / "log.jsonl").read_text().splitlines()[0])["loss"]
    assert first_loss("clm25_mlm75") == first_loss("clm")
    assert first_loss("mlm30") != first_loss("mlm50")
    cpt = json.loads((out / "pretrain" / "cpt_clm" / "config.json").read_text())
    assert cpt["init_from"] == str(out / "pretrain" / "clm" / "checkpoints" / "step_00000004" / "model")
    assert cpt["max_steps"] == 2

    table = (out / "results.md").read_text()
    assert "CLM -> MLM 25/75" in table and "| 2 | " in table, table
    try:
        import matplotlib  # noqa: F401
        assert all((out / n).stat().st_size > 0
                   for n in ("accuracy_vs_steps.png", "lr_sensitivity.png", "pretrain_loss.png"))
    except ImportError:
        assert "matplotlib is not installed" in capsys.readouterr().out

    # resume: a lost fine-tuning result and an unfinished pretraining run are redone, nothing else
    lost = next((ft / "cpt_mlm" / "runs").glob("*/sst2/lr0.01_seed1.json"))
    before = json.loads(lost.read_text())
    lost.unlink()
    import shutil
    log50 = out / "pretrain" / "mlm50" / "log.jsonl"
    step4 = [json.loads(line) for line in log50.read_text().splitlines() if '"loss"' in line][-1]
    shutil.rmtree(out / "pretrain" / "mlm50" / "checkpoints" / "step_00000004")
    capsys.readouterr()
    again = R.main(argv)
    assert again["timing"]["invocations"][-1]["executed"] == ["pretrain_mlm50", "finetune_cpt_mlm"]
    assert "step_00000003 at step 3" in capsys.readouterr().out, "mlm50 resumes from its newest checkpoint"
    redone = [json.loads(line) for line in log50.read_text().splitlines() if '"loss"' in line][-1]
    assert redone["step"] == 4 and redone["loss"] == step4["loss"], "the resumed step is the same step"
    assert json.loads(lost.read_text())["test"] == before["test"], "the redone fine-tuning gives the same result"


def test_the_longer_budget_with_pretraining_seeds(data, tmp_path):
    """--long: MLM-30 % and CLM for 4x the steps, once per pretraining seed, fine-tuned along the
    way; --runs keeps only the named runs; the table pools the seeds per step."""
    out = tmp_path / "long"
    argv = [f"--text={data / 'reviews.txt'}", f"--sst2={data / 'sst2'}", f"--out_dir={out}",
            "--vocab_size=300", "--steps=2", f"--pretrain_args={['--' + kv for kv in TINY]}", "--lrs=[1e-2]",
            "--seeds=[0, 1]", "--ft_steps=2", "--ft_batch_size=8", "--max_train=32", "--max_eval=16", "--jobs=0",
            "--long", "--pretrain_seeds=[1337, 7]", "--runs=init,mlm30_x4,clm_x4,mlm30_x4_seed7,clm_x4_seed7"]
    results = R.main(argv)
    runs = results["runs"]
    assert list(runs) == ["init", "mlm30_x4", "clm_x4", "mlm30_x4_seed7", "clm_x4_seed7"]
    assert not (out / "pretrain" / "mlm30").exists(), "--runs ran only the named runs"
    for name in ("mlm30_x4", "clm_x4", "mlm30_x4_seed7", "clm_x4_seed7"):
        assert runs[name]["pretrain_steps"] == 8 and list(runs[name]["curve"]) == ["1", "2", "4", "6"], name
    assert runs["mlm30_x4_seed7"]["group"] == "mlm30_x4" and runs["mlm30_x4_seed7"]["pretrain_seed"] == 7
    assert runs["mlm30_x4"]["pretrain_seed"] == 1337 and runs["clm_x4"]["objective"] == "clm"

    def log(name):
        return [json.loads(line) for line in (out / "pretrain" / name / "log.jsonl").read_text().splitlines()]
    # the config seed's long run starts from the "init" run's weights; another seed from others
    assert log("mlm30_x4")[0]["loss"] != log("mlm30_x4_seed7")[0]["loss"]

    # the pooled table, against the per-run JSONs of eval/finetune.py (one LR: it is the best)
    def acc(name, step):
        files = (out / "finetune" / name / "runs").glob(f"step_{step:08d}--model-*/sst2/*.json")
        return statistics.mean(100 * json.loads(p.read_text())["test"]["accuracy"] for p in files)
    table = (out / "results.md").read_text()
    assert "Longer budget" in table and "2 pretraining seeds" in table
    for step in (1, 8):
        m = [acc("mlm30_x4", step), acc("mlm30_x4_seed7", step)]
        c = [acc("clm_x4", step), acc("clm_x4_seed7", step)]
        row = (f"| {step} | {statistics.mean(m):.1f} ± {statistics.stdev(m):.1f} | "
               f"{statistics.mean(c):.1f} ± {statistics.stdev(c):.1f} | {statistics.mean(m) - statistics.mean(c):+.1f} |")
        assert row in table, (row, table)


def test_runs_names_what_it_cannot_run(data, tmp_path):
    base = [f"--text={data / 'reviews.txt'}", f"--sst2={data / 'sst2'}", f"--out_dir={tmp_path}"]
    with pytest.raises(cli.ConfigError, match="unknown run.*mlm30_x4.*--long adds"):
        R.runs_of({"long": False, "pretrain_seeds": [1337], "runs": "mlm30_x4"})
    with pytest.raises(cli.ConfigError, match="cpt_clm continues clm's final model; add clm"):
        R.main(base + ["--runs=init,cpt_clm", "--vocab_size=300"])
