"""Small-scale reproduction of the SPLADE rescaling paper ("Rescaling the MLM head for neural sparse
retrieval"): a head with a large norm degrades or collapses standard SPLADE training, dividing it by
the right k before the first step fixes that, and dividing a head that is already small hurts.
One command, on a CPU, from local files, with the project's own train_splade.py and
eval/retrieval.py:

    python experiments/repro_splade_rescaling.py configs/repro_splade_rescaling.py
    python experiments/repro_splade_rescaling.py configs/repro_splade_rescaling.py --out_dir=out/repro_splade \
        --init=../shared/data/models/splade-tiny --eval_beir=../shared/data/ir/cranfield \
        --train_beir=../shared/data/ir/cacm,../shared/data/ir/cisi
    python experiments/repro_splade_rescaling.py configs/repro_splade_rescaling.py --action=table   # collect only

What it does, all under out_dir:
1. pairs.tsv: pseudo-query pairs from the BEIR corpora of train_beir - each document's title as
   the query, its text as the positive (documents without a title or a text, or whose text is
   just the title, are skipped); train_splade.py reads it with n_negatives=0 (in-batch negatives).
2. per condition (head_scale m, k) x (tied, untied decoder), a run <condition>_<tied|untied>/:
   train_splade.py with train_config and --head_scale, --k, --untie_head (log.jsonl with a
   `collapse` field every step, head_norms.json, model/), then eval/retrieval.py on eval_beir
   (eval/metrics.json). Every run has the same seed, data order and steps.
3. step0/<digest>/: the model each run starts from - the backbone untied, scaled and rescaled
   by train_splade.rescale_backbone, the function the training run calls - saved and evaluated the
   same way. Runs whose starting weights are identical (m/k = 1 is exact for powers of two)
   share one evaluation; <digest> is a hash of the weights.
4. results.json (config, rows, wall time), results.md (the table), loss_curves.png and
   ndcg_vs_flops.png (matplotlib, optional: the table is complete without it).

Resuming: a finished stage is skipped (a run with model/, an evaluation with metrics.json, each
made by the same command from the same inputs: its job.json stamp, experiments/runner.py) and
train_splade.py resumes a killed run from its last checkpoint, so the same command continues.
A failed run (non-finite losses, a collapse stop) is reported in the table and the rest goes on.
jobs=N runs N processes at a time, each with `threads` intra-op threads (OMP_NUM_THREADS);
jobs=0 runs everything inside this process, one after the other (the tests do that).
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

import hashlib
import json
import math
import os
import time

from data import stamp as stamps
from data.atomic import write_json, write_text
from eval.plots import pyplot_or_say, save
import cli
from checkpoint import read_log
from cli import ConfigError
from experiments.runner import Job, cell, markdown_table, run_jobs

ROOT = Path(__file__).resolve().parents[1]

DEFAULTS = dict(
    out_dir="out/repro_splade",
    # local data (nothing is downloaded)
    init="../shared/data/models/splade-tiny",   # a SPLADE / MLM checkpoint folder
    train_beir="../shared/data/ir/cacm,../shared/data/ir/cisi",  # comma-separated BEIR folders: title -> text
    eval_beir="../shared/data/ir/cranfield",    # a BEIR folder with real queries and judgments
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

METRICS = ("nDCG@10", "R@100")


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


def local_path(value, what):
    path = Path(value)
    if not path.exists():
        raise FileNotFoundError(f"{what}={value!r} does not exist (relative paths are from {Path.cwd()}). "
                                f"Give it with --{what}=PATH")
    return path.resolve()


# ------------------------------------------------------------------------------------------------
# Training data: title -> text pairs of BEIR corpora
# ------------------------------------------------------------------------------------------------


def pseudo_query_pairs(folder):
    """(title, text) of every document of a BEIR folder's corpus.jsonl with a title and a text
    other than the title; whitespace runs (tabs, newlines) become single spaces, so a pair is
    one TSV line."""
    from data.ir_datasets import RowProblems, jsonl_objects
    path = next((p for p in (folder / "corpus.jsonl", folder / "corpus.jsonl.gz") if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(f"train_beir: {folder} has no corpus.jsonl; give BEIR-format folders")
    problems = RowProblems(path, strict=False)
    for _, rec in jsonl_objects(path, problems):
        title, text = (" ".join(str(rec.get(field) or "").split()) for field in ("title", "text"))
        if title and text and text != title:
            yield title, text
    problems.report()


def write_pairs(folders, path):
    """pairs.tsv (query<TAB>positive) of the folders, in order; returns the number of pairs."""
    pairs = [pair for folder in folders for pair in pseudo_query_pairs(folder)]
    if not pairs:
        raise FileNotFoundError(f"train_beir {[str(f) for f in folders]}: no document has both a title and a "
                                "text other than it, so there is no pseudo-query pair to train on")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{q}\t{d}\n" for q, d in pairs))
    os.replace(tmp, path)
    return len(pairs)


# ------------------------------------------------------------------------------------------------
# The models a run starts from (step 0)
# ------------------------------------------------------------------------------------------------


def start_model(C, run, k_target=None):
    """The backbone prepared as train_splade.py prepares it before its first step. A run may name
    its own backbone (run["init"], experiments/repro_heads.py) and k="auto" (then k_target is the
    rule's target, as train_splade.py's config sets it)."""
    import model as M
    import train_splade as S
    model = M.from_pretrained(run.get("init") or C["init"])
    S.rescale_backbone(model, run["k"], C["k_bias"], run["head_scale"], run["untie"], k_target=k_target)
    return model


def step0_key(C, run, k_target=None):
    """What decides a run's starting weights."""
    return json.dumps([str(run.get("init") or C["init"]), run["head_scale"], run["k"], run["untie"], C["k_bias"],
                       *([k_target] if run["k"] == "auto" else [])])


