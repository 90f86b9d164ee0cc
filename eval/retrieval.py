"""Evaluate a SPLADE model on a retrieval benchmark: encode -> inverted index -> exact top-k -> metrics.

    python eval/retrieval.py --model out/splade-modernbert-k16 --bench nanobeir --out runs/nano
    python eval/retrieval.py --model hf:naver/splade-v3 --bench dl19 --out runs/dl19
    torchrun --nproc_per_node=8 eval/retrieval.py --model ... --bench msmarco-dev --out runs/dev
    python eval/retrieval.py --model ... --bench path/to/beir_folder --out runs/mine

Benchmarks (data/ir_datasets.py loads them): nanobeir, nanobeir/<name>, beir13, beir/<name>,
msmarco-dev, dl19, dl20, or a local BEIR-format folder. Under --out, per dataset: the encoded corpus
(vectors/) and its index (index/), reused when their key is the same (docs/reuse.md; a killed run resumes
at the first missing chunk), run.trec and metrics.json; at the top, metrics.json with the means over
datasets. One retrieval at a time writes an --out (OUT/RUN.lock).

Measures, as the SPLADE papers report them: MS MARCO dev RR@10 and R@1000; TREC DL nDCG@10 and
recall with grades >= 2 relevant; BEIR/NanoBEIR nDCG@10 without results whose doc id is the query id.
Every judged query counts, one that retrieves nothing as 0 (docs/splade_rescaling.md). Texts are cut
at the model's one length unless --max-len / --query-max-len. --export-anserini also writes the vectors
for Anserini under OUT/anserini/ (docs/vectors_elsewhere.md); --binary-relevance scores as
sentence-transformers' IR evaluators do.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    # run as a file: the repo root on sys.path instead of eval/ (whose module names must not shadow anything)
    _here = str(Path(__file__).resolve().parent)
    sys.path = [p for p in sys.path if str(Path(p or ".").resolve()) != _here]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import contextlib
import dataclasses
import hashlib
import itertools
import os
import shutil
import tempfile
import time
import warnings
import zipfile

import numpy as np
import scipy.sparse as sp
import torch
import torch.distributed as dist
from tqdm import tqdm

from cli import UserError
from data import manifest
from data.atomic import atomic_write, disk_full, disk_full_error, write_json
from data.ir_datasets import MSMARCO_BENCHMARKS, IRDataError, IRDataset, load_benchmark
from data.tokenizer import pad_batch, pad_id, token_ids
from eval.metrics import evaluate, mean_metrics, queries_without_results, write_metrics_json, write_run
from eval.sparse_index import (FORMAT, SparseIndex, bad_run_id, build_index, write_impact_queries,
                               write_json_vectors)
from training import Dist, autocast, default_dtype

CHUNK_DOCS = 32_768          # documents per chunk file: ~30 MB of vectors for SPLADE-sized ones
CHUNK = "chunk-{:06d}.npz"
TOKENIZE_BATCH = 4_096       # texts handed to the Rust tokenizer at once
ENCODING_FORMAT = 3     # 3: data/manifest.py
# measures reported per benchmark (module docstring); the first is the headline number; "beir": any other
MEASURES = {"msmarco-dev": ("RR@10", "R@1000", "nDCG@10"),
            **dict.fromkeys(("dl19", "dl20"), ("nDCG@10", "RR(rel=2)@10", "R(rel=2)@1000")),
            "beir": ("nDCG@10", "RR@10", "R@100", "R@1000")}
SPARSITY_KEYS = ("flops", "mean_query_active_dims", "mean_doc_active_dims")
COUNT_KEYS = ("num_queries", "num_empty_queries")   # per dataset; summed, not averaged, over datasets
RETRIEVAL_FIX = ("Free some space (or choose an --out on a larger disk) and run the same command again: what is "
                 "written is kept and reused")


def rank_and_world(distributed=None):
    """(rank, world_size) from torch.distributed when it is initialised (and not switched off)."""
    if distributed is None:
        distributed = dist.is_available() and dist.is_initialized()
    return (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)


# ---------------- Encoding texts into sparse vectors
def _to_csr(w: torch.Tensor) -> sp.csr_matrix:
    """Dense (B, V) vectors to a float32 CSR matrix, moving only the non-zeros off the device."""
    rows, cols = torch.nonzero(w, as_tuple=True)          # row-major, as CSR wants
    indptr = torch.zeros(w.shape[0] + 1, dtype=torch.long, device=w.device)
    indptr[1:] = torch.cumsum(torch.bincount(rows, minlength=w.shape[0]), 0)
    return sp.csr_matrix((w[rows, cols].float().cpu().numpy(), cols.int().cpu().numpy(),
                          indptr.cpu().numpy()), shape=tuple(w.shape))


@torch.no_grad()
def encode_sparse(model, tokenizer, texts, *, max_len=256, batch_size=64, device=None, dtype=None,
                  bar=None) -> sp.csr_matrix:
    """SPLADE vectors of `texts` as a float32 CSR matrix in their order, batched longest first."""
    from fast_paths import covers, fused_splade_pool
    from model import splade_pool
    pool = fused_splade_pool if covers(fused_splade_pool, model.splade.pooling) else splade_pool
    device = torch.device(device or next(model.parameters()).device)
    dtype = dtype or default_dtype(device)
    limit = model.config.position_limit
    if limit is not None and max_len > limit:
        raise ValueError(f"max_len={max_len}: this model has learned positions for {limit} tokens only; "
                         f"use --max-len {limit} or less")
    if not texts:
        return sp.csr_matrix((0, model.head.decoder.weight.shape[0]), dtype=np.float32)
    ids = token_ids(tokenizer, texts, max_len, batch=TOKENIZE_BATCH)
    order = np.argsort([-len(x) for x in ids], kind="stable")
    pieces, was_training = [], model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            input_ids, mask = pad_batch([ids[i] for i in batch], pad_id(tokenizer), device=device, multiple=8)
            with autocast(device, dtype):
                pieces.append(_to_csr(pool(model, input_ids, mask)))
            if bar is not None:
                bar.update(len(batch))
    finally:
        model.train(was_training)
    return sp.vstack(pieces, format="csr")[np.argsort(order)]   # back to the order of `texts`


def encode_queries(model, tokenizer, dataset: IRDataset, max_len, **kw):
    """(query ids, their vectors, the ids of blank queries): the one place queries are encoded. A blank
    query (blank_queries) gets no vector: its template alone would still retrieve documents."""
    qids = list(dataset.queries)
    vectors = encode_sparse(model, tokenizer, [dataset.queries[q] for q in qids], max_len=max_len, **kw)
    if blank := set(blank_queries(dataset, tokenizer)):
        vectors = sp.diags(np.array([q not in blank for q in qids], np.float32)) @ vectors
    return qids, vectors, blank


def _corpus_chunks(corpus, size):
    """(ids, texts) chunks of `size` documents of a dict, an IRDataset, or an iterable of (docid, text) (lists)."""
    if isinstance(corpus, IRDataset):
        corpus = corpus.iter_corpus()
    pairs = iter(corpus.items()) if isinstance(corpus, dict) else itertools.chain.from_iterable(
        item if isinstance(item, list) else [item] for item in corpus)
    while chunk := list(itertools.islice(pairs, size)):
        yield [str(docid) for docid, _ in chunk], [text for _, text in chunk]


def _corpus_size(corpus):
    corpus = corpus.corpus if isinstance(corpus, IRDataset) else corpus
    return len(corpus) if isinstance(corpus, dict) else None


def weights_identity(model) -> str:
    """A model in memory by content: "sha256:" and the hash of the exact values of all its tensors."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        flat = t.detach().reshape(-1).contiguous().cpu()
        h.update(f"{name} {tuple(t.shape)} {t.dtype}".encode())
        h.update(flat.view(torch.uint8).numpy() if flat.numel() else b"")
    return "sha256:" + h.hexdigest()


