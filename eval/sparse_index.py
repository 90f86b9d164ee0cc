"""Inverted index over sparse (SPLADE) vectors: bounded-memory build, exact top-k search,
sparsity statistics (active dims, FLOPS) and export for Anserini/Pyserini.

A corpus of SPLADE vectors is a sparse (num_docs x vocab) matrix; its transpose is the inverted
index: for every vocabulary id, the documents that use it (postings) with their weights, so that
scoring `s(d) = q . d` touches only the postings of the query's terms. On disk, memory-mapped on load:
    meta.json               counts and format version
    indptr.npy              int64 (vocab + 1): postings of term t are [indptr[t], indptr[t+1])
    postings_docs.npy       int32 (num_postings): doc numbers, ascending within a term
    postings_weights.npy    float32 (num_postings)
    doc_ids.npy             bytes (num_docs): the external id (utf-8) of every doc number
The build transposes each chunk to scratch files, then assembles the postings block of terms by block: its
memory is bounded by a chunk.

Ranking is trec_eval's (top_k): score descending, ties by doc id descending, so a top-k run is the
full ranking cut at k. Scores are float32, the precision trec_eval ranks in, and go into runs exactly.
"""
import contextlib
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from tqdm import tqdm

from data.atomic import atomic_write

FORMAT = {"format": "sparse-inverted-index", "version": 1}
ANSERINI_SCALE = 100.0   # weight -> integer impact: the x100 of the SPLADE releases' Anserini indexes


def iter_csr_chunks(rows, vocab_size: int, chunk_rows: int = 10_000):
    """Group `(doc_id, indices, values)` rows into `(ids, csr_matrix)` chunks for build_index."""
    rows = iter(rows)
    while chunk := list(itertools.islice(rows, chunk_rows)):
        ids, cols, vals = zip(*chunk)
        indptr = np.cumsum([0, *map(len, cols)])
        yield list(ids), sp.csr_matrix((np.concatenate(vals).astype(np.float32),
                                        np.concatenate(cols).astype(np.int64), indptr),
                                       shape=(len(ids), vocab_size))


def bad_run_id(ids):
    """The first id that is empty or contains whitespace (a TREC run line cannot hold it), or None."""
    return next((i for i in map(str, ids) if i.split() != [i]), None)


def _clean_chunk(item, first_row, vocab_size, what="chunk"):
    """(ids, csr float32 matrix without zeros or duplicates), with the checks that matter later."""
    ids, matrix = item if isinstance(item, tuple) else (None, item)
    at = f"{what} starting at row {first_row}"
    if not sp.issparse(matrix):
        raise TypeError(f"{at}: expected a scipy.sparse matrix or (ids, matrix), got {type(matrix).__name__}")
    matrix = sp.csr_matrix(matrix, dtype=np.float32, copy=True)
    matrix.sum_duplicates()
    matrix.eliminate_zeros()
    if matrix.shape[1] != vocab_size:
        raise ValueError(f"{at} has {matrix.shape[1]} columns, the vocabulary has {vocab_size}")
    if matrix.nnz and not (np.isfinite(matrix.data).all() and matrix.data.min() > 0):
        row = int(np.searchsorted(matrix.indptr, np.flatnonzero(~(matrix.data > 0))[0], "right")) - 1
        raise ValueError(f"{what} row {first_row + row}: weights must be finite and >= 0 "
                         f"(SPLADE weights are log(1 + relu(.))); fix the encoder output")
    ids = [str(i) for i in (range(first_row, first_row + matrix.shape[0]) if ids is None else ids)]
    if len(ids) != matrix.shape[0]:
        raise ValueError(f"{at}: {len(ids)} ids for {matrix.shape[0]} rows")
    if (bad := bad_run_id(ids)) is not None:
        raise ValueError(f"{at}: doc id {bad!r} is empty or contains whitespace, which a TREC run cannot hold")
    return ids, matrix


# ----------------------------------------------------------------------------- sparsity / FLOPS
def active_dims(matrix) -> np.ndarray:
    m = sp.csr_matrix(matrix)
    return np.bincount(np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))[m.data != 0], minlength=m.shape[0])


def term_doc_counts(matrix) -> np.ndarray:
    """For every vocabulary id, the number of rows where its weight is non-zero."""
    m = sp.csr_matrix(matrix)
    return np.bincount(m.indices[m.data != 0], minlength=m.shape[1])


def flops(doc_counts, num_docs: int, query_counts, num_queries: int) -> float:
    """FLOPS = sum_j p_j q_j with p_j (q_j) the fraction of documents (queries) whose weight j is
    non-zero: the expected number of multiplications per query-document pair (Paria et al., ICLR
    2020, as SPLADE reports it, Formal et al., SIGIR 2021)."""
    if num_docs == 0 or num_queries == 0:
        return 0.0
    p = np.asarray(doc_counts, np.float64) / num_docs
    return float(np.dot(p, np.asarray(query_counts, np.float64) / num_queries))


