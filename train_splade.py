"""Train SPLADE from a masked-LM backbone, with the MLM-head rescaling of the SPLADE rescaling
paper: divide the vocabulary projection by k before the first step. 1 to N GPUs with torchrun.

    python train_splade.py --init hf:answerdotai/ModernBERT-base --k 16
    torchrun --nproc_per_node=8 train_splade.py --init hf:jhu-clsp/ettin-encoder-150m --k 16
    python train_splade.py configs/splade_tiny.py                          # CPU, a few minutes
    python train_splade.py --init hf:google-bert/bert-base-uncased --train_data=my_triplets.tsv

The method (SPLADE v2, Formal et al. 2021, and SPLADE++, Formal et al. 2022, "From Distillation
to Hard Negative Sampling"; their code is github.com/naver/splade), all of it in this file except
the pooling (model.splade_pool):

    w(text)   = max_t log(1 + relu(logits_t))   over the text's non-padding tokens
    s(q, d)   = w(q) . w(d)                      a plain dot product
    loss      = InfoNCE(s(q, its positive) against every other document of the global batch)
              + MarginMSE / KL to teacher scores (when the data has them and their weight > 0)
              + lambda_q(t) FLOPS(queries) + lambda_d(t) REG_d(documents)
    FLOPS(W)  = sum_j (mean_i |w_ij|)^2          (Paria et al., ICLR 2020, "Minimizing FLOPs to
                                                  Learn Efficient Sparse Representations")
    REG_d     = mean over the document sets S_0 (positives), S_1 (first negatives), ... of FLOPS(S_s)
    lambda(t) = lambda * min(1, t / T)^2

REG_d is naver/splade's document regulariser (doc_reg="per_set", the default): its trainer
(splade/tasks/transformer_trainer.py, TransformerTrainer.train_iterations) computes FLOPS once on
the batch of positives and once on the batch of negatives and averages the two. FLOPS is a squared
batch mean, so this is not FLOPS of all documents as one batch: by Jensen that one is smaller (up
to 2x with one negative, when positives and negatives use different terms), and naver's lambda_d
values refer to the per-set form. With n hard negatives each set S_s is still a batch of one
document per query, as in naver's triplets, so lambda_d keeps its meaning; with in-batch negatives
only (n_negatives=0) REG_d = FLOPS(positives). doc_reg="concat" regularises all documents as one
batch instead (what naver's newer Hugging Face trainer, splade/hf/trainers.py, does, with its own
lambda values).

The recipe. The paper did not publish its hyper-parameters, so one fixed recipe is used for every
backbone and k (DEFAULTS below, printed at start): naver/splade's contrastive recipe on BM25
triplets - AdamW lr 2e-5, weight decay 0.01, 128 queries per step each with its positive and one
BM25 hard negative, linear warm-up (10 %) then linear decay, max length 256, lambda_q = 3e-4,
lambda_d = 1e-4 with the quadratic warm-up over the first third of training - shortened from
naver's 150k steps to 30k (the default data has 503k triplets: 7.6 epochs).

Training data (train_data=):
- msmarco-bm25 (default): sentence-transformers/msmarco-bm25, subset `triplet` - 502 931 MS MARCO
  training queries, each with a positive passage and one BM25-retrieved hard negative, as texts
  (parquet, ~330 MB). BM25 negatives are what naver's lambda values above were tuned for.
- msmarco-margin-mse: sentence-transformers/msmarco, subset `bert-ensemble-margin-mse` - 39.8M
  (query_id, positive_id, negative_id, score) rows where score is the margin
  s(q, pos) - s(q, neg) of the BERT_CAT ensemble of Hofstaetter et al. (2020), the teacher of
  MarginMSE distillation. Ids are turned into texts with the repo's `queries` and `corpus` subsets
  (the 8.8M passages are held as an Arrow column, ~3 GB per process). See
  configs/splade_margin_mse.py.
- hf:org/name[@rev] with train_subset=<folder>: any Hub dataset with the columns below.
- local files, comma-separated paths or globs: .tsv (query<TAB>positive<TAB>negative[<TAB>...];
  a first line starting query<TAB>positive is a header), .jsonl, .parquet (optionally .gz). JSONL/parquet fields: query, positive, and
  negative | negative_1..negative_n | negatives (a list); optional teacher scores: scores (a list
  for [positive, negatives...]) or margin / score (s(pos) - s(neg), with exactly one negative).
  A malformed row stops with its file and line (data_strict=False skips up to 10 per file).

DDP and batch size. batch_size is the GLOBAL number of queries per optimizer step, so the same
config trains the same model on 1 or 8 GPUs: each rank takes batch_size / (world * grad_accum)
queries per micro-step. Every rank gathers all ranks' query and document vectors, so the
contrastive problem and the FLOPS batch means are those of the global micro-batch; the local
rows keep their gradient, the gathered copies do not, and every rank computes the same global
loss - so rank r's backward delivers exactly the gradient of the global loss through its own
rows, and DDP's averaging (scaled back by world size) sums those into the full gradient.

Gradient accumulation and in-batch negatives. With grad_accum = A > 1, each micro-batch of
batch_size / A queries is its own contrastive problem (its queries compete against its own
documents) and its own FLOPS batch mean; the A losses are averaged. So accumulation is NOT
equivalent to a larger batch: it saves memory at the cost of fewer in-batch negatives, and
lambda refers to the micro-batch size (FLOPS depends on the batch mean: re-tune lambda when the
batch changes). Exact large-batch equivalence would need a cached-representation
scheme (GradCache: a second forward pass); prefer more GPUs, or a shorter max length.

Every default can be overridden by configs/*.py files and --key=value flags (unknown keys and wrong
types are errors). Restarting the same command resumes from the newest complete checkpoint in
out_dir (resume=never starts fresh); SIGTERM saves a checkpoint and exits. Checkpoints are Hugging
Face folders that transformers' AutoModelForMaskedLM and sentence-transformers' SparseEncoder load;
the final model is copied to out_dir/model.
"""
import collections
import contextlib
import dataclasses
import glob
import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import training as T
from model import (TOKENIZER_FILES, encode_texts, flops_per_token, from_pretrained, head_norms, load_tokenizer,
                   mlm_head_weight, rescale_mlm_head, splade_pool)

