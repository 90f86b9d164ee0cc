"""The SimReg paper's experiment at CPU scale, as one driver around train_lm.py: a tiny LLaMA on one
plain-text file (a byte-level BPE trained on its training part, data/text_corpus.py), in two modes.

    # λ calibration: widths x λ x seeds; the best λ per width, and c in λ = c·√d
    python experiments/simreg_sweep.py configs/repro_simreg_lambda.py
    # the paper's comparison: baseline vs SimReg chunked and full, seeds, steps to the baseline's loss
    python experiments/simreg_sweep.py configs/repro_simreg.py
    python experiments/simreg_sweep.py configs/repro_simreg.py --action=table    # collect only
    python experiments/simreg_sweep.py configs/repro_simreg.py --dry_run         # print the commands

Under root: data/, runs/<name>/ (a train_lm.py out_dir), results.json, results.md and the plot. Every run
sees the same tokens in the same order (seeds change the initialisation only), seed by seed.
mode=lambda: per width d and λ (0: the baseline) the final validation loss over seeds, the best λ of a
width (best_lambda) and c of λ* = c·√d beside the free slope α (fit_sqrt_law); lambda_sweep.png.
mode=compare (the paper's §5): per condition and seed, the steps to reach the same seed's baseline final
loss, the median step time against that baseline's (run side by side), the inter-class angle; val_curves.png.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

import json
import math
import statistics
import time
from types import SimpleNamespace

import cli
import train_lm
from checkpoint import read_log
from cli import ConfigError
from data import manifest
from data.atomic import write_json
from data.text_corpus import prepare_text_corpus
from eval.compare_runs import Run, compare, load_run
from eval.plots import save
from experiments.runner import Driver, Job, Report, cell, markdown_table, pyplot

ROOT = Path(__file__).resolve().parents[1]

DEFAULTS = dict(
    mode="lambda",            # lambda: λ sweep over widths | compare: baseline vs SimReg chunked/full
    root="out/repro_simreg",
    text="data/sample/tinyshakespeare.txt",  # the plain-text corpus (the shipped sample by default)
    vocab_size=2048,          # BPE vocabulary (a multiple of 128: the LM head's matmul stays aligned)
    val_fraction=0.1,         # the last 10 % of the characters (whole paragraphs) for validation
    train_config="configs/repro_simreg_lm.py",  # train_lm.py settings shared by every run
    train_args=[],            # extra train_lm.py flags for every run, e.g. ["--max_steps=600"]
    seeds=[0, 1, 2],
    head_dim=32,              # n_heads = d_model // head_dim; d_ff = 8/3·d_model rounded to a multiple of 4
    # mode=lambda
    widths=[64, 128, 256],
    lambdas=[0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0],   # 0 = SimReg off (the baseline of that width)
    # mode=compare
    d_model=128,
    conditions={"baseline": {"simreg": False},
                "simreg_chunked": {"simreg": True, "simreg_chunk": 32},
                "simreg_full": {"simreg": True, "simreg_chunk": 0}},   # λ: train_lm.py's default unless given here
    # running
    parallel=2,               # training processes at once; 0 = in this process, one after the other
    threads=1,                # OMP_NUM_THREADS of each process: tiny models run fastest on one thread
    action="all",             # all | table (collect what exists)
    dry_run=False,
)


def width_args(C, d):
    """train_lm.py model flags of width d: fixed head size, SwiGLU hidden 8/3·d (LLaMA's ratio)."""
    if d % C["head_dim"]:
        raise ConfigError(f"width {d} is not a multiple of head_dim={C['head_dim']}")
    return {"d_model": d, "n_heads": d // C["head_dim"], "d_ff": 4 * round(8 * d / 3 / 4)}


def planned_runs(C):
    """[(name, facts, train_lm overrides)] in launch order: seed by seed."""
    if C["mode"] not in MODES:
        raise ConfigError(f"mode={C['mode']!r}: use 'lambda' or 'compare'")
    runs = []
    for seed in C["seeds"]:
        if C["mode"] == "lambda":
            for d in sorted(C["widths"], reverse=True):   # the slowest first: the two slots finish together
                for lam in map(float, C["lambdas"]):
                    over = {**width_args(C, d), "seed": seed, "simreg": lam > 0,
                            **({"simreg_lambda": lam} if lam > 0 else {})}
                    runs.append((f"d{d}_lam{lam:g}_s{seed}", {"width": d, "lambda": lam, "seed": seed}, over))
        else:
            for cond, extra in C["conditions"].items():
                over = {**width_args(C, C["d_model"]), "seed": seed, **extra}
                runs.append((f"{cond}_s{seed}", {"condition": cond, "width": C["d_model"], "seed": seed}, over))
    return runs


def check(C):
    """The runs, and validation losses to compare them by, before anything runs."""
    planned_runs(C)
    if not cli.parse_config(train_lm.SETTINGS, [str(ROOT / C["train_config"]), *C["train_args"]])["eval_interval"]:
        raise ConfigError("train_args: eval_interval=0 leaves the runs without the validation losses this sweep "
                          "compares; drop it, or give eval_interval > 0")


def plan(C, root):
    """The prepared corpus (its end held out, paragraphs kept whole; the delimiter its one special token), then
    one train_lm.py run per planned run (its result.json marks it collected)."""
    corpus, jobs, t_start = prepare_text_corpus(Path(C["text"]).resolve(), root / "data", C["vocab_size"],
                                                val_fraction=C["val_fraction"]), [], time.time()
    data = {"train_shards": corpus["train_shards"], "val_shards": corpus["val_shards"],
            "vocab_size": corpus["vocab_size"], "eos_id": corpus["delimiter_id"], "tokenizer": corpus["tokenizer"]}
    for name, facts, over in planned_runs(C):
        out = root / "runs" / name

        def collected(seconds, out=out, facts=facts):
            result = collect_run(C, out, facts, seconds)
            write_json(out / "result.json", result)
            print(f"  {out.name}: final val_loss {result['final_val_loss']:.4f} "
                  f"({time.time() - t_start:.0f} s since start)", flush=True)
        argv = [str(ROOT / C["train_config"]), *(f"--{k}={v}" for k, v in {**data, **over, "out_dir": out}.items()),
                *C["train_args"]]
        jobs.append(Job(name, "train_lm.py", argv, log=out / "stdout.txt", on_success=collected, output=out,
                        done=lambda out=out: manifest.read_json(out / "result.json") is not None))
    return jobs


def step_time(records, config):
    """Median seconds per optimizer step over train_lm.py's logging windows, leaving out the first (the warm-up)
    and any right after an evaluation (it may hold the evaluation's time); None when none is left."""
    tokens_per_step = config["batch_size"] * config["seq_len"] * config["grad_accum"]
    evals = {r["step"] for r in records if "val_loss" in r}
    train = [r for r in records if "tokens_per_s" in r]
    clean = [r for r in train[1:] if r["step"] - config["log_interval"] not in evals
             and r["step"] % config["log_interval"] == 0]
    return statistics.median(tokens_per_step / r["tokens_per_s"] for r in clean) if clean else None


def collect_run(C, out, facts, seconds):
    """result.json of a finished run: its facts, final/best val loss, angle, step time, and how large λ·R
    was next to the cross-entropy (the largest share, early when R is large, and at the end)."""
    config = json.loads((out / "config.json").read_text())
    run = load_run(out)
    summary = compare([run])["runs"][0]
    records = read_log(out / "log.jsonl")
    simreg = config.get("simreg")
    lam = float(train_lm.simreg_lambda(config, SimpleNamespace(d_model=config["d_model"]))) if simreg else 0.0
    shares = [lam * r["simreg"] / r["ce"] for r in records if "simreg" in r and r.get("ce")]
    return {**facts, "name": out.name, "lambda_used": lam, "simreg_chunk": config.get("simreg_chunk"),
            **{k: summary[k] for k in ("final_val_loss", "best_val_loss", "final_step", "final_train_ce",
                                       "interclass_angle")},
            "val_curve": [[r["step"], r["val_loss"]] for r in run.evals],
            "step_time_s": step_time(records, config), "wall_s": round(seconds, 1),
            "max_lambda_r_over_ce": max(shares, default=None),
            "final_lambda_r_over_ce": shares[-1] if shares else None}


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def best_lambda(lams, losses):
    """(λ*, bracketed): the vertex of the parabola in log λ through the lowest loss and its two
    neighbours on the grid (λ > 0 only), or the grid point itself when it is an end of the grid or
    the three points do not curve upwards."""
    pts = sorted((l, v) for l, v in zip(lams, losses) if l > 0 and v is not None)
    if not pts:
        return None, False
    i = min(range(len(pts)), key=lambda k: pts[k][1])
    if i == 0 or i == len(pts) - 1:
        return pts[i][0], False
    (x0, y0), (x1, y1), (x2, y2) = [(math.log(l), v) for l, v in pts[i - 1:i + 2]]
    # the parabola through three points: y = a·x² + b·x + c, vertex at -b / 2a
    denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / denom
    if a <= 0:
        return pts[i][0], True
    return math.exp(min(max(-b / (2 * a), x0), x2)), True


def fit_sqrt_law(best):
    """c of λ* = c·√d (least squares in log λ, slope fixed at ½) and the free slope α of
    log λ* = a + α·log d; best = {d: λ*}."""
    ds = sorted(d for d, lam in best.items() if lam)
    if not ds:
        return None, None
    c = math.exp(statistics.fmean(math.log(best[d]) - 0.5 * math.log(d) for d in ds))
    if len(ds) < 2:
        return c, None
    xs, ys = [math.log(d) for d in ds], [math.log(best[d]) for d in ds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    alpha = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return c, alpha


def lambda_table(C, results):
    """mode=lambda: a row per width and λ, the best λ per width and the fit of c."""
    rows, best, per_seed_best = [], {}, {}
    for d in sorted(C["widths"]):
        mine, means = [r for r in results if r["width"] == d], {}
        base = mean_std([r["final_val_loss"] for r in mine if r["lambda"] == 0])[0]
        for lam in sorted(C["lambdas"]):
            runs = [r for r in mine if r["lambda"] == lam]
            m, s = mean_std([r["final_val_loss"] for r in runs])
            means[lam] = m
            rows.append({"width": d, "lambda": lam, "n": len(runs), "mean": m, "std": s,
                         "delta_vs_baseline": None if m is None or base is None else m - base,
                         "seeds": {str(r["seed"]): r["final_val_loss"] for r in runs},
                         "angle": mean_std([r["interclass_angle"] for r in runs])[0],
                         "max_lambda_r_over_ce": mean_std([r["max_lambda_r_over_ce"] for r in runs])[0]})
        lam_star, bracketed = best_lambda(list(means), list(means.values()))
        # the λ whose mean is within one seed-std of the best mean: how flat the optimum is
        pos = [r for r in rows if r["width"] == d and r["lambda"] > 0 and r["mean"] is not None]
        top = min(pos, key=lambda r: r["mean"]) if pos else None
        near = [r["lambda"] for r in pos if r["mean"] <= top["mean"] + top["std"]] if top else []
        best[d] = {"lambda": lam_star, "bracketed": bracketed,
                   "lambda_over_sqrt_d": None if lam_star is None else lam_star / math.sqrt(d),
                   "within_one_std": [min(near), max(near)] if near else None}
        for seed in C["seeds"]:
            vals = {r["lambda"]: r["final_val_loss"] for r in mine if r["seed"] == seed}
            per_seed_best.setdefault(str(seed), {})[d] = best_lambda(list(vals), list(vals.values()))[0]
    c, alpha = fit_sqrt_law({d: b["lambda"] for d, b in best.items()})
    seeds = {s: dict(zip(("c", "alpha"), fit_sqrt_law(b)), best=b) for s, b in per_seed_best.items()}
    return {"rows": rows, "best": best, "c": c, "alpha": alpha, "per_seed": seeds,
            "fit": "λ*_d: vertex of a parabola in log λ through the best mean final val loss and its grid "
                   "neighbours; c: least squares of log λ*_d = log c + ½·log d; alpha: free slope of log λ* on log d"}


def lambda_markdown(res):
    grid = markdown_table(
        ["width d", "λ", "seeds", "final val loss (mean ± std)", "vs baseline", "angle °", "max λ·R/CE"],
        [[str(r["width"]), "0 (baseline)" if r["lambda"] == 0 else f"{r['lambda']:g}", str(r["n"]),
          f"{cell(r['mean'], '.4f')} ± {cell(r['std'], '.4f')}", cell(r["delta_vs_baseline"], "+.4f"),
          cell(r["angle"], ".1f"), cell(r["max_lambda_r_over_ce"], ".3f")] for r in res["rows"]])
    best = markdown_table(["width d", "best λ", "bracketed", "λ*/√d", "λ within one std of the best"], [
        [str(d), cell(b["lambda"], ".3g"), "-" if b["lambda"] is None else "yes" if b["bracketed"] else "no (grid end)",
         cell(b["lambda_over_sqrt_d"], ".3f"),
         "-" if not b["within_one_std"] else "{:g} – {:g}".format(*b["within_one_std"])]
        for d, b in res["best"].items()])
    fit = [f"c (λ = c·√d) = {cell(res['c'], '.3f')}; free fit λ* ∝ d^α: α = {cell(res['alpha'], '.2f')}",
           "per seed: " + "; ".join(f"seed {s}: c {cell(v['c'], '.3f')}, α {cell(v['alpha'], '.2f')}"
                                    for s, v in res["per_seed"].items()),
           "", res["fit"]]
    return grid + "\n" + best + "\n" + "\n".join(fit) + "\n"


def compare_table(C, results):
    """mode=compare: per condition, mean ± std over seeds of each seed's numbers against its baseline's."""
    names = list(C["conditions"])
    per = {n: [] for n in names}
    for seed in C["seeds"]:
        by_cond = {r["condition"]: r for r in results if r["seed"] == seed}
        if names[0] not in by_cond:
            continue
        base, others = by_cond[names[0]], [n for n in names if n in by_cond]
        cmp = compare([Run(by_cond[n]["name"], Path(by_cond[n]["name"]), [],   # target: this seed's baseline
                           [{"step": s, "val_loss": v} for s, v in by_cond[n]["val_curve"]], []) for n in others])
        for n, s in zip(others, cmp["runs"]):
            r = by_cond[n]
            per[n].append({"seed": seed, "target": cmp["target"], "final_val_loss": r["final_val_loss"],
                           "reached": s["reached"], "steps_to_target": s["steps_to_target"],
                           "fewer_steps_pct": s.get("fewer_steps_pct"), "step_time_s": r["step_time_s"],
                           "overhead_pct": 100.0 * (r["step_time_s"] / base["step_time_s"] - 1)
                           if r["step_time_s"] and base["step_time_s"] else None,
                           "interclass_angle": r["interclass_angle"],
                           "lambda_used": r["lambda_used"], "simreg_chunk": r["simreg_chunk"]})
    rows = []
    for n, seeds in per.items():
        ms = {k: mean_std([s[k] for s in seeds]) for k in ("final_val_loss", "steps_to_target", "fewer_steps_pct",
                                                           "step_time_s", "overhead_pct", "interclass_angle")}
        ms["step_time_ms"] = tuple(None if v is None else 1000 * v for v in ms.pop("step_time_s"))
        rows.append({"condition": n, "n": len(seeds), "reached": sum(s["reached"] for s in seeds),
                     "lambda": seeds[0]["lambda_used"] if seeds else None, **ms, "seeds": seeds})
    return {"rows": rows, "baseline": names[0],
            "target": "per seed: that seed's baseline final val loss (same data order and initialisation)",
            "step_time": "median over logging windows without an evaluation; overhead against the same seed's "
                         "baseline"}


def compare_markdown(res):
    def pm(pair, spec):
        m, s = pair
        return "-" if m is None else f"{format(m, spec)} ± {format(s, spec)}"
    head = ["condition", "λ", "seeds", "final val loss", "steps to baseline's final loss", "fewer steps %",
            "ms/step", "overhead %", "inter-class angle °"]
    rows = [[r["condition"], cell(r["lambda"], ".3g"), str(r["n"]), pm(r["final_val_loss"], ".4f"),
             f"{pm(r['steps_to_target'], '.0f')} ({r['reached']}/{r['n']} reached)", pm(r["fewer_steps_pct"], ".1f"),
             pm(r["step_time_ms"], ".1f"), pm(r["overhead_pct"], ".1f"), pm(r["interclass_angle"], ".1f")]
            for r in res["rows"]]
    return markdown_table(head, rows) + f"\ntarget: {res['target']}; step time: {res['step_time']}\n"


def plot_lambda(C, results, res, root):
    """Final val loss vs λ per width (mean ± std over seeds; the baseline as a dashed line, since λ = 0
    has no place on a log axis), and the same as a difference to each width's baseline."""
    plt = pyplot()
    if plt is None:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, d in enumerate(sorted(C["widths"])):
        rows = [r for r in res["rows"] if r["width"] == d and r["mean"] is not None]
        base = next((r for r in rows if r["lambda"] == 0), None)
        pos = [r for r in rows if r["lambda"] > 0]
        for ax, key in zip(axes, ("mean", "delta_vs_baseline")):
            if not pos or pos[0][key] is None:
                continue
            ax.errorbar([r["lambda"] for r in pos], [r[key] for r in pos], yerr=[r["std"] for r in pos],
                        fmt="o-", color=f"C{i}", capsize=3, label=f"d = {d}")
            if base is not None:
                ax.axhline(base[key], color=f"C{i}", ls="--", lw=1)
            if res["best"][d]["lambda"]:
                ax.axvline(res["best"][d]["lambda"], color=f"C{i}", ls=":", lw=1)
    axes[0].set(xscale="log", xlabel="λ", ylabel="final validation loss", title="final val loss (dashed: λ = 0)")
    axes[1].set(xscale="log", xlabel="λ", ylabel="minus the baseline of the same width",
                title=f"vs baseline; dotted: best λ (c = {cell(res['c'], '.3f')} in λ = c·√d)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return [save(fig, root / "lambda_sweep.png", dpi=130)]


def plot_compare(C, results, res, root):
    """Validation loss per condition: mean over seeds, band from the lowest to the highest seed."""
    plt = pyplot()
    if plt is None:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, cond in enumerate(C["conditions"]):
        curves = [dict(r["val_curve"]) for r in results if r["condition"] == cond]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if not steps:
            continue
        vals = [[c[s] for c in curves] for s in steps]
        ax.plot(steps, [statistics.fmean(v) for v in vals], color=f"C{i}", label=f"{cond} ({len(curves)} seeds)")
        ax.fill_between(steps, [min(v) for v in vals], [max(v) for v in vals], color=f"C{i}", alpha=0.2)
    targets = [s["target"] for r in res["rows"] for s in r["seeds"] if r["condition"] == res["baseline"]]
    if targets:
        ax.axhline(statistics.fmean(targets), color="gray", ls="--", lw=1, label="baseline final (mean)")
    ax.set(xlabel="step", ylabel="validation loss", title="validation loss, mean and min-max over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return [save(fig, root / "val_curves.png", dpi=130)]


# mode -> (its summary of the results, that summary's table, its plot)
MODES = {"lambda": (lambda_table, lambda_markdown, plot_lambda),
         "compare": (compare_table, compare_markdown, plot_compare)}


def report(C, root, outcome):
    failed = {name: f"train_lm.py exited with {rc} (see {root / 'runs' / name / 'stdout.txt'})"
              for name, rc in outcome.failed.items()}
    found = {name: manifest.read_json(root / "runs" / name / "result.json") for name, _, _ in planned_runs(C)}
    results = [r for r in found.values() if r is not None]   # unreadable = not there
    missing = [name for name, r in found.items() if r is None]
    settings = {k: C[k] for k in ("mode", "widths", "lambdas", "seeds", "d_model", "conditions", "train_args")}
    res = MODES[C["mode"]][0](settings, results)
    plots = (lambda: MODES[C["mode"]][2](C, results, res, root)) if results else None
    res.update(mode=C["mode"], missing=missing, failed=failed, runs=results, settings=settings)
    if missing:
        print(f"{len(missing)} run(s) without results yet: {', '.join(missing[:6])}{' ...' * (len(missing) > 6)}")
    return Report("".join(tables(res).values()), res, plots=plots, rows="runs", tables=tables)


def tables(record):
    """{name: markdown} from a results record alone (results.json, or docs/results/'s rows)."""
    summary, markdown, _ = MODES[record["settings"]["mode"]]
    return {record["settings"]["mode"]: markdown(summary(record["settings"], record["runs"]))}


main = Driver(__file__, DEFAULTS, plan, report, check=check, out_key="root", slots_key="parallel").main


if __name__ == "__main__":
    cli.run_cli(main)
