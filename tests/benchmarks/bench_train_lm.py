"""Tokens/s and MFU of train_lm.py's training step at the LLaMA-350M and LLaMA-1.3B shapes.

    python tests/benchmarks/bench_train_lm.py                  # a GPU: both shapes, bf16, compile
    python tests/benchmarks/bench_train_lm.py --configs configs/llama_350m_simreg.py --set batch_size=8
    python tests/benchmarks/bench_train_lm.py --tiny           # CPU dry run: tiny shape, a few seconds
    python tests/benchmarks/bench_train_lm.py --configs configs/eurobert_210m_mlm.py   # masked LM

What is timed: the step train_lm.py runs on one GPU, built with train_lm's own pieces: the config
file's model (train_lm.build_model), LMObjective (CE, plus SimReg with a *_simreg config) under the
config's autocast dtype and torch.compile, backward, gradient clipping and fused AdamW with the
non-finite guard's found_inf (nothing is read back from the GPU, as in the loop), for --steps steps
after --warmup untimed ones (which include compilation). Random tokens replace the shards: the loader is not measured.
The shapes (d_model, layers, heads, d_ff, vocab, seq_len) and the micro-batch (batch_size x seq_len)
are the configs' own:

    configs/llama_350m_baseline.py   LLaMA-350M: d 1024, 24 layers, SwiGLU 2736, vocab 50304, 16 x 2048
    configs/llama_1b_baseline.py     LLaMA-1.3B: d 2048, 24 layers, SwiGLU 5461, vocab 50304,  8 x 2048

MFU = throughput.flops_per_token(cfg, seq_len, head_fraction) x tokens/s / the GPU's dense bf16 peak
(throughput.peak_flops; unknown GPUs and the CPU print no MFU), where head_fraction is 1 for causal
LM and mask_ratio for masked LM, whose head runs at the masked positions only (as train_lm.py
counts it). Causal attention is counted as full T x T scores (PaLM's convention), not the half
a causal kernel computes: README, Performance. Peak memory is the allocator's peak over the timed steps.
"""
import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import train_lm  # noqa: E402
import checkpoint  # noqa: E402
import cli  # noqa: E402
import throughput  # noqa: E402
import training  # noqa: E402
from throughput import flops_per_token  # noqa: E402

CONFIGS = ["configs/llama_350m_baseline.py", "configs/llama_1b_baseline.py"]
# --tiny: the same code at a shape the CPU runs in seconds (fp32, eager)
TINY = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=172, vocab_size=512, seq_len=64,
            max_seq_len=64, batch_size=4, grad_accum=1, dtype="float32", compile=False, device="cpu",
            bos_id=1, eos_id=2, pad_id=0, mask_id=4)  # special ids inside the tiny vocabulary


def bench_config(path, args):
    """One config: {config, params_m, tokens_per_step, ms_per_step, tokens_per_s, mfu, peak_gb}."""
    overrides = [f"--{k}={v}" for k, v in TINY.items()] if args.tiny else []
    C = cli.parse_config(train_lm.DEFAULTS, [str(ROOT / path), *overrides, *(f"--{s}" for s in args.set)])
    if args.no_compile:
        C["compile"] = False
    device = torch.device("cuda" if C["device"] in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.tiny:
        raise SystemExit("no CUDA device: these shapes are for a GPU; use --tiny for a CPU dry run")
    training.seed_everything(C["seed"])
    model = train_lm.build_model(C, None)
    train_lm.init_weights(model, C, device)  # built on the meta device, drawn on the training device
    model.train()
    objective = train_lm.LMObjective(model, C)
    step_obj = torch.compile(objective) if C["compile"] else objective
    optimizer = training.adamw(model, C["lr"], C["weight_decay"], (C["beta1"], C["beta2"]), C["adam_eps"], device,
                               fused=True)
    B, L = C["batch_size"], C["seq_len"]
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (B, L + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    causal, use_simreg = train_lm.step_objective(C, 0)
    rows, head_fraction = None, 1.0
    if not causal:  # masked LM (eurobert_*_mlm configs): train_lm's own masking of the same tokens
        x, y = train_lm.mlm_mask(x, train_lm.masking(C, model), torch.Generator().manual_seed(0))
        rows, y = train_lm.masked_rows(y, train_lm.mlm_bucket(C))
        rows, head_fraction = rows.to(device), C["mask_ratio"]  # the head runs at the masked positions only
    x, y = x.to(device), y.to(device)

    def step():  # train_lm.py's step, without a read back from the device
        with training.autocast(device, C["dtype"]):
            loss, _ = step_obj(x, y, causal, use_simreg, rows)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), C["grad_clip"])
        optimizer.found_inf = checkpoint.NonFiniteGuard.found_inf(loss, grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps
    peak = throughput.peak_flops(device)
    tps = B * L / dt
    return {"config": path, "objective": "clm" if causal else "mlm", "simreg": bool(use_simreg), "device": torch.cuda.get_device_name(device)
            if device.type == "cuda" else "cpu", "dtype": C["dtype"], "compile": C["compile"],
            "params_m": round(model.num_params() / 1e6, 1), "tokens_per_step": B * L,
            "ms_per_step": round(1e3 * dt, 1), "tokens_per_s": round(tps),
            "mfu": flops_per_token(model.config, L, head_fraction) * tps / peak if peak else None,
            "peak_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=CONFIGS, help="train_lm config files (default: 350M and 1.3B)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="train_lm overrides for every config, e.g. batch_size=8 simreg=True")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20; --tiny 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first, compilation included (default 5; --tiny 1)")
    ap.add_argument("--no-compile", action="store_true", help="eager, whatever the config says")
    ap.add_argument("--tiny", action="store_true", help="CPU dry run at a tiny shape (checks the harness, not speed)")
    args = ap.parse_args(argv)
    args.steps = args.steps or (2 if args.tiny else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 5)
    print(f"{time.strftime('%Y-%m-%d')}; torch {torch.__version__}; command: python tests/benchmarks/bench_train_lm.py "
          + " ".join(sys.argv[1:] if argv is None else argv))
    print("| config | params | device | tokens/step | ms/step | tokens/s | MFU | peak GB |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    rows = []
    for path in args.configs:
        r = bench_config(path, args)
        rows.append(r)
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "-"
        print(f"| {r['config']} ({r['objective']}{' + SimReg' if r['simreg'] else ''}) | {r['params_m']}M | {r['device']} "
              f"| {r['tokens_per_step']:,} | {r['ms_per_step']} | {r['tokens_per_s']:,} | {mfu} | {r['peak_gb'] or '-'} |",
              flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    for r in rows:
        print(json.dumps(r))
    return rows


if __name__ == "__main__":
    main()
