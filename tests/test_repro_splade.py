"""Smoke test of the small-scale rescaling reproduction (experiments/repro_splade_rescaling.py): a few steps
of every stage on a generated tiny BERT (tied head) and generated BEIR folders, in this process."""
import json
import math
import random
from pathlib import Path

import pytest

import model as M
from hf.models import from_pretrained
from test_splade import make_corpus, write_tiny_model

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def write_beir(folder, docs, queries=None, titles=None, extra_docs=()):
    """A BEIR folder; documents get `titles` (or none); queries judge document i for query i."""
    folder.mkdir(parents=True)
    rows = [{"_id": f"d{i}", "title": titles[i] if titles else "", "text": t} for i, t in enumerate(docs)]
    rows += list(extra_docs)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if queries is not None:
        (folder / "qrels").mkdir()
        (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": q}) + "\n"
                                                      for i, q in enumerate(queries)))
        (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" +
                                                   "".join(f"q{i}\td{i}\t1\n" for i in range(len(queries))))
    return folder


def test_repro_splade_smoke_runs_every_stage_then_resumes_without_rerunning(tmp_path, monkeypatch):
    import experiments.repro_splade_rescaling as R
    rng = random.Random(0)
    model = write_tiny_model(tmp_path / "bert", "bert", type_vocab_size=2)
    docs_a, titles_a = make_corpus(rng, 40)
    docs_b, titles_b = make_corpus(rng, 30)
    skipped = [{"_id": "empty", "title": "c1 c2", "text": ""},          # no text
               {"_id": "same", "title": "c3 r4", "text": " c3  r4 "},   # text = title (up to spaces)
               {"_id": "untitled", "title": "", "text": "c5 r6 c7"}]    # no query
    train_a = write_beir(tmp_path / "a", docs_a, titles=titles_a, extra_docs=skipped)
    train_b = write_beir(tmp_path / "b", docs_b, titles=titles_b)
    test_docs, test_queries = make_corpus(rng, 30)
    heldout = write_beir(tmp_path / "heldout", test_docs, test_queries)
    out = tmp_path / "out"
    argv = [f"--out_dir={out}", f"--init={model}", f"--train_beir={train_a},{train_b}",
            f"--eval_beir={heldout}", "--conditions={'large_k1': (4, 1), 'large_k4': (4, 4)}",
            "--untie=[False, True]", "--jobs=0", "--eval_max_len=32", "--eval_query_max_len=16",
            "--train_args=['--max_steps=3', '--batch_size=8', '--query_max_len=16', '--doc_max_len=32', "
            "'--lambda_warmup=2', '--warmup_steps=1', '--ckpt_interval=3']"]
    record = R.main(argv)

    lines = (out / "pairs.tsv").read_text().splitlines()
    assert lines == [f"{q}\t{d}" for q, d in zip(titles_a + titles_b, docs_a + docs_b)]
    rows = {r["run"]: r for r in record["rows"]}
    assert list(rows) == ["large_k1_tied", "large_k1_untied", "large_k4_tied", "large_k4_untied"]
    reference = from_pretrained(model).head.decoder.weight.norm(dim=1).mean().item()
    for r in rows.values():
        assert r["status"] == "done" and r["steps"] == 3
        assert r["head_row_l2"] == pytest.approx(reference * r["head_scale"] / r["k"], rel=1e-5)
        for when in ("before", "after"):
            assert 0 <= r[when]["nDCG@10"] <= 1 and 0 <= r[when]["R@100"] <= 1 and r[when]["flops"] >= 0
        assert math.isfinite(r["step0_loss"]) and math.isfinite(r["final_loss"])
        sbert = out / r["run"] / "checkpoints" / "step_00000003" / "model" / "sentence_bert_config.json"
        assert json.loads(sbert.read_text())["max_seq_length"] == 32, "the checkpoint's length is the one it is scored at"
        states = [x["collapse"] for x in json.loads("[" + ",".join((out / r["run"] / "log.jsonl").read_text()
                                                                  .splitlines()) + "]") if "loss" in x]
        assert len(states) == 3 and all(f"{s} " in r["collapse"] for s in states if s is not None)
    # a 4x head, tied: the input embeddings are scaled too (BERT), untied: they are not
    assert rows["large_k1_tied"]["embedding_cosine"] < 0.99 and rows["large_k1_untied"]["embedding_cosine"] == 1.0
    # m = k = 4 starts from exactly the published weights, tied or not: one evaluation, the same first loss
    assert rows["large_k4_tied"]["step0_eval"] == rows["large_k4_untied"]["step0_eval"]
    assert len(list((out / "step0").glob("*/eval/metrics.json"))) == 3
    assert rows["large_k4_tied"]["step0_loss"] == pytest.approx(rows["large_k4_untied"]["step0_loss"], rel=1e-6)
    assert "| large_k4_untied | 4 | 4 |" in (out / "results.md").read_text()
    pytest.importorskip("matplotlib")
    assert (out / "loss_curves.png").stat().st_size > 0 and (out / "ndcg_vs_flops.png").stat().st_size > 0

    # resuming: everything is there, so nothing runs again and the table is the same
    def no_run(*args, **kwargs):
        raise AssertionError(f"ran again: {args}")
    import train_splade
    from eval import retrieval
    monkeypatch.setattr(train_splade, "main", no_run)
    monkeypatch.setattr(retrieval, "main", no_run)
    again = R.main(argv)
    assert again["rows"] == record["rows"]