DEFAULTS = dict(
    out_dir="out/splade",
    resume="auto",            # auto: continue from out_dir's newest valid checkpoint | never | a checkpoint folder
    # backbone and the paper's rescaling
    init="hf:answerdotai/ModernBERT-base",  # hf:org/name[@rev] or a local Hugging Face folder with an MLM head
    k=1.0,                    # W_head <- W_head / k before the first step; 1 = standard SPLADE
    k_bias=False,             # also divide the decoder bias by k (the paper does not say; default: leave it)
    head_scale=1.0,           # multiply W_head by this before the division by k: emulates a large-norm head
    untie_head=False,         # give a tied decoder its own copy of the matrix first (then k leaves the embeddings)
    # training data (module docstring)
    train_data="msmarco-bm25",
    train_subset="",          # folder of a hf: dataset repo holding the files (named sets set their own)
    max_train_examples=0,     # 0: every example; N: the first N (quick runs download less)
    n_negatives=1,            # hard negatives per query; 0: in-batch negatives only
    data_strict=True,         # a malformed row stops the run (False: skip up to 10 per file, with a warning)
    query_max_len=256, doc_max_len=256,
    # loss
    infonce_weight=1.0,       # InfoNCE over the global batch's documents, scale 1 (dot products)
    margin_mse_weight=0.0,    # MarginMSE to teacher margins (needs teacher scores)
    kl_weight=0.0,            # KL(teacher || student) over [positive, negatives] (needs teacher scores)
    kl_temperature=1.0,
    lambda_q=3e-4, lambda_d=1e-4,
    lambda_warmup=10000,      # T of the quadratic warm-up lambda * min(1, t/T)^2; 0: constant
    query_reg="flops",        # flops | l1 (Efficient-SPLADE regularises queries with L1)
    doc_reg="per_set",        # per_set: mean of FLOPS over positives and each negative set (naver/splade) | concat
    # optimizer and schedule
    batch_size=128,           # GLOBAL queries per optimizer step (all ranks and micro-steps together)
    grad_accum=1,             # micro-steps per optimizer step (each its own contrastive problem)
    lr=2e-5, warmup_steps=3000, max_steps=30000, schedule="linear", min_lr_ratio=0.0,
    weight_decay=0.01, beta1=0.9, beta2=0.999, adam_eps=1e-8, grad_clip=1.0,
    pool_chunk=0,             # tokens per chunk of the fused SPLADE pooling; 0: automatic (~64M logits)
    # system
    device="auto",            # auto | cpu | cuda
    dtype="bfloat16",         # bfloat16 | float16 | float32 autocast (weights stay fp32); CPU runs use float32
    compile=False,            # torch.compile the loss module (lengths vary per batch: dynamic shapes)
    seed=1337,
    # logging, evaluation, checkpoints
    log_interval=50,
    eval_interval=5000,       # 0: no periodic evaluation
    eval_benchmark="nanobeir",  # anything eval/retrieval.py accepts: nanobeir, nanobeir/NFCorpus, a BEIR folder...
    eval_max_len=256, eval_batch_size=64,
    ckpt_interval=5000, keep_checkpoints=3, nonfinite_patience=5,
    collapse_patience=0,      # stop after this many collapsed steps in a row; 0: warn only
)

# Named training sets: (hf: spec of the dataset repo, folder of its training files)
TRAIN_SETS = {
    "msmarco-bm25": ("hf:sentence-transformers/msmarco-bm25", "triplet"),
    "msmarco-margin-mse": ("hf:sentence-transformers/msmarco", "bert-ensemble-margin-mse"),
}

PARTS = ("loss", "infonce", "margin_mse", "kl", "reg_q", "reg_d", "q_active_dims", "d_active_dims",
         "batch_flops", "zero_q", "zero_d", "doc_cosine")


# ------------------------------------------------------------------------------------------------
# Training data: (query, [positive, negatives...], optional teacher scores)
# ------------------------------------------------------------------------------------------------


class TrainingSet:
    """Examples held in memory as texts. `example(i, n_neg, seed)` picks `n_neg` of the example's
    negatives (all of them, in order, when it has exactly n_neg; else a subset that changes with
    `seed`, so each epoch sees other hard negatives) and the teacher scores that go with them."""

    def __init__(self, source, queries, docs, teacher):
        self.source, self.queries, self.docs, self.teacher = source, queries, docs, teacher

    def __len__(self):
        return len(self.queries)

    @property
    def has_teacher(self):
        return self.teacher is not None

    def example(self, i, n_neg, seed):
        docs = self.docs[i]
        keep = _pick_negatives(len(docs) - 1, n_neg, seed)
        teacher = None
        if self.teacher is not None:
            teacher = [self.teacher[i][0]] + [self.teacher[i][1 + j] for j in keep]
        return self.queries[i], [docs[0]] + [docs[1 + j] for j in keep], teacher


def _pick_negatives(available, n_neg, seed):
    if available == n_neg:
        return range(n_neg)
    return np.random.default_rng(seed).choice(available, size=n_neg, replace=False).tolist()


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
    from data.ir_datasets import file_format, jsonl_objects, parquet_rows, text_lines
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
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        return pq.read_schema(path).names
    except (pa.ArrowException, OSError) as e:
        raise _data_error(path, None, f"not a readable parquet file ({e})", "download or write it again") from e


def _data_error(path, pos, detail, fix):
    from data.ir_datasets import IRDataError
    unit = "row" if str(path).endswith(".parquet") else "line"
    return IRDataError(f"{path}{f', {unit} {pos}' if pos else ''}: {detail}. Fix: {fix}.")


def read_training_files(paths, n_negatives, strict=True, limit=0, source=None):
    """A TrainingSet from local files (module docstring). Malformed rows stop with file and line,
    or, with strict=False, are skipped (up to 10 per file) with a warning naming them."""
    from data.ir_datasets import IRDataError, RowProblems
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
                docs.append(tuple(d))
                teacher.append(None if t is None else tuple(t))
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
    return TrainingSet(source or ",".join(map(str, paths)), queries, docs, teacher if has_teacher else None)


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
    from data import hub
    from data.ir_datasets import file_format
    try:
        files = hub.list_repo_files(repo, repo_type="dataset", revision=rev)
    except hub.OfflineCacheMissError:  # offline: the files of the cached snapshot
        snap = hub.snapshot_download(repo, repo_type="dataset", revision=rev, allow_patterns=[f"{subset}/"])
        files = [p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()]
    chosen = sorted(f for f in files if f.startswith(f"{subset}/" if subset else "") and file_format(f))
    if not chosen:
        raise FileNotFoundError(f"hf:{repo}@{rev}: no .parquet/.jsonl/.tsv files under {subset or 'the root'!r}; "
                                f"the repo has {sorted(files)[:12]}. Set train_subset to the folder that holds them.")
    return chosen


