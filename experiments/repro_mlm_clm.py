"""Small-scale reproduction of the MLM-vs-CLM paper (Gisserot-Boukhlef et al., 2025, "Should We Still
Pretrain Encoders with Masked Language Modeling?") on a CPU, as one command:

    python experiments/repro_mlm_clm.py          # reads data/repro (experiments/fetch_data.py)

What it runs (docs/mlm_vs_clm.md has the paper's protocol; the configs say what is scaled down):
1. data/text_corpus.py: a byte-level BPE (4 096 ids) trained on the text file, and token shards.
2. train_lm.py, one run per configs/repro_mlm_clm_*.py, all with the same initialisation, steps and
   batches in the same order: MLM-30 %, MLM-50 %, CLM, CLM -> MLM 25/75 (one run, switching at
   25 % of the steps), and continued pretraining (CPT) of the finished CLM model with MLM, against
   CPT of the finished MLM-30 % model for the same steps (the paper's CPT comparison; both have
   1.5x the from-scratch budget). Plus "init": the shared initialisation, not pretrained.
3. eval/finetune.py on SST-2 (train subset -> its dev set as test; the learning rate is picked by
   the mean accuracy over seeds on 5 % of train held out, the paper's protocol), every model x
   learning-rate grid x seeds; for MLM-30 % and CLM also the intermediate checkpoints (1/8, 1/4
   and 1/2 of the steps), for the paper's accuracy-vs-steps comparison.
4. OUT/results.json and OUT/results.md (per objective: accuracy mean +- std at the best learning
   rate, the best learning rate, the LR sensitivity = max - min over the grid of the mean
   accuracy), and with matplotlib installed (optional: requirements-dev) accuracy_vs_steps.png,
   lr_sensitivity.png and pretrain_loss.png.
5. With --long, the longer budget: MLM-30 % and CLM pretrained for 4x the steps
   (configs/repro_mlm_clm_*_x4.py), once per --pretrain_seeds seed (another initialisation and
   other masks, the same batches), each fine-tuned at 1/16, 1/8, 1/4, 1/2, 3/4 and all of its
   steps: does MLM catch up with CLM and pass it when trained long enough (the paper's finding
   1)? Its table: accuracy per step, mean +- std over the pretraining seeds, and MLM - CLM.
   --runs picks runs by name (e.g. --long --runs=init,mlm30,clm,mlm30_x4,clm_x4).

Jobs run as separate processes, --jobs at a time (a job waits for the run it starts from).
Resumable (experiments/runner.py): the same command skips what is done and continues the rest.
Logs of every job: OUT/logs/<job>.log. `--action=table` collects what exists without running.

    python experiments/repro_mlm_clm.py --out_dir=out/repro_mlm_clm_long --long --jobs=1 \
        --runs=init,mlm30,clm,mlm30_x4,clm_x4
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

import statistics
from dataclasses import dataclass, replace

import cli
from checkpoint import read_log
from data.text_corpus import prepare_text_corpus
from eval import finetune as FT
from eval.finetune_data import load_task, parse_task
from eval.plots import save
from experiments.pretraining import checkpoint, final_checkpoint, parsed, pretrain_job
from experiments.runner import Driver, Job, Report, cell, markdown_table, pyplot

# Llama-3/EuroBERT names, which hf.models.load_tokenizer and data.fineweb_edu recognise: the delimiter
# (BOS) first, then EOS, the MLM mask and padding
SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>")
# one review per line; a shuffled 10 % of them held out; fine-tuning inputs start with the delimiter
CORPUS = dict(special_tokens=SPECIAL_TOKENS, val_fraction=0.1, documents="line", split="shuffle", min_frequency=2,
              delimiter_template=True)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

DEFAULTS = dict(
    out_dir="out/repro_mlm_clm",  # output folder (corpus, runs, results, plots)
    text="data/repro/text/movie_reviews.txt",  # pretraining text, one document per line (experiments/fetch_data.py)
    sst2="data/repro/labeled/sst2",            # folder with SST-2's train.tsv and dev.tsv
    vocab_size=4096,          # ids of the byte-level BPE, specials included
    steps=0,                  # pretraining steps from scratch (CPT: half); 0 = the configs' (1 200 and 600)
    pretrain_args=[],         # extra train_lm.py flags for every pretraining run, e.g. ["--d_model=32"]
    # fine-tuning (eval/finetune.py on SST-2)
    lrs=[3e-4, 1e-3, 3e-3, 1e-2],  # the learning-rate grid
    seeds=[0, 1, 2],          # fine-tuning seeds
    ft_steps=200,             # fine-tuning steps
    ft_batch_size=32,
    max_train=8000,           # SST-2 training examples used
    max_eval=872,             # validation (from train) and test (dev) examples
    # the longer budget
    long=False,               # also MLM-30 % and CLM for 4x the steps, fine-tuned along the way
    pretrain_seeds=[1337],    # pretraining seeds of the long runs (initialisation and masks; the same batches)
    runs="",                  # comma-separated: only these pretraining runs (and their fine-tuning), e.g. init,mlm30,clm
    # execution
    jobs=2,                   # processes at a time; 0: everything in this process, in order
    threads=1,                # OMP_NUM_THREADS of each process
    action="all",             # all | table (collect what exists, run nothing)
)


@dataclass(frozen=True)
class Pretraining:
    name: str
    label: str
    config: str                 # configs/<config>
    start_from: str | None = None  # CPT: the run whose final checkpoint it continues
    budget: int = 1             # its steps as a multiple of the from-scratch budget (--steps)
    seed: int | None = None     # a pretraining seed other than the config's (--pretrain-seeds)
    group: str = ""             # the run it repeats with another seed (its name without the seed)


RUNS = (
    Pretraining("init", "no pretraining", "repro_mlm_clm_init.py"),
    Pretraining("mlm30", "MLM-30 %", "repro_mlm_clm_mlm30.py"),
    Pretraining("mlm50", "MLM-50 %", "repro_mlm_clm_mlm50.py"),
    Pretraining("clm", "CLM", "repro_mlm_clm_clm.py"),
    Pretraining("clm25_mlm75", "CLM -> MLM 25/75", "repro_mlm_clm_clm25_mlm75.py"),
    Pretraining("cpt_clm", "CPT: CLM, then MLM", "repro_mlm_clm_cpt_clm.py", start_from="clm"),
    Pretraining("cpt_mlm", "CPT: MLM, then MLM", "repro_mlm_clm_cpt_mlm.py", start_from="mlm30"),
)
# pretraining runs start in this order when slots are free: the CPT runs' bases first, so that the
# longest chain (CLM, CPT, fine-tuning) starts early
PRIORITY = ("init", "clm", "mlm30", "cpt_clm", "cpt_mlm", "mlm50", "clm25_mlm75")
CURVE_RUNS = ("mlm30", "clm")          # intermediate checkpoints fine-tuned too
CURVE_FRACTIONS = (1 / 8, 1 / 4, 1 / 2)
# --long: the paper's finding 1 needs a longer budget than 1 200 steps (there MLM-30 % leads only at
# 600 steps); the same two objectives for 4x the steps, every intermediate checkpoint along the way
# fine-tuned. Their intermediate checkpoints are in the stable phase of the warmup-stable-decay
# schedule (not annealed, unlike a shorter run's final one); 1 200 steps are in both.
LONG_RUNS = (Pretraining("mlm30_x4", "MLM-30 %, 4x steps", "repro_mlm_clm_mlm30_x4.py", budget=4),
             Pretraining("clm_x4", "CLM, 4x steps", "repro_mlm_clm_clm_x4.py", budget=4))
LONG_CURVE_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4)
CONFIG_SEED = 1337                     # configs/repro_mlm_clm_mlm30.py's seed
TASK = "sst2"


# ------------------------------------------------------------------------------------------------
# What to run
# ------------------------------------------------------------------------------------------------


def runs_of(C):
    """The pretraining runs of this invocation: RUNS, with --long the longer-budget runs once per
    pretraining seed, then only those named by --runs."""
    runs = list(RUNS)
    for seed in (C["pretrain_seeds"] if C["long"] else []):
        runs += [r if seed == CONFIG_SEED else replace(r, name=f"{r.name}_seed{seed}", label=f"{r.label}, seed {seed}",
                                                      seed=seed, group=r.name) for r in LONG_RUNS]
    wanted = [n.strip() for n in C["runs"].split(",") if n.strip()]
    if not wanted:
        return runs
    names = [r.name for r in runs]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise cli.ConfigError(f"--runs: unknown run(s) {', '.join(unknown)}; the runs are {', '.join(names)}"
                              + ("" if C["long"] else " (--long adds the 4x-budget ones)"))
    chosen = [r for r in runs if r.name in wanted]
    for r in chosen:
        if r.start_from and r.start_from not in wanted:
            raise cli.ConfigError(f"--runs: {r.name} continues {r.start_from}'s final model; add {r.start_from}")
    return chosen


def pretrain_args(run, C, corpus, out):
    """train_lm.py's arguments for `run`: its config, then this experiment's data and folders."""
    ids = corpus["special_ids"]
    bos, eos, mask, pad = (ids[t] for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>"))
    argv = [str(CONFIGS / run.config), f"--out_dir={out / 'pretrain' / run.name}",
            f"--train_shards={corpus['train_shards']}", f"--val_shards={corpus['val_shards']}",
            f"--tokenizer={corpus['tokenizer']}", f"--vocab_size={corpus['vocab_size']}",
            f"--bos_id={bos}", f"--eos_id={eos}", f"--mask_id={mask}", f"--pad_id={pad}"]
    if C["steps"] and run.name != "init":
        steps = C["steps"] // 2 if run.start_from else C["steps"] * run.budget  # CPT: half the from-scratch budget
        every = steps // 16 if run.budget > 1 else C["steps"] // 8              # the curve's checkpoints exist
        argv += [f"--max_steps={steps}", f"--ckpt_interval={max(1, every)}"]
    if run.seed is not None:
        argv.append(f"--seed={run.seed}")
    argv += C["pretrain_args"]
    if run.start_from:
        argv.append(f"--init_from={final_checkpoint(parsed(pretrain_args(by_name(run.start_from), C, corpus, out)))}")
    return argv


def by_name(name):
    return next(r for r in RUNS if r.name == name)


def curve_steps(C, fractions=CURVE_FRACTIONS):
    """The intermediate checkpoints fine-tuned for the accuracy-vs-steps curve (multiples of
    ckpt_interval, so they exist)."""
    every, n = C["ckpt_interval"], C["max_steps"]
    steps = {every * max(1, round(f * n / every)) for f in fractions}
    return sorted(s for s in steps if s < n)


def finetuned_models(run, C):
    """(pretraining step, model folder as a string) of the checkpoints of `run` that are fine-tuned."""
    steps = curve_steps(C, LONG_CURVE_FRACTIONS) if run.budget > 1 else curve_steps(C) if run.name in CURVE_RUNS else []
    return [(s, str(checkpoint(C, s) / "model")) for s in steps] + [(C["max_steps"], str(final_checkpoint(C)))]


def finetune_args(C, out, run, models):
    return ["--models", ",".join(m for _, m in models), "--tasks", f"{TASK}={C['sst2']}",
            "--out", str(out / "finetune" / run.name), "--lrs", ",".join(f"{x:g}" for x in C["lrs"]),
            "--seeds", ",".join(str(s) for s in C["seeds"]), "--steps", str(C["ft_steps"]),
            "--batch-size", str(C["ft_batch_size"]), "--max-train", str(C["max_train"]),
            "--max-eval", str(C["max_eval"]), "--bucket", "--device", "cpu"]


def finetuned(C, out, run, models):
    return all(FT.finished(FT.run_path(out / "finetune" / run.name, m, TASK, lr, seed))
               for _, m in models for lr in C["lrs"] for seed in C["seeds"])


def corpus_of(C, out):
    """The tokenizer and shards of `text` (data/text_corpus.py: made once, reused after)."""
    return prepare_text_corpus(C["text"], out / "corpus", C["vocab_size"], **CORPUS)


def configs_of(C, corpus, out):
    """The config train_lm.py runs with, per pretraining run."""
    return {r.name: parsed(pretrain_args(r, C, corpus, out)) for r in runs_of(C)}


def plan(C, out):
    """The jobs: pretraining first, in an order that starts the CPT runs' bases early, the long
    runs last; then fine-tuning, the largest jobs first."""
    corpus, runs = corpus_of(C, out), runs_of(C)
    configs, logs, jobs = configs_of(C, corpus, out), out / "logs", []
    for r in sorted(runs, key=lambda r: PRIORITY.index(r.name) if r.name in PRIORITY else len(PRIORITY)):
        jobs.append(pretrain_job(f"pretrain_{r.name}", pretrain_args(r, C, corpus, out), logs / f"pretrain_{r.name}.log",
                                 needs=[f"pretrain_{r.start_from}"] if r.start_from else []))
    # the largest fine-tuning jobs (several checkpoints) first, so that none is left alone at the end
    for r in sorted(runs, key=lambda r: -len(finetuned_models(r, configs[r.name]))):
        models = finetuned_models(r, configs[r.name])
        jobs.append(Job(f"finetune_{r.name}", "eval/finetune.py", finetune_args(C, out, r, models),
                        needs=[f"pretrain_{r.name}"], done=lambda r=r, models=models: finetuned(C, out, r, models),
                        log=logs / f"finetune_{r.name}.log"))  # eval/finetune.py redoes the runs of other inputs
    return jobs


def stop_if_failed(outcome, out):
    """After the jobs: stop with the end of each failed job's log (the table would be incomplete)."""
    if not outcome.failed:
        return
    logs = [log for name in outcome.failed if (log := out / "logs" / f"{name}.log").exists()]
    tails = "\n".join(f"--- {log} (end):\n" + log.read_text()[-1500:] for log in logs)
    blocked = f" ({', '.join(outcome.blocked)} could not start)" if outcome.blocked else ""
    failed = "; ".join(f"{name} ({outcome.reasons.get(name, f'exit {rc}')})" for name, rc in outcome.failed.items())
    raise SystemExit(f"{tails}\nerror: job(s) {failed} failed{blocked}; fix the cause and run "
                     "the same command again (finished runs are skipped)")


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------