def weights_digest(model):
    """A hash of every weight, a tied matrix under both of its names, so a tied model and an untied
    one with the same values (which compute the same function) get the same digest."""
    h = hashlib.sha1()
    for name, p in model.named_parameters(remove_duplicate=False):
        h.update(name.encode() + str(tuple(p.shape)).encode() + p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def prepare_step0(C, runs, out, k_target=None):
    """{run name: step0/<digest> folder}, saving each distinct starting model once."""
    import model as M
    where, digest_file = {}, out / "step0" / "digests.json"
    known = stamps.read(digest_file) or {}
    for run in runs:
        key = step0_key(C, run, k_target)
        if key not in known or not (out / "step0" / known[key] / "model" / "model.safetensors").exists():
            model = start_model(C, run, k_target)
            known[key] = weights_digest(model)
            folder = out / "step0" / known[key] / "model"
            if not (folder / "model.safetensors").exists():
                model.source = str(run.get("init") or C["init"])  # save_pretrained copies the tokenizer files from there
                M.save_pretrained(model, folder)
            stamps.write(digest_file, known)
        where[run["name"]] = out / "step0" / known[key]
    return where


# ------------------------------------------------------------------------------------------------
# Running: train_splade.py and eval/retrieval.py, as processes (jobs > 0) or in this process
# ------------------------------------------------------------------------------------------------


def train_argv(C, run, pairs, out):
    return [str(C["train_config"]), f"--init={run.get('init') or C['init']}", f"--train_data={pairs}", f"--out_dir={out}",
            f"--head_scale={run['head_scale']}", f"--k={run['k']}", f"--untie_head={run['untie']}",
            f"--k_bias={C['k_bias']}", f"--eval_max_len={C['eval_max_len']}", *C["train_args"]]  # the checkpoints' length


def eval_argv(C, model, out):
    return ["--model", str(model), "--bench", str(C["eval_beir"]), "--out", str(out),
            "--max-len", str(C["eval_max_len"]), "--query-max-len", str(C["eval_query_max_len"]),
            "--batch-size", str(C["eval_batch_size"]), "--device", "cpu", "--dtype", "fp32", "--no-progress"]


def run_all(C, runs, out, pairs, step0):
    """Train and evaluate what is missing; returns ({run name or step0/<digest>: problem}, {job: seconds})."""
    def evaluation(model, dest, key, needs=()):
        return Job(f"{key} eval", "eval/retrieval.py", eval_argv(C, model, dest), needs=list(needs),
                   done=lambda: stamps.read(dest / "metrics.json") is not None, log=dest.parent / "eval.out",
                   marker=dest / "job.json", output=dest, inputs=[model])

    jobs = []
    for run in runs:   # the long ones first
        folder = out / run["name"]
        jobs += [Job(f"{run['name']} train", "train_splade.py", train_argv(C, run, pairs, folder),
                     done=lambda folder=folder: (folder / "model" / "model.safetensors").exists(),
                     log=folder / "train.out", marker=folder / "job.json", output=folder, inputs=[pairs]),
                 evaluation(folder / "model", folder / "eval", run["name"], needs=[f"{run['name']} train"])]
    for folder in dict.fromkeys(step0.values()):
        jobs.append(evaluation(folder / "model", folder / "eval", f"step0/{folder.name}"))
    outcome = run_jobs(jobs, C["jobs"], threads=C["threads"], cwd=ROOT)
    failed = {}
    for job in jobs:   # named "<run> train", "<run> eval" or "step0/<digest> eval"
        if job.name in outcome.failed:
            key = job.name.rsplit(" ", 1)[0]
            what, log = ("training", "train.out") if job.script == "train_splade.py" else ("evaluation", "eval.out")
            failed[key] = f"{what} exited with {outcome.failed[job.name]} (see {log})"
    return failed, {name: round(t["seconds"], 1) for name, t in outcome.timing.items()}


# ------------------------------------------------------------------------------------------------
# Collecting: one row per run
# ------------------------------------------------------------------------------------------------


def _read_json(path):
    return stamps.read(path)  # absent, cut short or not JSON: None


def collapse_episodes(records):
    """[(kind, first step, last step or None while it lasts)] from the log's per-step `collapse`
    field (the collapse monitor's state: the kind of the episode, None outside one)."""
    episodes, current = [], None
    for r in records:
        state = r.get("collapse")
        if current is not None and state != current[0]:
            episodes[-1] = (current[0], current[1], r["step"] - 1)
            current = None
        if state is not None and current is None:
            current = (state, r["step"])
            episodes.append((state, r["step"], None))
    return episodes


def _episodes_text(episodes):
    return "; ".join(f"{k} {a}-{'end' if b is None else b}" for k, a, b in episodes) or "none"


def eval_numbers(metrics):
    if not metrics:
        return {}
    return {**{m: metrics.get("mean", {}).get(m) for m in METRICS}, "flops": metrics.get("flops"),
            "q_dims": metrics.get("mean_query_active_dims"), "d_dims": metrics.get("mean_doc_active_dims"),
            "empty_queries": metrics.get("num_empty_queries")}


def collect(C, runs, out, step0, failed):
    rows = []
    for run in runs:
        folder = out / run["name"]
        norms = _read_json(folder / "head_norms.json") or {}
        log = read_log(folder / "log.jsonl") if (folder / "log.jsonl").exists() else []
        steps = [r for r in log if "loss" in r]
        losses = [r["loss"] for r in steps]
        head, tail = losses[:10], losses[-10:]
        rule = run["k"] == "auto"  # the k train_splade.py's rule picked is in its record
        row = dict(run=run["name"], condition=run["condition"], head_scale=run["head_scale"],
                   k=norms.get("k") if rule else run["k"], k_rule=rule, untied=run["untie"],
                   head_row_l2=norms.get("after", {}).get("mean_row_l2"),
                   embedding_cosine=norms.get("embedding_cosine"),
                   step0_loss=losses[0] if losses else None,   # the first step's loss: before any update
                   # one batch is noisy (16 in-batch candidates): means over the first and last 10 steps
                   first_loss=sum(head) / len(head) if head else None,
                   final_loss=sum(tail) / len(tail) if tail else None, steps=steps[-1]["step"] if steps else 0,
                   collapse=_episodes_text(collapse_episodes(steps)) if steps else None,
                   step0_eval=str(step0[run["name"]].relative_to(out)),
                   before=eval_numbers(_read_json(step0[run["name"]] / "eval" / "metrics.json")),
                   after=eval_numbers(_read_json(folder / "eval" / "metrics.json")))
        problem = failed.get(run["name"]) or failed.get(f"step0/{step0[run['name']].name}")
        row["status"] = problem or ("done" if row["after"] and row["before"] else "incomplete")
        rows.append(row)
    return rows


def k_text(row):
    """k as the table shows it: the number, or the rule's pick (auto, then the k once the run has chosen it)."""
    if not row.get("k_rule"):
        return f"{row['k']:g}"
    return "auto" if row["k"] is None else f"auto: {row['k']:.2f}"


def _fmt(value, spec):  # a diverged run's NaN loss shows as missing, not as "nan"
    return cell(None if isinstance(value, float) and math.isnan(value) else value, spec)


def table(rows):
    head = ["run", "m", "k", "head row L2", "emb. cos", "step-0 loss", "loss, first -> last 10 steps",
            "nDCG@10 before", "nDCG@10 after", "R@100 before", "R@100 after",
            "q dims", "d dims", "FLOPS", "collapse (steps)", "status"]
    cells = []
    for r in rows:
        b, a = r["before"], r["after"]
        cells.append([
            r["run"], f"{r['head_scale']:g}", k_text(r), _fmt(r["head_row_l2"], ".3f"),
            _fmt(r["embedding_cosine"], ".3f"), _fmt(r["step0_loss"], ".3f"),
            f"{_fmt(r['first_loss'], '.3f')} -> {_fmt(r['final_loss'], '.3f')}",
            _fmt(b.get("nDCG@10"), ".3f"), _fmt(a.get("nDCG@10"), ".3f"),
            _fmt(b.get("R@100"), ".3f"), _fmt(a.get("R@100"), ".3f"),
            f"{_fmt(b.get('q_dims'), '.0f')} -> {_fmt(a.get('q_dims'), '.0f')}",
            f"{_fmt(b.get('d_dims'), '.0f')} -> {_fmt(a.get('d_dims'), '.0f')}",
            f"{_fmt(b.get('flops'), '.2f')} -> {_fmt(a.get('flops'), '.2f')}",
            r["collapse"] or "-", r["status"]])
    return markdown_table(head, cells)


# ------------------------------------------------------------------------------------------------
# Plots (matplotlib: optional)
# ------------------------------------------------------------------------------------------------


def plot(rows, out):
    """loss_curves.png and ndcg_vs_flops.png in out; a message instead when matplotlib is missing."""
    plt = pyplot_or_say("run the same command again with --action=table")
    if plt is None:
        return []
    conditions = list(dict.fromkeys(r["condition"] for r in rows))
    color = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(conditions)}
    # conditions can coincide (m = k starts from the control's exact weights): later ones are drawn
    # dashed / smaller on top, so that both stay visible
    style = {c: ("-", "--", "-.", ":")[i % 4] for i, c in enumerate(conditions)}
    size = {c: max(20, 110 - 18 * i) for i, c in enumerate(conditions)}
    written = []

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
                        label=f"{r['condition']} (m={r['head_scale']:g}, k={k_text(r)})")
        ax.set_yscale("log")  # a 16x head starts an order of magnitude above the control
        ax.set(title=f"{'untied decoder' if untied else 'tied head'} (faint: each step; line: 10-step mean)",
               xlabel="step", ylabel="training loss")
        ax.legend(fontsize=7)
    save(fig, out / "loss_curves.png", dpi=130)
    written.append(out / "loss_curves.png")

    fig, ax = plt.subplots(figsize=(7, 5))
    for r in rows:
        b, a = r["before"], r["after"]
        marker = "s" if r["untied"] else "o"
        if a.get("flops") is not None:
            ax.scatter(a["flops"], a["nDCG@10"], marker=marker, color=color[r["condition"]], zorder=3,
                       s=size[r["condition"]], edgecolors="white", linewidths=0.5,
                       label=f"{r['condition']}, {'untied' if r['untied'] else 'tied'}")
        if b.get("flops") is not None:
            ax.scatter(b["flops"], b["nDCG@10"], marker=marker, facecolors="none", edgecolors=color[r["condition"]],
                       s=size[r["condition"]])
            if a.get("flops") is not None:
                ax.annotate("", (a["flops"], a["nDCG@10"]), (b["flops"], b["nDCG@10"]),
                            arrowprops=dict(arrowstyle="->", color=color[r["condition"]], lw=0.7, alpha=0.6))
    ax.set_xscale("log")
    ax.set(xlabel="FLOPS on Cranfield (expected multiplications per query-document pair)",
           ylabel="Cranfield nDCG@10", title="Effectiveness vs sparsity: step 0 (hollow) -> trained (filled)")
    ax.legend(fontsize=7)
    save(fig, out / "ndcg_vs_flops.png", dpi=130)
    written.append(out / "ndcg_vs_flops.png")
    return written