def read_hub_training_set(spec, subset, n_negatives, strict=True, limit=0):
    """A training set from a Hub dataset repo, downloading file by file only as many as `limit` needs."""
    from data import hub
    repo, rev = hub.parse_spec(spec)
    files = _hub_files(repo, rev, subset)
    if _parquet_is_id_layout(repo, rev, files[0]):
        return read_msmarco_id_triplets(repo, rev, files, n_negatives, limit)
    paths, rows = [], 0
    for f in files:
        paths.append(hub.hf_hub_download(repo, f, repo_type="dataset", revision=rev))
        if limit and f.endswith(".parquet"):
            import pyarrow.parquet as pq
            rows += pq.ParquetFile(paths[-1]).metadata.num_rows
            if rows >= limit:
                break
    return read_training_files(paths, n_negatives, strict, limit, source=f"{spec}/{subset}")


def _parquet_is_id_layout(repo, rev, first):
    from data import hub
    if not first.endswith(".parquet"):
        return False
    names = _parquet_columns(hub.hf_hub_download(repo, first, repo_type="dataset", revision=rev))
    return {"query_id", "positive_id", "negative_id"} <= set(names) and "query" not in names


class MarcoIdTriplets:
    """MS MARCO (query_id, positive_id, negative_id[, margin]) rows resolved to texts through the
    `queries` and `corpus` subsets of the same repo (sentence-transformers/msmarco's layout).
    Ids live in numpy arrays and the 8.8M passages in one Arrow column (not 8.8M Python strings)."""

    def __init__(self, source, qids, pids, margin, query_text, corpus_ids, corpus_text):
        self.source, self.qids, self.pids, self.margin = source, qids, pids, margin
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

    def example(self, i, n_neg, seed):
        docs = [self._passage(self.pids[i, 0])] + [self._passage(self.pids[i, 1])] * n_neg
        teacher = None if self.margin is None else [float(self.margin[i])] + [0.0] * n_neg
        return self.query_text[int(self.qids[i])], docs, teacher


def _int_ids(column, where):
    import pyarrow as pa
    import pyarrow.compute as pc
    try:
        return pc.cast(column, pa.int64()).to_numpy()
    except pa.ArrowInvalid as e:
        raise _data_error(where, None, f"ids are not integers ({e})", "use the MS MARCO ids as given") from e


def read_msmarco_id_triplets(repo, rev, files, n_negatives, limit=0):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from data import hub
    if n_negatives > 1:
        raise T.ConfigError(f"hf:{repo}: rows have one negative each; n_negatives={n_negatives} must be 0 or 1")

    def table(paths, columns):
        return pa.concat_tables([pq.read_table(p, columns=columns) for p in paths])

    rows, paths = 0, []
    for f in files:
        paths.append(hub.hf_hub_download(repo, f, repo_type="dataset", revision=rev))
        rows += pq.ParquetFile(paths[-1]).metadata.num_rows
        if limit and rows >= limit:
            break
    names = _parquet_columns(paths[0])
    t = table(paths, [c for c in ("query_id", "positive_id", "negative_id", "score") if c in names])
    if limit:
        t = t.slice(0, limit)
    where = f"hf:{repo}/{files[0].split('/')[0]}"
    qids = _int_ids(t.column("query_id"), where)
    pids = np.stack([_int_ids(t.column("positive_id"), where), _int_ids(t.column("negative_id"), where)], 1)
    margin = t.column("score").to_numpy() if "score" in names else None
    qtab = table([hub.hf_hub_download(repo, f, repo_type="dataset", revision=rev)
                  for f in _hub_files(repo, rev, "queries")], ["query_id", "query"])
    query_text = dict(zip(_int_ids(qtab.column("query_id"), "queries").tolist(), qtab.column("query").to_pylist()))
    ctab = table([hub.hf_hub_download(repo, f, repo_type="dataset", revision=rev)
                  for f in _hub_files(repo, rev, "corpus")], ["passage_id", "passage"])
    data = MarcoIdTriplets(f"hf:{repo}@{rev}/{where}", qids, pids, margin, query_text,
                           _int_ids(ctab.column("passage_id"), "corpus"), ctab.column("passage"))
    missing_q = next((int(q) for q in np.unique(qids) if int(q) not in query_text), None)
    found = np.searchsorted(data.corpus_ids, pids).clip(max=len(data.corpus_ids) - 1)
    missing_p = pids[data.corpus_ids[found] != pids]
    if missing_q is not None or missing_p.size:
        raise _data_error(where, None, f"ids without a text (query {missing_q}, passages {missing_p[:3].tolist()})",
                          "the queries/corpus subsets must be those of the same repo and revision")
    return data


def load_training_set(C):
    """The training set named by train_data (module docstring)."""
    spec, subset = C["train_data"], C["train_subset"]
    if spec in TRAIN_SETS:
        spec, subset = TRAIN_SETS[spec][0], subset or TRAIN_SETS[spec][1]
    if spec.startswith("hf:"):
        return read_hub_training_set(spec, subset, C["n_negatives"], C["data_strict"], C["max_train_examples"])
    return read_training_files(_local_paths(spec), C["n_negatives"], C["data_strict"], C["max_train_examples"])


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


def micro_batch_positions(C, step, micro, rank, world):
    """Stream positions of this rank's examples in micro-step `micro` of optimizer step `step`:
    the global micro-batch is consecutive, and rank r holds its r-th slice, so one process with
    the same global batch sees the same examples in the same order."""
    n_micro = C["batch_size"] // C["grad_accum"]
    per_rank = n_micro // world
    start = (step * C["grad_accum"] + micro) * n_micro + rank * per_rank
    return range(start, start + per_rank)


def make_batch(data, order, positions, C, tokenizer, device):
    """Tokenised (query ids, query mask, doc ids, doc mask, teacher or None) of the examples at
    `positions`, and their number of real tokens; documents are laid out per example:
    [pos_0, negs_0..., pos_1, negs_1..., ...]."""
    queries, docs, teacher = [], [], []
    for p in positions:
        epoch, i = order(p)
        q, d, t = data.example(i, C["n_negatives"], [C["seed"], epoch, i])
        queries.append(q)
        docs += d
        teacher.append(t)
    q_ids, q_mask = encode_texts(tokenizer, queries, C["query_max_len"])
    d_ids, d_mask = encode_texts(tokenizer, docs, C["doc_max_len"])
    t = torch.tensor(teacher, dtype=torch.float32, device=device) if data.has_teacher else None
    n_tokens = int(q_mask.sum() + d_mask.sum())  # counted on the CPU: no device sync
    return (q_ids.to(device), q_mask.to(device), d_ids.to(device), d_mask.to(device), t), n_tokens


