"""Small-scale reproduction of the SPLADE rescaling paper ("Rescaling the MLM head for neural sparse
retrieval"): a head with a large norm degrades or collapses standard SPLADE training, dividing it by
the right k before the first step fixes that, and dividing a head that is already small hurts.
One command, on a CPU, from local files, with the project's own train_splade.py and eval/retrieval.py:

    python experiments/repro_splade_rescaling.py configs/repro_splade_rescaling.py
    python experiments/repro_splade_rescaling.py configs/repro_splade_rescaling.py --action=table   # collect only

Under out_dir (experiments/splade_protocol.py): pairs.tsv (train_beir's titles as queries, texts as positives),
<condition>_<tied|untied>/ per (head_scale m, k) x tie (train_splade.py, then eval/retrieval.py on eval_beir),
step0/<digest>/ per distinct starting model, results.json, results.md and the plots. Resumable.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

import cli
from checkpoint import read_log
from cli import ConfigError
from experiments import splade_protocol as P
from experiments.runner import ROOT, Driver, Report, pyplot
from eval.plots import save

DEFAULTS = dict(
    out_dir="out/repro_splade",
    # local data (nothing is downloaded)
    init="data/repro/models/splade-tiny",   # a SPLADE / MLM checkpoint folder
    train_beir="data/repro/ir/cacm,data/repro/ir/cisi",  # comma-separated BEIR folders: title -> text
    eval_beir="data/repro/ir/cranfield",    # a BEIR folder with real queries and judgments
    # the conditions
    train_config="configs/repro_splade_train.py",  # train_splade.py recipe shared by every run
    conditions={"original_k1": (1, 1), "large_k1": (16, 1), "large_k16": (16, 16)},  # name -> (m, k)
    untie=[False, True],      # each condition with the tied head and with an untied decoder
    k_bias=False,             # also divide the decoder bias by k (train_splade.py --k_bias)
    train_args=[],            # extra train_splade.py flags for every run, e.g. ["--max_steps=20"]
    # evaluation (eval/retrieval.py)
    eval_max_len=128, eval_query_max_len=64, eval_batch_size=32,
    # execution
    jobs=2,                   # processes at a time; 0: everything in this process, in order
    threads=1,                # OMP_NUM_THREADS of each process
    only="",                  # comma-separated run names to run (default: all); the table shows all
    action="all",             # all | table (collect what exists, run nothing)
)


def runs_of(C):
    """[{name, condition, head_scale, k, untie}] in table order."""
    runs = []
    for name, mk in C["conditions"].items():
        if not (isinstance(mk, (list, tuple)) and len(mk) == 2 and all(isinstance(v, (int, float)) for v in mk)):
            raise ConfigError(f"conditions[{name!r}] = {mk!r}: give (head_scale m, k), e.g. (16, 4)")
        for untie in C["untie"]:
            runs.append(dict(name=f"{name}_{'untied' if untie else 'tied'}", condition=name,
                             head_scale=float(mk[0]), k=float(mk[1]), untie=bool(untie)))
    return runs


def chosen(C):
    """The run names of `only` (all: empty)."""
    return [n.strip() for n in C["only"].split(",") if n.strip()]


def check(C):
    names = [r["name"] for r in runs_of(C)]
    if set(chosen(C)) - set(names):
        raise ConfigError(f"only={C['only']!r}: unknown run(s) {sorted(set(chosen(C)) - set(names))}; the runs are "
                          f"{names}")
    config = Path(C["train_config"])
    C["train_config"] = config.resolve() if config.is_file() else P.local_path(ROOT / config, "train_config")
    C["init"], C["eval_beir"] = P.local_path(C["init"], "init"), P.local_path(C["eval_beir"], "eval_beir")


def plan(C, out):
    """pairs.tsv and the starting models (written here), then the chosen runs' jobs."""
    runs, pairs = runs_of(C), out / "pairs.tsv"
    folders = P.beir_folders(C["train_beir"])
    print(f"{pairs}: {P.write_pairs(folders, pairs)} title -> text pairs from {', '.join(map(str, folders))}")
    step0 = P.prepare_step0(C, runs, out)
    mine = [r for r in runs if not chosen(C) or r["name"] in chosen(C)]
    return P.jobs(C, mine, out, pairs, {r["name"]: step0[r["name"]] for r in mine})


