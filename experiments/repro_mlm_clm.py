"""Small-scale reproduction of the MLM-vs-CLM paper (Gisserot-Boukhlef et al., 2025, "Should We Still
Pretrain Encoders with Masked Language Modeling?") on a CPU, as one command:

    python experiments/repro_mlm_clm.py          # reads data/repro (experiments/fetch_data.py)
    python experiments/repro_mlm_clm.py --out_dir=out/repro_mlm_clm_long --long --jobs=1 \
        --runs=init,mlm30,clm,mlm30_x4,clm_x4

docs/mlm_vs_clm.md has the paper's protocol; the configs say what is scaled down. Under out_dir: corpus/,
pretrain/<run>/ (train_lm.py per configs/repro_mlm_clm_*.py, the same initialisation, steps and batches),
finetune/<run>/ (eval/finetune.py on SST-2, every model x learning rate x seed; MLM-30 % and CLM also at 1/8,
1/4 and 1/2 of their steps), logs/, results.json, results.md and the plots. --long adds MLM-30 % and CLM for
4x the steps, once per pretraining seed: does MLM catch up with CLM (the paper's finding 1)? Resumable.
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
    runs="",                  # comma-separated: only these pretraining runs and their fine-tuning, e.g. init,clm
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
# --long: at 1 200 steps MLM-30 % leads only at 600; the same two objectives for 4x the steps, every
# intermediate checkpoint fine-tuned (they are in the stable phase of the warmup-stable-decay schedule,
# not annealed as a shorter run's final one is)
LONG_RUNS = (Pretraining("mlm30_x4", "MLM-30 %, 4x steps", "repro_mlm_clm_mlm30_x4.py", budget=4),
             Pretraining("clm_x4", "CLM, 4x steps", "repro_mlm_clm_clm_x4.py", budget=4))
LONG_CURVE_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4)
CONFIG_SEED = 1337                     # configs/repro_mlm_clm_mlm30.py's seed
TASK = "sst2"


def runs_of(C):
    """The pretraining runs: RUNS, with --long the longer-budget runs per pretraining seed; only --runs's."""
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
    bos, eos, mask, pad = (ids[t] for t in SPECIAL_TOKENS)
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
        base = next(r for r in RUNS if r.name == run.start_from)
        argv.append(f"--init_from={final_checkpoint(parsed(pretrain_args(base, C, corpus, out)))}")
    return argv


def finetuned_models(run, C):
    """(pretraining step, model folder) of the fine-tuned checkpoints of `run`: the final one, and the curve's."""
    fractions = LONG_CURVE_FRACTIONS if run.budget > 1 else CURVE_FRACTIONS if run.name in CURVE_RUNS else ()
    every, n = C["ckpt_interval"], C["max_steps"]
    steps = sorted(s for s in {every * max(1, round(f * n / every)) for f in fractions} if s < n)
    return [(s, str(checkpoint(C, s) / "model")) for s in steps] + [(n, str(final_checkpoint(C)))]


def corpus_of(C, out):
    """The tokenizer and shards of `text` (data/text_corpus.py: made once, reused after)."""
    return prepare_text_corpus(C["text"], out / "corpus", C["vocab_size"], **CORPUS)


def configs_of(C, corpus, out):
    return {r.name: parsed(pretrain_args(r, C, corpus, out)) for r in runs_of(C)}


