"""eval/metrics.py against pytrec_eval (trec_eval itself) and against hand-computed values."""
import json
import math
import random

import pytest

pytrec_eval = pytest.importorskip("pytrec_eval")

from eval.metrics import (evaluate, mean_metrics, parse_measure, queries_without_results, read_qrels,
                          read_run, trec_order, write_metrics_json, write_qrels, write_run)

TOL = 1e-6
# ir_measures name -> trec_eval measure; RR@k is recip_rank on the run cut at depth k
MEASURES = ["nDCG@10", "nDCG@5", "nDCG@2000", "nDCG", "RR@10", "RR", "R@1000", "R@3", "P@10",
            "P@1500", "AP", "AP@10"]
TREC_NAMES = {"nDCG@10": "ndcg_cut_10", "nDCG@5": "ndcg_cut_5", "nDCG@2000": "ndcg_cut_2000",
              "nDCG": "ndcg", "RR": "recip_rank", "R@1000": "recall_1000", "R@3": "recall_3",
              "P@10": "P_10", "P@1500": "P_1500", "AP": "map", "AP@10": "map_cut_10"}
TREC_MEASURES = {"ndcg_cut.5,10,2000", "ndcg", "recip_rank", "recall.3,1000", "P.10,1500", "map",
                 "map_cut.10"}


def reference(qrels, run, rel=1):
    """pytrec_eval's numbers under our names. pytrec_eval scores a query whose run is an empty dict
    as 0 (trec_eval never sees such a query), so callers pass exactly the queries to evaluate.
    trec_eval has no cut-off RR; RR@10 follows from the full one: 1/rank of the first relevant
    document when that rank is <= 10 (RR >= 1/10), else 0, with trec_eval's ranking throughout."""
    full = pytrec_eval.RelevanceEvaluator(qrels, TREC_MEASURES, relevance_level=rel).evaluate(run)
    out = {}
    for q, values in full.items():
        out[q] = {name: values[TREC_NAMES[name]] for name in TREC_NAMES}
        out[q]["RR@10"] = values["recip_rank"] if values["recip_rank"] > 1 / 10.5 else 0.0
    return out


def assert_same(ours, ref, context):
    assert ours.keys() == ref.keys(), f"{context}: evaluated queries differ: " \
                                      f"{sorted(ours.keys() ^ ref.keys())}"
    for q in ref:
        for name in MEASURES:
            assert ours[q][name] == pytest.approx(ref[q][name], abs=TOL), \
                f"{context}: query {q} {name}: ours {ours[q][name]} vs trec_eval {ref[q][name]}"


def random_case(rng, n_queries=40):
    """Ties, numeric-looking ids (string order != numeric order), grades -1..3, unretrieved judged
    docs, queries missing on either side, empty runs, and runs of 1 to 1000 documents."""
    qrels, run = {}, {}
    for i in range(n_queries):
        qid = str(rng.choice([i, 1000 + i]))
        size = rng.choice([1, 2, 3, 9, 10, 11, 50, 200, 1000])
        ids = rng.sample(range(3000), size)
        docs = {(str(j) if j % 2 else f"d{j}"): s for j, s in
                zip(ids, [rng.choice([0.5, 1.0, 1.0, 2.0, 3.25]) if rng.random() < 0.5
                          else rng.uniform(-5, 5) for _ in ids])}
        judged = rng.sample(list(docs), min(len(docs), rng.randint(0, 8)))
        judged += [f"u{j}" for j in range(rng.randint(0, 4))]
        side = rng.random()
        if side > 0.1:
            run[qid] = docs if side > 0.15 else {}
        if side < 0.9 and judged:
            qrels[qid] = {d: rng.choice([-1, 0, 0, 1, 2, 3]) for d in judged}
    return qrels, run


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rel", [1, 2])
def test_agrees_with_pytrec_eval_on_random_adversarial_runs(seed, rel):
    qrels, run = random_case(random.Random(seed))
    nonempty = {q: d for q, d in run.items() if d}
    ours = evaluate(qrels, run, MEASURES, rel=rel, complete=False)
    assert_same(ours, reference(qrels, nonempty, rel), f"seed {seed} rel {rel}")


