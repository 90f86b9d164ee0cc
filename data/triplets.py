"""SPLADE training data: (query, [positive, negatives...], optional teacher scores) examples, and
the order in which train_splade.py reads them.

Training sets (train_splade.py's train_data=):
- msmarco-bm25-50 (default): sentence-transformers/msmarco-bm25 `triplet-50`: the MS MARCO training
  queries (~0.5M), a positive and 50 BM25 negatives each, the first 8 kept; each pass draws another
  (TrainingSet.example). naver/splade's lambda values were tuned on BM25 negatives.
- msmarco-bm25: its `triplet` subset, 502 931 queries with one fixed BM25 negative.
- msmarco-margin-mse: sentence-transformers/msmarco `bert-ensemble-margin-mse`: 39.8M (query_id,
  positive_id, negative_id, score) rows, score the margin s(q, pos) - s(q, neg) of the BERT_CAT
  ensemble of Hofstaetter et al. (2020); ids resolved with the repo's `queries` and `corpus` subsets.
- hf:org/name[@rev] with train_subset=<folder>, or local files (comma-separated paths or globs):
  .tsv (query<TAB>positive<TAB>negative[<TAB>...], an optional header), .jsonl, .parquet (optionally
  .gz) with fields query, positive, and negative | negative_1..negative_n | negatives (a list);
  optional teacher scores: scores ([positive, negatives...]) or margin / score (one negative).
  A malformed row stops with its file and line (data_strict=False skips up to 10 per file).

Order: position p of the training stream is example EpochOrder(p), and optimizer step s, micro-step
m, rank r reads micro_batch_positions(...): one process with the same global batch sees the same
examples in the same order, and a resumed run needs no loader state.
"""
import glob
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hf import hub
from data import manifest
from data.ir_datasets import (IRDataError, RowProblems, file_format, hub_dataset_files, jsonl_objects, parquet_rows,
                              read_parquet, text_lines)

# Named training sets: (hf: spec of the dataset repo, folder of its training files, negatives kept per query; 0: all)
TRAIN_SETS = {
    "msmarco-bm25-50": ("hf:sentence-transformers/msmarco-bm25", "triplet-50", 8),
    "msmarco-bm25": ("hf:sentence-transformers/msmarco-bm25", "triplet", 0),
    "msmarco-margin-mse": ("hf:sentence-transformers/msmarco", "bert-ensemble-margin-mse", 0),
}


class TrainingSet:
    """Examples held in memory as texts. `example(i, n_neg, seed, epoch)` picks `n_neg` of the example's
    negatives (all, in order, when it has exactly n_neg; else the epoch-th n_neg of their order drawn from
    (seed, i): each pass sees other hard negatives) and the teacher scores that go with them."""
    def __init__(self, source, queries, docs, teacher, files=()):
        self.source, self.queries, self.docs, self.teacher = source, queries, docs, teacher
        self.files = list(files)  # what it was read from (training_set_identity)

    def __len__(self):
        return len(self.queries)

    @property
    def has_teacher(self):
        return self.teacher is not None

    def example(self, i, n_neg, seed, epoch=0):
        docs = self.docs[i]
        keep = _pick_negatives(len(docs) - 1, n_neg, [seed, i], epoch)
        teacher = None
        if self.teacher is not None:
            teacher = [self.teacher[i][0]] + [self.teacher[i][1 + j] for j in keep]
        return self.queries[i], [docs[0]] + [docs[1 + j] for j in keep], teacher


def _pick_negatives(available, n_neg, seed, epoch):
    if available == n_neg:
        return range(n_neg)
    order = np.random.default_rng(seed).permutation(available)  # the example's own, the same every pass
    return [int(order[(epoch * n_neg + j) % available]) for j in range(n_neg)]


class _BadRow(Exception):
    """A row that is not a training example; the message says why."""


def _nonempty_text(value, what):
    if not isinstance(value, str):
        raise _BadRow(f"{what} is {type(value).__name__}, not a string")
    if not value.strip():
        raise _BadRow(f"empty {what}")
    return value