# ---------------- Chunk files: a scipy CSR matrix (so scipy.sparse.load_npz reads it) plus the doc ids
def save_chunk(path, ids, matrix):
    """Write one chunk atomically: a crash leaves no half-written file for a resume to trust."""
    with atomic_write(path) as f:
        np.savez(f, format=b"csr", shape=np.array(matrix.shape), data=matrix.data,
                 indices=matrix.indices, indptr=matrix.indptr, ids=np.array(ids, dtype=str))


class BadChunk(UserError, ValueError):
    """A chunk file that cannot be read; `path` names it."""
    def __init__(self, path, message):
        super().__init__(message)
        self.path = Path(path)


def load_chunk(path):
    """(ids, csr_matrix) of a chunk file written by save_chunk."""
    try:
        with np.load(path) as f:
            ids = f["ids"].tolist()
        return ids, sp.load_npz(path)
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise BadChunk(path, f"{path}: not a readable chunk file ({e}); delete it and rerun to "
                             f"encode that chunk again") from None


def iter_chunks(chunks):
    """(ids, csr_matrix) of every chunk, from encode_corpus's list (pairs or file paths)."""
    for chunk in chunks:
        yield load_chunk(chunk) if isinstance(chunk, (str, Path)) else chunk


def corpus_identity(corpus):
    """What the vectors of `corpus` are computed from: in memory, a hash of its ids and texts in order; an
    IRDataset streamed from its files, the policy they are read with (the files are in encoding_key); None for
    any other iterable, which cannot be identified before it is read (its encoding is never reused)."""
    if isinstance(corpus, IRDataset) and corpus.corpus is not None:
        corpus = corpus.corpus
    if isinstance(corpus, dict):
        h = hashlib.sha256()
        for part in (str(x).encode("utf-8", "surrogatepass") for pair in corpus.items() for x in pair):
            h.update(len(part).to_bytes(8, "little") + part)  # lengths first: ("ab", "c") != ("a", "bc")
        return {"texts": h.hexdigest()}
    if isinstance(corpus, IRDataset) and corpus.corpus_files:
        return {"streamed": True, "strict": corpus.strict, "keep_empty": corpus.keep_empty}
    return None


