"""The SPLADE rescaling paper's experiment as one command: train backbones x k with train_splade.py,
evaluate every model with eval/retrieval.py, and collect one table and two plots.

    python experiments/splade_sweep.py configs/splade_sweep.py --launcher "torchrun --nproc_per_node=8"
    python experiments/splade_sweep.py configs/splade_sweep.py --only modernbert,roberta --ks "[1, 2, 16]"
    python experiments/splade_sweep.py configs/splade_sweep.py --action table      # collect what exists
    python experiments/splade_sweep.py configs/splade_sweep.py --dry_run           # print the commands

Under root: <backbone>_k<k>/ (a train_splade.py out_dir, eval/<benchmark>/ in it); results.md / .csv / .json:
per backbone and k the head norm after rescaling, each benchmark's headline number, FLOPS and active dimensions;
and the plots. Resumable; a failed run is reported in the table and the sweep goes on.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

import re
import shlex

import cli
from checkpoint import read_log
from data import manifest
from eval.plots import save
from experiments.runner import Driver, Job, Report, cell, markdown_table, pyplot, run_jobs

ROOT = Path(__file__).resolve().parents[1]

DEFAULTS = dict(
    root="out/splade_sweep",
    backbones={"modernbert": "hf:answerdotai/ModernBERT-base"},   # name -> --init spec
    ks=[1, 16],
    benchmarks=["msmarco-dev", "dl19", "beir13", "nanobeir"],     # anything eval/retrieval.py --bench accepts
    launcher="python",        # e.g. "torchrun --nproc_per_node=8" (used for training and evaluation)
    train_config="",          # a configs/*.py file given to every train_splade.py run
    train_args=[],            # extra train_splade.py flags, e.g. ["--max_steps=10000"]
    eval_args=[],             # extra eval/retrieval.py flags, e.g. ["--batch-size", "128"]
    only="",                  # comma-separated backbone names to run (default: all)
    jobs=1,                   # processes at a time, each on every GPU of the launcher; 0: in this process (the tests)
    action="all",             # all | train | eval | table
    dry_run=False,
)

# the number reported for each benchmark (docs/splade_rescaling.md, retrieval evaluation); others report nDCG@10
HEADLINE = {"msmarco-dev": ("RR@10", "MS MARCO dev MRR@10"), "dl19": ("nDCG@10", "DL19 nDCG@10"),
            "dl20": ("nDCG@10", "DL20 nDCG@10"), "beir13": ("nDCG@10", "BEIR-13 nDCG@10"),
            "nanobeir": ("nDCG@10", "NanoBEIR nDCG@10")}


def bench_dir(bench):
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(bench)).strip("-")


def headline(bench):
    return HEADLINE.get(str(bench), ("nDCG@10", f"{bench} nDCG@10"))


def selected(C):
    """[(backbone, its --init, k, its run folder)] of `only` (all: empty)."""
    names = [n.strip() for n in C["only"].split(",") if n.strip()] or list(C["backbones"])
    unknown = [n for n in names if n not in C["backbones"]]
    if unknown:
        raise KeyError(f"only={C['only']!r}: unknown backbone(s) {unknown}; the config has {sorted(C['backbones'])}")
    return [(n, C["backbones"][n], k, Path(C["root"]) / f"{n}_k{float(k):g}") for n in names for k in C["ks"]]


def plan(C, root=None):
    """Per backbone x k: "<run> train" (action all, train) and "<run> eval <benchmark>" (all, eval: if trained)."""
    jobs, launcher = [], None if C["launcher"] == "python" else shlex.split(C["launcher"])
    for name, spec, k, out in selected(C):
        model = out / "model"
        if C["action"] in ("all", "train"):  # other training settings: the run is moved aside, trained again
            argv = [*([C["train_config"]] if C["train_config"] else []), f"--init={spec}", f"--k={float(k)}",
                    f"--out_dir={out}", *C["train_args"]]
            jobs.append(Job(f"{out.name} train", "train_splade.py", argv, launcher=launcher, output=out,
                            done=lambda model=model: (model / "model.safetensors").exists()))
        if C["action"] == "eval" and not C["dry_run"] and not (model / "model.safetensors").exists():
            continue  # the table says "no trained model to evaluate"
        for bench in C["benchmarks"]:
            dest = out / "eval" / bench_dir(bench)
            jobs.append(Job(f"{out.name} eval {bench}", "eval/retrieval.py",
                            ["--model", str(model), "--bench", str(bench), "--out", str(dest), *C["eval_args"]],
                            needs=[f"{out.name} train"] if C["action"] == "all" else [], launcher=launcher,
                            done=lambda dest=dest: manifest.read_json(dest / "metrics.json") is not None, output=dest))
    return jobs


def run_sweep(C):
    """The plan's jobs, run as main runs them before the table."""
    return run_jobs(plan(C), slots=C["jobs"], cwd=ROOT, dry_run=C["dry_run"])


def training_losses(out):
    """(step, loss) pairs of a run's log.jsonl."""
    log = Path(out) / "log.jsonl"
    return [(r["step"], r["loss"]) for r in read_log(log) if "loss" in r] if log.exists() else []