def _negatives_of(rec):
    if "negatives" in rec and rec["negatives"] is not None:
        negs = rec["negatives"]
        if not isinstance(negs, (list, tuple)):
            raise _BadRow(f"negatives is {type(negs).__name__}, not a list of strings")
        return list(negs)
    numbered = sorted((int(k.split("_")[1]), k) for k in rec if k.startswith("negative_") and k[9:].isdigit())
    if numbered:
        return [rec[k] for _, k in numbered]
    return [rec["negative"]] if rec.get("negative") is not None else []


def _teacher_of(rec, n_docs):
    """Teacher scores for [positive, negatives...], or None. A margin s(pos) - s(neg) becomes the
    scores [margin, 0]: MarginMSE uses only differences and softmax (KL) is shift-invariant."""
    if rec.get("scores") is not None:
        scores = rec["scores"]
        if not isinstance(scores, (list, tuple)) or len(scores) != n_docs:
            raise _BadRow(f"scores must be a list of {n_docs} numbers (positive, then each negative)")
    elif rec.get("margin", rec.get("score")) is not None:
        if n_docs != 2:
            raise _BadRow(f"a margin/score needs exactly one negative, the row has {n_docs - 1}")
        scores = [rec.get("margin", rec.get("score")), 0.0]
    else:
        return None
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in scores):
        raise _BadRow(f"teacher scores must be finite numbers, got {scores}")
    return [float(s) for s in scores]


def parse_example(rec, n_negatives):
    """(query, [positive, negatives...], teacher scores or None) of one record; _BadRow if malformed."""
    if "query" not in rec or "positive" not in rec:
        raise _BadRow(f"needs the fields query and positive (it has {sorted(rec)})")
    negs = _negatives_of(rec)
    docs = [_nonempty_text(rec["query"], "query"), _nonempty_text(rec["positive"], "positive")]
    docs += [_nonempty_text(n, f"negative {j + 1}") for j, n in enumerate(negs)]
    if len(negs) < n_negatives:
        raise _BadRow(f"{len(negs)} negative(s), but n_negatives={n_negatives} needs at least that many "
                      f"(lower n_negatives, or give every row enough negatives)")
    return docs[0], docs[1:], _teacher_of(rec, len(docs) - 1)


def _records(path, problems):
    """(position, dict) of every row of a tsv / jsonl / parquet training file."""
    fmt = file_format(path)
    if fmt == "tsv":
        for lineno, line in text_lines(path, problems):
            fields = line.split("\t")
            if lineno == 1 and fields[:2] == ["query", "positive"]:
                continue  # a header line
            if len(fields) < 2:
                problems.skip("malformed", lineno, f"{len(fields)} tab-separated field(s); expected "
                              "query<TAB>positive<TAB>negative[<TAB>negative...]")
                continue
            yield lineno, {"query": fields[0], "positive": fields[1], "negatives": fields[2:]}
    elif fmt == "jsonl":
        yield from jsonl_objects(path, problems)
    elif fmt == "parquet":
        names = _parquet_columns(path)
        if {"query_id", "positive_id"} <= set(names) and "query" not in names:
            raise _data_error(path, None, "id columns (query_id, positive_id, ...) without texts; only the "
                              "sentence-transformers/msmarco layout on the Hub is resolved to texts",
                              "give the texts (query, positive, negative columns), or use "
                              "train_data=msmarco-margin-mse")
        known = [c for c in names if c in ("negative", "negatives", "scores", "margin", "score")
                 or (c.startswith("negative_") and c[9:].isdigit())]
        yield from parquet_rows(path, problems, ("query", "positive"), known)
    else:
        raise _data_error(path, None, "unknown file type", "use .tsv, .jsonl or .parquet (optionally .gz)")


def _parquet_columns(path):
    try:
        return pq.read_schema(path).names
    except (pa.ArrowException, OSError) as e:
        raise _data_error(path, None, f"not a readable parquet file ({e})", "download or write it again") from e


def _data_error(path, pos, detail, fix):
    return RowProblems(path, True).error(pos, detail, fix)


