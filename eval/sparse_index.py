"""Inverted index over sparse (SPLADE) vectors: bounded-memory build, exact top-k search,
sparsity statistics (active dims, FLOPS) and export for Anserini/Pyserini.

A SPLADE vector has a weight per vocabulary id and ~100 non-zeros, so a corpus is a sparse
(num_docs x vocab) matrix and its transpose is an inverted index: for every vocabulary id, the
documents that use it (postings, ascending doc number) with their weights. Scoring a query
`s(d) = q . d` then only touches the postings of the query's terms ("term at a time"), instead of
every non-zero of the corpus.

On disk (one folder, reused across evaluations; the big arrays are memory-mapped on load):
    meta.json               counts and format version
    indptr.npy              int64 (vocab + 1): postings of term t are [indptr[t], indptr[t+1])
    postings_docs.npy       int32 (num_postings): doc numbers, ascending within a term
    postings_weights.npy    float32 (num_postings)
    doc_ids.npy             bytes (num_docs): the external id (utf-8) of every doc number

Build input is a stream of chunks, each a scipy.sparse matrix (rows = docs) or `(ids, matrix)`.
Memory is bounded by a chunk: every chunk is transposed and appended to scratch files, then the
final postings are assembled term-block by term-block (each block at most a chunk's worth of
postings) and written sequentially.

Ranking follows eval/metrics.py: score descending, ties by doc id descending, so evaluating a
top-k run equals evaluating the full ranking cut at k. Scores are accumulated in float32, the
precision trec_eval ranks in, and written to runs exactly (float32 -> float64 is exact), so the
k kept here are the first k of trec_eval's ranking of the same scores.
"""
import json
import shutil
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from tqdm import tqdm

from data.atomic import atomic_write

FORMAT = {"format": "sparse-inverted-index", "version": 1}


# ----------------------------------------------------------------------------- input chunks


def iter_csr_chunks(rows, vocab_size: int, chunk_rows: int = 10_000):
    """Group `(doc_id, indices, values)` rows into `(ids, csr_matrix)` chunks for build_index."""
    ids, cols, vals, indptr = [], [], [], [0]
    for doc_id, indices, values in rows:
        ids.append(doc_id)
        cols.append(np.asarray(indices, np.int64))
        vals.append(np.asarray(values, np.float32))
        indptr.append(indptr[-1] + len(cols[-1]))
        if len(ids) == chunk_rows:
            yield ids, _csr(cols, vals, indptr, vocab_size)
            ids, cols, vals, indptr = [], [], [], [0]
    if ids:
        yield ids, _csr(cols, vals, indptr, vocab_size)


def _csr(cols, vals, indptr, vocab_size):
    data = np.concatenate(vals) if vals else np.zeros(0, np.float32)
    indices = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    return sp.csr_matrix((data, indices, np.array(indptr)), shape=(len(indptr) - 1, vocab_size))


def bad_run_id(ids):
    """The first id that is empty or contains whitespace (a TREC run line cannot hold it), or None."""
    return next((i for i in map(str, ids) if not i or len(i.split()) != 1 or i.split()[0] != i), None)


def _clean_chunk(item, first_row, vocab_size, what="chunk"):
    """(ids, csr float32 matrix without zeros or duplicates), with the checks that matter later."""
    ids, matrix = item if isinstance(item, tuple) else (None, item)
    if not sp.issparse(matrix):
        raise TypeError(f"{what} starting at row {first_row}: expected a scipy.sparse matrix or "
                        f"(ids, matrix), got {type(matrix).__name__}")
    matrix = sp.csr_matrix(matrix, dtype=np.float32, copy=True)
    matrix.sum_duplicates()
    matrix.eliminate_zeros()
    if matrix.shape[1] != vocab_size:
        raise ValueError(f"{what} starting at row {first_row} has {matrix.shape[1]} columns, "
                         f"the vocabulary has {vocab_size}")
    if matrix.nnz and not (np.isfinite(matrix.data).all() and matrix.data.min() > 0):
        row = int(np.searchsorted(matrix.indptr, np.flatnonzero(~(matrix.data > 0))[0], "right")) - 1
        raise ValueError(f"{what} row {first_row + row}: weights must be finite and >= 0 "
                         f"(SPLADE weights are log(1 + relu(.))); fix the encoder output")
    if ids is None:
        ids = [str(first_row + i) for i in range(matrix.shape[0])]
    ids = [str(i) for i in ids]
    if len(ids) != matrix.shape[0]:
        raise ValueError(f"{what} starting at row {first_row}: {len(ids)} ids for "
                         f"{matrix.shape[0]} rows")
    bad = bad_run_id(ids)
    if bad is not None:
        raise ValueError(f"{what} starting at row {first_row}: doc id {bad!r} is empty or contains "
                         f"whitespace, which a TREC run cannot hold")
    return ids, matrix


