"""Benchmark: a SPLADE training step with the fused, chunked pooling (model.splade_pool) against the
plain pooling over the full B x T x V logits (model.splade_pool_reference on model(ids)).

    python tests/benchmarks/bench_splade_pooling.py [--layers 2] [--rounds 5] [--threads 1]
            [--queries 8] [--query-len 32] [--docs-per-query 2] [--doc-len 128] [--chunks 0,16]
            [--device cpu|cuda] [--bf16]

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


def plain_splade_pool(model, input_ids, attention_mask, chunk_size=None):
    """The B x T x V way: full logits, then log(1 + relu), mask, max - autograd keeps it all."""
    return M.splade_pool(model, input_ids, attention_mask, fused=False)


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
    return S.SpladeObjective(model, dict(S.DEFAULTS, pool_chunk=chunk), 1, 0)


def train_step(setup, variant, args):
    model, batch, lam, optimizer = setup
    S.splade_pool = plain_splade_pool if variant == "plain" else M.splade_pool
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