def read_training_files(paths, n_negatives, strict=True, limit=0, source=None, keep=0):
    """A TrainingSet from local files (module docstring); keep > 0: the first `keep` negatives of a row only."""
    queries, docs, teacher = [], [], []
    for path in paths:
        problems = RowProblems(Path(path), strict)
        try:
            for pos, rec in _records(Path(path), problems):
                try:
                    q, d, t = parse_example(rec, n_negatives)
                except _BadRow as e:
                    problems.skip("malformed", pos, str(e))
                    continue
                if teacher and (t is None) != (teacher[0] is None):
                    raise _data_error(path, pos, "teacher scores on some rows and not on others",
                                      "give scores on every row or on none")
                queries.append(q)
                docs.append(tuple(d[:1 + keep] if keep else d))
                teacher.append(None if t is None else tuple(t[:1 + keep] if keep else t))
                if limit and len(queries) >= limit:
                    break
        except IRDataError as e:
            hint = " (data_strict=False skips up to 10 malformed rows per file, with a warning)" if strict else ""
            raise IRDataError(f"{e}{hint}") from None
        problems.report()
        if limit and len(queries) >= limit:
            break
    if not queries:
        raise _data_error(", ".join(map(str, paths)), None, "no training example", "check the files")
    has_teacher = teacher[0] is not None
    return TrainingSet(source or ",".join(map(str, paths)), queries, docs, teacher if has_teacher else None, paths)


def _local_paths(spec):
    paths = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        found = sorted(glob.glob(part)) if any(c in part for c in "*?[") else [part]
        if not found or not all(Path(p).is_file() for p in found):
            raise FileNotFoundError(f"train_data: {part!r} is not a file (nor a glob matching files). Give "
                                    f"local .tsv/.jsonl/.parquet files, hf:org/name with train_subset, or "
                                    f"one of the named sets {sorted(TRAIN_SETS)}")
        paths += found
    return paths


def _hub_files(repo, rev, subset):
    """The data files of one subset folder of a Hub dataset repo, in order."""
    files = hub_dataset_files(repo, rev, subset)
    chosen = sorted(f for f in files if f.startswith(f"{subset}/" if subset else "") and file_format(f))
    if not chosen:
        raise FileNotFoundError(f"hf:{repo}@{rev}: no .parquet/.jsonl/.tsv files under {subset or 'the root'!r}; "
                                f"the repo has {sorted(files)[:12]}. Set train_subset to the folder that holds them.")
    return chosen


def _download(repo, rev, files, limit=0):
    """Local copies of a Hub dataset's `files`, in order: only as many as `limit` rows need (0: all)."""
    paths, rows = [], 0
    for f in files:
        paths.append(hub.hf_hub_download(repo, f, repo_type="dataset", revision=rev))
        if limit and f.endswith(".parquet"):
            rows += pq.read_metadata(paths[-1]).num_rows
            if rows >= limit:
                break
    return paths


def read_hub_training_set(spec, subset, n_negatives, strict=True, limit=0, keep=0):
    """A training set from a Hub dataset repo, downloading only as many files as `limit` needs."""
    repo, rev = hub.parse_spec(spec)
    files = _hub_files(repo, rev, subset)
    if files[0].endswith(".parquet"):
        names = _parquet_columns(_download(repo, rev, files[:1])[0])
        if {"query_id", "positive_id", "negative_id"} <= set(names) and "query" not in names:
            return read_msmarco_id_triplets(repo, rev, files, n_negatives, limit)
    paths = _download(repo, rev, files, limit)
    return read_training_files(paths, n_negatives, strict, limit, source=f"{spec}/{subset}", keep=keep)


class MarcoIdTriplets:
    """MS MARCO (query_id, positive_id, negative_id[, margin]) rows resolved to texts through the repo's `queries`
    and `corpus` subsets; ids in numpy arrays, the 8.8M passages in one Arrow column (not 8.8M Python strings)."""
    def __init__(self, source, qids, pids, margin, query_text, corpus_ids, corpus_text, files=()):
        self.source, self.qids, self.pids, self.margin = source, qids, pids, margin
        self.files = list(files)  # what it was read from (training_set_identity)
        self.query_text, self.corpus_text = query_text, corpus_text
        self.corpus_rows = np.argsort(corpus_ids, kind="stable")   # sorted ids -> rows, without a 3 GB copy
        self.corpus_ids = corpus_ids[self.corpus_rows]

    def __len__(self):
        return len(self.qids)

    @property
    def has_teacher(self):
        return self.margin is not None

    def _passage(self, pid):
        return self.corpus_text[int(self.corpus_rows[np.searchsorted(self.corpus_ids, pid)])].as_py()

    def example(self, i, n_neg, seed, epoch=0):
        docs = [self._passage(self.pids[i, 0])] + [self._passage(self.pids[i, 1])] * n_neg
        teacher = None if self.margin is None else [float(self.margin[i])] + [0.0] * n_neg
        return self.query_text[int(self.qids[i])], docs, teacher