def encoding_key(model, tokenizer, corpus, *, max_len, chunk_size, dtype, model_folder=None) -> dict:
    """Everything the encoded chunks depend on, by content: the model (its folder's model_files, or in memory its
    values), the tokenizer's whole serialised definition, the settings, the corpus (files, or corpus_identity)."""
    from hf.models import model_files
    inputs = {"model": model_files(model_folder)} if model_folder is not None else {}
    settings = {"format": ENCODING_FORMAT, "model": None if inputs else weights_identity(model),
                "tokenizer": "sha256:" + hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest(),
                "max_len": max_len, "chunk_size": chunk_size,
                "dtype": str(dtype), "vocab_size": model.head.decoder.weight.shape[0],
                "pooling": model.splade.pooling,   # a model in memory may pool otherwise than its folder's file
                "corpus": corpus_identity(corpus)}
    if isinstance(corpus, IRDataset) and corpus.corpus_files:
        inputs["corpus"], settings["corpus_read"] = corpus.corpus_files, settings["corpus"]
    return manifest.key(settings, inputs)


def _reopen(folder: Path, work: Path, bad=None):
    """Move an encoding back to its work folder to encode its chunk files `bad` again (None: the unrecorded)."""
    recorded = manifest.read(folder)["files"]
    bad = bad if bad is not None else [n for n, h in recorded.items()
                                       if not (folder / n).is_file() or manifest.sha256(folder / n) != h]
    names = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    manifest.note(f"note: {folder}: {names} {'is' if len(bad) == 1 else 'are'} not the chunk file(s) this encoding "
                  "wrote (missing, cut short or damaged); encoding them again")
    for name in [*bad, manifest.MANIFEST]:
        (folder / name).unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    os.replace(folder, work)


def encode_corpus(model, tokenizer, corpus, out_dir=None, *, max_len=256, batch_size=64,
                  chunk_size=CHUNK_DOCS, device=None, dtype=None, distributed=None,
                  progress=True, desc="encode", model_folder=None) -> list:
    """Encode a corpus (see _corpus_chunks) into SPLADE vectors, chunk by chunk; under torch.distributed (every
    rank calls this) rank r encodes chunks r, r + world, ... Returns, on rank 0, the chunks in corpus order (file
    paths, or (ids, csr) pairs; iter_chunks reads either); [] elsewhere. out_dir: the chunk files are an output
    of data/manifest.py's kind there, keyed by encoding_key (resumable); None keeps the chunks in memory."""
    rank, world = rank_and_world(distributed)
    device = torch.device(device or next(model.parameters()).device)
    dtype = dtype or default_dtype(device)
    folder = Path(out_dir) if out_dir is not None else None
    if folder is not None:
        key = encoding_key(model, tokenizer, corpus, max_len=max_len, chunk_size=chunk_size, dtype=dtype,
                           model_folder=model_folder)
        work = manifest.work_folder(folder, key)
        if rank == 0 and key["corpus"] is None:          # an iterable corpus is read again
            shutil.rmtree(work, ignore_errors=True)
        elif rank == 0 and not manifest.reuse(folder, key, "the encoded corpus"):
            if (manifest.read(folder) or {}).get("key") == key:   # damaged chunks: encoded again
                _reopen(folder, work)
        if world > 1:
            dist.barrier()
        if key["corpus"] is not None and (manifest.read(folder) or {}).get("key") == key:   # nothing to read
            return sorted(folder.glob("chunk-*.npz")) if rank == 0 else []
        work.mkdir(parents=True, exist_ok=True)
    total = _corpus_size(corpus)
    bar = tqdm(total=total, desc=desc, unit="doc", smoothing=0.05, disable=not progress or rank != 0)
    mine, num_chunks = [], 0
    for c, (ids, texts) in enumerate(_corpus_chunks(corpus, chunk_size)):
        num_chunks = c + 1
        path = work / CHUNK.format(c) if folder is not None else None
        if c % world != rank or (path is not None and path.is_file()):
            bar.update(len(ids))                         # another rank's, or written by a run of this key
            continue
        vectors = encode_sparse(model, tokenizer, texts, max_len=max_len, batch_size=batch_size,
                                device=device, dtype=dtype, bar=bar)
        if path is None:
            mine.append((c, (ids, vectors)))
            continue
        try:
            save_chunk(path, ids, vectors)
        except (OSError, RuntimeError) as e:
            if not disk_full(e):
                raise
            docs = total or (c + 1) * chunk_size     # a streamed corpus: at least this many
            # the rest of the vectors, and an index as large
            per_doc = (vectors.data.nbytes + vectors.indices.nbytes + vectors.indptr.nbytes + 4 * sum(map(len, ids)))
            raise disk_full_error(work, per_doc / len(ids) * (docs - c * chunk_size + docs),
                                  f"{path.name} of the encoded corpus", RETRIEVAL_FIX) from None
    bar.close()
    if world > 1:   # rank 0 gathers the chunks in memory, or waits until every chunk file is written
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        mine = [item for part in gathered or [] for item in part]
    if rank != 0:
        return []
    if folder is None:
        return [chunk for _, chunk in sorted(mine, key=lambda x: x[0])]
    manifest.finish(work, folder, key)
    return [folder / CHUNK.format(c) for c in range(num_chunks)]