@pytest.mark.parametrize("seed", range(3))
def test_complete_scores_missing_queries_as_zero_like_trec_eval_c(seed):
    qrels, run = random_case(random.Random(100 + seed))
    padded = {q: run.get(q, {}) for q in qrels}      # pytrec_eval scores empty queries as trec_eval -c
    ours = evaluate(qrels, run, MEASURES)
    assert_same(ours, reference(qrels, padded), f"seed {seed} complete (the default)")
    missing = [q for q in qrels if not run.get(q)]
    assert missing, "the random case should contain qrels queries without results"
    assert all(v == 0.0 for q in missing for v in ours[q].values())
    assert queries_without_results(qrels, run) == missing


def test_every_judged_query_counts_by_default_trec_eval_default_on_request():
    qrels = {"a": {"d1": 1}, "b": {"d1": 1}, "c": {"d1": 1}, "e": {}}
    run = {"a": {"d1": 1.0}, "b": {}, "x": {"d1": 1.0}}
    assert list(evaluate(qrels, run)) == ["a", "b", "c"], "every judged query, as trec_eval -c"
    assert mean_metrics(evaluate(qrels, run, ["RR"])) == {"RR": pytest.approx(1 / 3)}
    assert list(evaluate(qrels, run, complete=False)) == ["a"], "trec_eval's default"
    assert queries_without_results(qrels, run) == ["b", "c"]


def test_drop_self_removes_the_query_document_like_beir():
    qrels = {"q1": {"d2": 1}}
    run = {"q1": {"q1": 9.0, "d2": 5.0}}
    assert evaluate(qrels, run, ["RR@10"])["q1"]["RR@10"] == 0.5
    assert evaluate(qrels, run, ["RR@10"], drop_self=True)["q1"]["RR@10"] == 1.0
    assert evaluate({"q1": {"d2": 1}}, {"q1": {"q1": 1.0}}, drop_self=True, complete=False) == {}, \
        "a run left empty by drop_self has no results"
    assert queries_without_results({"q1": {"d2": 1}}, {"q1": {"q1": 1.0}}, drop_self=True) == ["q1"]


def test_ties_are_broken_by_doc_id_descending_as_strings():
    # all scores equal: trec_eval ranks "9" > "10" > "1" (strcmp, descending)
    run = {"q": {"1": 1.0, "10": 1.0, "9": 1.0}}
    assert trec_order(run["q"]) == ["9", "10", "1"]
    assert evaluate({"q": {"1": 1}}, run, ["RR"])["q"]["RR"] == pytest.approx(1 / 3)
    assert evaluate({"q": {"9": 1}}, run, ["RR"])["q"]["RR"] == 1.0


# Near-ties: trec_eval keeps scores as C floats (float32), so scores closer than float32 resolution
# tie and the doc id decides; each case ranks differently in float64.
NEAR_TIES = {
    "1 + 1e-9 vs 1": {"a": 1 + 1e-9, "b": 1.0},
    "0.1 + 2e-9 vs 0.1 vs 0.10000001": {"a": 0.1 + 2e-9, "b": 0.1, "c": 0.10000001},
    "beyond float32's range: both inf": {"a": 1e300, "b": 1e301, "c": 3.5e38},
    "below float32's range: all 0": {"a": 1e-300, "b": -1e-300, "c": 0.0, "d": 1e-46},
    "negative": {"a": -2.0, "b": -2.0 - 1e-8, "c": -1.9999999},
}


@pytest.mark.parametrize("case", NEAR_TIES)
def test_near_ties_rank_as_float32_scores_like_trec_eval(case):
    docs = NEAR_TIES[case]
    qrels = {"q": {"a": 1}}
    run = {"q": docs}
    assert_same(evaluate(qrels, run, MEASURES), reference(qrels, run), case)


def test_near_tie_from_the_issue_and_trec_order():
    qrels, run = {"q": {"a": 1}}, {"q": {"a": 1 + 1e-9, "b": 1.0}}
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"]["recip_rank"]
    assert ref == 0.5, "pytrec_eval: a and b tie as float32, and 'b' > 'a' comes first"
    assert evaluate(qrels, run, ["RR"])["q"]["RR"] == ref
    assert trec_order(run["q"]) == ["b", "a"]