def report(C, out, outcome):
    runs, pairs = runs_of(C), out / "pairs.tsv"
    rows = P.collect(runs, out, P.known_step0(C, runs, out), P.failures(outcome))
    record = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in C.items()},
              "train_recipe": Path(C["train_config"]).read_text(),
              "pairs": len(pairs.read_text().splitlines()) if pairs.exists() else None, "rows": rows}
    return Report("".join(f"## {name}\n\n{text}\n" for name, text in tables(record).items()), record,
                  plots=lambda: plot(rows, out), rows="rows", tables=tables)


def tables(record):
    """{name: markdown} from a results record alone (results.json, or docs/results/'s rows)."""
    head = ["m", "k", "head", "head row L2", "step-0 loss", "loss, first -> last 10 steps", "nDCG@10 step 0 -> 80",
            "R@100 step 0 -> 80", "FLOPS step 0 -> 80", "collapse flag (steps)"]
    cells = []
    for r in record["rows"]:
        b, a = r["before"], r["after"]
        cells.append([f"{r['head_scale']:g}", P.k_text(r), "untied" if r["untied"] else "tied",
                      P.fmt(r["head_row_l2"], ".3f"), P.fmt(r["step0_loss"], ".3f"),
                      P.arrow(r["first_loss"], r["final_loss"], ".3f"),
                      *(P.arrow(b.get(m), a.get(m), ".3f") for m in P.METRICS),
                      P.arrow(b.get("flops"), a.get("flops"), ".1f"),
                      r["collapse"] or "-"])
    return {"rescaling": P.markdown_table(head, cells), "runs": P.table(record["rows"])}


def plot(rows, out):
    """loss_curves.png and ndcg_vs_flops.png in out (none without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return []
    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    color = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(conditions)}
    # conditions can coincide (m = k starts from the control's exact weights): later ones are drawn
    # dashed / smaller on top, so that both stay visible
    style = {c: ("-", "--", "-.", ":")[i % 4] for i, c in enumerate(conditions)}
    size = {c: max(20, 110 - 18 * i) for i, c in enumerate(conditions)}

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True, squeeze=False)
    for ax, untied in zip(axes[0], (False, True)):
        for r in (r for r in rows if r["untied"] == untied):
            log = out / r["run"] / "log.jsonl"
            steps = [x for x in read_log(log) if "loss" in x] if log.exists() else []
            if steps:
                x, y = [s["step"] for s in steps], [s["loss"] for s in steps]
                mean = [sum(y[max(0, i - 9):i + 1]) / len(y[max(0, i - 9):i + 1]) for i in range(len(y))]
                ax.plot(x, y, lw=0.5, alpha=0.25, color=color[r["condition"]])
                ax.plot(x, mean, lw=1.6, ls=style[r["condition"]], color=color[r["condition"]],
                        label=f"{r['condition']} (m={r['head_scale']:g}, k={P.k_text(r)})")
        ax.set_yscale("log")  # a 16x head starts an order of magnitude above the control
        ax.set(title=f"{'untied decoder' if untied else 'tied head'} (faint: each step; line: 10-step mean)",
               xlabel="step", ylabel="training loss")
        ax.legend(fontsize=7)
    written = [save(fig, out / "loss_curves.png", dpi=130)]

    fig, ax = plt.subplots(figsize=(7, 5))
    for r in rows:
        b, a, c = r["before"], r["after"], r["condition"]
        marker = "s" if r["untied"] else "o"
        if a.get("flops") is not None:
            ax.scatter(a["flops"], a["nDCG@10"], marker=marker, color=color[c], zorder=3, s=size[c],
                       edgecolors="white", linewidths=0.5, label=f"{c}, {'untied' if r['untied'] else 'tied'}")
        if b.get("flops") is not None:
            ax.scatter(b["flops"], b["nDCG@10"], marker=marker, facecolors="none", edgecolors=color[c], s=size[c])
            if a.get("flops") is not None:
                ax.annotate("", (a["flops"], a["nDCG@10"]), (b["flops"], b["nDCG@10"]),
                            arrowprops=dict(arrowstyle="->", color=color[c], lw=0.7, alpha=0.6))
    ax.set_xscale("log")
    ax.set(xlabel="FLOPS on Cranfield (expected multiplications per query-document pair)",
           ylabel="Cranfield nDCG@10", title="Effectiveness vs sparsity: step 0 (hollow) -> trained (filled)")
    ax.legend(fontsize=7)
    return [*written, save(fig, out / "ndcg_vs_flops.png", dpi=130)]


main = Driver(__file__, DEFAULTS, plan, report, check=check).main


if __name__ == "__main__":
    cli.run_cli(main)