# ---------------- One dataset, one benchmark
def text_lengths(model, max_len=None, query_max_len=None) -> tuple[int, int]:
    """(tokens per document, tokens per query): as given, else the model's one length (model_max_seq_length)."""
    if max_len is None:
        from hf.models import model_max_seq_length
        max_len = model_max_seq_length(getattr(model, "source", None), model.config)[0]
    return max_len, query_max_len or max_len


def measures_for(name: str) -> tuple:
    return MEASURES.get(name.lower(), MEASURES["beir"])


def drops_self_hits(name: str) -> bool:
    """BEIR's evaluator drops results whose doc id is the query id (ArguAna, Quora); MS MARCO's: plain trec_eval."""
    return name.lower() not in MSMARCO_BENCHMARKS


def _corpus_folder_name(name: str) -> str:
    # the three MS MARCO benchmarks share one 8.8M-passage corpus: encode and index it once
    return "msmarco-passage" if name.lower() in MSMARCO_BENCHMARKS else name.replace("/", "-")


def blank_queries(dataset: IRDataset, tokenizer) -> list:
    """The ids of the queries of which the tokenizer keeps nothing but its special tokens."""
    qids = list(dataset.queries)
    encoded = tokenizer.encode_batch([dataset.queries[q] for q in qids], add_special_tokens=False)
    return [q for q, e in zip(qids, encoded) if not e.ids]


def _blank_message(dataset, blank) -> str:
    return (f"{dataset.name}: {len(blank)} judged queries have no text after tokenisation "
            f"({', '.join(map(repr, blank[:3]))}{', ...' if len(blank) > 3 else ''}): the model's tokenizer keeps "
            "nothing of their text but its special tokens")


def check_before_encoding(dataset: IRDataset, tokenizer=None):
    """Before encoding: the dataset can be evaluated, its ids fit a TREC run line, and (strict) no query is blank."""
    dataset.check_evaluable()
    if tokenizer is not None and dataset.strict and (blank := blank_queries(dataset, tokenizer)):
        where = ", ".join(map(str, dataset.query_files)) or "the queries"
        raise IRDataError(f"{_blank_message(dataset, blank)}; --strict stops at them. Give them a text in {where}, "
                          "or run without --strict (they then score 0, counted as empty)")
    for kind, ids in (("query", dataset.queries), ("document", dataset.corpus or ())):
        if (bad := bad_run_id(ids)) is not None:
            raise ValueError(f"{dataset.name}: {kind} id {bad!r} is empty or contains whitespace, which a TREC run "
                             f"line cannot hold. Fix: rename it in the {kind} file (and in the qrels).")


def _load_or_build_index(chunks, folder, vocab_size, vectors, progress):
    """The index in folder/index: a data/manifest.py output whose key holds the encoding's manifest (`vectors`;
    None: the chunks are in memory, the index is not kept), reused when the same, else built in index.tmp and
    renamed, so a build that fails (a full disk) leaves no partial index."""
    index_dir = folder / "index"
    if vectors is None:
        return build_index(iter_chunks(chunks), index_dir, vocab_size, progress=progress)
    key = manifest.key({"format": FORMAT, "vocab_size": vocab_size}, {"vectors": vectors})
    if manifest.reuse(index_dir, key, "the index"):
        try:
            return SparseIndex.load(index_dir)
        except (OSError, ValueError, EOFError, KeyError) as e:
            manifest.note(f"note: the index in {index_dir} cannot be read ({e}); building it again")
    tmp = folder / "index.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build_index(iter_chunks(chunks), tmp, vocab_size, progress=progress)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SparseIndex.load(manifest.finish(tmp, index_dir, key))


