"""Ranking metrics with trec_eval semantics, and TREC run / qrels / metrics-JSON files.

The SPLADE paper's claims are numbers (MS MARCO MRR@10, TREC DL nDCG@10, BEIR nDCG@10), so the
evaluator gives exactly what trec_eval (and pytrec_eval, which wraps it) gives:

- a query's results are ranked by score descending, ties by doc id *descending* (strcmp); scores
  are compared as float32, because trec_eval stores them in a C `float` (TEXT_RESULTS.sim, read
  with atof; pytrec_eval converts each Python float the same way), so scores closer than float32
  resolution tie (1 + 1e-9 and 1.0 are one score there, and the doc id decides);
- nDCG uses the qrels grade as gain (grades <= 0 gain nothing), discount 1/log2(rank + 1), and the
  ideal ranking of *all* judged documents with grade >= 1, cut at the same depth; IDCG = 0 gives 0;
- the binary measures (RR, P, R, AP) count a document as relevant when grade >= `rel`
  (TREC DL uses rel=2 for recall and MAP; nDCG ignores `rel`);
- P@k divides by k even when fewer than k documents were retrieved; R@k and AP divide by the
  number of relevant judged documents (0 when there are none);
- queries without qrels are ignored; queries with qrels but no results are scored 0 in every
  measure, so a mean is taken over every judged query (`complete=True`, the default: trec_eval -c,
  the number a benchmark reports); `complete=False` is trec_eval's own default, which ignores them
  and so flatters a system that returns nothing for its hard queries.

Measures are named as in ir_measures: `nDCG@10`, `nDCG`, `RR@10`, `RR`, `R@1000`, `P@10`, `AP`,
`AP@100`, optionally with a per-measure relevance level, `R(rel=2)@1000`.
"""
import math
import re
from dataclasses import dataclass

import numpy as np

from data.atomic import atomic_write, write_json

DEFAULT_MEASURES = ("nDCG@10", "RR@10", "R@1000")
_MEASURE_RE = re.compile(r"^(nDCG|RR|R|P|AP)(?:\(rel=(\d+)\))?(?:@(\d+))?$")
_DECIMAL_RE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)",
                         re.IGNORECASE | re.ASCII)


@dataclass(frozen=True)
class Measure:
    name: str          # as the user wrote it; the key in the results
    kind: str          # nDCG | RR | R | P | AP
    cutoff: float      # depth k, math.inf for none
    rel: int | None    # relevance level for binary measures; None = the evaluate() default


def parse_measure(name: str) -> Measure:
    m = _MEASURE_RE.match(name)
    if m is None:
        raise ValueError(f"unknown measure {name!r}; supported: nDCG[@k], RR[@k], R@k, P@k, AP[@k], "
                         f"with an optional relevance level such as R(rel=2)@1000")
    kind, rel, cutoff = m.group(1), m.group(2), m.group(3)
    if kind in ("R", "P") and cutoff is None:
        raise ValueError(f"measure {name!r} needs a cutoff, e.g. {kind}@10")
    if cutoff is not None and int(cutoff) < 1:
        raise ValueError(f"measure {name!r}: the cutoff must be >= 1")
    if rel is not None and kind == "nDCG":
        raise ValueError(f"measure {name!r}: nDCG uses the graded qrels, a relevance level has no effect")
    return Measure(name, kind, math.inf if cutoff is None else int(cutoff),
                   None if rel is None else int(rel))


# ----------------------------------------------------------------------------- ranking
def trec_scores(qid, docs: dict) -> np.ndarray:
    """One query's scores as trec_eval compares them: float32 (rounded from float64, as C's
    double-to-float conversion does; beyond float32's range they become +-inf, and below it 0)."""
    scores = np.fromiter(docs.values(), np.float64, len(docs))
    if np.isnan(scores).any():
        bad = next(d for d, s in docs.items() if s != s)
        raise ValueError(f"run: query {qid!r} doc {bad!r} has score NaN; scores must be numbers")
    with np.errstate(over="ignore"):
        return scores.astype(np.float32)