def point(ft_out, model, spec, lrs, seeds):
    """One checkpoint's fine-tuning results: per learning rate the test accuracy (mean, sample
    std over seeds) and the validation mean; the best lr picked on validation by finetune.summarize
    (the paper's protocol). Accuracies in %. None before any run finished."""
    rows = FT.summarize(ft_out, [model], [spec], lrs, seeds)
    if not rows:
        return None
    row = rows[0]
    means = [v["test_mean"] for v in row["per_lr"].values()]
    return {"best_lr": row["best_lr"], "test_mean": row["test_mean"], "test_std": row["test_std"],
            "val_mean": row["val_mean"], "n_seeds": row["n_seeds"], "lr_spread": max(means) - min(means),
            "per_lr": {f"{lr:g}": v for lr, v in row["per_lr"].items()}}


def final_val_loss(C):
    log = Path(C["out_dir"]) / "log.jsonl"
    evals = [r for r in read_log(log) if "val_loss" in r] if log.exists() else []
    return evals[-1]["val_loss"] if evals else None


def collect(E, out, configs):
    spec = parse_task(f"{TASK}={E['sst2']}")[0]
    runs = {}  # E: the experiment's settings; C: a run's train_lm config
    for r in runs_of(E):
        C = configs[r.name]
        base = configs[r.start_from]["max_steps"] if r.start_from else 0
        ft_out = out / "finetune" / r.name
        points = {}
        for step, model in finetuned_models(r, C):
            p = point(ft_out, model, spec, E["lrs"], E["seeds"])
            if p is not None:
                points[step] = p
        final = points.get(C["max_steps"])
        runs[r.name] = {"label": r.label, "config": f"configs/{r.config}", "objective": C["objective"],
                        "group": r.group or r.name, "pretrain_seed": C["seed"], "budget": r.budget,
                        "clm_fraction": C["clm_fraction"], "mask_ratio": C["mask_ratio"],
                        "init_from": C["init_from"], "pretrain_steps": 0 if r.name == "init" else base + C["max_steps"],
                        "final_val_loss": final_val_loss(C), "final": final,
                        "curve": {str(s): p for s, p in sorted(points.items()) if s != C["max_steps"]}}
    return runs