# ----------------------------------------------------------------------------- sparsity / FLOPS


def active_dims(matrix) -> np.ndarray:
    """Number of non-zero weights in every row."""
    m = sp.csr_matrix(matrix)
    return np.bincount(np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))[m.data != 0],
                       minlength=m.shape[0])


def term_doc_counts(matrix) -> np.ndarray:
    """For every vocabulary id, the number of rows where its weight is non-zero."""
    m = sp.csr_matrix(matrix)
    return np.bincount(m.indices[m.data != 0], minlength=m.shape[1])


def flops(doc_counts, num_docs: int, query_counts, num_queries: int) -> float:
    """FLOPS = sum_j p_j q_j with p_j (q_j) the fraction of documents (queries) whose weight j is
    non-zero: the expected number of multiplications per query-document pair (Paria et al.,
    "Minimizing FLOPs to Learn Efficient Sparse Representations", ICLR 2020, as SPLADE reports it,
    Formal et al., SIGIR 2021)."""
    if num_docs == 0 or num_queries == 0:
        return 0.0
    p = np.asarray(doc_counts, np.float64) / num_docs
    q = np.asarray(query_counts, np.float64) / num_queries
    return float(np.dot(p, q))


def sparsity_stats(docs, queries) -> dict:
    """Mean active dims per query and per document, and FLOPS, from two sparse matrices."""
    return _stats(term_doc_counts(docs), docs.shape[0], term_doc_counts(queries), queries.shape[0])


def _stats(doc_counts, num_docs, query_counts, num_queries):
    # the active dims of all rows add up to the per-term counts, so the means need only those
    return {"mean_query_active_dims": float(np.sum(query_counts)) / max(num_queries, 1),
            "mean_doc_active_dims": float(np.sum(doc_counts)) / max(num_docs, 1),
            "flops": flops(doc_counts, num_docs, query_counts, num_queries)}


# ----------------------------------------------------------------------------- building


