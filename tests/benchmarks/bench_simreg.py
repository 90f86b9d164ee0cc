"""Benchmark: cost of SimReg (step time, peak memory) next to cross-entropy, full vs chunked.

    python tests/benchmarks/bench_simreg.py [--layers 2] [--rounds 3] [--batch 1] [--threads 1]
                                            [--clock cpu|wall] [--device cpu|cuda] [--bf16]

The paper claims full SimReg costs < 2 % run time and < 1 % GPU memory of a training step, and the
chunked variant is nearly free. Shape: a 350M-like LLaMA's last layer reduced to fit a CPU: d = 1024,
vocabulary 50 304, sequence 2 048, chunk 512, batch 1. Three steps are compared (forward + backward,
gradients dropped after each step as zero_grad(set_to_none=True) would):

    CE            h → LM head matmul → cross-entropy
    CE + SimReg   the same + λ·simreg_loss(h, labels, chunk 512)     ("chunked")
    CE + SimReg   the same + λ·simreg_loss(h, labels, chunk = T)     ("full")

once with h a leaf (the head only: what every training step pays at the top of the model) and once
with h produced by a small LLaMA-like stack built from plain torch layers (RMSNorm, causal SDPA
attention with 16 heads, SwiGLU 2736, no RoPE) under the same head. A real 350M step has 24 such
layers, so the overhead there is smaller still; the script extrapolates to 24 layers from its own
per-layer measurements (labelled as an estimate, AdamW states added analytically for memory).

Time: medians over rounds in which the variants alternate; on CPU by default the process's CPU time
with one thread, as wall time on a shared machine measures the neighbours too. Also SimReg
alone (forward + backward of the regulariser on h), the direct cost, which is less noisy than a
difference of two step times. Memory: every variant runs in a fresh subprocess (CPU), resets its RSS
high-water mark after setup (/proc/self/clear_refs, Linux) and reports its peak RSS (VmHWM, the
high-water mark getrusage reports as ru_maxrss, read from /proc/self/status) minus the RSS just before its measured step (after one warm-up step), i.e. the step's peak working
set above parameters and inputs; glibc is told to unmap freed blocks ≥ 64 KiB so RSS follows live
tensors; RSS counts what the CPU allocator really holds, which tracemalloc does
not see. On CUDA the same numbers come from torch.cuda.max_memory_allocated in-process.

CPU note: with τ = 0.01 the logsumexp gradients exp(s − lse) of far-away tokens fall into fp32
denormals, which x86 multiplies ~100× slower; a CPU trainer should call torch.set_flush_denormal(True)
(GPUs have no such penalty). This script does so unless --keep-denormals is given.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from simreg import simreg_loss  # noqa: E402

VARIANTS = ("ce", "chunked", "full")  # CE alone, CE + chunked SimReg, CE + full SimReg
ALONE = ("simreg-chunked", "simreg-full")  # SimReg alone


class Block(nn.Module):
    """A LLaMA-like pre-norm decoder block from plain torch layers (RoPE omitted: negligible cost)."""

    def __init__(self, d, n_heads, ffn):
        super().__init__()
        self.n_heads = n_heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate_up, self.down = nn.Linear(d, 2 * ffn, bias=False), nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, T, 3, self.n_heads, -1).transpose(1, 3).unbind(2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(B, T, d))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def zipf_labels(batch, seq, vocab, generator):
    """Next-token labels with text-like repetition (Zipf over the vocabulary), so groups form."""
    weights = 1.0 / (torch.arange(vocab, dtype=torch.float64) + 2.7)
    return torch.multinomial(weights, batch * seq, replacement=True, generator=generator).view(batch, seq)


def make_setup(args, layers):
    """Parameters and inputs of one benchmark configuration (layers = 0: the LM head alone)."""
    g = torch.Generator().manual_seed(0)
    dev = torch.device(args.device)
    d, T, B, V = args.d, args.seq, args.batch, args.vocab
    setup = {"labels": zipf_labels(B, T, V, g).to(dev),
             "head": (torch.randn(V, d, generator=g) * d**-0.5).to(dev).requires_grad_()}
    # final-norm outputs share a common direction, as real LM states do (cosines well above 0)
    states = torch.randn(B, T, d, generator=g) + 0.7 * torch.randn(d, generator=g)
    if layers:
        torch.manual_seed(0)
        blocks = [Block(d, args.heads, args.ffn) for _ in range(layers)]
        setup["model"] = nn.Sequential(*blocks, nn.RMSNorm(d, eps=1e-5)).to(dev)
        setup["x"] = states.to(dev)  # stands in for the token embeddings
    else:
        setup["h"] = F.rms_norm(states, (d,)).to(dev).requires_grad_()
    return setup


def train_step(setup, variant, args):
    """Forward + backward of one step; gradients dropped afterwards, as zero_grad(set_to_none).

    variant: "ce", "chunked" or "full" (CE + SimReg), or "simreg-chunked" / "simreg-full" (the
    regulariser alone, no LM head).
    """
    with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16):
        h = setup["model"](setup["x"]) if "model" in setup else setup["h"]
        loss = 0.0
        if not variant.startswith("simreg-"):
            logits = h @ setup["head"].T
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), setup["labels"].view(-1))
        if variant != "ce":
            chunk = args.chunk if variant.endswith("chunked") else None
            loss = loss + args.lam * simreg_loss(h, setup["labels"], tau=args.tau, chunk_size=chunk)
    loss.backward()
    params = list(setup["model"].parameters()) if "model" in setup else [setup["h"]]
    for p in params + [setup["head"]]:
        p.grad = None


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def seconds(fn, args):
    """Wall time of fn on CUDA; on CPU the process's CPU time by default (--clock), which a busy
    shared machine inflates far less than wall time (run with 1 thread: no spin-waiting counted)."""
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    synchronize(args.device)
    start = clock()
    fn()
    synchronize(args.device)
    return clock() - start


def time_steps(setup, args):
    """Median seconds per step of each variant, the variants alternating round by round."""
    for variant in VARIANTS:  # warm-up: first-call allocations and kernel selection
        train_step(setup, variant, args)
    times = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            times[variant].append(seconds(lambda: train_step(setup, variant, args), args))
    return {v: statistics.median(t) for v, t in times.items()}


def time_simreg_alone(args):
    """Median seconds of forward + backward of the regulariser alone on the head-only states."""
    setup = make_setup(args, 0)
    result = {}
    for variant in ALONE:
        train_step(setup, variant, args)
        result[variant] = statistics.median(
            seconds(lambda: train_step(setup, variant, args), args) for _ in range(max(5, args.rounds)))
    return result


def proc_status_bytes(field):
    """A memory field of /proc/self/status (Linux), e.g. VmRSS (now) or VmHWM (peak RSS), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} line: this memory measurement needs Linux")