def table(runs) -> str:
    head = ["objective", "pretraining steps", "final val loss (own objective)",
            "SST-2 acc. (%) at best LR, mean ± std", "best LR",
            "LR sensitivity (max − min of mean acc. over the grid, pts)"]
    rows = []
    for r in runs.values():
        f = r["final"]
        accuracy = ["–"] * 3 if f is None else [f"{f['test_mean']:.1f} ± {f['test_std']:.1f} (n={f['n_seeds']})",
                                                f"{f['best_lr']:g}", f"{f['lr_spread']:.1f}"]
        rows.append([r["label"], str(r["pretrain_steps"]), cell(r["final_val_loss"], ".3f", "–"), *accuracy])
    return markdown_table(head, rows)


def curve_table(runs) -> str:
    """Accuracy (best LR, mean ± std) at each fine-tuned checkpoint of the curve runs."""
    curves = {name: curve(runs, name) for name in CURVE_RUNS if name in runs}
    if not curves:
        return ""
    rows = []
    for step in sorted({s for steps, _, _ in curves.values() for s in steps}):
        rows.append([str(step)] + [f"{m[s.index(step)]:.1f} ± {d[s.index(step)]:.1f}" if step in s else "–"
                                   for s, m, d in curves.values()])
    return markdown_table(["pretraining steps", *(runs[n]["label"] for n in curves)], rows)


