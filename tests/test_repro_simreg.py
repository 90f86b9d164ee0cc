"""The SimReg reproduction (experiments/simreg_sweep.py) and its corpus (data/text_corpus.py): the split
and the shards hold exactly the text, the tokenizer cannot cut or pad, the λ fit recovers known
optima, the comparison's numbers on hand-made logs, and both modes end to end on generated text in
a few seconds (in-process runs of a few steps)."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

import train_lm
from data.fineweb_edu import PreparationError
from data.shards import read_shard
from data.text_corpus import prepare_text_corpus, split_documents
from experiments import simreg_sweep as sweep

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def generated_text(n_paragraphs=300, seed=0):
    """Paragraphs of 1-3 lines of words from a small Zipfian vocabulary, separated by blank lines
    (the shape of a play: one speech per paragraph)."""
    rng = np.random.default_rng(seed)
    words = ["thou", "art", "the", "king", "and", "I", "am", "not", "a", "fool", "good", "my", "lord",
             "what", "say", "you", "to", "this", "love", "night"]
    p = 1.0 / np.arange(1, len(words) + 1)
    paras = []
    for _ in range(n_paragraphs):
        lines = [" ".join(rng.choice(words, size=rng.integers(3, 10), p=p / p.sum())).capitalize() + "."
                 for _ in range(rng.integers(1, 4))]
        paras.append("SPEAKER:\n" + "\n".join(lines) + "\n")
    return "\n".join(paras)


@pytest.fixture
def no_plots(monkeypatch):
    """Drawing takes longer than the tiny runs; the plots are tested once, on hand-made logs."""
    monkeypatch.setattr(sweep, "pyplot", lambda: None)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "play.txt"
    path.write_text(generated_text(), encoding="utf-8")
    return path


# ---------------------------------------------------------------- the corpus


def test_split_keeps_whole_paragraphs_and_about_the_fraction():
    text = generated_text(200)
    (train,), train_docs, val_docs = split_documents(text, "paragraph", "tail", 0.1, seed=0)
    val = text[len(train) + 1:]
    assert "".join(train_docs) == train.replace("\n\n", "\n") and "".join(val_docs) == val.replace("\n\n", "\n")
    assert train + "\n" + val == text, "the split drops or adds nothing but the blank line between the parts"
    assert train.endswith("\n") and not train.endswith("\n\n") and val.startswith("SPEAKER:")
    assert 0.85 < len(train) / len(text) < 0.95
    with pytest.raises(PreparationError, match="no blank line"):
        split_documents("one paragraph without any blank line\n" * 20, "paragraph", "tail", 0.1, seed=0)


def test_shards_hold_exactly_the_train_and_val_text(text_file, tmp_path):
    from tokenizers import Tokenizer
    meta = prepare_text_corpus(text_file, tmp_path / "corpus", vocab_size=320)
    cfg = json.loads((tmp_path / "corpus" / "tokenizer.json").read_text())
    assert cfg["truncation"] is None and cfg["padding"] is None
    tok = Tokenizer.from_file(meta["tokenizer"])
    assert tok.get_vocab_size() == 320 and tok.token_to_id("<|endoftext|>") == meta["delimiter_id"] == 0
    text = text_file.read_text()  # independent reference: the first blank line after 90 % of the characters
    cut = text.find("\n\n", int(0.9 * len(text)))
    train, val = text[:cut + 1], text[cut + 2:]
    for pattern, part in ((meta["val_shards"], val), (meta["train_shards"], train)):
        ids = np.concatenate([read_shard(p) for p in sorted(Path(pattern).parent.glob(Path(pattern).name))])
        assert ids.max() < 320
        starts = np.flatnonzero(ids == 0)
        assert starts[0] == 0, "every document starts with the delimiter"
        docs = [tok.decode(ids[a + 1:b].tolist()) for a, b in zip(starts, list(starts[1:]) + [len(ids)])]
        # independent reference: the part's paragraphs, split at blank lines here. Equal lists mean
        # every document came back byte for byte: nothing cut, nothing padded, no other id inserted.
        assert docs == [p.strip("\n") + "\n" for p in part.split("\n\n")]
    # a re-run reuses the folder; other settings for it are refused
    assert prepare_text_corpus(text_file, tmp_path / "corpus", vocab_size=320) == meta
    with pytest.raises(PreparationError, match="vocab_size"):
        prepare_text_corpus(text_file, tmp_path / "corpus", vocab_size=384)


def test_a_tokenizer_that_truncates_or_pads_is_refused(text_file, tmp_path):
    out = tmp_path / "corpus"
    prepare_text_corpus(text_file, out, vocab_size=320)
    cfg = json.loads((out / "tokenizer.json").read_text())
    cfg["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    (out / "tokenizer.json").write_text(json.dumps(cfg))
    for shard in out.glob("corpus_*.bin"):  # an unfinished folder: its recorded tokenizer.json is reused
        shard.unlink()
    with pytest.raises(PreparationError, match="truncation"):
        prepare_text_corpus(text_file, out, vocab_size=320)


def test_committed_configs_parse():
    """The driver configs with the driver's keys, the shared training config with train_lm.py's."""
    import cli
    for name in ("repro_simreg.py", "repro_simreg_lambda.py"):
        C = cli.parse_config(sweep.DEFAULTS, [str(ROOT / "configs" / name)])
        assert C["root"].startswith("out/") and len(C["seeds"]) >= 3 and sweep.planned_runs(C)
        cli.parse_config(train_lm.DEFAULTS, [str(ROOT / C["train_config"]), *C["train_args"]])
    C = cli.parse_config(train_lm.DEFAULTS, [str(ROOT / "configs" / "repro_simreg_lm.py")])
    train_lm.check_config(C)
    assert C["simreg_tau"] == 0.01 and C["simreg_lambda"] == -1.0, "the paper's τ; λ from train_lm's default"


# ---------------------------------------------------------------- the λ fit


def test_best_lambda_is_the_vertex_in_log_lambda():
    lams = [0.0, 0.1, 0.3, 1.0, 3.0, 10.0]
    star = 0.55
    losses = [5.0] + [4.0 + 0.02 * (math.log(l) - math.log(star)) ** 2 for l in lams[1:]]
    lam, bracketed = sweep.best_lambda(lams, losses)
    assert bracketed and lam == pytest.approx(star, rel=1e-9)   # a parabola through 3 of its own points
    lam, bracketed = sweep.best_lambda(lams, [5.0, 4.0, 4.1, 4.2, 4.3, 4.4])
    assert (lam, bracketed) == (0.1, False), "a best λ at the end of the grid is not bracketed"


def test_fit_of_c_and_the_exponent():
    c, alpha = sweep.fit_sqrt_law({64: 0.2 * 8, 128: 0.2 * math.sqrt(128), 256: 0.2 * 16})
    assert c == pytest.approx(0.2) and alpha == pytest.approx(0.5)
    c, alpha = sweep.fit_sqrt_law({64: 1.0, 256: 1.0})
    assert alpha == pytest.approx(0.0) and c == pytest.approx(1 / math.sqrt(8 * 16))  # geometric mean of 1/√d


def test_default_lambda_grows_like_sqrt_d_and_no_longer_dominates():
    """The calibrated default (train_lm.simreg_lambda) keeps the paper's sqrt(d) form; the former
    guess gave λ = 8 at d = 1024, where SimReg dominated early training (issue: CE 8.6 vs 6.9)."""
    from types import SimpleNamespace
    lam = [train_lm.simreg_lambda({"simreg_lambda": -1.0}, SimpleNamespace(d_model=d)) for d in (64, 256, 1024)]
    assert lam[1] == pytest.approx(2 * lam[0]) and lam[2] == pytest.approx(4 * lam[0])
    assert 0 < lam[2] <= 4, "at most half the former default at d = 1024"
    # the sweep's flat optimum at d = 64 ... 256 was λ = 0.1 ... 1
    assert 0.1 <= lam[0] and lam[1] <= 1
    assert train_lm.simreg_lambda({"simreg_lambda": 0.7}, SimpleNamespace(d_model=64)) == 0.7


# ---------------------------------------------------------------- the comparison on hand-made logs


def fake_run(root, name, facts, evals, tokens_per_s, simreg=False, chunk=32):
    """A finished run folder as train_lm.py leaves it (config.json, log.jsonl), collected."""
    out = root / "runs" / name
    out.mkdir(parents=True)
    config = {**train_lm.DEFAULTS, "batch_size": 2, "seq_len": 5, "grad_accum": 1, "log_interval": 10,
              "d_model": 64, "simreg": simreg, "simreg_chunk": chunk, "simreg_lambda": 1.5}
    (out / "config.json").write_text(json.dumps(config))
    lines = []
    for i, tps in enumerate(tokens_per_s, 1):
        lines.append({"step": 10 * i, "loss": 5.0, "ce": 5.0, "tokens": 100 * i, "tokens_per_s": tps})
        if 10 * i in evals:
            lines.append({"step": 10 * i, "val_loss": evals[10 * i], "interclass_angle": 60.0 + simreg * 10})
    (out / "log.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    (out / "result.json").write_text(json.dumps(sweep.collect_run({}, out, facts, 1.0)))


def test_compare_table_steps_to_target_and_overhead(tmp_path):
    # tokens per step = 2 x 5 = 10. Baseline: 10 tokens / 100 tok/s = 0.1 s per step in the clean windows;
    # the first window (warm-up) and the one after the eval at step 20 are slower and must not count.
    base_tps = [10, 100, 20, 100, 100]
    sr_tps = [10, 80, 20, 80, 80]            # 0.125 s per step: +25 %
    conds = {"baseline": {"simreg": False}, "simreg_chunked": {"simreg": True}}
    for seed, shift in ((0, 0.0), (1, 0.1)):
        fake_run(tmp_path, f"baseline_s{seed}", {"condition": "baseline", "width": 64, "seed": seed},
                 {20: 5.0 + shift, 40: 4.0 + shift}, base_tps)
        # reaches the baseline's final loss halfway between steps 20 and 40: step 30, 25 % fewer steps
        fake_run(tmp_path, f"simreg_chunked_s{seed}", {"condition": "simreg_chunked", "width": 64, "seed": seed},
                 {20: 4.5 + shift, 40: 3.5 + shift}, sr_tps, simreg=True)
    res = sweep.main([str(ROOT / "configs" / "repro_simreg.py"), f"--root={tmp_path}", "--action=table",
                      f"--conditions={conds!r}", "--seeds=[0, 1]"])
    base, sr = res["rows"]
    assert base["steps_to_target"] == pytest.approx((40, 0)) and sr["steps_to_target"] == pytest.approx((30, 0))
    assert sr["fewer_steps_pct"] == pytest.approx((25, 0)) and sr["reached"] == 2
    assert base["step_time_ms"] == pytest.approx((100, 0)) and sr["overhead_pct"] == pytest.approx((25, 0))
    assert sr["lambda"] == 1.5 and base["lambda"] == 0.0
    assert sr["interclass_angle"][0] == pytest.approx(70.0)
    assert "| simreg_chunked | 1.5 | 2 | 3.5500 ± 0.0707 | 30 ± 0" in (tmp_path / "results.md").read_text()
    if sweep.pyplot() is not None:  # matplotlib is optional
        assert (tmp_path / "val_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- both modes end to end (in-process)


def tiny_args(root, text_file, *extra):
    train = ["--max_steps=6", "--eval_interval=3", "--eval_batches=2", "--seq_len=32", "--max_seq_len=32",
             "--batch_size=4", "--warmup_steps=2", "--log_interval=2"]
    return [f"--root={root}", f"--text={text_file}", "--vocab_size=320", "--head_dim=16", "--parallel=0",
            f"--train_args={train!r}", *extra]


@pytest.mark.usefixtures("no_plots")
def test_lambda_mode_end_to_end_and_resume(text_file, tmp_path, monkeypatch):
    argv = [str(ROOT / "configs" / "repro_simreg_lambda.py"),
            *tiny_args(tmp_path, text_file, "--widths=[16, 32]", "--lambdas=[0.0, 0.5]", "--seeds=[0, 1]")]
    res = sweep.main(argv)
    assert not res["missing"] and not res["failed"] and len(res["runs"]) == 8
    for row in res["rows"]:
        finals = []
        for seed in (0, 1):
            out = tmp_path / "runs" / f"d{row['width']}_lam{row['lambda']:g}_s{seed}"
            log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
            config = json.loads((out / "config.json").read_text())
            assert config["d_model"] == row["width"] and config["seed"] == seed
            assert config["simreg"] == (row["lambda"] > 0) and any("simreg" in r for r in log) == (row["lambda"] > 0)
            if row["lambda"] > 0:
                assert config["simreg_lambda"] == row["lambda"]
            finals.append([r["val_loss"] for r in log if "val_loss" in r][-1])
        assert row["mean"] == pytest.approx(np.mean(finals)) and row["std"] == pytest.approx(np.std(finals, ddof=1))
    assert (tmp_path / "results.md").exists()

    def no_training(argv):
        raise AssertionError("a run with a result.json must not be trained again")
    monkeypatch.setattr(train_lm, "main", no_training)
    again = sweep.main(argv)
    assert again["rows"] == json.loads(json.dumps(res["rows"]))


@pytest.mark.usefixtures("no_plots")
def test_compare_mode_end_to_end(text_file, tmp_path):
    res = sweep.main([str(ROOT / "configs" / "repro_simreg.py"), *tiny_args(tmp_path, text_file, "--d_model=32",
                                                                           "--seeds=[0]")])
    assert [r["condition"] for r in res["rows"]] == ["baseline", "simreg_chunked", "simreg_full"]
    assert all(r["n"] == 1 for r in res["rows"]) and not res["failed"]
    chunks = {c: json.loads((tmp_path / "runs" / f"{c}_s0" / "config.json").read_text())
              for c in ("baseline", "simreg_chunked", "simreg_full")}
    assert not chunks["baseline"]["simreg"] and chunks["simreg_full"]["simreg_chunk"] == 0
    assert chunks["simreg_chunked"]["simreg_chunk"] == 32
    from types import SimpleNamespace
    default = train_lm.simreg_lambda({"simreg_lambda": -1.0}, SimpleNamespace(d_model=32))
    assert res["rows"][1]["lambda"] == pytest.approx(default)
    assert res["rows"][0]["steps_to_target"][0] is not None, "the baseline reaches its own final loss"
