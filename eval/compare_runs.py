"""Compare train_lm.py runs the way the SimReg paper does: how many steps (and tokens) each run needs
to first reach a target validation loss, and how much sooner than the baseline (the first run).

    python eval/compare_runs.py out/base out/simreg [--target 3.2] [--plot curves.png] [--json result.json]
    python -m eval.compare_runs out/base/log.jsonl out/simreg/log.jsonl --json      # JSON on stdout

The target defaults to the baseline's final val_loss ("SimReg reaches the baseline's final loss with
31.8 % fewer steps", the paper's ">30 % fewer steps", §5). val_loss is measured every eval_interval
steps, so the crossing is interpolated linearly between the two evaluations that bracket it (marked
in the output). Train curves use the logged cross-entropy `ce`: a SimReg run's `loss` also holds
lambda * R. Also reported: final and best val_loss, the last train CE and the last inter-class angle
(the paper's 61.3 -> 74 deg). `--plot` draws train CE (EMA) and val loss against steps and tokens
(needs matplotlib, an optional extra).
"""
import argparse
import bisect
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

from eval.plots import MatplotlibMissing, pyplot, save
from checkpoint import read_log
from cli import ConfigError
from data.atomic import write_json

INTERPOLATION = "linear in val_loss between the two evaluations that bracket the target"


@dataclass
class Run:
    name: str
    log_path: Path
    train: list = field(default_factory=list)   # (step, train CE), sorted by step
    evals: list = field(default_factory=list)   # records with a finite val_loss, sorted by step
    tokens: list = field(default_factory=list)  # (step, tokens seen), from the training records


def load_run(path, name=None) -> Run:
    """A train_lm.py out_dir (or its log.jsonl) as training and evaluation series."""
    path = Path(path)
    log = path / "log.jsonl" if path.is_dir() else path
    if not log.is_file():
        raise FileNotFoundError(f"{path}: no log.jsonl found; give a train_lm.py out_dir or the path of its log.jsonl")
    records = [r for r in read_log(log) if "step" in r]
    loss_key = "ce" if any("ce" in r for r in records) else "loss"
    # a repeated step (rare after a resume): the last one wins
    train = {r["step"]: float(r[loss_key]) for r in records if loss_key in r}
    tokens = {r["step"]: r["tokens"] for r in records if "tokens" in r}
    evals = {r["step"]: r for r in records if "val_loss" in r and math.isfinite(r["val_loss"])}
    if not train and not evals:
        raise ConfigError(f"{log}: no '{loss_key}' and no 'val_loss' records; give the log.jsonl of a train_lm.py run")
    name = name or (log.parent.name if log.name == "log.jsonl" else log.stem)
    return Run(name, log, sorted(train.items()), [evals[s] for s in sorted(evals)], sorted(tokens.items()))


def tokens_at(run: Run, step):
    """Tokens seen after `step` (fractional steps too), linear between logged points; None if never logged."""
    if not run.tokens:
        return None
    steps, toks = [0, *(s for s, _ in run.tokens)], [0, *(t for _, t in run.tokens)]
    i = min(max(bisect.bisect_left(steps, step), 1), len(steps) - 1)
    s0, s1, t0, t1 = steps[i - 1], steps[i], toks[i - 1], toks[i]
    return t0 + (t1 - t0) * (step - s0) / (s1 - s0) if s1 != s0 else t1


def first_reach(evals, target):
    """(step, interpolated, bracket) where the val_loss curve first gets to `target` or below, or None.
    Between evaluations (s0, v0 > target) and (s1, v1 <= target) the crossing is
    s0 + (v0 - target) / (v0 - v1) * (s1 - s0). When the first evaluation is already at or below the
    target, its step is an upper bound: the bracket's lower end is None."""
    prev = None
    for r in evals:
        s1, v1 = r["step"], r["val_loss"]
        if v1 <= target:
            if prev is None:
                return s1, False, (None, s1)
            s0, v0 = prev["step"], prev["val_loss"]
            if v1 == target:
                return s1, False, (s0, s1)
            return s0 + (v0 - target) / (v0 - v1) * (s1 - s0), True, (s0, s1)
        prev = r
    return None