def long_curves(runs):
    """{long run: {step: [(test mean, std over fine-tuning seeds) at the best LR, per pretraining
    seed]}}: the longer budget's accuracy-vs-steps curves, its pretraining seeds side by side (from
    the first checkpoint: the "no pretraining" point is the config seed's initialisation only)."""
    out = {}
    for r in LONG_RUNS:
        points = {}
        for x in runs.values():
            if x["group"] == r.name:
                for step, p in [*x["curve"].items(), (str(x["pretrain_steps"]), x["final"])]:
                    if p is not None:
                        points.setdefault(int(step), []).append((p["test_mean"], p["test_std"]))
        if points:
            out[r.name] = dict(sorted(points.items()))
    return out


def pooled(values):
    """(mean, std) of one step's [(mean, std)] per pretraining seed: over the seeds' means, or for
    a single seed its own fine-tuning seeds' std."""
    means = [m for m, _ in values]
    return statistics.mean(means), statistics.stdev(means) if len(means) > 1 else values[0][1]


def long_table(runs) -> str:
    """The longer budget: per fine-tuned step, each objective's accuracy at the best LR and MLM − CLM."""
    curves = long_curves(runs)
    if len(curves) < 2:
        return ""
    mlm, clm = (curves[r.name] for r in LONG_RUNS)
    n = max(len(v) for c in curves.values() for v in c.values())
    rows = []
    for step in sorted(set(mlm) | set(clm)):
        cells = ["{:.1f} ± {:.1f}".format(*pooled(c[step])) if step in c else "–" for c in (mlm, clm)]
        gap = f"{pooled(mlm[step])[0] - pooled(clm[step])[0]:+.1f}" if step in mlm and step in clm else "–"
        rows.append([str(step), *cells, gap])
    spread = ("mean ± std over the fine-tuning seeds (one pretraining seed)" if n == 1
              else f"mean ± std over {n} pretraining seeds of each one's mean over fine-tuning seeds")
    return (f"Longer budget: SST-2 accuracy (%) at the best LR, {spread}\n\n"
            + markdown_table(["pretraining steps", *(r.label for r in LONG_RUNS), "MLM − CLM (pts)"], rows))