def sparsity_stats(docs, queries) -> dict:
    """Mean active dims per query and per document, and FLOPS, from two sparse matrices."""
    return _stats(term_doc_counts(docs), docs.shape[0], queries)


def _stats(doc_counts, num_docs, queries):
    query_counts = term_doc_counts(queries)
    # the active dims of all rows add up to the per-term counts, so the means need only those
    return {"mean_query_active_dims": float(np.sum(query_counts)) / max(queries.shape[0], 1),
            "mean_doc_active_dims": float(np.sum(doc_counts)) / max(num_docs, 1),
            "flops": flops(doc_counts, num_docs, query_counts, queries.shape[0])}


# ----------------------------------------------------------------------------- building
def build_index(chunks, out_dir, vocab_size: int, block_postings: int | None = None,
                progress: bool = True) -> "SparseIndex":
    """Build the inverted index of a stream of document chunks into out_dir; returns it loaded."""
    out = Path(out_dir)
    scratch = out / "_build"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        chunk_indptrs, num_docs, longest_id, biggest = _write_chunks(chunks, scratch, vocab_size, progress)
        df = sum((np.diff(p) for p in chunk_indptrs), np.zeros(vocab_size, np.int64))
        indptr = np.concatenate([[0], np.cumsum(df)]).astype(np.int64)
        with _npy_writer(out / "indptr.npy", np.int64, len(indptr)) as write:
            write(indptr)
        _merge_postings(scratch, out, chunk_indptrs, indptr, block_postings or max(biggest, 1), progress)
        _write_doc_ids(scratch / "ids.txt", out / "doc_ids.npy", num_docs, longest_id)
        meta = {**FORMAT, "num_docs": num_docs, "vocab_size": vocab_size, "num_postings": int(indptr[-1])}
        (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return SparseIndex.load(out)


def _write_chunks(chunks, scratch, vocab_size, progress):
    """Pass 1: every chunk, transposed to term-major order, appended to scratch files."""
    chunk_indptrs, num_docs, longest_id, biggest = [], 0, 1, 0
    with open(scratch / "docs.bin", "wb") as fd, open(scratch / "weights.bin", "wb") as fw, \
            open(scratch / "ids.txt", "wb") as fi:
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
            encoded = [i.encode() for i in ids]
            fi.writelines(i + b"\n" for i in encoded)
            chunk_indptrs.append(inverted.indptr.astype(np.int64))
            num_docs += inverted.shape[0]
            longest_id = max([longest_id, *map(len, encoded)])
            biggest = max(biggest, inverted.nnz)
    return chunk_indptrs, num_docs, longest_id, biggest


def _merge_postings(scratch, out, chunk_indptrs, indptr, block_postings, progress):
    """Pass 2: for each block of terms of about block_postings postings, gather its postings from
    every chunk (chunk order = doc order) into term-major order, appended to the output arrays."""
    chunk_base = np.cumsum([0] + [int(p[-1]) for p in chunk_indptrs])
    starts = sorted({0, *(np.searchsorted(indptr, np.arange(0, indptr[-1], block_postings), "right") - 1).tolist()})
    blocks = [(s, e) for s, e in zip(starts, starts[1:] + [len(indptr) - 1]) if e > s]
    total = int(indptr[-1])
    with open(scratch / "docs.bin", "rb") as fd, open(scratch / "weights.bin", "rb") as fw, \
            _npy_writer(out / "postings_docs.npy", np.int32, total) as write_docs, \
            _npy_writer(out / "postings_weights.npy", np.float32, total) as write_weights:
        for t0, t1 in tqdm(blocks, desc="index: merge", unit="block", disable=not progress):
            size = int(indptr[t1] - indptr[t0])
            docs, weights = np.empty(size, np.int32), np.empty(size, np.float32)
            next_slot = indptr[t0:t1] - indptr[t0]          # where each term's next posting goes
            for base, local in zip(chunk_base, chunk_indptrs):
                lo, hi = int(local[t0]), int(local[t1])
                if hi == lo:
                    continue
                counts = np.diff(local[t0:t1 + 1])
                slots = np.repeat(next_slot - (local[t0:t1] - lo), counts) + np.arange(hi - lo)
                for f, array in ((fd, docs), (fw, weights)):
                    f.seek((base + lo) * array.itemsize)
                    array[slots] = np.fromfile(f, array.dtype, hi - lo)
                next_slot += counts
            write_docs(docs)
            write_weights(weights)


@contextlib.contextmanager
def _npy_writer(path, dtype, length):
    """A function writing the items of a 1-D .npy file of `length` items in turn: it is never in memory."""
    with open(path, "wb") as f:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (length,)}
        np.lib.format.write_array_header_1_0(f, header)
        yield lambda array: f.write(np.ascontiguousarray(array, dtype).tobytes())