def reset_peak_rss():
    """Reset the RSS high-water mark VmHWM (Linux ≥ 4.0), so import and setup peaks do not hide the
    step's own peak. (getrusage's ru_maxrss is not used: after fork + exec it also keeps the parent's
    RSS at fork time, which no reset clears.)"""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def step_peak_memory(args, variant, layers):
    """Peak memory of one step above what is held before it, in bytes."""
    setup = make_setup(args, layers)
    if args.device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        train_step(setup, variant, args)
        return torch.cuda.max_memory_allocated() - before
    train_step(setup, variant, args)  # warm-up: thread pools, kernel buffers (~70 MB, once per process)
    reset_peak_rss()
    before = proc_status_bytes("VmRSS")
    train_step(setup, variant, args)
    return proc_status_bytes("VmHWM") - before


def memory_in_fresh_process(args, child_args, measure):
    """Peak step memory in bytes. On CPU, the running benchmark script is re-run as
    `script ARGS --child CHILD_ARGS` (which prints {"peak_bytes": ...} last) in a fresh process, so
    that earlier variants' freed memory cannot hide this one's peak; on CUDA the allocator's own
    peak counter is exact, and `measure()` runs here."""
    if args.device == "cuda":
        torch.cuda.empty_cache()
        return measure()
    cmd = [sys.executable, sys.argv[0], *sys.argv[1:], "--child", *map(str, child_args)]
    # A fixed mmap threshold makes glibc return every freed block ≥ 64 KiB to the OS at once (the
    # default raises the threshold over time and keeps freed tensors resident), so RSS follows the
    # tensors alive at each moment.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_bytes"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--ffn", type=int, default=2736)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=2, help="layers of the small model (0: head only)")
    p.add_argument("--full-layers", type=int, default=24, help="layer count to extrapolate to (350M: 24)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tau", type=float, default=0.01)
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--clock", choices=["cpu", "wall"], default=None,
                   help="time measure; default: cpu (process CPU time) on CPU, wall on CUDA")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast, as training on GPU")
    p.add_argument("--keep-denormals", action="store_true", help="skip torch.set_flush_denormal(True)")
    p.add_argument("--child", nargs=2, metavar=("VARIANT", "LAYERS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    args.clock = args.clock or ("wall" if args.device == "cuda" else "cpu")
    return args


def pct(part, whole):
    return f"{100 * part / whole:6.2f} %"


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    flushing = not args.keep_denormals and torch.set_flush_denormal(True)
    if args.child:
        variant, layers = args.child
        print(json.dumps({"peak_bytes": step_peak_memory(args, variant, int(layers))}))
        return
    print("command: python " + " ".join([sys.argv[0], *sys.argv[1:]]))
    print(f"shape: batch {args.batch} × seq {args.seq}, d {args.d}, vocab {args.vocab}, chunk {args.chunk}, "
          f"τ {args.tau}; device {args.device}, {torch.get_num_threads()} threads, clock {args.clock}, "
          f"bf16 autocast {args.bf16}, flush denormals {bool(flushing)}; torch {torch.__version__}")
    configs = [("head only (LM head + CE)", 0)]
    if args.layers:
        configs.append((f"{args.layers}-layer LLaMA-like + head", args.layers))

    print(f"\nstep time, forward + backward ({args.clock} seconds, median of {args.rounds} alternating rounds)")
    print(f"{'':34} {'CE':>9} {'+SimReg chunked':>22} {'+SimReg full':>22}")
    step_time = {}
    for label, layers in configs:
        t = time_steps(make_setup(args, layers), args)
        step_time[layers] = t["ce"]
        print(f"{label:34} {t['ce']:8.3f}s " + " ".join(
            f"{t[v]:8.3f}s ({pct(t[v] - t['ce'], t['ce'])})" for v in ("chunked", "full")))

    alone = time_simreg_alone(args)
    refs = [("head-only step", step_time[0])]
    if args.layers:
        per_layer = (step_time[args.layers] - step_time[0]) / args.layers
        refs += [(f"{args.layers}-layer step", step_time[args.layers]),
                 (f"est. {args.full_layers}-layer step", step_time[0] + args.full_layers * per_layer)]
    print("\nSimReg alone, forward + backward (the direct overhead), relative to the CE step:")
    for v in ALONE:
        print(f"  {v:15} {1000 * alone[v]:8.1f} ms = "
              + ", ".join(f"{pct(alone[v], t)} of {name}" for name, t in refs))

    how = "peak RSS − RSS before the step, fresh process each" if args.device == "cpu" else \
        "torch.cuda.max_memory_allocated − allocated before the steps"
    print(f"\npeak memory of a step above parameters and inputs ({how})")
    print(f"{'':34} {'CE':>9} {'+SimReg chunked':>22} {'+SimReg full':>22}")
    peak = {}
    for label, layers in configs:
        m = {v: memory_in_fresh_process(args, [v, layers], lambda: step_peak_memory(args, v, layers)) for v in VARIANTS}
        peak[layers] = m
        print(f"{label:34} {m['ce'] / 2**20:7.0f}MB " + " ".join(
            f"{m[v] / 2**20:7.0f}MB ({pct(m[v] - m['ce'], m['ce'])})" for v in ("chunked", "full")))
    m = {v: memory_in_fresh_process(args, [v, 0], lambda: step_peak_memory(args, v, 0)) for v in ALONE}
    print("SimReg alone (its own transient peak, no LM head): "
          + ", ".join(f"{v} {m[v] / 2**20:.0f}MB" for v in ALONE))
    if args.layers:
        # Measured per layer: its gradients and saved activations (its weights are held before the
        # step). Added analytically: every weight plus AdamW's two fp32 moments (12 bytes/param) and
        # the input embedding's gradient, which the head-only step does not have.
        layer_params = sum(p.numel() for p in Block(args.d, args.heads, args.ffn).parameters())
        per_layer = (peak[args.layers]["ce"] - peak[0]["ce"]) / args.layers
        all_params = args.full_layers * layer_params + 2 * args.vocab * args.d  # untied embedding + head
        full = peak[0]["ce"] + args.full_layers * per_layer + 12 * all_params + 4 * args.vocab * args.d
        print(f"est. {args.full_layers}-layer step incl. weights and AdamW moments: {full / 2**30:.2f} GiB; "
              + ", ".join(f"SimReg {v} adds {pct(peak[0][v] - peak[0]['ce'], full)}" for v in ("chunked", "full")))
    print("\nThe head-only ratios are upper bounds: a training step also runs every layer below the head.\n"
          "A step's peak grows by less than SimReg's own peak: autograd runs SimReg's backward (and frees\n"
          "its tensors) before the CE backward, where the step peaks.")


if __name__ == "__main__":
    main()