def collect(C, outcome):
    """One row per backbone x k from the files the runs wrote (missing: None), with a failed run's problem."""
    failed = {}
    for job, rc in outcome.failed.items():
        run, what = job.split(" ", 1)
        failed[run] = (f"training exited with {rc}" if what == "train"
                       else f"evaluation on {what.removeprefix('eval ')} exited with {rc}")
    rows = []
    for name, spec, k, out in selected(C):
        trained = (out / "model" / "model.safetensors").exists()
        after = (manifest.read_json(out / "head_norms.json") or {}).get("after", {})
        row = {"backbone": name, "init": spec, "k": float(k),
               "status": failed.get(out.name, "no trained model to evaluate" if C["action"] == "eval" and not trained
                                    else ""),
               "head_frobenius": after.get("frobenius"), "head_row_l2": after.get("mean_row_l2")}
        sparsity = None
        for bench in C["benchmarks"]:
            metrics = manifest.read_json(out / "eval" / bench_dir(bench) / "metrics.json")
            measure, column = headline(bench)
            row[column] = (metrics or {}).get("mean", {}).get(measure)
            if metrics and (sparsity is None or str(bench) == "nanobeir"):
                sparsity = metrics
        row.update({"FLOPS": (sparsity or {}).get("flops"), "q dims": (sparsity or {}).get("mean_query_active_dims"),
                    "d dims": (sparsity or {}).get("mean_doc_active_dims")})
        losses = training_losses(out)
        row["final loss"] = losses[-1][1] if losses else None
        row["status"] = row["status"] or ("done" if trained else "not trained")
        rows.append(row)
    return rows


def report(C, root, outcome):
    """The table (results.md, .csv, .json): per backbone and k, the head norm, each benchmark's number, FLOPS."""
    rows = collect(C, outcome)
    metric_cols = [headline(b)[1] for b in C["benchmarks"]]
    head = ["backbone", "k", "head ‖W‖_F", "head row L2", *metric_cols, "FLOPS", "q dims", "d dims",
            "final loss", "status"]
    table = markdown_table(head, [
        [r["backbone"], f"{r['k']:g}", cell(r["head_frobenius"], ".2f"), cell(r["head_row_l2"], ".4f"),
         *(cell(r[c], ".3f") for c in metric_cols), cell(r["FLOPS"], ".2f"), cell(r["q dims"], ".1f"),
         cell(r["d dims"], ".1f"), cell(r["final loss"], ".4g"), r["status"]] for r in rows])
    return Report(table, rows, plots=lambda: plot(C, rows), csv=rows)


def plot(C, rows):
    """nanobeir_vs_flops.png and loss_curves.png in root (none without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return []
    root, written = Path(C["root"]), []
    by_backbone = {}
    for r in rows:
        by_backbone.setdefault(r["backbone"], []).append(r)

    nano = headline("nanobeir")[1]
    points = [r for r in rows if r.get(nano) is not None and r["FLOPS"] is not None]
    if points:
        fig, ax = plt.subplots(figsize=(7, 5))
        for name, group in by_backbone.items():
            group = sorted((r for r in group if r in points), key=lambda r: r["k"])
            if not group:
                continue
            line, = ax.plot([r["FLOPS"] for r in group], [r[nano] for r in group], "o-", label=name)
            for r in group:
                ax.annotate(f"k={r['k']:g}", (r["FLOPS"], r[nano]), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=line.get_color())
        ax.set_xscale("log")
        ax.set(xlabel="FLOPS (expected multiplications per query-document pair)", ylabel="NanoBEIR nDCG@10",
               title="Effectiveness vs sparsity")
        ax.legend(fontsize=8)
        written.append(save(fig, root / "nanobeir_vs_flops.png", dpi=150))

    curves = {name: [(r["k"], c) for r in group if (c := training_losses(root / f"{name}_k{r['k']:g}"))]
              for name, group in by_backbone.items()}
    curves = {n: cs for n, cs in curves.items() if cs}
    if curves:
        cols = min(4, len(curves))
        rows_ = -(-len(curves) // cols)
        fig, axes = plt.subplots(rows_, cols, figsize=(4 * cols, 3 * rows_), squeeze=False)
        for ax, (name, cs) in zip(axes.flat, curves.items()):
            for k, c in cs:
                ax.plot([s for s, _ in c], [max(v, 1e-6) for _, v in c], label=f"k={k:g}", lw=1)
            ax.set_yscale("log")  # un-rescaled heads start near 1e5: only a log axis shows both
            ax.set(title=name, xlabel="step", ylabel="training loss")
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(curves):]:
            ax.axis("off")
        written.append(save(fig, root / "loss_curves.png", dpi=150))
    return written


def check(C):
    selected(C)
    config = Path(C["train_config"])
    if C["train_config"] and not config.is_absolute() and not config.exists() and (ROOT / config).exists():
        C["train_config"] = str(ROOT / config)  # the jobs run in the repository root


main = Driver(__file__, DEFAULTS, plan, report, check=check, out_key="root",
                actions=("all", "train", "eval", "table")).main


if __name__ == "__main__":
    cli.run_cli(main)
