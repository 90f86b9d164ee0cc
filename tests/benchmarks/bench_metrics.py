"""Benchmark: eval.metrics.evaluate vs pytrec_eval on an MS MARCO dev-sized run.

    python tests/benchmarks/bench_metrics.py [--queries 7000] [--depth 1000]

7 000 queries x 1 000 results (the size of an MS MARCO dev-small run), ~1-2 judged relevant docs
per query plus graded judgements, ties and float32 near-ties in the scores. Both sides get the same Python dicts; the
pytrec_eval time includes building its RelevanceEvaluator (it converts the qrels to C structures),
as that is part of evaluating a run. Prints both times, their ratio, and the largest difference.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from eval.metrics import evaluate, mean_metrics  # noqa: E402


def make_data(n_queries, depth, seed=0):
    rng = np.random.default_rng(seed)
    run, qrels = {}, {}
    for q in range(n_queries):
        ids = rng.choice(8_841_823, depth, replace=False)
        # 2 decimals: plenty of ties; the +-1e-9 noise leaves them ties for trec_eval, which ranks
        # float32 scores, but not in float64, so the difference printed below checks that too
        scores = np.round(rng.normal(20, 3, depth), 2) + rng.integers(-1, 2, depth) * 1e-9
        run[str(q)] = dict(zip(map(str, ids.tolist()), scores.tolist()))
        n_judged = int(rng.integers(1, 5))
        judged = [str(x) for x in rng.choice(ids, n_judged // 2 + 1, replace=False).tolist()]
        judged += [str(x) for x in rng.integers(0, 8_841_823, n_judged).tolist()]
        qrels[str(q)] = {d: int(rng.integers(0, 4)) for d in judged}
    return qrels, run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=7000)
    parser.add_argument("--depth", type=int, default=1000)
    args = parser.parse_args()
    import pytrec_eval

    print(f"command: python tests/benchmarks/bench_metrics.py --queries {args.queries} "
          f"--depth {args.depth}")
    qrels, run = make_data(args.queries, args.depth)

    t0 = time.perf_counter()
    ours = evaluate(qrels, run, ("nDCG@10", "RR", "R@1000", "AP"))
    t_ours = time.perf_counter() - t0

    t0 = time.perf_counter()
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recip_rank", "recall.1000",
                                                       "map"})
    ref = evaluator.evaluate(run)
    t_ref = time.perf_counter() - t0

    names = {"nDCG@10": "ndcg_cut_10", "RR": "recip_rank", "R@1000": "recall_1000", "AP": "map"}
    diff = max(abs(ours[q][m] - ref[q][t]) for q in ref for m, t in names.items())
    print(f"{args.queries} queries x {args.depth} results; means: "
          + ", ".join(f"{k}={v:.4f}" for k, v in mean_metrics(ours).items()))
    print(f"ours        {t_ours:7.3f} s")
    print(f"pytrec_eval {t_ref:7.3f} s")
    print(f"speed-up (pytrec_eval / ours): {t_ref / t_ours:.2f}x; max |difference| = {diff:.2e}")


if __name__ == "__main__":
    main()