def _corpus_index(model, tokenizer, dataset, corpus_dir, vectors, distributed, progress, **encoding):
    """The index of the dataset's corpus on rank 0 (None elsewhere), encoded by every rank into `vectors` (None:
    in memory); a chunk file that cannot be read although its manifest vouched for it is encoded again, once."""
    def encode(distributed):
        return encode_corpus(model, tokenizer, dataset, vectors, distributed=distributed, progress=progress,
                             desc=f"encode {dataset.name}", **encoding)

    def index_of(chunks):
        try:
            return _load_or_build_index(chunks, corpus_dir, model.head.decoder.weight.shape[0], vectors, progress)
        except (OSError, RuntimeError) as e:
            if not disk_full(e):
                raise
            # the build holds the postings twice (its scratch files and the arrays), each as large as the chunks
            needed = 2 * sum(Path(c).stat().st_size for c in chunks) if vectors is not None else 0
            raise disk_full_error(corpus_dir, needed, "the index", RETRIEVAL_FIX) from None

    chunks = encode(distributed)
    if rank_and_world(distributed)[0] != 0:
        return None
    try:
        return index_of(chunks)
    except BadChunk as e:
        if vectors is None:
            raise
        manifest.note(f"note: {e}; encoding it again")
        _reopen(vectors, manifest.work_folder(vectors, manifest.read(vectors)["key"]), [e.path.name])
        return index_of(encode(False))


def evaluate_splade(model, tokenizer, benchmark, out_dir=None, *, max_len=None,
                    query_max_len=None, batch_size=64, top_k=1000, device=None, dtype=None,
                    measures=None, drop_self=None, chunk_size=CHUNK_DOCS, distributed=None,
                    progress=True, benchmark_name=None, model_folder=None, **load_options) -> dict:
    """Evaluate a SPLADE model (the plain Transformer, not a DDP wrapper) on a benchmark name or
    folder (load_benchmark, with load_options), one IRDataset or a list of them.

    Returns {"datasets": {name: {measure: mean, ..., "num_queries", "num_empty_queries", "flops",
    "mean_query_active_dims", "mean_doc_active_dims"}}, "mean": those averaged over the datasets (e.g.
    NanoBEIR's result["mean"]["nDCG@10"]), "num_queries" and "num_empty_queries" summed, "max_len" and
    "query_max_len"}. out_dir: where vectors, indexes, run.trec and metrics.json are kept (None: temporary).
    Under torch.distributed every rank calls this (a training loop calling it on rank 0 only passes
    distributed=False), rank 0 searches and scores, every rank gets the result."""
    rank, world = rank_and_world(distributed)
    if isinstance(benchmark, (list, tuple, IRDataset)):
        datasets = [benchmark] if isinstance(benchmark, IRDataset) else list(benchmark)
    else:
        datasets = load_benchmark(benchmark, **load_options)
    for dataset in datasets:
        check_before_encoding(dataset, tokenizer)
    max_len, query_max_len = text_lengths(model, max_len, query_max_len)
    kw = dict(batch_size=batch_size, device=device, dtype=dtype)
    results = {}
    with hold_out(out_dir, distributed), tempfile.TemporaryDirectory(prefix="splade-eval-") as tmp:
        if rank == 0 and out_dir is not None:  # a run that fails must not leave an earlier run's number behind
            for name in ["metrics.json"] + [f"{d.name.replace('/', '-')}/{f}" for d in datasets
                                            for f in ("metrics.json", "run.trec")]:
                (Path(out_dir) / name).unlink(missing_ok=True)
        for dataset in datasets:
            # kept: OUT/<corpus>/{vectors,index} (MS MARCO's three benchmarks share one), OUT/<dataset>/ the run
            corpus_dir = (Path(out_dir) / _corpus_folder_name(dataset.name) if out_dir is not None
                          else Path(tmp) / dataset.name.replace("/", "-"))
            t0 = time.time()
            index = _corpus_index(model, tokenizer, dataset, corpus_dir,
                                  corpus_dir / "vectors" if out_dir is not None else None, distributed, progress,
                                  max_len=max_len, chunk_size=chunk_size, model_folder=model_folder, **kw)
            if index is None:  # not rank 0
                continue
            t_docs = time.time() - t0
            qids, queries, blank = encode_queries(model, tokenizer, dataset, query_max_len, **kw)
            if blank:
                warnings.warn(f"{_blank_message(dataset, sorted(blank))}; nothing is searched for them, and they "
                              "count as 0 in every mean (the `empty` column)")
            t1 = time.time()
            run = index.search(queries, qids, k=top_k, progress=progress)
            seconds = {"encode_corpus": round(t_docs, 2), "search": round(time.time() - t1, 2)}
            drop = drops_self_hits(dataset.name) if drop_self is None else drop_self
            per_query = evaluate(dataset.qrels, run, measures or measures_for(dataset.name), drop_self=drop,
                                 complete=True)
            empty = queries_without_results(dataset.qrels, run, drop_self=drop)
            sparsity = index.sparsity_stats(queries)
            results[dataset.name] = {"mean": mean_metrics(per_query), "num_queries": len(per_query),
                                     "num_empty_queries": len(empty), "sparsity": sparsity, "seconds": seconds,
                                     "per_query": per_query}
            if out_dir is not None:
                out = Path(out_dir) / dataset.name.replace("/", "-")
                try:
                    out.mkdir(parents=True, exist_ok=True)
                    write_run(run, out / "run.trec", tag="splade")
                    write_metrics_json(out / "metrics.json", per_query, dataset=dataset.name,
                                       num_empty_queries=len(empty), empty_queries=empty, drop_self=drop, top_k=top_k,
                                       sparsity=sparsity, seconds=seconds, max_len=max_len, query_max_len=query_max_len)
                except OSError as e:
                    if not disk_full(e):
                        raise
                    raise disk_full_error(out, 100 * top_k * len(qids), "run.trec and metrics.json",
                                          RETRIEVAL_FIX) from None
        summary = {**_summarise(results), "max_len": max_len, "query_max_len": query_max_len} if rank == 0 else None
        if rank == 0 and out_dir is not None:
            try:
                _write_summary(Path(out_dir), benchmark_name or benchmark, model, summary, results)
            except OSError as e:
                if not disk_full(e):
                    raise
                raise disk_full_error(out_dir, 1 << 20, "metrics.json", RETRIEVAL_FIX) from None
    if world > 1:
        box = [summary]
        dist.broadcast_object_list(box, src=0)
        summary = box[0]
    return summary


