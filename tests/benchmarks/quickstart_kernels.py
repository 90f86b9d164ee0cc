"""How far the quick start's numbers move with the CPU's kernels and the thread count.

    python tests/benchmarks/quickstart_kernels.py [--out out/quickstart_kernels] [--steps 200]

A CPU of another model (AVX2 or AVX-512, Intel or AMD) runs other kernels: torch's own vectorised
ones (ATen: AVX-512, AVX2 or none, chosen at start-up; ATEN_CPU_CAPABILITY forces one) and MKL's
matrix products (MKL_ENABLE_INSTRUCTIONS caps its code path; on AMD MKL takes its AVX2 path); and
more threads split the reductions differently. Each sums in another order, so fp32 results differ
in their last bits, and training either damps those differences (a smooth descent) or amplifies
them (a plateau it leaves at a step that depends on them). This script runs the quick start's
three language models (experiments/quickstart.py, SPLADE skipped) once per kernel choice, each in
a fresh process with its own output folder, and prints each run's numbers unrounded and their
spread. tests/test_first_hour.py compares README's summary with a fresh run within that spread.
Runs take ~1 min each on an idle 2-core machine at one thread (the unvectorised kernels and 2
threads on a loaded machine much longer).
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eval.compare_runs import compare, load_run  # noqa: E402

KERNELS = {  # name: (environment, threads)
    "default": ({}, 1),
    "aten_avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, 1),
    "aten_none": ({"ATEN_CPU_CAPABILITY": "default"}, 1),
    "mkl_avx2": ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 1),
    "mkl_sse42": ({"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, 1),
    "aten_mkl_avx2": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 1),
    "default_2_threads": ({}, 2),
    "aten_avx2_2_threads": ({"ATEN_CPU_CAPABILITY": "avx2"}, 2),
}

RUN = """import sys
from experiments import quickstart
quickstart.SPLADE_DATA = ()
quickstart.main(["--out", sys.argv[1], "--steps", sys.argv[2]])
"""


def numbers(out):
    """The summary's numbers of one run, unrounded."""
    base, sr = compare([load_run(out / "lm", "CE"), load_run(out / "lm_simreg", "CE+SimReg")])["runs"]
    evals = [json.loads(line) for line in (out / "encoder" / "log.jsonl").read_text().splitlines()]
    return {"CE loss": base["final_val_loss"], "CE+SimReg loss": sr["final_val_loss"],
            "steps to CE's loss": sr["steps_to_target"], "CE angle": base["interclass_angle"],
            "CE+SimReg angle": sr["interclass_angle"],
            "encoder CLM -> MLM loss": [r for r in evals if "val_loss" in r][-1]["val_loss"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/quickstart_kernels", help="one folder per kernel choice under it")
    ap.add_argument("--steps", default="200", help="the quick start's --steps (default 200)")
    ap.add_argument("--kernels", default=",".join(KERNELS), help=f"which of: {', '.join(KERNELS)}")
    args = ap.parse_args(argv)
    rows = {}
    for name in args.kernels.split(","):
        env, threads = KERNELS[name]
        out = Path(args.out) / name
        child = {**os.environ, **env, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
        p = subprocess.run([sys.executable, "-c", RUN, str(out), args.steps], cwd=ROOT, env=child,
                           capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"error: {name}: the quick start failed:\n{p.stderr[-3000:]}")
        capability = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu."
                                     "get_cpu_capability())"], env=child, capture_output=True, text=True).stdout
        rows[name] = numbers(out)
        print(f"{name:<22} ATen {capability.strip():<8} " + "  ".join(f"{k} {v:.5f}" if v is not None else f"{k} -" for k, v in rows[name].items()),
              flush=True)
    print("spread (max - min):")
    for key in next(iter(rows.values())):
        values = [r[key] for r in rows.values() if r[key] is not None]  # None: SimReg never reached CE's loss
        if not values:
            continue
        print(f"  {key:<24} {min(values):.5f} .. {max(values):.5f}  ({max(values) - min(values):.5f})")


if __name__ == "__main__":
    main()