def near_tie_case(rng, n_queries=30):
    """Scores 1 + j * 1e-9 (float32 sees a handful of distinct values) and rounded ones, mixed."""
    qrels, run = {}, {}
    for i in range(n_queries):
        size = rng.choice([2, 5, 12, 40])
        run[f"q{i}"] = {f"d{j}": rng.choice([1.0, 2.0]) + rng.randint(-300, 300) * 1e-9
                        for j in rng.sample(range(100), size)}
        qrels[f"q{i}"] = {d: rng.choice([0, 1, 2]) for d in rng.sample(list(run[f"q{i}"]), 2)}
    return qrels, run


@pytest.mark.parametrize("seed", range(3))
def test_random_near_ties_agree_with_pytrec_eval(seed):
    qrels, run = near_tie_case(random.Random(seed))
    assert_same(evaluate(qrels, run, MEASURES), reference(qrels, run), f"near ties, seed {seed}")


def test_run_file_near_ties_rank_like_trec_eval_reading_the_file(tmp_path):
    path = tmp_path / "near.trec"
    # written by another tool: decimal strings that differ below float32 resolution
    path.write_text("q1 Q0 a 1 1.000000001 x\nq1 Q0 b 2 1 x\nq1 Q0 c 3 0.5 x\n"
                    "q2 Q0 a 1 3.00000001 x\nq2 Q0 z 2 3.0 x\nq2 Q0 b 3 1e-46 x\nq2 Q0 c 4 0 x\n")
    qrels = {"q1": {"a": 1}, "q2": {"a": 1, "b": 2}}
    with open(path) as f:
        ref = reference(qrels, pytrec_eval.parse_run(f))
    assert ref["q1"]["RR"] == 0.5 and ref["q2"]["RR"] == 0.5, "trec_eval ties them in float32"
    assert_same(evaluate(qrels, read_run(path), MEASURES), ref, "run file")

    # our own files: write_run keeps float64 scores exactly, so the file ranks as the dict did
    run = near_tie_case(random.Random(7))[1]
    write_run(run, path)
    qrels = near_tie_case(random.Random(7))[0]
    with open(path) as f:
        ref = reference(qrels, pytrec_eval.parse_run(f))
    assert_same(evaluate(qrels, read_run(path), MEASURES), ref, "written run file")
    assert_same(evaluate(qrels, run, MEASURES), ref, "the dict it was written from")


def test_hand_computed_values():
    # ranking: z(3.0) c(2.0) b(1.0) a(0.5); grades c=2, a=1, x=3 (not retrieved), b=0
    qrels = {"q": {"a": 1, "b": 0, "c": 2, "x": 3}}
    run = {"q": {"a": 0.5, "b": 1.0, "c": 2.0, "z": 3.0}}
    got = evaluate(qrels, run, ["nDCG@3", "nDCG", "RR@1", "RR@10", "P@10", "R@2", "AP",
                                "R(rel=2)@1000"])["q"]
    dcg3 = 2 / math.log2(3)
    idcg3 = 3 + 2 / math.log2(3) + 1 / 2
    assert got["nDCG@3"] == pytest.approx(dcg3 / idcg3)
    assert got["nDCG"] == pytest.approx((dcg3 + 1 / math.log2(5)) / idcg3)
    assert got["RR@1"] == 0.0 and got["RR@10"] == 0.5
    assert got["P@10"] == pytest.approx(2 / 10), "P@k divides by k even when fewer were retrieved"
    assert got["R@2"] == pytest.approx(1 / 3)
    assert got["AP"] == pytest.approx((1 / 2 + 2 / 4) / 3)
    assert got["R(rel=2)@1000"] == pytest.approx(1 / 2), "only c and x have grade >= 2"


def test_negative_grades_and_idcg_zero_score_zero():
    got = evaluate({"q": {"a": -1, "b": 0}}, {"q": {"a": 2.0, "b": 1.0}}, ["nDCG@10", "AP", "R@10"])
    assert got["q"] == {"nDCG@10": 0.0, "AP": 0.0, "R@10": 0.0}