def trec_order(docs: dict, qid=None) -> list:
    """Doc ids of one query's results in trec_eval order: float32 score descending, then doc id
    descending (Python compares str by code point, which is strcmp's order on their UTF-8 bytes)."""
    keys = trec_scores(qid, docs).tolist()
    return [d for _, d in sorted(zip(keys, docs), reverse=True)]


def _judged_ranks(qid, docs: dict, judged_ids: list):
    """1-based trec_eval ranks of the judged documents that were retrieved.

    rank(d) = 1 + #{score > s_d} + #{score == s_d and id > d}; the second term only needs string
    comparisons among exact ties, which are rare, so the common path is a sort and a binary search."""
    hits = [d for d in judged_ids if d in docs]
    if not hits:
        return hits, np.zeros(0, np.int64)
    scores = trec_scores(qid, docs)
    hit_scores = trec_scores(qid, {d: docs[d] for d in hits})
    ordered = np.sort(scores)
    above = np.searchsorted(ordered, hit_scores, side="right")
    ranks = (len(scores) - above) + 1
    tied = above - np.searchsorted(ordered, hit_scores, side="left") > 1
    if tied.any():
        ids = list(docs)
        for i in np.flatnonzero(tied):
            same = np.flatnonzero(scores == hit_scores[i])
            ranks[i] += sum(ids[j] > hits[i] for j in same)
    return hits, ranks


def _grades(qid, judged: dict) -> np.ndarray:
    grades = np.fromiter(judged.values(), np.float64, len(judged))
    if not np.all(grades == np.floor(grades)):
        bad = next(d for d, g in judged.items() if g != int(g))
        raise ValueError(f"qrels: query {qid!r} doc {bad!r} has grade {judged[bad]!r}; "
                         f"grades must be integers")
    return grades.astype(np.int64)


# ----------------------------------------------------------------------------- measures
def _segment_sum(seg, values, n):
    return np.bincount(seg, weights=values, minlength=n)


def _ndcg(m, q, rank, grade, ideal_q, ideal_pos, ideal_gain, n):
    # trec_eval's gain is the grade itself (linear, not 2^g - 1):
    #   DCG@k = Σ_{retrieved d, rank r_d <= k, g_d > 0} g_d / log2(r_d + 1)
    #   IDCG@k = Σ_{i=1..k} g_(i) / log2(i + 1), g_(1) >= g_(2) >= ... the positive grades of the judged documents
    #   nDCG@k = DCG@k / IDCG@k, and 0 when IDCG@k = 0
    keep = (grade > 0) & (rank <= m.cutoff)
    dcg = _segment_sum(q[keep], grade[keep] / np.log2(rank[keep] + 1.0), n)
    ikeep = ideal_pos <= m.cutoff
    idcg = _segment_sum(ideal_q[ikeep], ideal_gain[ikeep] / np.log2(ideal_pos[ikeep] + 1.0), n)
    return np.divide(dcg, idcg, out=np.zeros(n), where=idcg > 0)


def _rr(m, q, rank, relevant, n):
    first = np.full(n, np.inf)
    keep = relevant & (rank <= m.cutoff)
    np.minimum.at(first, q[keep], rank[keep])
    return 1.0 / first


def _ap(m, q, rank, relevant, num_rel, n):
    q, rank = q[relevant], rank[relevant]
    order = np.lexsort((rank, q))
    q, rank = q[order], rank[order]
    # position of each relevant doc among the query's relevant docs, in rank order (1-based)
    starts = np.searchsorted(q, q, side="left")
    precision = (np.arange(len(q)) - starts + 1) / rank
    total = _segment_sum(q[rank <= m.cutoff], precision[rank <= m.cutoff], n)
    return np.divide(total, num_rel, out=np.zeros(n), where=num_rel > 0)