def _write_doc_ids(src, dst, num_docs, longest):
    dtype = np.dtype(f"S{longest}")
    with open(src, "rb") as f, _npy_writer(dst, dtype, num_docs) as write:
        for lines in iter(lambda: f.readlines(1 << 26), []):
            write(np.array([line[:-1] for line in lines], dtype))
    # the one O(corpus) step: sorting the ids (a few bytes per doc) to catch duplicates, which would
    # otherwise silently merge two documents in a run dict
    ids = np.sort(np.load(dst))
    if len(dup := np.flatnonzero(ids[1:] == ids[:-1])):
        raise ValueError(f"doc id {ids[dup[0]].decode()!r} occurs more than once in the corpus; doc ids must be unique")


# ----------------------------------------------------------------------------- search
def id_rank(doc_ids) -> torch.Tensor:
    """Every doc id's position in byte-wise (strcmp) order: trec_eval's order among tied scores."""
    ids = doc_ids if isinstance(doc_ids, np.ndarray) else np.array([str(d).encode() for d in doc_ids], dtype=bytes)
    order = np.argsort(ids, kind="stable")
    rank = np.empty(len(ids), np.int64)
    rank[order] = np.arange(len(ids))
    return torch.from_numpy(rank)


def top_k(scores: torch.Tensor, k: int, rank: torch.Tensor) -> torch.Tensor:
    """Columns of the k best scores of every row of `scores` in trec_eval order (score descending,
    then doc id descending; rank: id_rank of the columns' ids). Of the documents tied with the k-th
    score trec_eval ranks the largest ids first, so those are kept: the top k is the full ranking cut at k."""
    k = min(k, scores.shape[1])
    values, index = scores.topk(min(k + 1, scores.shape[1]), dim=1)   # the (k+1)-th tells a tie cut at k
    cut = values[:, k] == values[:, k - 1] if 0 < k < values.shape[1] else torch.zeros(len(scores), dtype=torch.bool)
    for r in torch.nonzero(cut).flatten().tolist():
        kth = values[r, k - 1]
        above = index[r, :k][values[r, :k] > kth]
        tied = torch.nonzero(scores[r] == kth).flatten()
        index[r, :k] = torch.cat([above, tied[torch.argsort(rank[tied], descending=True)[:k - len(above)]]])
    index = index[:, :k]
    index = index.gather(1, torch.argsort(rank[index], dim=1, descending=True))
    return index.gather(1, torch.argsort(scores.gather(1, index), dim=1, descending=True, stable=True))


class SparseIndex:
    """A built index (see build_index), memory-mapped from its folder by load."""
    @classmethod
    def load(cls, path):
        self, path = cls(), Path(path)
        if not (path / "meta.json").is_file():
            raise FileNotFoundError(f"{path / 'meta.json'} not found: {path} is not a sparse index "
                                    f"(build one with eval.sparse_index.build_index)")
        self.path, self.meta = path, json.loads((path / "meta.json").read_text())
        if {k: self.meta.get(k) for k in FORMAT} != FORMAT:
            raise ValueError(f"{path / 'meta.json'}: unsupported index format {self.meta.get('format')!r} version "
                             f"{self.meta.get('version')!r}; rebuild the index")
        self.num_docs, self.vocab_size, self.num_postings = (self.meta[k] for k in ("num_docs", "vocab_size",
                                                                                   "num_postings"))
        self.indptr = np.load(path / "indptr.npy")
        mode = "c" if self.num_postings else None        # an empty file cannot be mapped
        self.docs = np.load(path / "postings_docs.npy", mmap_mode=mode)
        self.weights = np.load(path / "postings_weights.npy", mmap_mode=mode)
        self.doc_ids = np.load(path / "doc_ids.npy", mmap_mode="r" if self.num_docs else None)
        if (len(self.indptr), len(self.docs), len(self.weights), len(self.doc_ids)) != \
                (self.vocab_size + 1, self.num_postings, self.num_postings, self.num_docs):
            raise ValueError(f"{path}: array sizes disagree with meta.json; the index is damaged, rebuild it")
        # torch views share the memory maps; copy-on-write maps make them writable without copying
        self._docs_t, self._weights_t = torch.from_numpy(self.docs), torch.from_numpy(self.weights)
        return self

    def sparsity_stats(self, queries) -> dict:
        """Mean active dims per query and per document, and FLOPS of these queries on this corpus."""
        return _stats(np.diff(self.indptr), self.num_docs, queries)

    def scores(self, terms, values) -> torch.Tensor:
        """Exact scores q . d of every document (float32; terms added in the order given)."""
        # Term at a time into a dense accumulator. torch's index_add_ is the fastest scatter-add at
        # hand on one thread (8M postings, 1M docs: ~36 ms, vs ~84 ms for a scipy mat-vec over the
        # gathered postings and ~62 ms for numpy's add.at); each doc's sum runs in term order.
        acc = torch.zeros(self.num_docs, dtype=torch.float32)
        for t, w in zip(terms.tolist(), values.tolist()):
            lo, hi = int(self.indptr[t]), int(self.indptr[t + 1])
            if hi > lo and w != 0:
                acc.index_add_(0, self._docs_t[lo:hi], self._weights_t[lo:hi], alpha=w)
        return acc

    def search(self, queries, query_ids=None, k: int = 1000, progress: bool = True) -> dict:
        """Exact top-k of every query row as a TREC run `{qid: {docid: score}}`, documents sharing no term left out."""
        query_ids, q = _clean_chunk(queries if query_ids is None else (query_ids, queries), 0, self.vocab_size,
                                    what="queries")
        rank, run = id_rank(self.doc_ids), {}
        for row, qid in enumerate(tqdm(query_ids, desc="search", unit="query", disable=not progress)):
            scores = self.scores(q.indices[q.indptr[row]:q.indptr[row + 1]], q.data[q.indptr[row]:q.indptr[row + 1]])
            best = top_k(scores[None], min(k, np.count_nonzero(scores.numpy())), rank)[0]
            run[qid] = dict(zip((i.decode() for i in self.doc_ids[best.numpy()]), scores[best].double().tolist()))
        return run