# ------------------------------------------------------------------------------------------------
# The loss
# ------------------------------------------------------------------------------------------------


def lambda_at(step, lam, warmup):
    """lambda(t) = lambda * min(1, t/T)^2 (naver/splade): the regulariser starts at 0 and grows
    quadratically, so the ranking loss first shapes the vectors and sparsity comes after."""
    return lam if warmup <= 0 else lam * min(1.0, step / warmup) ** 2


def flops_reg(w):
    """FLOPS(W) = sum_j (mean_i |w_ij|)^2: a smooth proxy of the expected number of multiplications
    per query-document pair; squaring the mean pushes down the dimensions many texts use."""
    return (w.abs().mean(0) ** 2).sum()


def l1_reg(w):
    return w.abs().sum(1).mean()


def doc_flops(d, n, mode="per_set"):
    """The document regulariser of documents d (N * n, V) laid out per query [positive, negatives...]
    (module docstring). per_set: the mean over the n sets (positives, first negatives, ...) of each
    set's FLOPS, naver/splade's definition; concat: FLOPS of all N * n documents as one batch."""
    if mode == "concat":
        return flops_reg(d)
    per_set = d.abs().view(-1, n, d.shape[1]).mean(0)                # (n, V): mean over the N queries
    return (per_set ** 2).sum(1).mean()


def gather_keep_grad(x, world, rank):
    """All ranks' rows of x, in rank order. The local rows stay in the autograd graph; the others
    are copies without gradient (module docstring: why that gives the exact global gradient)."""
    if world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.detach().contiguous())
    parts[rank] = x
    return torch.cat(parts)


def ranking_losses(q, d, teacher, kl_temperature=1.0):
    """(InfoNCE, MarginMSE, KL) of queries q (N, V) against documents d (N * n, V) laid out per
    query [positive, negatives...]; teacher (N, n) scores or None (then the distillation terms are 0).

    InfoNCE: query i's positive against every document of the batch - its own negatives and the
    positives and negatives of the other queries - with the plain dot product as the logit."""
    N = q.shape[0]
    n = d.shape[0] // N
    scores = q @ d.T                                                  # (N, N * n)
    positive = torch.arange(N, device=q.device) * n
    infonce = F.cross_entropy(scores, positive)
    zero = scores.new_zeros(())
    if teacher is None or n < 2:
        return infonce, zero, zero
    own = scores.view(N, N, n)[torch.arange(N), torch.arange(N)]     # (N, n): [s(q, pos), s(q, negs)]
    margin_mse = F.mse_loss(own[:, :1] - own[:, 1:], teacher[:, :1] - teacher[:, 1:])
    kl = F.kl_div(F.log_softmax(own / kl_temperature, -1), F.log_softmax(teacher / kl_temperature, -1),
                  reduction="batchmean", log_target=True)
    return infonce, margin_mse, kl


@torch.no_grad()
def batch_sparsity(q, d):
    """Statistics of a batch's vectors, for the log and the collapse checks: mean active dims per
    side, the batch FLOPS estimate sum_j p_j q_j (p_j, q_j: fraction of documents / queries using
    term j; the cost metric of naver/splade's splade/flops.py), the fraction of all-zero vectors,
    and the mean cosine between distinct documents, from
    |sum_i u_i|^2 = sum_i |u_i|^2 + sum_{i != j} u_i . u_j (u_i = unit vectors): O(M V) instead of
    the O(M^2 V) Gram matrix."""
    qa, da = q > 0, d > 0
    u = F.normalize(d.float(), dim=1)                                 # all-zero rows stay zero
    M = d.shape[0]
    cos = ((u.sum(0) ** 2).sum() - (u ** 2).sum()) / max(M * (M - 1), 1)
    return torch.stack([qa.sum(1).float().mean(), da.sum(1).float().mean(),
                        (qa.float().mean(0) * da.float().mean(0)).sum(),
                        (~qa.any(1)).float().mean(), (~da.any(1)).float().mean(), cos])