def _measure_values(m, rel, pairs, ideal, grades_per_query, n):
    q, rank, grade = pairs
    if m.kind == "nDCG":
        return _ndcg(m, q, rank, grade, *ideal, n)
    level = rel if m.rel is None else m.rel
    relevant = grade >= level
    num_rel = np.array([np.count_nonzero(g >= level) for g in grades_per_query], np.float64)
    if m.kind == "RR":
        return _rr(m, q, rank, relevant, n)
    if m.kind == "AP":
        return _ap(m, q, rank, relevant, num_rel, n)
    found = _segment_sum(q[relevant & (rank <= m.cutoff)], None, n)
    if m.kind == "P":
        return found / m.cutoff
    return np.divide(found, num_rel, out=np.zeros(n), where=num_rel > 0)   # R@k


# ----------------------------------------------------------------------------- public API
def _results(qid, run: dict, drop_self: bool) -> dict:
    docs = run.get(qid) or {}
    if drop_self and qid in docs:
        docs = {d: s for d, s in docs.items() if d != qid}
    return docs


def queries_without_results(qrels: dict, run: dict, drop_self: bool = False) -> list:
    """The judged queries that retrieved nothing (after drop_self): evaluate() scores them 0 or leaves them out."""
    return [qid for qid, judged in qrels.items() if judged and not _results(qid, run, drop_self)]


def evaluate(qrels: dict, run: dict, measures=DEFAULT_MEASURES, rel: int = 1,
             complete: bool = True, drop_self: bool = False) -> dict:
    """Per-query measures, `{qid: {measure: value}}`, with trec_eval semantics (module docstring).

    qrels: `{qid: {docid: int grade}}`; run: `{qid: {docid: score}}` (pytrec_eval shapes); a query whose
    results are an empty dict has none. rel: the binary measures' relevance level. complete: judged
    queries without results score 0 (trec_eval -c) or, False, are left out. drop_self: drop results
    whose doc id is the query id (BEIR does, e.g. for ArguAna and Quora, where a query is also a document)."""
    if isinstance(measures, str):
        measures = (measures,)
    specs = [parse_measure(name) for name in measures]
    if rel < 0:
        raise ValueError(f"rel={rel}: the relevance level must be >= 0 (trec_eval -l)")

    qids, grades_per_query, ranks, pair_grades, gains = [], [], [], [], []
    for qid, judged in qrels.items():
        docs = _results(qid, run, drop_self)
        if not judged or (not docs and not complete):
            continue
        grades = _grades(qid, judged)
        hits, hit_ranks = _judged_ranks(qid, docs, list(judged))
        qids.append(qid)
        grades_per_query.append(grades)
        ranks.append(hit_ranks)
        pair_grades.append(np.array([judged[d] for d in hits], np.int64))
        gains.append(-np.sort(-grades[grades > 0]))   # the ideal ranking's
    n = len(qids)
    if n == 0:
        return {}
    # (query index, rank, grade) of every retrieved judged document, and (query index, position, gain) of the ideal
    pairs = (np.repeat(np.arange(n), [len(r) for r in ranks]), np.concatenate(ranks).astype(np.float64),
             np.concatenate(pair_grades))
    ideal = (np.repeat(np.arange(n), [len(g) for g in gains]),
             np.concatenate([np.arange(1, len(g) + 1) for g in gains]).astype(np.float64),
             np.concatenate(gains).astype(np.float64))
    columns = [_measure_values(m, rel, pairs, ideal, grades_per_query, n).tolist() for m in specs]
    return {qid: {m.name: col[i] for m, col in zip(specs, columns)} for i, qid in enumerate(qids)}


def mean_metrics(per_query: dict) -> dict:
    """Mean of every measure over the evaluated queries (the number trec_eval prints as 'all')."""
    if not per_query:
        return {}
    names = next(iter(per_query.values())).keys()
    return {name: float(np.mean([v[name] for v in per_query.values()])) for name in names}