def plan(C, out):
    """Pretraining first, the CPT runs' bases early and the long runs last; then fine-tuning, the largest first."""
    corpus, runs = corpus_of(C, out), runs_of(C)
    configs, logs, jobs = configs_of(C, corpus, out), out / "logs", []
    for r in sorted(runs, key=lambda r: PRIORITY.index(r.name) if r.name in PRIORITY else len(PRIORITY)):
        needs = [f"pretrain_{r.start_from}"] if r.start_from else []
        log = logs / f"pretrain_{r.name}.log"
        jobs.append(pretrain_job(f"pretrain_{r.name}", pretrain_args(r, C, corpus, out), log, needs=needs))
    for r in sorted(runs, key=lambda r: -len(finetuned_models(r, configs[r.name]))):
        models = finetuned_models(r, configs[r.name])
        done = [FT.run_path(out / "finetune" / r.name, m, TASK, lr, seed)
                for _, m in models for lr in C["lrs"] for seed in C["seeds"]]
        argv = ["--models", ",".join(m for _, m in models), "--tasks", f"{TASK}={C['sst2']}",
                "--out", str(out / "finetune" / r.name), "--lrs", ",".join(f"{x:g}" for x in C["lrs"]),
                "--seeds", ",".join(str(s) for s in C["seeds"]), "--steps", str(C["ft_steps"]),
                "--batch-size", str(C["ft_batch_size"]), "--max-train", str(C["max_train"]),
                "--max-eval", str(C["max_eval"]), "--bucket", "--device", "cpu"]
        jobs.append(Job(f"finetune_{r.name}", "eval/finetune.py", argv, needs=[f"pretrain_{r.name}"],
                        done=lambda done=done: all(map(FT.finished, done)),
                        log=logs / f"finetune_{r.name}.log"))  # eval/finetune.py redoes the runs of other inputs
    return jobs


def point(ft_out, model, spec, lrs, seeds):
    """One checkpoint's fine-tuning results (finetune.summarize): test accuracy per lr and at the best, or None."""
    row = next(iter(FT.summarize(ft_out, [model], [spec], lrs, seeds)), None)
    if row is None:
        return None
    means = [v["test_mean"] for v in row["per_lr"].values()]
    return {"best_lr": row["best_lr"], "test_mean": row["test_mean"], "test_std": row["test_std"],
            "val_mean": row["val_mean"], "n_seeds": row["n_seeds"], "lr_spread": max(means) - min(means),
            "per_lr": {f"{lr:g}": v for lr, v in row["per_lr"].items()}}


def val_losses(C):
    log = Path(C["out_dir"]) / "log.jsonl"
    return [r for r in read_log(log) if "val_loss" in r] if log.exists() else []