def timing_lines(timing) -> str:
    jobs = timing.get("jobs", {})
    wall = sum(i["seconds"] for i in timing.get("invocations", []))
    cpu = sum(j["cpu_seconds"] for j in jobs.values())
    return (f"Wall time {wall / 60:.1f} min over {len(timing.get('invocations', []))} invocation(s); the jobs used "
            f"{cpu / 60:.1f} CPU-min ({len(jobs)} jobs).\n")


def curve(runs, name):
    """(steps, means, stds) of a run's accuracy-vs-steps curve; step 0 is the shared init."""
    pts = []
    if "init" in runs and runs["init"]["final"]:
        pts.append((0, runs["init"]["final"]))
    pts += [(int(s), p) for s, p in runs[name]["curve"].items()]
    if runs[name]["final"]:
        pts.append((runs[name]["pretrain_steps"], runs[name]["final"]))
    return [s for s, _ in pts], [p["test_mean"] for _, p in pts], [p["test_std"] for _, p in pts]


def plot(runs, configs, out):
    """accuracy_vs_steps.png, lr_sensitivity.png, pretrain_loss.png; returns the paths (none
    without matplotlib, with a message)."""
    plt = pyplot()
    if plt is None:
        return []
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in CURVE_RUNS:
        if name in runs:
            steps, means, stds = curve(runs, name)
            ax.errorbar(steps, means, yerr=stds, marker="o", capsize=3, label=runs[name]["label"])
    long = long_curves(runs)
    for r in LONG_RUNS:  # the longer budget, its pretraining seeds pooled
        points = long.get(r.name, {})
        ax.errorbar(list(points), [pooled(v)[0] for v in points.values()], yerr=[pooled(v)[1] for v in points.values()],
                    marker="s", ls="--", capsize=3, label=r.label)
    ax.set(xlabel="pretraining steps", ylabel="SST-2 accuracy (%), best LR, mean ± std over seeds",
           title="Fine-tuned accuracy vs pretraining steps")
    ax.legend()
    paths.append(out / "accuracy_vs_steps.png")
    save(fig, paths[-1], dpi=120)

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs.values():
        if r["final"] is None:
            continue
        lrs = sorted(r["final"]["per_lr"], key=float)
        ax.errorbar([float(x) for x in lrs], [r["final"]["per_lr"][x]["test_mean"] for x in lrs],
                    yerr=[r["final"]["per_lr"][x]["test_std"] for x in lrs], marker="o", capsize=3, label=r["label"])
    ax.set(xscale="log", xlabel="fine-tuning learning rate", ylabel="SST-2 accuracy (%), mean ± std",
           title="Learning-rate sensitivity (final checkpoints)")
    ax.legend(fontsize=7)
    paths.append(out / "lr_sensitivity.png")
    save(fig, paths[-1], dpi=120)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in runs.items():
        log = Path(configs[name]["out_dir"]) / "log.jsonl"
        evals = [e for e in read_log(log) if "val_loss" in e] if log.exists() else []
        if name != "init" and evals:
            start = by_name(name).start_from if name in {x.name for x in RUNS} else None
            base = configs[start]["max_steps"] if start else 0
            ax.plot([base + e["step"] for e in evals], [e["val_loss"] for e in evals], marker=".", label=r["label"])
    ax.set(xlabel="pretraining steps", ylabel="validation loss of the step's objective",
           title="Pretraining (MLM and CLM losses are not comparable)")
    ax.legend(fontsize=7)
    paths.append(out / "pretrain_loss.png")
    save(fig, paths[-1], dpi=120)
    return paths


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------