# ------------------------------------------------------------------------------------------------


def main(argv=None):
    C = cli.parse_config(DEFAULTS, sys.argv[1:] if argv is None else argv, script=__file__)
    if C["action"] not in ("all", "table"):
        raise ConfigError(f"action={C['action']!r}: use all (run what is missing, then collect) or table")
    if C["jobs"] < 0 or C["threads"] < 1:
        raise ConfigError("jobs must be >= 0 (0: in this process) and threads >= 1")
    runs = runs_of(C)
    only = [n.strip() for n in C["only"].split(",") if n.strip()]
    unknown = [n for n in only if n not in {r["name"] for r in runs}]
    if unknown:
        raise ConfigError(f"only={C['only']!r}: unknown run(s) {unknown}; the runs are {[r['name'] for r in runs]}")
    config = Path(C["train_config"])
    C["train_config"] = config.resolve() if config.is_file() else local_path(ROOT / config, "train_config")
    C["init"], C["eval_beir"] = local_path(C["init"], "init"), local_path(C["eval_beir"], "eval_beir")
    out = Path(C["out_dir"]).resolve()
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    failed, seconds, n_pairs = {}, {}, None
    pairs = out / "pairs.tsv"
    if C["action"] == "all":
        folders = [local_path(f.strip(), "train_beir") for f in C["train_beir"].split(",") if f.strip()]
        n_pairs = write_pairs(folders, pairs)
        print(f"{pairs}: {n_pairs} title -> text pairs from {', '.join(map(str, folders))}")
    step0 = prepare_step0(C, runs, out) if C["action"] == "all" else {
        r["name"]: out / "step0" / d for r, d in zip(runs, known_digests(C, runs, out))}
    if C["action"] == "all":
        chosen = [r for r in runs if not only or r["name"] in only]
        failed, seconds = run_all(C, chosen, out, pairs, {r["name"]: step0[r["name"]] for r in chosen})
    rows = collect(C, runs, out, step0, failed)
    text = table(rows)
    write_text(out / "results.md", text)
    previous = _read_json(out / "results.json") or {}
    wall = round(time.time() - t0, 1)
    record = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in C.items()},
              "train_recipe": Path(C["train_config"]).read_text(),
              "pairs": n_pairs if n_pairs is not None else previous.get("pairs"),
              "wall_seconds_this_invocation": wall,
              "wall_seconds_all_invocations": round(previous.get("wall_seconds_all_invocations", 0) + wall, 1)
              if C["action"] == "all" else previous.get("wall_seconds_all_invocations"),
              "task_seconds": {**previous.get("task_seconds", {}), **seconds}, "rows": rows}
    write_json(out / "results.json", record)  # atomically: a kill leaves the old file or the new one
    print(text)
    for path in plot(rows, out):
        print(f"wrote {path}")
    print(f"wrote {out / 'results.md'} and {out / 'results.json'} ({wall:.0f} s)")
    return record


def known_digests(C, runs, out, k_target=None):
    """The step0/<digest> of each run whose starting model was saved ("missing" for the others)."""
    known = _read_json(out / "step0" / "digests.json") or {}
    return [known.get(step0_key(C, r, k_target), "missing") for r in runs]


if __name__ == "__main__":
    cli.run_cli(main)
