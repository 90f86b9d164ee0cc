"""Benchmark: a SPLADE training step with the fused, chunked pooling (fast_paths.fused_splade_pool) against the
plain pooling over the full B x T x V logits (model.splade_pool).

    python tests/benchmarks/bench_splade_pooling.py [--layers 2] [--rounds 5] [--threads 1]
            [--queries 8] [--query-len 32] [--docs-per-query 2] [--doc-len 128] [--chunks 0,16]
            [--device cpu|cuda] [--bf16]
    python tests/benchmarks/bench_splade_pooling.py --compare-chunks 0,4,8,16,32 [--rounds 4]

What is compared: one optimizer step of train_splade.py's objective (both encoders, InfoNCE over the
batch's documents, FLOPS on both sides, backward, AdamW), on a ModernBERT-base-like model reduced
to fit a CPU: d = 768, 12 heads, GeGLU 1152, vocabulary 50 368, tied head with its dense + norm
transform, every third layer global and the others a +-64-token window - only 2 layers instead of
22 (--layers), which makes the pooling's share of the step, and so the differences, larger than in
the real model. Batch: 8 queries of 32 tokens, each with a positive and a hard negative of 128
tokens: 16 x 128 x 50 368 = 103M document logits (412 MB in fp32 per copy of the tensor).

Variants: plain; fused with the automatic chunk (~64M logits per chunk: at this batch the whole
sequence in one chunk, but the backward still keeps only the winners); fused with a chunk of 16
tokens (--chunks; 0 = automatic).

--compare-chunks: is the automatic chunk (0) as fast as the best fixed one? The training step
(fused pooling only; padded batches, each text's length drawn between half and all of its budget;
the update by SGD with lr 0, so that every chunk runs on the same weights) at the shapes of SHAPES, one after the other; within a shape the chunks alternate in ABBA order
(round r runs them forwards when r is even, backwards when odd). Reported per shape: median step
time of each chunk, its ratio to the best fixed chunk, the per-round range of automatic / best
fixed, and whether the first-step losses of all chunks are bitwise equal (the chunk must change
no vector).

Time: medians over rounds in which the variants alternate; on CPU the process's CPU time with one
thread (wall time on a shared machine measures the neighbours too), on CUDA wall time. Memory:
each variant in a fresh process (CPU) that resets its RSS high-water mark after a warm-up step
and reports its peak RSS during one step minus the RSS just before it (glibc is told to unmap
freed blocks >= 64 KiB, so RSS follows live tensors); on CUDA torch.cuda.max_memory_allocated.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))
import model as M  # noqa: E402
import train_splade as S  # noqa: E402
from bench_simreg import memory_in_fresh_process, proc_status_bytes, reset_peak_rss, seconds  # noqa: E402

VOCAB = 50368  # ModernBERT's


def make_setup(args):
    torch.manual_seed(0)
    cfg = M.ModelConfig(**{**M.FAMILY_TRAITS["modernbert"], "family": "modernbert", "vocab_size": VOCAB,
                           "d_model": 768, "n_layers": args.layers, "n_heads": 12, "d_ff": 1152, "pad_id": 0,
                           "window": 64, "local_layers": tuple(i for i in range(args.layers) if i % 3)})
    model = M.Transformer(cfg).to(args.device).train()
    g = torch.Generator().manual_seed(1)
    nq, nd = args.queries, args.queries * args.docs_per_query
    batch = [torch.randint(5, VOCAB, (nq, args.query_len), generator=g), torch.ones(nq, args.query_len, dtype=torch.long),
             torch.randint(5, VOCAB, (nd, args.doc_len), generator=g), torch.ones(nd, args.doc_len, dtype=torch.long)]
    batch = [t.to(args.device) for t in batch] + [None]
    lam = torch.tensor(1e-3, device=args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    return model, batch, lam, optimizer


def objective(setup, variant):
    model = setup[0]
    chunk = 0 if variant in ("plain", "fused") else int(variant.split("-c")[1])
    # plain: the B x T x V way (fused=False): full logits, then log(1 + relu), mask, max - autograd keeps it all
    return S.SpladeObjective(model, dict(S.DEFAULTS, pool_chunk=chunk, fused=variant != "plain"), 1, 0)


def train_step(setup, variant, args):
    model, batch, lam, optimizer = setup
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16)
    with autocast:
        loss, stats = objective(setup, variant)(*batch, lam, lam)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return stats["loss"].item()


def step_peak_memory(args, variant):
    setup = make_setup(args)
    train_step(setup, variant, args)  # warm-up: AdamW state, thread pools, kernel buffers
    if args.device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        train_step(setup, variant, args)
        return torch.cuda.max_memory_allocated() - before
    reset_peak_rss()
    before = proc_status_bytes("VmRSS")
    train_step(setup, variant, args)
    return proc_status_bytes("VmHWM") - before


# --compare-chunks: (name, model, queries, query length, documents per query, document length)
BERT_TINY = dict(family="bert", vocab_size=30522, d_model=128, n_layers=2, n_heads=2, d_ff=512, max_seq_len=512,
                 type_vocab_size=2, norm_eps=1e-12, pad_id=0)  # the architecture of ../shared/data/models/splade-tiny
MODERNBERT_2L = dict(family="modernbert", vocab_size=VOCAB, d_model=768, n_layers=2, n_heads=12, d_ff=1152, pad_id=0,
                     window=64, local_layers=(1,))
SHAPES = [
    ("bert-tiny, configs/repro_splade_train.py: 16 q x 32 + 16 d x 64", BERT_TINY, 16, 32, 1, 64),
    ("bert-tiny, 16 q x 32 + 32 d x 128 (a hard negative each)", BERT_TINY, 16, 32, 2, 128),
    ("bert-tiny, 64 q x 16 + 64 d x 64", BERT_TINY, 64, 16, 1, 64),
    ("modernbert-like d 768, 2 layers: 8 q x 32 + 16 d x 128", MODERNBERT_2L, 8, 32, 2, 128),
]


def padded_batch(n, length, g):
    """n texts of random ids, each of a length drawn between length / 2 and length, right-padded."""
    ids = torch.randint(5, 30000, (n, length), generator=g)
    mask = (torch.arange(length)[None] < torch.randint(length // 2, length + 1, (n, 1), generator=g)).long()
    return ids * mask, mask


def compare_chunks(args):
    chunks = [int(c) for c in args.compare_chunks.split(",")]
    fixed = [c for c in chunks if c]
    assert 0 in chunks and fixed, "--compare-chunks needs 0 (automatic) and at least one fixed chunk"
    print(f"device {args.device}, {args.threads} thread(s), {'bf16' if args.bf16 else 'fp32'}, {args.clock} time, "
          f"median of {args.rounds} rounds, chunks in ABBA order")
    summary = []
    for name, arch, nq, q_len, per_query, d_len in SHAPES:
        torch.manual_seed(0)
        model = M.Transformer(M.ModelConfig(**{**M.FAMILY_TRAITS[arch["family"]], **arch})).to(args.device).train()
        g = torch.Generator().manual_seed(1)
        batch = [t.to(args.device) for t in (*padded_batch(nq, q_len, g), *padded_batch(nq * per_query, d_len, g))]
        batch.append(None)
        lam = torch.tensor(1e-3, device=args.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the step's cost without changing the weights

        def step(chunk):
            objective = S.SpladeObjective(model, dict(S.DEFAULTS, pool_chunk=chunk), 1, 0)
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16):
                loss, _ = objective(*batch, lam, lam)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        losses = {c: step(c) for c in chunks}  # also the warm-up
        same = all(torch.equal(losses[c], losses[chunks[0]]) for c in chunks)
        times = {c: [] for c in chunks}
        for r in range(args.rounds):
            for c in (chunks if r % 2 == 0 else chunks[::-1]):
                times[c].append(seconds(lambda: step(c), args))
        median = {c: statistics.median(t) for c, t in times.items()}
        best = min(fixed, key=median.get)
        auto = max(1, (1 << 26) // (nq * per_query * model.config.vocab_size))
        per_round = [times[0][r] / min(times[c][r] for c in fixed) for r in range(args.rounds)]
        print(f"\n{name}: automatic chunk = {min(auto, d_len)} document tokens"
              f"{' (the whole text)' if auto >= d_len else ''}; first-step losses of all chunks bitwise equal: {same}")
        for c in chunks:
            print(f"  chunk {c if c else 'auto':>4}  {median[c]:8.3f} s  {median[c] / median[best]:6.3f} x best fixed ({best})")
        summary.append((name, median[0] / median[best], best, min(per_round), max(per_round)))
    print("\nautomatic / best fixed chunk, median step time (per-round range of automatic / fastest fixed chunk):")
    for name, ratio, best, lo, hi in summary:
        print(f"  {ratio:.3f} (best fixed {best}; per round {lo:.2f}-{hi:.2f})  {name}")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--query-len", type=int, default=32)
    p.add_argument("--docs-per-query", type=int, default=2)
    p.add_argument("--doc-len", type=int, default=128)
    p.add_argument("--chunks", default="0,16", help="fused variants: tokens per chunk, 0 = automatic")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast, as training on GPU")
    p.add_argument("--compare-chunks", metavar="CHUNKS", default="",
                   help="time the automatic chunk (0) against these fixed ones at the shapes of SHAPES")
    p.add_argument("--child", metavar="VARIANT", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.clock = "wall" if args.device == "cuda" else "cpu"
    args.variants = ["plain"] + ["fused" if c == "0" else f"fused-c{c}" for c in args.chunks.split(",")]
    return args


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps({"peak_bytes": step_peak_memory(args, args.child)}))
        return
    print("$ python tests/benchmarks/bench_splade_pooling.py " + " ".join(sys.argv[1:]))
    if args.compare_chunks:
        return compare_chunks(args)
    setup = make_setup(args)
    losses = {v: train_step(make_setup(args), v, args) for v in args.variants}  # same weights, same batch
    spread = max(losses.values()) - min(losses.values())
    times = {v: [] for v in args.variants}
    for v in args.variants:
        train_step(setup, v, args)  # warm-up
    for _ in range(args.rounds):
        for v in args.variants:
            times[v].append(seconds(lambda: train_step(setup, v, args), args))
    step = {v: statistics.median(t) for v, t in times.items()}
    memory = {v: memory_in_fresh_process(args, [v], lambda: step_peak_memory(args, v)) for v in args.variants}
    tokens = args.queries * args.query_len + args.queries * args.docs_per_query * args.doc_len
    logits = args.queries * args.docs_per_query * args.doc_len * VOCAB
    print(f"device {args.device}, {args.threads} thread(s), {args.layers} layers, d 768, vocab {VOCAB}, "
          f"{args.queries} queries x {args.query_len} + {args.queries * args.docs_per_query} docs x {args.doc_len} "
          f"tokens ({logits / 1e6:.0f}M document logits), {'bf16' if args.bf16 else 'fp32'}, "
          f"{args.clock} time, median of {args.rounds}")
    print(f"first-step loss of every variant equal to {spread:.1e}")
    print(f"{'variant':<12}{'step s':>10}{'vs plain':>10}{'tokens/s':>11}{'peak MB':>10}{'vs plain':>10}")
    for v in args.variants:
        print(f"{v:<12}{step[v]:>10.3f}{step[v] / step['plain']:>10.3f}{tokens / step[v]:>11.0f}"
              f"{memory[v] / 2**20:>10.0f}{memory[v] / memory['plain']:>10.3f}")


if __name__ == "__main__":
    main()
