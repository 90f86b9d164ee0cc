"""Benchmark: inverted-index exact top-k vs brute-force sparse scoring on SPLADE-like vectors.

    python tests/benchmarks/bench_sparse_index.py [--docs 1000000] [--queries 100] [--small-docs 250000]

Synthetic corpus: terms drawn from a Zipf(s) law over a 30k vocabulary (the same law for queries and
documents, under one random permutation of the vocabulary), ~120 distinct terms per document and
~30 per query, weights uniform in [0.05, 3]. Reports, measured in this one run on one thread:
- indexing time and peak traced memory (tracemalloc: Python + numpy heap) for a small and the full
  corpus, next to the size of one chunk and of the index: bounded by the chunk, not the corpus;
- index bytes per posting;
- per-query latency of exact top-k with the index vs brute-force scoring of every document
  (scipy sparse matrix-vector product over all postings, same top-k selection), and whether the two
  return identical runs.
"""
import argparse
import os
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from eval.sparse_index import SparseIndex, build_index, id_rank, top_k  # noqa: E402


def draws_for(p, target):
    """Number of draws with replacement whose expected count of distinct terms is `target`."""
    lo, hi = 1, 100 * target
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if np.sum(1 - (1 - p) ** mid) < target else (lo, mid)
    return hi


def zipf_chunks(n, vocab, active, s, seed, chunk):
    """CSR chunks of n SPLADE-like vectors (draw terms from Zipf(s), keep the distinct ones)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** s
    p /= p.sum()
    cdf = np.cumsum(p)
    term_of_rank = np.random.default_rng(12345).permutation(vocab)   # shared by docs and queries
    draws = draws_for(p, active)
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        t = np.minimum(np.searchsorted(cdf, rng.random((rows, draws))), vocab - 1)
        t.sort(axis=1)
        first = np.ones_like(t, bool)
        first[:, 1:] = t[:, 1:] != t[:, :-1]
        cols = term_of_rank[t[first]]
        indptr = np.concatenate([[0], np.cumsum(first.sum(1))])
        values = rng.uniform(0.05, 3.0, len(cols)).astype(np.float32)
        m = sp.csr_matrix((values, cols, indptr), shape=(rows, vocab))
        m.sort_indices()
        yield m


def timed_build(args, n, out):
    tracemalloc.start()
    t0 = time.perf_counter()
    index = build_index(zipf_chunks(n, args.vocab, args.doc_dims, args.zipf, 0, args.chunk), out,
                        args.vocab, progress=False)
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return index, seconds, peak


def positive_top_k(scores, k, rank):
    """search()'s selection: the k best positive scores, trec_eval order."""
    return top_k(scores[None], min(k, np.count_nonzero(scores.numpy())), rank)[0].numpy()


def brute_force_top_k(index, matrix, row, k, rank):
    """Score every document with a sparse matrix-vector product, same top-k selection."""
    q = np.zeros(index.vocab_size, np.float32)
    q[row.indices] = row.data
    return positive_top_k(torch.from_numpy(matrix @ q), k, rank)


def per_query_ms(fn, n):
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1000)
    return np.array(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--small-docs", type=int, default=250_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--brute-queries", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=30_000)
    parser.add_argument("--doc-dims", type=int, default=120)
    parser.add_argument("--query-dims", type=int, default=30)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--chunk", type=int, default=50_000)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--out", default=None, help="index folder (default: a temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("command: python tests/benchmarks/bench_sparse_index.py " + " ".join(sys.argv[1:]))
    print(f"corpus: {args.docs} docs, vocab {args.vocab}, Zipf s={args.zipf}, ~{args.doc_dims} "
          f"dims/doc, ~{args.query_dims} dims/query, chunks of {args.chunk} docs; 1 thread")

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        chunk_bytes = next(zipf_chunks(args.chunk, args.vocab, args.doc_dims, args.zipf, 0,
                                       args.chunk)).nnz * 12      # float32 + int32 + int32 row ids
        tracemalloc.start()
        for _ in zipf_chunks(4 * args.chunk, args.vocab, args.doc_dims, args.zipf, 0, args.chunk):
            pass
        generator_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows = []
        if args.small_docs:
            small, secs, peak = timed_build(args, args.small_docs, out / "small")
            rows.append((args.small_docs, secs, peak, small.num_postings))
            del small
        index, secs, peak = timed_build(args, args.docs, out / "full")
        rows.append((args.docs, secs, peak, index.num_postings))
        size = sum(f.stat().st_size for f in (out / "full").iterdir())
        print(f"one chunk of postings: {chunk_bytes / 2**20:.0f} MiB as CSR; generating chunks alone "
              f"peaks at {generator_peak / 2**20:.0f} MiB (included in the build peaks below)")
        for n, secs, peak, nnz in rows:
            print(f"build {n:>9} docs: {secs:7.1f} s, peak traced memory {peak / 2**20:7.0f} MiB, "
                  f"index {nnz * 8 / 2**20:7.0f} MiB of postings")
        print(f"process max RSS so far: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB")
        print(f"index on disk: {size / 2**20:.0f} MiB, {size / index.num_postings:.2f} bytes per "
              f"posting ({index.num_postings} postings)")

        index = SparseIndex.load(out / "full")
        queries = sp.vstack(list(zipf_chunks(args.queries, args.vocab, args.query_dims, args.zipf,
                                             1, args.queries))).tocsr()
        stats = index.sparsity_stats(queries)
        print(f"sparsity: {stats['mean_doc_active_dims']:.1f} dims/doc, "
              f"{stats['mean_query_active_dims']:.1f} dims/query, FLOPS {stats['flops']:.2f} "
              f"(~{stats['flops'] * index.num_docs / 1e6:.1f}M postings touched per query)")

        index.weights.sum(), index.docs.sum()          # read the memory-mapped index in once

        rank = id_rank(index.doc_ids)

        def indexed(i):
            return positive_top_k(index.scores(queries[i].indices, queries[i].data), args.k, rank)

        indexed(0)
        ms = per_query_ms(indexed, args.queries)
        full = sp.csc_matrix((index.weights, index.docs, index.indptr),
                             shape=(index.num_docs, index.vocab_size))
        brute = per_query_ms(lambda i: brute_force_top_k(index, full, queries[i], args.k, rank),
                             args.brute_queries)
        same = sum(np.array_equal(indexed(i), brute_force_top_k(index, full, queries[i], args.k, rank))
                   for i in range(args.brute_queries))
        run_t0 = time.perf_counter()
        index.search(queries, k=args.k, progress=False)
        run_ms = (time.perf_counter() - run_t0) * 1000 / args.queries
        print(f"exact top-{args.k}, inverted index: mean {ms.mean():.1f} ms/query, median "
              f"{np.median(ms):.1f}, p95 {np.percentile(ms, 95):.1f} ({args.queries} queries); "
              f"search() incl. building the run dict: {run_ms:.1f} ms/query")
        print(f"brute force (scipy sparse mat-vec over all postings): mean {brute.mean():.1f} "
              f"ms/query ({args.brute_queries} queries)")
        print(f"speed-up: {brute.mean() / ms.mean():.1f}x; identical top-{args.k} in "
              f"{same}/{args.brute_queries} queries")


if __name__ == "__main__":
    main()