class SpladeObjective(nn.Module):
    """The loss of one micro-batch. DDP and torch.compile wrap this module, so the whole loss (both
    encoders, the gathering, the regularisers) runs inside forward. Returns (the loss to
    backpropagate, the PARTS of the global loss for the log)."""

    def __init__(self, model, C, world, rank):
        super().__init__()
        self.model, self.world, self.rank = model, world, rank
        self.chunk = C["pool_chunk"] or None
        self.w = (C["infonce_weight"], C["margin_mse_weight"], C["kl_weight"])
        self.kl_temperature = C["kl_temperature"]
        self.query_reg = flops_reg if C["query_reg"] == "flops" else l1_reg
        self.doc_reg = C["doc_reg"]

    def forward(self, q_ids, q_mask, d_ids, d_mask, teacher, lam_q, lam_d):
        q = splade_pool(self.model, q_ids, q_mask, chunk_size=self.chunk)   # fp32 (B, V)
        d = splade_pool(self.model, d_ids, d_mask, chunk_size=self.chunk)
        Q = gather_keep_grad(q, self.world, self.rank)
        Dd = gather_keep_grad(d, self.world, self.rank)
        if teacher is not None and self.world > 1:
            teacher = gather_keep_grad(teacher, self.world, self.rank)
        # scores of unnormalised vectors reach 1e5 when the head is too large: never in bf16
        with torch.autocast(q.device.type, enabled=False):
            infonce, margin_mse, kl = ranking_losses(Q, Dd, teacher, self.kl_temperature)
            reg_q, reg_d = self.query_reg(Q), doc_flops(Dd, Dd.shape[0] // Q.shape[0], self.doc_reg)
            loss = (self.w[0] * infonce + self.w[1] * margin_mse + self.w[2] * kl
                    + lam_q * reg_q + lam_d * reg_d)
        parts = torch.cat([torch.stack([loss, infonce, margin_mse, kl, reg_q, reg_d]).detach(),
                           batch_sparsity(Q, Dd)])
        # every rank holds the same global loss; DDP averages gradients, so scale by world size
        return loss * self.world, parts


# ------------------------------------------------------------------------------------------------
# Backbone: load, check, rescale
# ------------------------------------------------------------------------------------------------

MLM_BACKBONES = "BERT, DistilBERT, ALBERT, GTE-MLM, RoBERTa, ModernBERT, Ettin or EuroBERT"


def load_backbone(spec):
    """An MLM encoder from `spec`; a clear error for checkpoints without an MLM head."""
    try:
        model = from_pretrained(spec)
    except KeyError as e:
        if "no masked-LM" not in str(e):
            raise
        raise T.ConfigError(f"--init {spec}: the checkpoint has no MLM head, and SPLADE reads its term weights "
                         f"from the MLM head's vocabulary logits. Use the masked-LM checkpoint of the model "
                         f"(saved as *ForMaskedLM), not the bare encoder. ({e})") from None
    if model.config.causal:
        raise T.ConfigError(f"--init {spec}: a {model.config.family} model is a causal decoder; its head predicts "
                         f"the next token, not the token at each position, so it is not an MLM head. SPLADE "
                         f"needs a masked-LM encoder: {MLM_BACKBONES}.")
    return model


def untie_mlm_head(model):
    """Give a tied decoder its own copy of the shared matrix (and say so in the config, so that
    checkpoints save the decoder separately with tie_word_embeddings=false)."""
    if model.head.decoder.weight is model.embed.tok.weight:
        model.head.decoder.weight = nn.Parameter(model.embed.tok.weight.detach().clone())
    model.config = dataclasses.replace(model.config, tie_embeddings=False)


@torch.no_grad()
def embedding_outputs(model, ids):
    """The embedding layer's output (word + position + segment embeddings, norm, projection)."""
    was_training = model.training
    model.eval()  # no dropout: the same ids must give the same output
    out = model.embed(ids).float()
    model.train(was_training)
    return out


def rescale_backbone(model, k, bias, head_scale=1.0, untie=False, probe=None):
    """The paper's intervention, W_head <- W_head / k, with the head norms before and after.

    Before it, two options of the small-scale experiments: `untie` gives a tied decoder its own
    matrix, and `head_scale` multiplies W_head by m, emulating a backbone with an m times larger
    head (the bias is left, like k leaves it by default; so k = m undoes head_scale = m exactly).

    A tied head shares W_head with the input word embeddings, so scaling it scales them too. A
    LayerNorm right after the word embeddings (ModernBERT) absorbs that; BERT adds the position and
    segment embeddings before its LayerNorm, so its embedding output changes. `probe` (token ids,
    mask) measures it: the mean cosine, over the real tokens, between the embedding layer's output
    before and after (1 when the input embeddings are untouched)."""
    before = head_norms(model)
    emb0 = embedding_outputs(model, probe[0]) if probe is not None else None
    if untie:
        untie_mlm_head(model)
    if head_scale != 1:
        with torch.no_grad():
            mlm_head_weight(model).mul_(head_scale)
    scaled = head_norms(model)
    rescale_mlm_head(model, k, bias=bias)
    cosine = None
    if probe is not None:
        real = probe[1].bool()
        cosine = F.cosine_similarity(embedding_outputs(model, probe[0]), emb0, dim=-1)[real].mean().item()
    return {"k": k, "k_bias": bias, "head_scale": head_scale, "untie_head": untie, "before": before,
            "scaled": scaled, "after": head_norms(model), "embedding_cosine": cosine,
            "embedding_probe_tokens": int(probe[1].sum()) if probe is not None else 0}


def _norms(n):
    bias = "none" if n["bias_l2"] is None else f"{n['bias_l2']:.4f}"
    return f"Frobenius {n['frobenius']:.2f}, mean row L2 {n['mean_row_l2']:.4f}, bias L2 {bias}"


def describe_rescaling(h):
    b, a = h["before"], h["after"]
    m, untie = h.get("head_scale", 1.0), h.get("untie_head", False)
    lines = [f"MLM head W_head{' (tied to the input embeddings)' if b['tied'] else ''}: {_norms(b)}"]
    if untie and b["tied"]:
        lines.append("  untied: the decoder got its own copy of the matrix (untie_head=True)")
    if m != 1:
        lines.append(f"  x head_scale {m:g} (emulating a larger head): {_norms(h['scaled'])}")
    lines.append(f"  / k={h['k']:g}{' (bias too)' if h['k_bias'] else ''}: {_norms(a)}")
    if h.get("embedding_cosine") is not None:
        lines.append(f"  input embedding layer output, after vs before: mean cosine {h['embedding_cosine']:.3f} over "
                     f"{h['embedding_probe_tokens']} tokens of the first documents")
        if a["tied"] and m != h["k"]:  # a net scaling of the shared matrix
            lines.append("  (the head is tied, so the input word embeddings were scaled too: a LayerNorm right after "
                         "them, as in ModernBERT, absorbs that; BERT adds position and segment embeddings first, "
                         "so its input changes; untie_head=True leaves it)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Collapse: the ways SPLADE training fails, reported instead of silently trained through
# ------------------------------------------------------------------------------------------------


class SpladeCollapse(RuntimeError):
    """collapse_patience collapsed steps in a row: the run stops (a user-facing outcome, not a bug)."""


class CollapseMonitor:
    """Watches every step's global-batch statistics for the ways SPLADE training fails when the
    MLM head's scale does not suit dot-product scores (the rescaling paper), or the regulariser
    wins. The signals of a step, first match wins:
    - zero: most vectors are all zero, or hold fewer than MIN_TERMS terms on average - the
      regulariser won, or the head is now too small;
    - dense: the active dims explode towards V (more than DENSE_FRACTION of the vocabulary) - the
      head's scale is too large (the paper's ModernBERT/Ettin at k=1);
    - identical: documents point the same way (mean cosine > SAME_COSINE) - the text hardly decides
      the terms, typically after dividing an already small head by a large k;
    - large: the ranking loss of the last LARGE_STEPS steps is LARGE_FACTOR x that of a random
      ranking, ln(candidates), or more - scores so large that the softmax is confidently wrong, a
      head too large even when the vectors look sane;
    - chance: the ranking loss of the last CHANCE_STEPS steps averages CHANCE_FRACTION x ln(candidates)
      or more - whatever the vectors look like, they do not rank.
    The last two need `candidates` (documents each query is ranked against; None: InfoNCE unused).

    Hysteresis: an episode begins with the first signal (one warning, naming the likely cause) and
    ends ("recovered") only after RECOVER_STEPS steps in a row with no signal and a ranking loss
    under the chance line, so vectors that flicker between 1 and 2 terms while the loss sits at
    ln(candidates) are one episode, not a warning and a recovery every few steps. Messages go to
    `out` (None: silent, for ranks > 0); with patience > 0 the run stops after that many bad
    steps in a row."""

    ZERO_FRACTION, MIN_TERMS = 0.5, 2.0
    DENSE_FRACTION, SAME_COSINE = 0.5, 0.9
    LARGE_FACTOR, LARGE_STEPS = 2.0, 5
    CHANCE_FRACTION, CHANCE_STEPS = 0.9, 50
    RECOVER_STEPS = 50

    def __init__(self, vocab_size, patience=0, head=None, out=sys.stderr, candidates=None):
        self.vocab, self.patience, self.head, self.out = vocab_size, patience, head, out
        self.candidates = candidates if candidates and candidates > 1 else None
        self.chance = math.log(self.candidates) if self.candidates else None
        self.losses = collections.deque(maxlen=self.CHANCE_STEPS)  # recent ranking losses
        self.state, self.since, self.in_a_row, self.clear = None, None, 0, 0

    def diagnose(self, s, lambdas):
        """(kind, why) of this step's first signal (with the recent losses), or (None, "")."""
        norm = f" (mean row L2 of W_head: {self.head:.4f})" if self.head else ""
        few = min(s["q_active_dims"], s["d_active_dims"])
        if max(s["zero_q"], s["zero_d"]) > self.ZERO_FRACTION or few < self.MIN_TERMS:
            return "zero", (f"{s['zero_q']:.0%} of query and {s['zero_d']:.0%} of document vectors are all zero; "
                            f"they hold {s['q_active_dims']:.1f} and {s['d_active_dims']:.1f} terms on average. "
                            f"Likely causes: the FLOPS regulariser is too strong (lambda_q={lambdas[0]:.3g}, "
                            f"lambda_d={lambdas[1]:.3g} now: lower lambda_q/lambda_d or lengthen lambda_warmup), "
                            f"or the MLM head was scaled down too far{norm} (a smaller --k)")
        dense = max(s["q_active_dims"], s["d_active_dims"]) / self.vocab
        if dense > self.DENSE_FRACTION:
            return "dense", (f"{dense:.0%} of the vocabulary is active (documents' mean cosine {s['doc_cosine']:.3f}). "
                             f"Likely cause: the MLM head's scale is too large for dot-product scores{norm}: "
                             f"rescale it with --k (the paper: 16 for ModernBERT/Ettin)")
        if s["doc_cosine"] > self.SAME_COSINE:
            return "identical", (f"documents use few terms ({s['d_active_dims']:.0f} on average) but the same ones "
                                 f"(mean cosine {s['doc_cosine']:.3f}), so the text hardly matters. Likely cause: "
                                 f"the MLM head was scaled down too far for this backbone{norm} (the paper: "
                                 f"rescaling a head that is already small collapses it): try a smaller --k")
        if self.chance is None or not self.losses:
            return None, ""
        recent = list(self.losses)[-self.LARGE_STEPS:]
        loss, ln = sum(recent) / len(recent), f"ln {self.candidates} = {self.chance:.2f}"
        if loss >= self.LARGE_FACTOR * self.chance:
            return "large", (f"the ranking loss ({loss:.3g} over the last {len(recent)} step(s)) is "
                             f"{loss / self.chance:.1f}x that of a random ranking ({ln}): the scores are so large "
                             f"that the softmax is confidently wrong. Likely cause: the MLM head's scale is too "
                             f"large for dot-product scores{norm}: rescale it with --k")
        loss = sum(self.losses) / len(self.losses)
        if len(self.losses) == self.CHANCE_STEPS and loss >= self.CHANCE_FRACTION * self.chance:
            return "chance", (f"the ranking loss has averaged {loss:.3f} over the last {self.CHANCE_STEPS} steps, "
                              f"{loss / self.chance:.0%} of a random ranking's {ln}: the vectors do not tell a "
                              f"query's positive from the other documents (documents hold {s['d_active_dims']:.0f} "
                              f"terms, mean cosine {s['doc_cosine']:.2f}). Likely causes: the MLM head's scale does "
                              f"not suit this backbone{norm} (too small after a large --k, or too large), or the "
                              f"learning rate")
        return None, ""

    def say(self, text):
        if self.out is not None:
            print(text, file=self.out)

    def check(self, step, s, lambdas):
        if self.chance is not None:
            self.losses.append(s["infonce"])
        kind, why = self.diagnose(s, lambdas)
        if kind and self.state is None:
            self.say(f"warning: step {step}: SPLADE collapse ({kind}): {why}")
            self.state, self.since, self.in_a_row, self.clear = kind, step, 0, 0
        if self.state is None:
            return
        if kind or (self.chance is not None and s["infonce"] >= self.CHANCE_FRACTION * self.chance):
            self.in_a_row, self.clear = self.in_a_row + 1, 0
        else:
            self.in_a_row, self.clear = 0, self.clear + 1
            if self.clear >= self.RECOVER_STEPS:
                loss = f" and a ranking loss under {self.CHANCE_FRACTION:.0%} of ln {self.candidates}"
                self.say(f"step {step}: recovered from the {self.state} collapse of step {self.since}: "
                         f"{self.RECOVER_STEPS} steps in a row without a collapse signal{loss if self.chance else ''}")
                self.state, self.since = None, None
                return
        if self.patience and self.in_a_row >= self.patience:
            why = why or "The ranking loss is still at chance."
            raise SpladeCollapse(f"step {step}: SPLADE collapse ({kind or self.state}) for {self.in_a_row} steps in "
                                 f"a row; stopping with the last checkpoint kept. {why}")


# ------------------------------------------------------------------------------------------------
# Saving: Hugging Face folder + the sentence-transformers SparseEncoder files
# ------------------------------------------------------------------------------------------------

ST_MODULES = [
    {"idx": 0, "name": "0", "path": "",
     "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
    {"idx": 1, "name": "1", "path": "1_SpladePooling",
     "type": "sentence_transformers.sparse_encoder.models.SpladePooling"},
]


def write_sparse_encoder_files(folder, vocab_size, max_seq_length):
    """The small files with which sentence-transformers' SparseEncoder(folder) loads the Hugging Face
    model in `folder` as MLMTransformer + SpladePooling (max over tokens of log(1 + relu(logits)))."""
    folder = Path(folder)
    files = {
        "modules.json": ST_MODULES,
        "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False},
        "config_sentence_transformers.json": {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""},
                                              "default_prompt_name": None, "similarity_fn_name": "dot"},
        "1_SpladePooling/config.json": {"pooling_strategy": "max", "activation_function": "relu",
                                        "word_embedding_dimension": vocab_size},
    }
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(content, indent=2) + "\n")


def read_tokenizer_files(folder):
    """The tokenizer files of a model folder, kept in memory so every checkpoint carries them even
    after the folder they came from is gone (a pruned checkpoint we resumed from)."""
    return {n: (Path(folder) / n).read_text() for n in TOKENIZER_FILES if (Path(folder) / n).exists()}


def export_final(folder, out):
    """Copy the final checkpoint's model to out_dir/model (atomically: copy, then rename)."""
    final, tmp = Path(out) / "model", Path(out) / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


# ------------------------------------------------------------------------------------------------
# Configuration checks (before anything is downloaded)
# ------------------------------------------------------------------------------------------------


def check_config(C, world=1):
    k = C["k"]
    if not (isinstance(k, (int, float)) and math.isfinite(k) and k > 0):
        raise T.ConfigError(f"--k {k!r}: the rescaling factor must be a finite number > 0 (W_head is divided by it; "
                         "k=1 is standard SPLADE, the paper uses 1 to 32, e.g. 16 for ModernBERT)")
    m = C["head_scale"]
    if not (isinstance(m, (int, float)) and math.isfinite(m) and m > 0):
        raise T.ConfigError(f"--head_scale {m!r}: must be a finite number > 0 (W_head is multiplied by it before the "
                         "division by k; 1 leaves the head as pretrained)")
    if C["query_reg"] not in ("flops", "l1"):
        raise T.ConfigError(f"query_reg={C['query_reg']!r}: use 'flops' or 'l1'")
    if C["doc_reg"] not in ("per_set", "concat"):
        raise T.ConfigError(f"doc_reg={C['doc_reg']!r}: use 'per_set' (naver/splade: FLOPS averaged over the positives "
                         "and each negative set) or 'concat' (FLOPS of all documents as one batch)")
    weights = (C["infonce_weight"], C["margin_mse_weight"], C["kl_weight"])
    if min(weights) < 0 or max(weights) == 0:
        raise T.ConfigError("infonce_weight, margin_mse_weight, kl_weight must be >= 0 with at least one > 0")
    if (C["margin_mse_weight"] or C["kl_weight"]) and C["n_negatives"] < 1:
        raise T.ConfigError("MarginMSE/KL compare a positive with its hard negatives: n_negatives must be >= 1")
    per = world * C["grad_accum"]
    if C["batch_size"] % per:
        raise T.ConfigError(f"batch_size={C['batch_size']} (global queries per step) must be divisible by "
                         f"world size x grad_accum = {world} x {C['grad_accum']}")
    if C["n_negatives"] < 0 or C["query_max_len"] < 2 or C["doc_max_len"] < 2:
        raise T.ConfigError("n_negatives must be >= 0 and query_max_len / doc_max_len >= 2")


def check_data(C, data):
    if (C["margin_mse_weight"] or C["kl_weight"]) and not data.has_teacher:
        raise T.ConfigError(f"margin_mse_weight/kl_weight > 0 need teacher scores, and {data.source} has none "
                         "(fields scores / margin / score). Use train_data=msmarco-margin-mse, or set them to 0.")


def master_first(D, fn):
    """Run fn on rank 0 first (downloads land in the shared cache once), then on the other ranks."""
    if not D.master:
        D.barrier()
    try:
        return fn()
    finally:
        if D.master:
            D.barrier()


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------


def evaluate(C, D, model, tokenizer, bench):
    """Periodic evaluation (eval/retrieval.py): nDCG@10 and FLOPS of the current model."""
    from eval.retrieval import evaluate_splade
    dtype = getattr(torch, C["dtype"]) if D.device.type == "cuda" else torch.float32
    summary = evaluate_splade(model, tokenizer, bench, None, max_len=C["eval_max_len"],
                              query_max_len=min(C["eval_max_len"], C["query_max_len"]),
                              batch_size=C["eval_batch_size"], device=D.device, dtype=dtype, progress=False)
    rec = {f"eval_{k}": v for k, v in summary["mean"].items()}
    rec["eval_ndcg10_per_dataset"] = {n: r.get("nDCG@10") for n, r in summary["datasets"].items()}
    return rec


def main(argv=None):
    C = T.parse_config(DEFAULTS, sys.argv[1:] if argv is None else argv, script=__file__)
    check_config(C, int(os.environ.get("WORLD_SIZE", 1)))
    with T.Run(C) as run:
        return train(C, run)


def train(C, run):
    """The training run for a parsed, checked config, inside its `training.Run`."""
    D, out, ckpts, preempt = run.dist, run.out, run.checkpoints, run.preemption

    # ---- model, resuming from the newest valid checkpoint if there is one
    def build(folder):
        return from_pretrained(folder / "model") if folder else master_first(D, lambda: load_backbone(C["init"]))
    model, state, opt_state, rng, resume = T.resume_or_build(ckpts, C["resume"], build)
    tokenizer_files = read_tokenizer_files(model.source)
    tokenizer = load_tokenizer(model.source)
    model.source = None  # checkpoints write the tokenizer files themselves (read_tokenizer_files)

    data = master_first(D, lambda: load_training_set(C))
    check_data(C, data)
    order = EpochOrder(len(data), C["seed"])

    if resume is None:  # untie, scale and rescale once, before the first step; a checkpoint already is
        probe = make_batch(data, order, range(min(16, len(data))), C, tokenizer, "cpu")[0][2:4]
        rescaling = rescale_backbone(model, C["k"], C["k_bias"], C["head_scale"], C["untie_head"], probe)
    else:
        rescaling = state["rescaling"]
        done = {"k": rescaling["k"], "k_bias": rescaling["k_bias"], "head_scale": rescaling.get("head_scale", 1.0),
                "untie_head": rescaling.get("untie_head", False)}
        if D.master and any(C[key] != v for key, v in done.items()):
            print(f"warning: the checkpoint's head was prepared with {done}; the config now says "
                  f"{ {key: C[key] for key in done} }. A resumed run keeps the checkpoint's head (it is not "
                  f"scaled again); start a new out_dir to change them", file=sys.stderr)
    model.to(D.device).train()
    cfg = model.config

    objective = SpladeObjective(model, C, D.world_size, D.rank)
    train_obj = D.ddp(objective)
    optimizer = T.adamw(model, C["lr"], C["weight_decay"], (C["beta1"], C["beta2"]), C["adam_eps"], D.device)
    if opt_state is not None:
        optimizer.load_state_dict(opt_state)
    if C["compile"]:
        train_obj = torch.compile(train_obj, dynamic=True)

    step = state.get("step", 0)
    if resume:
        if state.get("train_examples") != len(data):
            print(f"warning: the training data has {len(data)} examples, the checkpoint was trained on "
                  f"{state.get('train_examples')}: the example order differs from the original run", file=sys.stderr)
        if rng is not None:
            T.set_rng_state(rng)
        if D.master:
            print(f"resumed from {resume} at step {step}")
    guard = T.NonFiniteGuard(C["nonfinite_patience"], ckpts)
    guard.skipped = state.get("skipped_steps", 0)
    candidates = C["batch_size"] // C["grad_accum"] * (1 + C["n_negatives"]) if C["infonce_weight"] else None
    monitor = CollapseMonitor(cfg.vocab_size, C["collapse_patience"], rescaling["after"]["mean_row_l2"],
                              out=sys.stderr if D.master else None, candidates=candidates)
    log = T.JsonlLog(out / "log.jsonl", enabled=D.master, resume_step=step if resume else None)
    if D.master:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(C, indent=1))
        print("recipe (train_splade.py DEFAULTS + overrides):\n" + "\n".join(f"  {k} = {v!r}" for k, v in C.items()))
        print(f"{cfg.family}: {model.num_params() / 1e6:.1f}M parameters, vocabulary {cfg.vocab_size}; "
              f"{D.world_size} process(es) on {D.device}; {len(data):,} training examples from {data.source}"
              f"{' (with teacher scores)' if data.has_teacher else ''}")
        print(describe_rescaling(rescaling))
        if resume is None:
            (out / "head_norms.json").write_text(json.dumps(rescaling, indent=1))
            log.write(step=0, init=C["init"], rescaling=rescaling)

    bench = None
    if C["eval_interval"]:
        from data.ir_datasets import load_benchmark
        bench = master_first(D, lambda: load_benchmark(C["eval_benchmark"]))

    def save(step, final=False, periodic=False):
        trainer = {"config": C, "rescaling": rescaling, "skipped_steps": guard.skipped,
                   "train_examples": len(data), "examples_seen": step * C["batch_size"]}

        def extra(folder):
            for name, text in tokenizer_files.items():
                (folder / "model" / name).write_text(text)
            write_sparse_encoder_files(folder / "model", cfg.vocab_size, C["doc_max_len"])
        return ckpts.save(step, model, optimizer.state_dict(), trainer, extra=extra, final=final,
                          periodic=periodic)

    from tqdm import tqdm
    bar = tqdm(total=C["max_steps"], initial=step, disable=not D.master, dynamic_ncols=True, desc="train")
    throughput, save_due = T.Throughput(D, flops_per_token(cfg, C["doc_max_len"])), False
    while step < C["max_steps"]:
        lr = T.lr_at(step, lr=C["lr"], warmup=C["warmup_steps"], total=C["max_steps"], schedule=C["schedule"],
                     min_lr_ratio=C["min_lr_ratio"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        lambdas = tuple(lambda_at(step, C[lam], C["lambda_warmup"]) for lam in ("lambda_q", "lambda_d"))
        lam = [torch.tensor(x, device=D.device) for x in lambdas]  # tensors: compile does not re-trace per value
        parts, step_tokens = torch.zeros(len(PARTS), device=D.device), 0
        for micro in range(C["grad_accum"]):
            batch, n_tokens = make_batch(data, order, micro_batch_positions(C, step, micro, D.rank, D.world_size),
                                         C, tokenizer, D.device)
            step_tokens += n_tokens
            last = micro == C["grad_accum"] - 1
            # DDP: all-reduce gradients only on the last micro-step of the accumulation
            sync = contextlib.nullcontext() if last or not D.enabled else train_obj.no_sync()
            with sync, T.autocast(D.device, C["dtype"]):
                loss, p = train_obj(*batch, *lam)
                (loss / C["grad_accum"]).backward()
            parts += p / C["grad_accum"]
        stats = dict(zip(PARTS, parts.tolist()))  # global-batch values: the same on every rank
        grad_norm = guard.optimizer_step(model, optimizer, stats["loss"], step, C["grad_clip"],
                                         hint="an MLM head too large for SPLADE (try --k 16), "
                                              "lambda_q/lambda_d too high, ")
        step += 1
        bar.update(1)
        throughput.step(step_tokens)
        monitor.check(step, stats, lambdas)

        if step % C["log_interval"] == 0 or step == C["max_steps"]:
            rec = dict(step=step, **{k: stats[k] for k in PARTS if k not in ("margin_mse", "kl")},
                       lambda_q=lambdas[0], lambda_d=lambdas[1], lr=lr, grad_norm=grad_norm,
                       examples=step * C["batch_size"], skipped_steps=guard.skipped, collapse=monitor.state,
                       **throughput.report())
            if data.has_teacher:
                rec.update(margin_mse=stats["margin_mse"], kl=stats["kl"])
            log.write(**rec)
            bar.set_postfix(loss=f"{rec['loss']:.3f}", q=f"{rec['q_active_dims']:.0f}",
                            d=f"{rec['d_active_dims']:.0f}", lr=f"{lr:.2e}")
        if bench is not None and (step % C["eval_interval"] == 0 or step == C["max_steps"]):
            with throughput.paused():
                ev = evaluate(C, D, model, tokenizer, bench)
            log.write(step=step, **ev)
            if D.master:
                bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in ev.items() if isinstance(v, float)))
        stop = D.any(preempt.requested)
        save_due = save_due or step % C["ckpt_interval"] == 0 or step == C["max_steps"] or stop
        if save_due and not guard.healthy:  # never checkpoint weights that gave a non-finite loss
            if (stop or step == C["max_steps"]) and D.master:
                bar.write(guard.unsaved_message(step))
        elif save_due:
            save_due = False
            with throughput.paused():
                folder = save(step, final=step == C["max_steps"], periodic=not stop and step < C["max_steps"])
            if step == C["max_steps"] and D.master:
                bar.write(f"final model: {export_final(folder / 'model', out)}")
        if stop:
            if D.master and guard.healthy:
                bar.write(preempt.saved_message(step))
            break
    bar.close()
    D.close()
    return step


if __name__ == "__main__":
    T.run_cli(main, extra_errors=(SpladeCollapse,))