class _Ranks:
    """checkpoint.RunLock's view of the processes of an evaluation (rank 0 locks, all agree)."""
    def __init__(self, distributed):
        self.rank, self.world = rank_and_world(distributed)
        self.master = self.rank == 0

    def any(self, flag):
        if self.world == 1:
            return flag
        flags = [None] * self.world
        dist.all_gather_object(flags, bool(flag))
        return any(flags)


_held = set()   # the output folders this process holds


@contextlib.contextmanager
def hold_out(out_dir, distributed=None):
    """One writer per --out: checkpoint.RunLock on OUT/RUN.lock taken by rank 0, refused on every rank where
    another process holds it; a folder this process holds already (main's) or None: nothing to do."""
    key = Path(out_dir).resolve() if out_dir is not None else None
    if key is None or key in _held:
        yield
        return
    from checkpoint import RunLock
    with RunLock(out_dir, _Ranks(distributed), what="retrieval", option="--out"):
        _held.add(key)
        try:
            yield
        finally:
            _held.discard(key)


def _summarise(results: dict) -> dict:
    datasets = {name: {**r["mean"], **{k: r[k] for k in COUNT_KEYS}, **r["sparsity"]}
                for name, r in results.items()}
    names = dict.fromkeys(k for d in datasets.values() for k in d if k not in COUNT_KEYS)
    mean = {k: float(np.mean([d[k] for d in datasets.values() if k in d])) for k in names}
    return {"datasets": datasets, "mean": mean, **{k: sum(d[k] for d in datasets.values()) for k in COUNT_KEYS}}


def _write_summary(out: Path, benchmark, model, summary, results):
    write_json(out / "metrics.json", {
        "benchmark": str(benchmark if isinstance(benchmark, str) else list(results)),
        "model": getattr(model, "source", None),
        "splade": dict(vars(model.splade)),   # its pooling and the k applied, as its folder says
        "max_len": summary["max_len"], "query_max_len": summary["query_max_len"],
        "mean": {k: v for k, v in summary["mean"].items() if k not in SPARSITY_KEYS},
        **{k: summary["mean"].get(k) for k in SPARSITY_KEYS}, **{k: summary[k] for k in COUNT_KEYS},
        "datasets": {name: {"mean": r["mean"], **{k: r[k] for k in COUNT_KEYS}, **r["sparsity"],
                            "seconds": r["seconds"], "per_query": r["per_query"]} for name, r in results.items()}})