def speedup_pct(base, other):
    """'% fewer' of `other` relative to `base` (positive = other needs less)."""
    return None if base is None or other is None or base <= 0 else 100.0 * (1.0 - other / base)


def summarize(run: Run, target, base_summary=None) -> dict:
    last = run.evals[-1] if run.evals else {}
    best = min(run.evals, key=lambda r: r["val_loss"]) if run.evals else {}
    angle = next((r for r in reversed(run.evals) if "interclass_angle" in r), {})
    out = dict(name=run.name, log=str(run.log_path),
               final_step=max([s for s, _ in run.train] + [r["step"] for r in run.evals]),
               final_val_loss=last.get("val_loss"), final_val_step=last.get("step"),
               best_val_loss=best.get("val_loss"), best_val_step=best.get("step"),
               final_train_ce=run.train[-1][1] if run.train else None,
               interclass_angle=angle.get("interclass_angle"), angle_classes=angle.get("angle_classes"),
               angle_step=angle.get("step"),
               reached=False, steps_to_target=None, tokens_to_target=None, interpolated=None, bracket=None)
    hit = first_reach(run.evals, target) if target is not None else None
    if hit:
        step, interpolated, bracket = hit
        out.update(reached=True, steps_to_target=step, tokens_to_target=tokens_at(run, step),
                   interpolated=interpolated, bracket=list(bracket))
    if base_summary is not None:
        out["fewer_steps_pct"] = speedup_pct(base_summary["steps_to_target"], out["steps_to_target"])
        out["fewer_tokens_pct"] = speedup_pct(base_summary["tokens_to_target"], out["tokens_to_target"])
    return out


def compare(runs: list, target=None) -> dict:
    """The comparison as a JSON-able dict; runs[0] is the baseline."""
    base, source = runs[0], "--target"
    if target is None:
        if not base.evals:
            raise ConfigError(f"baseline {base.name} ({base.log_path}) has no val_loss records to take the target "
                              "from (it ran with eval_interval=0?); pass --target, or train it with eval_interval > 0")
        target, source = base.evals[-1]["val_loss"], f"final val_loss of the baseline {base.name}"
    base_summary = summarize(base, target)
    return dict(target=target, target_source=source, baseline=base.name, interpolation=INTERPOLATION,
                runs=[base_summary] + [summarize(r, target, base_summary) for r in runs[1:]])


# ---------------- Output
def _num(x, fmt):
    return "-" if x is None else format(x, fmt)


def human(n):
    if n is None:
        return "-"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def format_table(result: dict) -> str:
    rows = [("run", "final step", "final val", "best val (step)", "train CE", "angle deg",
             "steps to target", "tokens to target", "fewer steps")]
    for r in result["runs"]:
        pct = r.get("fewer_steps_pct")
        fewer = "baseline" if "fewer_steps_pct" not in r else "-" if pct is None else f"{pct:+.1f} %"
        steps = f"{r['steps_to_target']:,.0f}{'*' if r['interpolated'] else ''}" if r["reached"] else "not reached"
        rows.append((r["name"], f"{r['final_step']:,}", _num(r["final_val_loss"], ".4f"),
                     f"{_num(r['best_val_loss'], '.4f')} ({_num(r['best_val_step'], ',')})",
                     _num(r["final_train_ce"], ".4f"), _num(r["interclass_angle"], ".1f"), steps,
                     human(r["tokens_to_target"]) if r["reached"] else "-", fewer))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([f"target val_loss {result['target']:.4f} ({result['target_source']})", "", *lines, "",
                      f"* interpolated: {INTERPOLATION}", "", *headline_sentences(result)])


def _fewer(pct):
    return f"{abs(pct):.1f} % {'fewer' if pct >= 0 else 'more'}"