def test_mean_metrics_and_measure_names():
    per_query = {"a": {"RR@10": 1.0}, "b": {"RR@10": 0.0}, "c": {"RR@10": 0.5}}
    assert mean_metrics(per_query) == {"RR@10": 0.5}
    assert parse_measure("R(rel=2)@1000").rel == 2
    with pytest.raises(ValueError, match="MRR@10"):
        parse_measure("MRR@10")
    with pytest.raises(ValueError, match="needs a cutoff"):
        parse_measure("P")


def test_non_integer_grade_and_nan_score_are_errors_naming_the_entry():
    with pytest.raises(ValueError, match="'q'.*'a'.*grade"):
        evaluate({"q": {"a": 1.5}}, {"q": {"a": 1.0}})
    with pytest.raises(ValueError, match="'q'.*'b'.*NaN"):
        evaluate({"q": {"a": 1}}, {"q": {"a": 1.0, "b": float("nan")}})


def test_run_file_round_trip_and_order(tmp_path):
    run = {"q1": {"d1": 0.1 + 0.2, "d2": 3.0, "d3": 3.0}, "q2": {"x": -1e-300}}
    path = tmp_path / "run.trec"
    write_run(run, path, tag="splade")
    lines = path.read_text().splitlines()
    assert lines[0] == "q1 Q0 d3 1 3.0 splade", "ties written in trec_eval order with rank 1 first"
    assert read_run(path) == run, "scores must survive the round trip bit-exactly"
    write_run(run, path, depth=1)
    assert read_run(path) == {"q1": {"d3": 3.0}, "q2": {"x": -1e-300}}


def test_duplicate_document_in_run_file_is_an_error_naming_query_and_doc(tmp_path):
    path = tmp_path / "dup.trec"
    path.write_text("q1 Q0 a 1 2.0 t\nq1 Q0 b 2 1.0 t\nq1 Q0 a 3 0.5 t\n")
    with pytest.raises(ValueError, match=r"dup.trec:3.*query 'q1' doc 'a'"):
        read_run(path)


def test_malformed_run_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.trec"
    path.write_text("q1 Q0 a 1 2.0 t\nq1 Q0 b 2 notanumber t\n")
    with pytest.raises(ValueError, match=r"bad.trec:2: score 'notanumber'"):
        read_run(path)
    # Python's float() reads these, trec_eval's atof reads other numbers (1, 0): refused
    for score in ("1_000", "\uff11"):
        path.write_text(f"q1 Q0 a 1 {score} t\n")
        with pytest.raises(ValueError, match=rf"bad.trec:1: score '{score}'"):
            read_run(path)


def test_qrels_round_trip_trec_and_beir_tsv(tmp_path):
    qrels = {"1": {"a": 2, "b": 0, "c": -1}, "2": {"a": 1}}
    trec = tmp_path / "qrels.txt"
    write_qrels(qrels, trec)
    assert read_qrels(trec) == qrels
    beir = tmp_path / "test.tsv"
    beir.write_text("query-id\tcorpus-id\tscore\n1\ta\t2\n1\tb\t0\n1\tc\t-1\n2\ta\t1\n")
    assert read_qrels(beir) == qrels
    beir.write_text("query-id\tcorpus-id\tscore\n1\ta\t2\n1\ta\t1\n")
    with pytest.raises(ValueError, match=r"test.tsv:3: query '1' doc 'a' is judged twice"):
        read_qrels(beir)


def test_metrics_json(tmp_path):
    per_query = evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, ["RR@10", "nDCG@10"])
    record = write_metrics_json(tmp_path / "m.json", per_query, bench="toy", flops=1.5)
    loaded = json.loads((tmp_path / "m.json").read_text())
    assert loaded == record
    assert loaded["mean"] == {"RR@10": 1.0, "nDCG@10": 1.0} and loaded["num_queries"] == 1
    assert loaded["flops"] == 1.5 and loaded["per_query"]["q"]["RR@10"] == 1.0