def format_table(summary: dict) -> str:
    """The result as an aligned text table: one row per dataset and, for several, their mean.
    "queries": the judged queries every mean is over; "empty": how many of them retrieved nothing."""
    rows = dict(summary["datasets"])
    if len(rows) > 1:
        rows["mean"] = {**summary["mean"], **{k: summary.get(k, "") for k in COUNT_KEYS}}
    measures = [k for k in summary["mean"] if k not in SPARSITY_KEYS]
    lines = [["dataset", *measures, "FLOPS", "q dims", "d dims", "queries", "empty"]]
    for name, r in rows.items():
        lines.append([name, *(f"{r.get(m, float('nan')):.4f}" for m in measures), f"{r['flops']:.3f}",
                      f"{r['mean_query_active_dims']:.1f}", f"{r['mean_doc_active_dims']:.1f}",
                      *(str(r.get(k, "")) for k in COUNT_KEYS)])
    widths = [max(map(len, column)) for column in zip(*lines)]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
                     for line in lines)


# ---------------- Anserini export and the CLI
def anserini_vocab(tokenizer, vocab_size) -> list:
    """The term of every vocabulary id in Anserini files: the tokenizer's token string; ids it does not
    name, names that repeat and names with whitespace (which `--pretokenized` would split) get a placeholder."""
    vocab, seen = [], set()
    for i in range(vocab_size):
        token = tokenizer.id_to_token(i)
        vocab.append(token if token and token not in seen and token.split() == [token] else f"[unused_id_{i}]")
        seen.add(vocab[-1])
    return vocab


def anserini_folder_name(name: str) -> str:
    """A dataset's or corpus' folder under OUT/anserini/: its name, with "/" as "-" and the words
    `beir` and `cacm` in capitals: pyserini reads a --topics path that contains them as a TSV or CACM
    file, whatever its extension (pyserini 1.6's DefaultQueryIterator)."""
    return name.replace("/", "-").replace("beir", "BEIR").replace("cacm", "CACM")


def pyserini_commands(written: dict) -> str:
    """The two pyserini commands that index a written dataset's documents and search its queries, run from
    OUT/anserini/ so that --topics is a path of anserini_folder_name's."""
    root = written["queries"].parents[1]
    collection, queries = (written[k].relative_to(root) for k in ("collection", "queries"))
    index = collection.parents[1] / "index"
    return (f"cd {root}\n"
            f"python -m pyserini.index.lucene --collection JsonVectorCollection --generator "
            f"DefaultLuceneDocumentGenerator --input {collection.parent} --index {index} --impact --pretokenized "
            f"--threads 1\n"
            f"python -m pyserini.search.lucene --index {index} --topics {queries} --output {queries.parent}/run.trec "
            f"--hits 1000 --impact --pretokenized --min-idf -1")


def export_anserini(out_dir, datasets, model, tokenizer, *, max_len=None, query_max_len=None,
                    batch_size=64, device=None, dtype=None, progress=True) -> dict:
    """Write evaluated datasets for Anserini's impact search in out_dir/anserini/: <corpus>/collection/vectors.jsonl
    from the encoded chunks and <dataset>/queries.jsonl, both as round(100 w) on one token string per id
    (anserini_vocab), so Anserini's integer scores are our dot products, to the rounding.
    Returns {dataset name: {"collection": path, "queries": path}}."""
    out_dir = Path(out_dir)
    max_len, query_max_len = text_lengths(model, max_len, query_max_len)
    vocab = anserini_vocab(tokenizer, model.head.decoder.weight.shape[0])
    written = {}
    for dataset in datasets:
        corpus = _corpus_folder_name(dataset.name)
        chunks = out_dir / corpus / "vectors"
        if manifest.read(chunks) is None:
            raise ValueError(f"{chunks}: no finished encoding of {dataset.name}'s corpus to export; "
                             f"evaluate it into {out_dir} first")
        collection = out_dir / "anserini" / anserini_folder_name(corpus) / "collection" / "vectors.jsonl"
        if collection not in (w["collection"] for w in written.values()):  # MS MARCO's one corpus, once
            collection.parent.mkdir(parents=True, exist_ok=True)
            write_json_vectors(iter_chunks(sorted(chunks.glob("chunk-*.npz"))), collection, vocab, progress=progress)
        qids, vectors, _ = encode_queries(model, tokenizer, dataset, query_max_len, batch_size=batch_size,
                                          device=device, dtype=dtype)
        queries = out_dir / "anserini" / anserini_folder_name(dataset.name) / "queries.jsonl"
        queries.parent.mkdir(parents=True, exist_ok=True)
        write_impact_queries(qids, vectors, queries, vocab)
        written[dataset.name] = {"collection": collection, "queries": queries}
    return written