def headline_sentences(result: dict) -> list:
    base = result["runs"][0]
    what = "the baseline's final loss" if result["target_source"] != "--target" else f"val_loss {result['target']:.4f}"
    out = []
    if not base["reached"]:
        out.append(f"The baseline {base['name']} never reaches {what} (best {_num(base['best_val_loss'], '.4f')}), "
                   "so there is no speed-up to report.")
    for r in result["runs"][1:]:
        if not r["reached"]:
            out.append(f"{r['name']} does not reach {what} in {r['final_step']:,} steps "
                       f"(best val_loss {_num(r['best_val_loss'], '.4f')} at step {_num(r['best_val_step'], ',')}).")
        elif r["fewer_steps_pct"] is not None:
            tok = "" if r["fewer_tokens_pct"] is None else f", {_fewer(r['fewer_tokens_pct'])} tokens"
            out.append(f"{r['name']} reaches {what} with {_fewer(r['fewer_steps_pct'])} steps "
                       f"({r['steps_to_target']:,.0f} vs {base['steps_to_target']:,.0f}{tok}).")
    return out


def ema(values, alpha):
    """Exponential moving average with bias correction (TensorBoard-style smoothing)."""
    out, m = [], 0.0
    for i, v in enumerate(values, 1):
        m = alpha * m + (1 - alpha) * v
        out.append(m / (1 - alpha ** i))
    return out


def plot_curves(runs: list, path, target=None, smooth=0.9):
    """Train CE (smoothed) and val loss against steps and tokens, one colour per run."""
    plt = pyplot("the loss-curve plot")
    axes_x = ("steps", "tokens") if all(r.tokens for r in runs) else ("steps",)
    fig, axes = plt.subplots(1, len(axes_x), figsize=(6.5 * len(axes_x), 4.5), squeeze=False)
    for ax, axis in zip(axes[0], axes_x):
        for i, run in enumerate(runs):
            x = (lambda s: s) if axis == "steps" else (lambda s, run=run: tokens_at(run, s))
            if run.train:
                ax.plot([x(s) for s, _ in run.train], ema([v for _, v in run.train], smooth), color=f"C{i}",
                        alpha=0.6, lw=1, label=f"{run.name} train CE (EMA {smooth})")
            if run.evals:
                ax.plot([x(r["step"]) for r in run.evals], [r["val_loss"] for r in run.evals], "o-", color=f"C{i}",
                        ms=3, lw=1.5, label=f"{run.name} val")
            hit = first_reach(run.evals, target) if target is not None else None
            if hit:  # where the run first reaches the target
                ax.plot([x(hit[0])], [target], "x", color=f"C{i}", ms=9, mew=2)
        if target is not None:
            ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:.4f}")
        ax.set(xlabel=axis, ylabel="loss (cross-entropy)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save(fig, path, dpi=130)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="train_lm.py out_dirs (or log.jsonl files); the first is the baseline")
    ap.add_argument("--names", help="comma-separated display names (default: the folder names)")
    ap.add_argument("--target", type=float, help="target val_loss (default: the baseline's final val_loss)")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="write the comparison as JSON to PATH; without PATH, print JSON instead of the table")
    ap.add_argument("--plot", metavar="PNG", help="save loss curves here (needs matplotlib)")
    ap.add_argument("--smooth", type=float, default=0.9, help="EMA factor for the train curve in the plot")
    args = ap.parse_args(argv)
    names = args.names.split(",") if args.names else [None] * len(args.runs)
    if len(names) != len(args.runs):
        ap.error(f"--names has {len(names)} names for {len(args.runs)} runs")
    runs = [load_run(p, n) for p, n in zip(args.runs, names)]
    seen = {}
    for r in runs:  # two folders both called "out" would be indistinguishable in the table
        seen[r.name] = seen.get(r.name, 0) + 1
        if seen[r.name] > 1:
            r.name = f"{r.name}#{seen[r.name]}"
    result = compare(runs, args.target)
    print(json.dumps(result, indent=2) if args.json == "-" else format_table(result))
    if args.json and args.json != "-":
        write_json(args.json, result, indent=2)
    if args.plot:
        try:
            print(f"plot: {plot_curves(runs, args.plot, result['target'], args.smooth)}", file=sys.stderr)
        except MatplotlibMissing as e:
            print(f"plot skipped: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from cli import run_cli
    sys.exit(run_cli(main))