# ----------------------------------------------------------------------------- files
def read_run(path) -> dict:
    """Read a TREC run file (`qid Q0 docid rank score tag` per line) into `{qid: {docid: score}}`. The
    rank column is ignored, as trec_eval does: the order comes from the scores, kept as written (float64)
    and rounded to float32 when ranked, as trec_eval rounds them when it reads."""
    run = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise ValueError(f"{path}:{lineno}: expected 6 fields 'qid Q0 docid rank score tag', "
                                 f"got {len(parts)}: {line.rstrip()!r}")
            qid, _, docid, _, score, _ = parts
            if not _DECIMAL_RE.fullmatch(score):
                # Python's float() also reads "1_000" and non-ASCII digits, which trec_eval's atof
                # reads differently: refuse them rather than rank by another number
                raise ValueError(f"{path}:{lineno}: score {score!r} is not a number")
            value = float(score)
            docs = run.setdefault(qid, {})
            if docid in docs:
                raise ValueError(f"{path}:{lineno}: query {qid!r} doc {docid!r} appears twice; a run lists each "
                                 "document once per query")
            docs[docid] = value
    return run


def write_run(run: dict, path, tag: str = "run", depth: int | None = None) -> None:
    """Write `{qid: {docid: score}}` as a TREC run, each query in trec_eval order, ranks from 1."""
    if any(c.isspace() for c in tag) or not tag:
        raise ValueError(f"run tag {tag!r} must be one non-empty word")
    with atomic_write(path, "w") as f:  # a kill leaves the old run or the whole new one
        for qid, docs in run.items():
            for rank, docid in enumerate(trec_order(docs, qid)[:depth], 1):
                f.write(f"{qid} Q0 {docid} {rank} {float(docs[docid])!r} {tag}\n")


def read_qrels(path) -> dict:
    """Read TREC (`qid 0 docid grade`) or BEIR tsv (`query-id corpus-id score`) qrels into {qid: {docid: grade}}."""
    qrels, beir = {}, False
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if lineno == 1 and line.strip().split("\t")[:2] == ["query-id", "corpus-id"]:
                beir = True
                continue
            if not line.strip():
                continue
            parts = [p.strip() for p in line.split("\t")] if beir else line.split()
            if len(parts) != (3 if beir else 4):
                raise ValueError(f"{path}:{lineno}: expected 'qid 0 docid grade' (TREC) or, after a 'query-id<TAB>"
                                 f"corpus-id<TAB>score' header, 3 tab-separated fields; got {line.rstrip()!r}")
            qid, docid, grade = parts if beir else (parts[0], parts[2], parts[3])
            try:
                value = int(grade)
            except ValueError:
                raise ValueError(f"{path}:{lineno}: grade {grade!r} is not an integer") from None
            judged = qrels.setdefault(qid, {})
            if docid in judged:
                raise ValueError(f"{path}:{lineno}: query {qid!r} doc {docid!r} is judged twice; keep one line per "
                                 "(query, doc) as trec_eval requires")
            judged[docid] = value
    return qrels


def write_qrels(qrels: dict, path) -> None:
    """Write `{qid: {docid: grade}}` as TREC qrels (`qid 0 docid grade`)."""
    with atomic_write(path, "w") as f:
        for qid, judged in qrels.items():
            for docid, grade in judged.items():
                f.write(f"{qid} 0 {docid} {int(grade)}\n")


def write_metrics_json(path, per_query: dict, **extra) -> dict:
    """Write `{"mean": ..., "num_queries": ..., **extra, "per_query": ...}` as JSON and return it."""
    clash = {"mean", "num_queries", "per_query"} & extra.keys()
    if clash:
        raise ValueError(f"write_metrics_json: extra keys {sorted(clash)} are reserved")
    record = {"mean": mean_metrics(per_query), "num_queries": len(per_query), **extra, "per_query": per_query}
    write_json(path, record)  # atomically: a kill never leaves a half-written metrics.json
    return record