def check(C):
    C["text"], C["sst2"] = str(Path(C["text"]).resolve()), str(Path(C["sst2"]).resolve())
    runs_of(C)  # a bad --runs fails now, not after the corpus
    if C["action"] != "table":  # bad fine-tuning data fails now, not after the pretraining
        load_task(*parse_task(f"{TASK}={C['sst2']}"))


def report(C, out, outcome):
    stop_if_failed(outcome, out)
    corpus = corpus_of(C, out)
    configs = configs_of(C, corpus, out)
    runs = collect(C, out, configs)
    timing = outcome.history
    results = {"paper": "Gisserot-Boukhlef et al. 2025, Should We Still Pretrain Encoders with Masked Language "
                        "Modeling?", "settings": dict(C), "corpus": corpus, "runs": runs}
    md = "\n".join(text for text in tables(results).values()) + "\n" + timing_lines(timing)
    return Report(md, results, plots=lambda: plot(runs, configs, out), rows="runs", tables=tables)


def tables(record):
    """{name: markdown} from a results record alone (results.json, or docs/results/'s rows: there
    the runs are a list, each with its name as "run")."""
    runs = record["runs"]
    if isinstance(runs, list):
        runs = {r["run"]: {k: v for k, v in r.items() if k != "run"} for r in runs}
    made = {"objectives": table(runs), "curve": curve_table(runs), "long": long_table(runs)}
    return {name: text for name, text in made.items() if text}


DRIVER = Driver(__file__, DEFAULTS, plan, report, check=check)


def main(argv=None):
    return DRIVER.main(argv)


if __name__ == "__main__":
    cli.run_cli(main)