def collect(E, out, configs):
    """{run: its settings and fine-tuning results} (E: the experiment's settings; C: a run's train_lm config)."""
    spec = parse_task(f"{TASK}={E['sst2']}")[0]
    runs = {}
    for r in runs_of(E):
        C = configs[r.name]
        points = {step: p for step, model in finetuned_models(r, C)
                  if (p := point(out / "finetune" / r.name, model, spec, E["lrs"], E["seeds"])) is not None}
        base = configs[r.start_from]["max_steps"] if r.start_from else 0
        evals = val_losses(C)
        runs[r.name] = {"label": r.label, "config": f"configs/{r.config}", "objective": C["objective"],
                        "group": r.group or r.name, "pretrain_seed": C["seed"], "budget": r.budget,
                        "clm_fraction": C["clm_fraction"], "mask_ratio": C["mask_ratio"],
                        "init_from": C["init_from"], "pretrain_steps": 0 if r.name == "init" else base + C["max_steps"],
                        "final_val_loss": evals[-1]["val_loss"] if evals else None,
                        "final": points.get(C["max_steps"]),
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


def curve(runs, name):
    """(steps, means, stds) of a run's accuracy-vs-steps curve; step 0 is the shared init."""
    pts = [(0, runs["init"]["final"])] if "init" in runs and runs["init"]["final"] else []
    pts += [(int(s), p) for s, p in runs[name]["curve"].items()]
    if runs[name]["final"]:
        pts.append((runs[name]["pretrain_steps"], runs[name]["final"]))
    return [s for s, _ in pts], [p["test_mean"] for _, p in pts], [p["test_std"] for _, p in pts]


def curve_table(runs) -> str:
    """Accuracy (best LR, mean ± std) at each fine-tuned checkpoint of the curve runs."""
    curves = {name: curve(runs, name) for name in CURVE_RUNS if name in runs}
    if not curves:
        return ""
    rows = [[str(step)] + [f"{m[s.index(step)]:.1f} ± {d[s.index(step)]:.1f}" if step in s else "–"
                           for s, m, d in curves.values()]
            for step in sorted({s for steps, _, _ in curves.values() for s in steps})]
    return markdown_table(["pretraining steps", *(runs[n]["label"] for n in curves)], rows)


def long_curves(runs):
    """{long run: {step: [(test mean, std over fine-tuning seeds) at the best LR, per pretraining seed]}}
    (from the first checkpoint: the "no pretraining" point is the config seed's initialisation only)."""
    out = {}
    for r in LONG_RUNS:
        points = {}
        for x in (x for x in runs.values() if x["group"] == r.name):
            for step, p in [*x["curve"].items(), (str(x["pretrain_steps"]), x["final"])]:
                if p is not None:
                    points.setdefault(int(step), []).append((p["test_mean"], p["test_std"]))
        if points:
            out[r.name] = dict(sorted(points.items()))
    return out


def pooled(values):
    """(mean, std) over the pretraining seeds' means (one seed: its fine-tuning seeds' std)."""
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


def plot(runs, configs, out):
    """accuracy_vs_steps.png, lr_sensitivity.png, pretrain_loss.png (none without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return []
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
    written = [save(fig, out / "accuracy_vs_steps.png", dpi=120)]

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs.values():
        per_lr = (r["final"] or {}).get("per_lr", {})
        lrs = sorted(per_lr, key=float)
        if lrs:
            ax.errorbar([float(x) for x in lrs], [per_lr[x]["test_mean"] for x in lrs],
                        yerr=[per_lr[x]["test_std"] for x in lrs], marker="o", capsize=3, label=r["label"])
    ax.set(xscale="log", xlabel="fine-tuning learning rate", ylabel="SST-2 accuracy (%), mean ± std",
           title="Learning-rate sensitivity (final checkpoints)")
    ax.legend(fontsize=7)
    written.append(save(fig, out / "lr_sensitivity.png", dpi=120))

    fig, ax = plt.subplots(figsize=(6, 4))
    starts = {r.name: r.start_from for r in RUNS}
    for name, r in runs.items():
        evals = val_losses(configs[name])
        if name != "init" and evals:
            base = configs[starts[name]]["max_steps"] if starts.get(name) else 0
            ax.plot([base + e["step"] for e in evals], [e["val_loss"] for e in evals], marker=".", label=r["label"])
    ax.set(xlabel="pretraining steps", ylabel="validation loss of the step's objective",
           title="Pretraining (MLM and CLM losses are not comparable)")
    ax.legend(fontsize=7)
    return [*written, save(fig, out / "pretrain_loss.png", dpi=120)]


def check(C):
    C["text"], C["sst2"] = str(Path(C["text"]).resolve()), str(Path(C["sst2"]).resolve())
    runs_of(C)  # a bad --runs fails now, not after the corpus
    if C["action"] != "table":  # bad fine-tuning data fails now, not after the pretraining
        load_task(*parse_task(f"{TASK}={C['sst2']}"))


def report(C, out, outcome):
    corpus = corpus_of(C, out)
    configs = configs_of(C, corpus, out)
    runs = collect(C, out, configs)
    results = {"paper": "Gisserot-Boukhlef et al. 2025, Should We Still Pretrain Encoders with Masked Language "
                        "Modeling?", "settings": dict(C), "corpus": corpus, "runs": runs}
    jobs, calls = outcome.history.get("jobs", {}), outcome.history.get("invocations", [])
    md = "\n".join(tables(results).values()) + (
        f"\nWall time {sum(i['seconds'] for i in calls) / 60:.1f} min over {len(calls)} invocation(s); the jobs "
        f"used {sum(j['cpu_seconds'] for j in jobs.values()) / 60:.1f} CPU-min ({len(jobs)} jobs).\n")
    return Report(md, results, plots=lambda: plot(runs, configs, out), rows="runs", tables=tables)


def tables(record):
    """{name: markdown} from a results record alone (results.json, or docs/results/'s rows)."""
    runs = record["runs"]
    if isinstance(runs, list):
        runs = {r["run"]: {k: v for k, v in r.items() if k != "run"} for r in runs}
    made = {"objectives": table(runs), "curve": curve_table(runs), "long": long_table(runs)}
    return {name: text for name, text in made.items() if text}


main = Driver(__file__, DEFAULTS, plan, report, check=check).main


if __name__ == "__main__":
    cli.run_cli(main)