def test_the_committed_configs_describe_the_issue_s_ten_runs():
    import experiments.repro_splade_rescaling as R
    import train_splade
    from cli import parse_config
    C = parse_config(R.DEFAULTS, [str(ROOT / "configs" / "repro_splade_rescaling.py")])
    runs = {(r["head_scale"], r["k"], r["untie"]) for r in R.runs_of(C)}
    assert runs == {(m, k, u) for m, k in [(1, 1), (16, 1), (16, 4), (16, 16), (1, 16)] for u in (False, True)}
    recipe = parse_config(train_splade.DEFAULTS, [str(ROOT / C["train_config"])])
    assert recipe["n_negatives"] == 0 and recipe["log_interval"] == 1 and recipe["eval_interval"] == 0


def test_repro_splade_config_names_bad_conditions_and_missing_data(tmp_path):
    import experiments.repro_splade_rescaling as R
    from training import ConfigError
    with pytest.raises(ConfigError, match=r"conditions\['x'\].*head_scale m, k"):
        R.main([f"--out_dir={tmp_path}", "--conditions={'x': 16}"])
    with pytest.raises(FileNotFoundError, match="init=.*does not exist.*--init=PATH"):
        R.main([f"--out_dir={tmp_path}", f"--init={tmp_path / 'nope'}"])


def test_collapse_episodes_follow_the_logged_state():
    from experiments.splade_protocol import collapse_episodes
    states = [None, "large", "large", None, None, "chance", "chance"]
    records = [{"step": i + 1, "collapse": s} for i, s in enumerate(states)]
    assert collapse_episodes(records) == [("large", 2, 3), ("chance", 6, None)]
    assert collapse_episodes(records[:1]) == []


def test_pairs_are_written_once_and_again_when_the_collection_changes(tmp_path):
    """A driver plans again after every ended job: the same pairs leave pairs.tsv untouched (a job
    reading it sees one file), changed documents rewrite it."""
    from experiments import splade_protocol as P
    docs, titles = make_corpus(random.Random(1), 6)
    folder = write_beir(tmp_path / "a", docs, titles=titles)
    pairs = tmp_path / "pairs.tsv"
    assert P.write_pairs([folder], pairs) == 6
    before = pairs.stat()
    assert P.write_pairs([folder], pairs) == 6
    assert (pairs.stat().st_ino, pairs.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    rows = (folder / "corpus.jsonl").read_text().replace(docs[0], docs[0] + " more", 1)
    (folder / "corpus.jsonl").write_text(rows)
    P.write_pairs([folder], pairs)
    assert pairs.read_text().splitlines()[0] == f"{titles[0]}\t{docs[0]} more"