# ----------------------------------------------------------------------------- export
def impacts(weights, scale: float = ANSERINI_SCALE) -> np.ndarray:
    """round(weight * scale) as integers: Lucene stores a term's impact as an integer term frequency.
    Documents and queries go through this one function, so their products are the same integers."""
    return np.rint(np.asarray(weights, np.float64) * scale).astype(np.int64)


def _impact_rows(chunks, vocab, scale, what):
    """(id, tokens, impacts) of every row of the chunks, impacts that round to 0 left out; the vocabulary's
    tokens must be unique and without whitespace (`--pretokenized` splits queries at whitespace)."""
    seen = {}
    for i, token in enumerate(vocab):
        if not token or token in seen or any(c.isspace() for c in token):
            raise ValueError(f"vocab entry {i} ({token!r}) is empty, has whitespace or repeats entry "
                             f"{seen.get(token)}: Anserini terms must be unique tokens without spaces")
        seen[token] = i
    tokens, first = np.array(list(seen), dtype=object), 0
    for item in chunks:
        ids, m = _clean_chunk(item, first, len(tokens), what)
        weights = impacts(m.data, scale)
        for row, name in enumerate(ids):
            terms, counts = m.indices[m.indptr[row]:m.indptr[row + 1]], weights[m.indptr[row]:m.indptr[row + 1]]
            yield name, tokens[terms[counts > 0]].tolist(), counts[counts > 0].tolist()
        first += len(ids)


def _write_lines(path, records) -> int:
    """JSON lines, written atomically (an indexer never reads half a file); the number written."""
    n = 0
    with atomic_write(path, "wb") as f:
        for n, record in enumerate(records, 1):
            f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
    return n


def write_json_vectors(chunks, path, vocab, scale: float = ANSERINI_SCALE, progress: bool = True) -> int:
    """Write documents as an Anserini JsonVectorCollection (JSON lines `{"id", "contents": "", "vector": {token:
    impact}}`) for `--impact --pretokenized` indexing; returns the number of documents."""
    rows = _impact_rows(tqdm(chunks, desc="export", unit="chunk", disable=not progress), vocab, scale, "chunk")
    return _write_lines(path, ({"id": i, "contents": "", "vector": dict(zip(t, n))} for i, t, n in rows))


def write_impact_queries(query_ids, queries, path, vocab, scale: float = ANSERINI_SCALE) -> int:
    """Write query vectors as pretokenized impact topics (JSON lines `{"id", "title"}`; Anserini's
    JsonString topic reader, which pyserini uses for a .jsonl file). `--impact --pretokenized` search
    weighs each term of the title by how often it occurs, so each token is written impacts(w) times:
    the documents' quantisation. A query whose every weight rounds to 0 gets an empty title."""
    rows = _impact_rows([(list(query_ids), queries)], vocab, scale, "queries")
    return _write_lines(path, ({"id": i, "title": " ".join(t for t, n in zip(ts, ns) for _ in range(n))}
                               for i, ts, ns in rows))