def binary_relevance(dataset: IRDataset) -> IRDataset:
    """The dataset with every judgment of grade >= 1 as grade 1, the others left out: the relevance of
    sentence-transformers' (Sparse)InformationRetrievalEvaluator (--binary-relevance, to compare with it)."""
    qrels = {q: {d: 1 for d, grade in docs.items() if grade >= 1} for q, docs in dataset.qrels.items()}
    return dataclasses.replace(dataset, qrels={q: docs for q, docs in qrels.items() if docs})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="local model folder or hf:org/name[@revision]")
    ap.add_argument("--bench", required=True, help="nanobeir, nanobeir/<name>, beir13, beir/<name>, "
                    "msmarco-dev, dl19, dl20, or a BEIR-format folder; several, comma-separated")
    ap.add_argument("--out", required=True, help="output folder (vectors, index, run.trec, metrics.json)")
    ap.add_argument("--max-len", type=int, default=None, help="max tokens per document (and query); default: the "
                    "model's one length (sentence_bert_config.json's max_seq_length, else the longest input it reads)")
    ap.add_argument("--query-max-len", type=int, default=None, help="max tokens per query (default: --max-len)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=1000, help="results kept per query in run.trec")
    ap.add_argument("--chunk-size", type=int, default=CHUNK_DOCS, help="documents per vector file")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda when available)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], help="autocast (default: bf16 on GPU, fp32 on CPU)")
    ap.add_argument("--split", default=None, help="qrels split of a BEIR folder (default: test)")
    ap.add_argument("--msmarco-dir", default=None, help="folder with the official MS MARCO TSV files")
    for flag, text in (
            ("--strict", "stop at the first problem in the data files (an empty text, a malformed line, a judgment of "
                         "an unknown query or document) instead of skipping it with a warning"),
            ("--keep-self-hits", "do not drop results whose doc id equals the query id (BEIR drops them)"),
            ("--binary-relevance", "count every judged grade >= 1 as 1 (sentence-transformers' IR evaluators do; "
                                   "with --keep-self-hits, as they also keep self-hits, their nDCG@10)"),
            ("--export-anserini", "also write the documents and queries for Anserini's impact search under "
                                  "OUT/anserini/ (integer impacts round(100 w))"),
            ("--no-progress", None)):
        ap.add_argument(flag, action="store_true", help=text)
    args = ap.parse_args(argv)

    from hf.models import from_pretrained, load_tokenizer, model_max_seq_length, resolve_model_folder
    processes = Dist(args.device)   # torchrun: one process per GPU (gloo on CPU)
    device, rank = processes.device, processes.rank
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, None: None}[args.dtype]
    # the model's folder first (for hf:, only its config and tokenizer files), so that a wrong --model
    # is not hidden behind an error of the benchmark; then the data; the weights only once both are usable
    resolve_model_folder(args.model, need_weights=False)
    datasets = load_benchmark(args.bench, split=args.split, msmarco_dir=args.msmarco_dir, strict=args.strict)
    if args.binary_relevance:
        datasets = [binary_relevance(d) for d in datasets]
        if rank == 0:
            print("binary relevance: every judged grade >= 1 counts as 1 (--binary-relevance)", flush=True)
    with hold_out(args.out):  # one writer per --out, from the moment the inputs are known to be usable
        model = from_pretrained(args.model, device=device)
        tokenizer = load_tokenizer(args.model)
        max_len, source = ((args.max_len, "--max-len") if args.max_len is not None
                           else model_max_seq_length(args.model, model.config))
        lengths = dict(max_len=max_len, query_max_len=args.query_max_len or max_len)
        if rank == 0:
            print(f"reading up to {max_len} tokens per document and {lengths['query_max_len']} per query ({source}; "
                  f"--max-len and --query-max-len change them)", flush=True)
        kw = dict(batch_size=args.batch_size, device=device, dtype=dtype, progress=not args.no_progress)
        summary = evaluate_splade(model, tokenizer, datasets, args.out, **lengths, **kw, top_k=args.top_k,
                                  drop_self=False if args.keep_self_hits else None, chunk_size=args.chunk_size,
                                  benchmark_name=args.bench,
                                  model_folder=resolve_model_folder(args.model))  # the files they came from
        if rank == 0:
            print(format_table(summary))
            for name, r in summary["datasets"].items():
                if r["num_empty_queries"]:
                    print(f"{name}: {r['num_empty_queries']} of {r['num_queries']} judged queries "
                          f"retrieved nothing; they count as 0 in every mean (trec_eval -c)")
            print(f"wrote {Path(args.out) / 'metrics.json'}")
        if rank == 0 and args.export_anserini:
            for name, paths in export_anserini(args.out, datasets, model, tokenizer, **lengths, **kw).items():
                print(f"{name}: wrote {paths['collection']} and {paths['queries']}; to index and search them, "
                      f"in pyserini's environment (Java 21 or later):\n{pyserini_commands(paths)}")
    processes.close()
    return summary


if __name__ == "__main__":
    from cli import run_cli
    run_cli(main)