def build_index(chunks, out_dir, vocab_size: int, block_postings: int | None = None,
                progress: bool = True) -> "SparseIndex":
    """Build the inverted index of a stream of document chunks into out_dir; returns it loaded.

    block_postings: postings assembled at once in the merge (default: the largest chunk's count),
    which with the chunk size bounds the memory used.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / "_build"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        chunk_indptrs, num_docs, longest_id, biggest = _write_chunks(chunks, scratch, vocab_size,
                                                                     progress)
        df = sum((np.diff(p) for p in chunk_indptrs), np.zeros(vocab_size, np.int64))
        indptr = np.concatenate([[0], np.cumsum(df)]).astype(np.int64)
        with _NpyWriter(out / "indptr.npy", np.int64, len(indptr)) as w:
            w.write(indptr)
        _merge_postings(scratch, out, chunk_indptrs, indptr, block_postings or max(biggest, 1),
                        progress)
        _write_doc_ids(scratch / "ids.txt", out / "doc_ids.npy", num_docs, longest_id)
        meta = {**FORMAT, "num_docs": num_docs, "vocab_size": vocab_size,
                "num_postings": int(indptr[-1])}
        (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return SparseIndex.load(out)


def _write_chunks(chunks, scratch, vocab_size, progress):
    """Pass 1: every chunk, transposed to term-major order, appended to scratch files."""
    chunk_indptrs, num_docs, longest_id, biggest = [], 0, 1, 0
    with open(scratch / "docs.bin", "wb") as fd, open(scratch / "weights.bin", "wb") as fw, \
            open(scratch / "ids.txt", "w", encoding="utf-8") as fi:
        for item in tqdm(chunks, desc="index: chunks", unit="chunk", disable=not progress):
            ids, matrix = _clean_chunk(item, num_docs, vocab_size)
            if num_docs + matrix.shape[0] >= 2**31:
                raise ValueError("more than 2^31 - 1 documents: doc numbers are stored as int32")
            inverted = matrix.tocsc()          # columns = terms; rows ascend within a column
            del matrix
            inverted.sort_indices()
            # file.write, not ndarray.tofile: a full disk is then an OSError of errno ENOSPC (tofile's has none)
            fd.write((inverted.indices.astype(np.int32, copy=False) + np.int32(num_docs)).tobytes())
            fw.write(inverted.data.tobytes())
            fi.writelines(i + "\n" for i in ids)
            chunk_indptrs.append(inverted.indptr.astype(np.int64))
            num_docs += inverted.shape[0]
            longest_id = max([longest_id] + [len(i.encode()) for i in ids])
            biggest = max(biggest, inverted.nnz)
    return chunk_indptrs, num_docs, longest_id, biggest


def _term_blocks(indptr, block_postings):
    """Consecutive term ranges holding about block_postings postings each (>= 1 term)."""
    bounds = np.searchsorted(indptr, np.arange(0, indptr[-1], block_postings), side="right") - 1
    starts = sorted(set(bounds.tolist()) | {0})
    ends = starts[1:] + [len(indptr) - 1]
    return [(s, e) for s, e in zip(starts, ends) if e > s]


def _merge_postings(scratch, out, chunk_indptrs, indptr, block_postings, progress):
    """Pass 2: for each term block, gather its postings from every chunk (chunk order = doc order)
    into final term-major order, and append them to the output arrays."""
    chunk_base = np.cumsum([0] + [int(p[-1]) for p in chunk_indptrs])
    total = int(indptr[-1])
    with open(scratch / "docs.bin", "rb") as fd, open(scratch / "weights.bin", "rb") as fw, \
            _NpyWriter(out / "postings_docs.npy", np.int32, total) as out_docs, \
            _NpyWriter(out / "postings_weights.npy", np.float32, total) as out_weights:
        for t0, t1 in tqdm(_term_blocks(indptr, block_postings), desc="index: merge",
                           unit="block", disable=not progress):
            size = int(indptr[t1] - indptr[t0])
            docs, weights = np.empty(size, np.int32), np.empty(size, np.float32)
            next_slot = indptr[t0:t1] - indptr[t0]          # where each term's next posting goes
            for base, local in zip(chunk_base, chunk_indptrs):
                lo, hi = int(local[t0]), int(local[t1])
                if hi == lo:
                    continue
                counts = np.diff(local[t0:t1 + 1])
                slots = np.repeat(next_slot - (local[t0:t1] - lo), counts) + np.arange(hi - lo)
                docs[slots] = _read(fd, np.int32, base + lo, hi - lo)
                weights[slots] = _read(fw, np.float32, base + lo, hi - lo)
                next_slot += counts
            out_docs.write(docs)
            out_weights.write(weights)


def _read(f, dtype, start, count):
    f.seek(start * np.dtype(dtype).itemsize)
    return np.fromfile(f, dtype, count)


class _NpyWriter:
    """Writes a 1-D .npy file sequentially (header first), so it never has to be in memory."""

    def __init__(self, path, dtype, length):
        self.path, self.dtype, self.length, self.written = path, np.dtype(dtype), length, 0

    def __enter__(self):
        self.f = open(self.path, "wb")
        np.lib.format.write_array_header_1_0(
            self.f, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                     "shape": (self.length,)})
        return self

    def write(self, array):
        self.f.write(np.ascontiguousarray(array, self.dtype).tobytes())
        self.written += len(array)

    def __exit__(self, *exc):
        self.f.close()
        if exc[0] is None and self.written != self.length:
            raise RuntimeError(f"{self.path}: wrote {self.written} items, expected {self.length}")


def _write_doc_ids(src, dst, num_docs, longest, block=1_000_000):
    dtype = np.dtype(f"S{longest}")
    with open(src, encoding="utf-8") as f, _NpyWriter(dst, dtype, num_docs) as w:
        lines = []
        for line in f:
            lines.append(line[:-1].encode())
            if len(lines) == block:
                w.write(np.array(lines, dtype))
                lines = []
        w.write(np.array(lines, dtype))
    # the one O(corpus) step: sorting the ids (a few bytes per doc) to catch duplicates, which would
    # otherwise silently merge two documents in a run dict
    ids = np.sort(np.load(dst, mmap_mode="r")) if num_docs else np.zeros(0, dtype)
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if len(dup):
        raise ValueError(f"doc id {ids[dup[0]].decode()!r} occurs more than once in the corpus; "
                         f"doc ids must be unique")


# ----------------------------------------------------------------------------- the index


class SparseIndex:
    """A built index (see build_index), memory-mapped from its folder."""

    def __init__(self, path, meta, indptr, docs, weights, doc_ids):
        self.path, self.meta = Path(path), meta
        self.indptr, self.docs, self.weights, self.doc_ids = indptr, docs, weights, doc_ids
        self.num_docs, self.vocab_size = meta["num_docs"], meta["vocab_size"]
        # torch views share the memory maps; copy-on-write maps make them writable without copying
        self._docs_t, self._weights_t = torch.from_numpy(docs), torch.from_numpy(weights)

    @classmethod
    def load(cls, path):
        path = Path(path)
        meta_file = path / "meta.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"{meta_file} not found: {path} is not a sparse index "
                                    f"(build one with eval.sparse_index.build_index)")
        meta = json.loads(meta_file.read_text())
        if {k: meta.get(k) for k in FORMAT} != FORMAT:
            raise ValueError(f"{meta_file}: unsupported index format {meta.get('format')!r} version "
                             f"{meta.get('version')!r}; rebuild the index")
        indptr = np.load(path / "indptr.npy")
        mode = "c" if meta["num_postings"] else None        # an empty file cannot be mapped
        docs = np.load(path / "postings_docs.npy", mmap_mode=mode)
        weights = np.load(path / "postings_weights.npy", mmap_mode=mode)
        doc_ids = np.load(path / "doc_ids.npy", mmap_mode="r" if meta["num_docs"] else None)
        if len(indptr) != meta["vocab_size"] + 1 or len(docs) != meta["num_postings"] \
                or len(weights) != len(docs) or len(doc_ids) != meta["num_docs"]:
            raise ValueError(f"{path}: array sizes disagree with meta.json; the index is damaged, "
                             f"rebuild it")
        return cls(path, meta, indptr, docs, weights, doc_ids)

    @property
    def num_postings(self) -> int:
        return int(self.indptr[-1])

    def doc_counts(self) -> np.ndarray:
        """Number of documents using every vocabulary id (the length of its postings)."""
        return np.diff(self.indptr)

    def sparsity_stats(self, queries) -> dict:
        """Mean active dims per query and per document, and FLOPS of these queries on this corpus."""
        return _stats(self.doc_counts(), self.num_docs, term_doc_counts(queries), queries.shape[0])

    def scores(self, terms, values) -> torch.Tensor:
        """Exact scores q . d of every document (float32; terms added in the order given)."""
        acc = torch.zeros(self.num_docs, dtype=torch.float32)
        self._accumulate(acc, terms, values)
        return acc

    def _accumulate(self, acc, terms, values):
        # Term at a time into a dense accumulator. torch's index_add_ is the fastest scatter-add at
        # hand on one thread (8M postings, 1M docs: ~36 ms, vs ~84 ms for a scipy mat-vec over the
        # gathered postings and ~62 ms for numpy's add.at); each doc's sum runs in term order.
        for t, w in zip(terms.tolist(), values.tolist()):
            lo, hi = int(self.indptr[t]), int(self.indptr[t + 1])
            if hi > lo and w != 0:
                acc.index_add_(0, self._docs_t[lo:hi], self._weights_t[lo:hi], alpha=w)

    def top_k(self, scores: np.ndarray, k: int) -> np.ndarray:
        """Doc numbers of the k best positive scores, in trec_eval order (score desc, id desc)."""
        if np.count_nonzero(scores) <= k:
            chosen = np.flatnonzero(scores)
        else:
            part = np.argpartition(scores, len(scores) - k)[-k:]
            kth = scores[part].min()
            above = part[scores[part] > kth]
            # among docs tied with the k-th score, trec_eval ranks the larger doc ids first
            tied = np.flatnonzero(scores == kth)
            tied = tied[np.argsort(self.doc_ids[tied], kind="stable")[::-1][:k - len(above)]]
            chosen = np.concatenate([above, tied])
        order = np.lexsort((self.doc_ids[chosen], scores[chosen]))[::-1]
        return chosen[order]

    def search(self, queries, query_ids=None, k: int = 1000, progress: bool = True) -> dict:
        """Exact top-k of every query row of a sparse (num_queries x vocab) matrix, as a TREC run
        `{qid: {docid: score}}`; documents sharing no term with the query are not returned."""
        item = queries if query_ids is None else (query_ids, queries)
        query_ids, q = _clean_chunk(item, 0, self.vocab_size, what="queries")
        acc = torch.zeros(self.num_docs, dtype=torch.float32)
        scores = acc.numpy()
        run = {}
        for row, qid in enumerate(tqdm(query_ids, desc="search", unit="query",
                                       disable=not progress)):
            lo, hi = q.indptr[row], q.indptr[row + 1]
            acc.zero_()
            self._accumulate(acc, q.indices[lo:hi], q.data[lo:hi])
            best = self.top_k(scores, k)
            run[qid] = dict(zip((i.decode() for i in self.doc_ids[best]),
                                scores[best].astype(np.float64).tolist()))
        return run


# ----------------------------------------------------------------------------- export


ANSERINI_SCALE = 100.0   # weight -> integer impact: the x100 of the SPLADE releases' Anserini indexes


def impacts(weights, scale: float = ANSERINI_SCALE) -> np.ndarray:
    """round(weight * scale) as integers: Lucene stores a term's impact as an integer term frequency.
    Documents and queries go through this one function, so their products are the same integers."""
    return np.rint(np.asarray(weights, np.float64) * scale).astype(np.int64)


def check_anserini_vocab(vocab) -> np.ndarray:
    """The vocabulary as an array of token strings Anserini can hold: unique (they are the JSON keys
    of a document vector) and without whitespace (`--pretokenized` splits queries at whitespace)."""
    seen = {}
    for i, token in enumerate(vocab):
        if not token or token in seen or any(c.isspace() for c in token):
            raise ValueError(f"vocab entry {i} ({token!r}) is empty, has whitespace or repeats entry "
                             f"{seen.get(token)}: Anserini terms must be unique tokens without spaces")
        seen[token] = i
    return np.array(vocab, dtype=object)


def json_line(record) -> bytes:
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


def write_json_vectors(chunks, path, vocab, scale: float = ANSERINI_SCALE, progress: bool = True) -> int:
    """Write documents as an Anserini/Pyserini JsonVectorCollection (JSON lines
    `{"id", "contents": "", "vector": {token: impact}}`) for `--impact --pretokenized` indexing.

    Lucene stores integer term frequencies, so weights become impacts(w) = round(w * scale);
    weights that round to 0 are dropped. Written atomically (an indexer never reads half a file).
    Returns the number of documents.
    """
    tokens = check_anserini_vocab(list(vocab))
    written = 0
    with atomic_write(path, "wb") as f:
        for item in tqdm(chunks, desc="export", unit="chunk", disable=not progress):
            ids, m = _clean_chunk(item, written, len(tokens))
            weights = impacts(m.data, scale)
            for row, doc_id in enumerate(ids):
                lo, hi = m.indptr[row], m.indptr[row + 1]
                keep = weights[lo:hi] > 0
                vector = dict(zip(tokens[m.indices[lo:hi][keep]].tolist(),
                                  weights[lo:hi][keep].tolist()))
                f.write(json_line({"id": doc_id, "contents": "", "vector": vector}))
            written += len(ids)
    return written


def write_impact_queries(query_ids, queries, path, vocab, scale: float = ANSERINI_SCALE) -> int:
    """Write query vectors as pretokenized impact topics (JSON lines `{"id", "title"}`; Anserini's
    JsonString topic reader, which pyserini uses for a .jsonl file). `--impact --pretokenized` search
    splits the title at whitespace and weighs each term by how often it occurs, so each token is
    written impacts(w) times: the query's integer vector, the same quantisation as the documents'.
    A query whose every weight rounds to 0 gets an empty title. Returns the number of queries."""
    tokens = check_anserini_vocab(list(vocab))
    query_ids, q = _clean_chunk((list(query_ids), queries), 0, len(tokens), what="queries")
    weights = impacts(q.data, scale)
    with atomic_write(path, "wb") as f:
        for row, qid in enumerate(query_ids):
            lo, hi = q.indptr[row], q.indptr[row + 1]
            terms = " ".join(" ".join([t] * int(n)) for t, n in zip(tokens[q.indices[lo:hi]], weights[lo:hi])
                             if n > 0)
            f.write(json_line({"id": qid, "title": terms}))
    return len(query_ids)