def _int_ids(column, where):
    try:
        return pc.cast(column, pa.int64()).to_numpy()
    except pa.ArrowInvalid as e:
        raise _data_error(where, None, f"ids are not integers ({e})", "use the MS MARCO ids as given") from e


def _table(paths, required, optional=()):
    """The columns of parquet files as one table (read_parquet: a missing column or a damaged file named)."""
    return pa.Table.from_batches([batch for p in paths for batch in read_parquet(p, required, optional)])


def read_msmarco_id_triplets(repo, rev, files, n_negatives, limit=0):
    if n_negatives > 1:
        raise IRDataError(f"hf:{repo}: rows have one negative each; n_negatives={n_negatives} must be 0 or 1")
    paths = _download(repo, rev, files, limit)
    t = _table(paths, ("query_id", "positive_id", "negative_id"), ("score",))
    if limit:
        t = t.slice(0, limit)
    where = f"hf:{repo}/{files[0].split('/')[0]}"
    qids = _int_ids(t.column("query_id"), where)
    pids = np.stack([_int_ids(t.column("positive_id"), where), _int_ids(t.column("negative_id"), where)], 1)
    margin = t.column("score").to_numpy() if "score" in t.column_names else None
    query_files = _download(repo, rev, _hub_files(repo, rev, "queries"))
    qtab = _table(query_files, ("query_id", "query"))
    query_text = dict(zip(_int_ids(qtab.column("query_id"), "queries").tolist(), qtab.column("query").to_pylist()))
    corpus_files = _download(repo, rev, _hub_files(repo, rev, "corpus"))
    ctab = _table(corpus_files, ("passage_id", "passage"))
    data = MarcoIdTriplets(f"hf:{repo}@{rev}/{where}", qids, pids, margin, query_text,
                           _int_ids(ctab.column("passage_id"), "corpus"), ctab.column("passage"),
                           paths + query_files + corpus_files)
    missing_q = next((int(q) for q in np.unique(qids) if int(q) not in query_text), None)
    found = np.searchsorted(data.corpus_ids, pids).clip(max=len(data.corpus_ids) - 1)
    missing_p = pids[data.corpus_ids[found] != pids]
    if missing_q is not None or missing_p.size:
        raise _data_error(where, None, f"ids without a text (query {missing_q}, passages {missing_p[:3].tolist()})",
                          "the queries/corpus subsets must be those of the same repo and revision")
    return data


def load_training_set(cfg):
    """The training set named by train_data (module docstring)."""
    spec, subset, keep = cfg["train_data"], cfg["train_subset"], 0
    if spec in TRAIN_SETS:
        spec, subset, keep = TRAIN_SETS[spec][0], subset or TRAIN_SETS[spec][1], TRAIN_SETS[spec][2]
    if spec.startswith("hf:"):
        return read_hub_training_set(spec, subset, cfg["n_negatives"], cfg["data_strict"], cfg["max_train_examples"],
                                     keep)
    return read_training_files(_local_paths(spec), cfg["n_negatives"], cfg["data_strict"], cfg["max_train_examples"])


def training_set_identity(data) -> dict:
    """What a run trains on, by content: the number of examples and every file they were read from."""
    return manifest.key({"examples": len(data)}, {"files": list(data.files)})


class EpochOrder:
    """Position p of the training stream -> example index: epoch p // n walks a permutation seeded
    by (seed, epoch). The position is step * batch_size, so a resumed run needs no loader state."""
    def __init__(self, n, seed):
        self.n, self.seed, self._epoch, self._perm = n, seed, None, None

    def __call__(self, position):
        epoch, i = divmod(position, self.n)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return epoch, int(self._perm[i])


def micro_batch_positions(cfg, step, micro, rank, world):
    """Stream positions of this rank's examples in micro-step `micro` of optimizer step `step`: the global
    micro-batch is consecutive and rank r holds its r-th slice (module docstring)."""
    n_micro = cfg["batch_size"] // cfg["grad_accum"]
    per_rank = n_micro // world
    start = (step * cfg["grad_accum"] + micro) * n_micro + rank * per_rank
    return range(start, start + per_rank)
