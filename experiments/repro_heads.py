"""The rescaling paper's real case at CPU scale: MLM heads made large by how they were pretrained, not by
a multiplication. Tiny backbones of three recipes - BERT, ModernBERT and EuroBERT, each its family's
architecture with its published pretraining recipe scaled down (configs/repro_heads_*.py say where each
value comes from) - are pretrained with train_lm.py on the same text, tokenizer, token budget, batches
and seed; the MLM head's norms and the logits' scale are recorded at every checkpoint; an ablation
switches one recipe value at a time; then the SPLADE rescaling table runs on each backbone with the
protocol of experiments/repro_splade_rescaling.py (experiments/splade_protocol.py: CACM + CISI title ->
abstract pairs, Cranfield), for the grid of k and for train_splade.py's rule (--k=auto). One command,
resumable:

    python experiments/repro_heads.py configs/repro_heads.py
    python experiments/repro_heads.py configs/repro_heads.py --action=table     # collect only

What it does, under out_dir:
1. corpus/: data/fineweb_edu.py shards of `text` (comma-separated .txt/.jsonl files) with the
   tokenizer of `tokenizer` ([CLS] before every document; the first shard is held out).
2. pretrain/<run>/: train_lm.py per recipe (`recipes`: name -> config) and per ablation
   (`ablations`: name -> (recipe, extra train_lm flags)), a checkpoint every ckpt_interval steps.
3. heads.json: per run and checkpoint (step 0 is the seed's initialisation, rebuilt), the head's
   norms (model.head_norms: mean row L2, Frobenius, bias), the logits on `heads_tokens` held-out
   tokens (RMS, mean over tokens of the largest logit, fraction > 0), the terms a SPLADE vector of
   one 128-token text activates, and the k the rule would pick.
4. splade/: the rescaling protocol's stages (experiments/splade_protocol.py: pairs.tsv, step0/
   evaluations, one train_splade.py + eval/retrieval.py run per condition) for every backbone of
   `splade_backbones` (the final checkpoint of its recipe, once its pretraining has finished) x `ks`
   (numbers, or "auto": the rule).
5. results.json, results.md (the tables) and, with matplotlib, head_norms.png and splade_ndcg.png.
A finished stage is skipped (made by the same command from the same inputs, by content: its job.json
stamp, experiments/runner.py) and the training scripts resume a killed run, so the same command
continues.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

import math

import torch

import cli
from checkpoint import read_log
from cli import ConfigError
from data import stamp as stamps
from data.atomic import write_json
from eval.plots import save
from experiments import splade_protocol as P
from experiments.pretraining import checkpoint, parsed, pretrain_job
from experiments.runner import Driver, Job, Report, cell, markdown_table, pyplot
from model import scale_problem

ROOT = Path(__file__).resolve().parents[1]

DEFAULTS = dict(
    out_dir="out/repro_heads",
    # pretraining data: the same text and tokenizer for every recipe
    text="../shared/data/text/movie_reviews.txt,../shared/data/ir/cacm/corpus.jsonl,../shared/data/ir/cisi/corpus.jsonl",
    tokenizer="../shared/data/models/splade-tiny",  # a tokenizer.json or its folder (SPLADE reads its vocabulary)
    delimiter="[CLS]",        # written before every document
    shard_tokens=200_000,     # the first shard is the held-out one
    # the backbones
    recipes={"bert": "configs/repro_heads_bert.py", "modernbert": "configs/repro_heads_modernbert.py",
             "eurobert": "configs/repro_heads_eurobert.py"},
    ablations={},             # name -> (recipe, [train_lm flags]): one recipe value switched
    pretrain_args=[],         # extra train_lm.py flags for every pretraining run, e.g. ["--max_steps=20"]
    heads_tokens=4096,        # held-out tokens the logits' scale is measured on (sequences of 128)
    # SPLADE on the backbones (experiments/repro_splade_rescaling.py's protocol)
    splade_backbones=["bert", "modernbert", "eurobert"],
    ks=[1, 4, 16, "auto"],    # "auto": train_splade.py's rule, k = the head's mean row L2 / k_target
    train_beir="../shared/data/ir/cacm,../shared/data/ir/cisi",
    eval_beir="../shared/data/ir/cranfield",
    train_config="configs/repro_splade_train.py",
    train_args=[],            # extra train_splade.py flags for every SPLADE run
    k_bias=False,
    eval_max_len=128, eval_query_max_len=64, eval_batch_size=32,
    # execution
    jobs=1,                   # processes at a time; 0: everything in this process, in order
    threads=1,
    action="all",             # all | table (collect what exists, run nothing)
)
SEQ = 128  # tokens per held-out text of the logits' measurement (at most the model's max_seq_len)


def local(value, what):
    return P.local_path(value if Path(value).is_absolute() or Path(value).exists() else ROOT / value, what)


# ------------------------------------------------------------------------------------------------
# What to run
# ------------------------------------------------------------------------------------------------


def pretraining_runs(C):
    """{run name: (recipe name, config path, extra flags)}: the recipes, then the ablations."""
    runs = {name: (name, str(local(path, f"recipes[{name!r}]")), []) for name, path in C["recipes"].items()}
    for name, spec in C["ablations"].items():
        if not (isinstance(spec, (list, tuple)) and len(spec) == 2 and spec[0] in C["recipes"]
                and isinstance(spec[1], (list, tuple))):
            raise ConfigError(f"ablations[{name!r}] = {spec!r}: give (a recipe of {sorted(C['recipes'])}, "
                              "[train_lm flags])")
        runs[name] = (spec[0], runs[spec[0]][1], list(spec[1]))
    return runs


def corpus_facts(out):
    """(train glob, val glob, first val shard)."""
    return (str(out / "corpus" / "corpus_train_*.bin"), str(out / "corpus" / "corpus_val_*.bin"),
            out / "corpus" / "corpus_val_000000.bin")


def pretrain_argv(C, out, name, run):
    train, val, _ = corpus_facts(out)
    return [run[1], f"--out_dir={out / 'pretrain' / name}", f"--train_shards={train}", f"--val_shards={val}",
            f"--tokenizer={C['tokenizer']}", *C["pretrain_args"], *run[2]]


def corpus_done(out):
    progress = out / "corpus" / "corpus_progress.json"
    return (stamps.read(progress) or {}).get("done") is True


def splade_runs(C, configs):
    """The protocol's run records (experiments/splade_protocol.py): one per backbone x k, starting
    from the backbone's final checkpoint. (Another SPLADE seed of a condition is a run with
    args=["--seed=S"] and its own name.)"""
    runs = []
    for b in C["splade_backbones"]:
        if b not in configs:
            raise ConfigError(f"splade_backbones: {b!r} is not a pretraining run ({sorted(configs)})")
        for k in C["ks"]:
            if k != "auto" and scale_problem(k):
                raise ConfigError(f"ks: {k!r}: a number > 0 or 'auto'")
            runs.append(dict(name=f"{b}_k{k:g}" if k != "auto" else f"{b}_kauto", condition=b, backbone=b,
                             init=str(checkpoint(configs[b], configs[b]["max_steps"]) / "model"),
                             head_scale=1.0, k=k, untie=False))
    return runs


def splade_config(C, out):
    """The settings the protocol reads, for this experiment's SPLADE runs."""
    S = dict(C, out_dir=str(out / "splade"))
    S["train_config"], S["eval_beir"] = local(C["train_config"], "train_config"), local(C["eval_beir"], "eval_beir")
    return S


# ------------------------------------------------------------------------------------------------
# The head at every checkpoint
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def head_record(model, ids, k_target):
    """The head's norms, the logits' scale on held-out texts `ids` (n, SEQ) and what a SPLADE vector
    of one text activates, for a model as it stands."""
    from model import auto_k, head_norms, splade_pool
    model.eval()
    n = head_norms(model)
    sq, top, pos, count, active = 0.0, 0.0, 0.0, 0, []
    for chunk in ids.split(4):  # 4 x 128 x V logits at a time
        logits = model(chunk).float()
        sq += (logits ** 2).sum().item()
        top += logits.max(-1).values.sum().item()
        pos += (logits > 0).sum().item()
        count += logits.shape[0] * logits.shape[1]
        w = splade_pool(model, chunk, torch.ones_like(chunk), fused=False)
        active += (w > 0).sum(1).tolist()
    V = logits.shape[-1]
    return {"mean_row_l2": n["mean_row_l2"], "frobenius": n["frobenius"], "bias_l2": n["bias_l2"], "tied": n["tied"],
            "logit_rms": math.sqrt(sq / (count * V)), "logit_max_mean": top / count, "logit_positive": pos / (count * V),
            "splade_active_terms": sum(active) / len(active), "rule_k": auto_k(model, k_target)}


def initial_model(cfg):
    """The model every run of this recipe starts from: train_lm's initialisation from its seed."""
    import train_lm
    from model import Transformer
    model = Transformer(train_lm.model_config(cfg))
    model.init_weights(torch.Generator().manual_seed(cfg["seed"]))
    return model


def record_heads(C, out, configs, k_target):
    """heads.json: {run: {step: record}}, each checkpoint measured once (an existing record is kept)."""
    from data.shards import read_shard
    from model import from_pretrained
    path = out / "heads.json"
    heads = stamps.read(path) or {}
    val = read_shard(corpus_facts(out)[2])
    for name, cfg in configs.items():
        seq = min(SEQ, cfg["max_seq_len"])
        n = min(C["heads_tokens"], len(val)) // seq
        if n < 1:
            raise ConfigError(f"the held-out shard has {len(val)} tokens, fewer than one text of {seq}")
        ids = torch.from_numpy(val[:n * seq].astype("int64")).view(n, seq)
        steps = sorted(int(p.name.split("_")[1]) for p in (Path(cfg["out_dir"]) / "checkpoints").glob("step_*")
                       if p.name.split("_")[1].isdigit() and (p / "model" / "model.safetensors").exists())
        mine = heads.setdefault(name, {})
        for step in [0, *steps]:
            if str(step) not in mine:
                model = initial_model(cfg) if step == 0 else from_pretrained(checkpoint(cfg, step) / "model")
                mine[str(step)] = head_record(model, ids, k_target)
        write_json(path, heads)
    return heads


# ------------------------------------------------------------------------------------------------
# Tables and plots
# ------------------------------------------------------------------------------------------------


def val_losses(cfg):
    log = Path(cfg["out_dir"]) / "log.jsonl"
    return {r["step"]: r["val_loss"] for r in read_log(log) if "val_loss" in r} if log.exists() else {}


def pretraining_rows(C, configs, heads, runs):
    rows = []
    for name, cfg in configs.items():
        steps = sorted(int(s) for s in heads.get(name, {}))
        first, last = (heads[name][str(steps[0])], heads[name][str(steps[-1])]) if steps else ({}, {})
        losses = val_losses(cfg)
        rows.append(dict(run=name, recipe=runs[name][0], flags=runs[name][2], family=cfg["family"],
                         tied=last.get("tied"), lr=cfg["lr"], weight_decay=cfg["weight_decay"],
                         decay_per_step=cfg["lr"] * cfg["weight_decay"], decay_params=cfg["decay_params"],
                         mask=f"{cfg['mask_ratio']:g} {cfg['mask_replacement']}", steps=steps[-1] if steps else 0,
                         start=first, final=last, final_val_loss=losses[max(losses)] if losses else None,
                         curve={s: heads[name][str(s)] for s in steps}))
    return rows


def pretraining_table(rows):
    head = ["run", "family", "tied", "lr", "decay per step (lr x wd)", "decayed", "mask", "steps",
            "head row L2, step 0 -> end", "Frobenius", "bias L2", "logit RMS", "mean max logit", "logits > 0",
            "SPLADE terms / text", "rule's k", "final val loss"]
    cells = []
    for r in rows:
        a, b = r["start"], r["final"]
        cells.append([r["run"], r["family"], "-" if r["tied"] is None else ("tied" if r["tied"] else "untied"),
                      f"{r['lr']:g}", f"{r['decay_per_step']:.1e}", r["decay_params"], r["mask"], str(r["steps"]),
                      f"{cell(a.get('mean_row_l2'), '.3f')} -> {cell(b.get('mean_row_l2'), '.3f')}",
                      cell(b.get("frobenius"), ".1f"), cell(b.get("bias_l2"), ".2f"),
                      f"{cell(a.get('logit_rms'), '.2f')} -> {cell(b.get('logit_rms'), '.2f')}",
                      cell(b.get("logit_max_mean"), ".2f"), cell(b.get("logit_positive"), ".3f"),
                      f"{cell(a.get('splade_active_terms'), '.0f')} -> {cell(b.get('splade_active_terms'), '.0f')}",
                      cell(b.get("rule_k"), ".2f"), cell(r["final_val_loss"], ".3f")])
    return markdown_table(head, cells)


def rule_rows(rows):
    """Per backbone: the k the rule picked and the grid's best k by Cranfield nDCG@10 after training."""
    out = []
    for b in dict.fromkeys(r["condition"] for r in rows):
        mine = [r for r in rows if r["condition"] == b and r["after"].get("nDCG@10") is not None]
        grid = [r for r in mine if not r["k_rule"]]
        auto = next((r for r in mine if r["k_rule"]), None)
        best = max(grid, key=lambda r: r["after"]["nDCG@10"]) if grid else None
        out.append(dict(backbone=b, rule_k=auto["k"] if auto else None,
                        rule_ndcg=auto["after"]["nDCG@10"] if auto else None,
                        best_k=best["k"] if best else None, best_ndcg=best["after"]["nDCG@10"] if best else None,
                        grid={f"{r['k']:g}": r["after"]["nDCG@10"] for r in grid}))
    return out


def rule_table(rules):
    head = ["backbone", "k by the rule", "nDCG@10 with it", "grid's best k", "its nDCG@10", "nDCG@10 per grid k"]
    return markdown_table(head, [[r["backbone"], cell(r["rule_k"], ".2f"), cell(r["rule_ndcg"], ".3f"),
                                  cell(r["best_k"], "g"), cell(r["best_ndcg"], ".3f"),
                                  ", ".join(f"k={k}: {v:.3f}" for k, v in r["grid"].items()) or "-"] for r in rules])


def plot(prows, srows, out):
    plt = pyplot()
    if plt is None:
        return []
    written = []
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for r in prows:
        steps = sorted(r["curve"])
        ls = "-" if not r["flags"] else "--"
        for ax, key in zip(axes, ("mean_row_l2", "logit_rms", "splade_active_terms")):
            ax.plot(steps, [r["curve"][s][key] for s in steps], marker=".", ls=ls, label=r["run"])
    for ax, title in zip(axes, ("MLM head: mean row L2 of W_head", "logit RMS on held-out text",
                                "terms a SPLADE vector of one text activates")):
        ax.set(xlabel="pretraining step", title=title)
    axes[0].legend(fontsize=7)
    save(fig, out / "head_norms.png", dpi=110)
    written.append(out / "head_norms.png")
    if srows:
        fig, ax = plt.subplots(figsize=(6, 4))
        for b in dict.fromkeys(r["condition"] for r in srows):
            pts = sorted((r["k"], r["after"]["nDCG@10"], r["k_rule"]) for r in srows
                         if r["condition"] == b and r["after"].get("nDCG@10") is not None and r["k"] is not None)
            if pts:
                line = ax.plot([p[0] for p in pts if not p[2]], [p[1] for p in pts if not p[2]], marker="o", label=b)
                ax.scatter([p[0] for p in pts if p[2]], [p[1] for p in pts if p[2]], marker="*", s=160,
                           color=line[0].get_color(), zorder=3)
        ax.set(xscale="log", xlabel="k (star: the rule's)", ylabel="Cranfield nDCG@10 after SPLADE training",
               title="SPLADE on the pretrained backbones")
        ax.legend(fontsize=8)
        save(fig, out / "splade_ndcg.png", dpi=110)
        written.append(out / "splade_ndcg.png")
    return written


# ------------------------------------------------------------------------------------------------


def k_target_of(C, S):
    """The rule's target of the SPLADE recipe (train_splade.py's k_target)."""
    import train_splade
    return cli.parse_config(train_splade.DEFAULTS, [str(S["train_config"]), *C["train_args"]],
                            words={"k": ("auto",)})["k_target"]


def configs_of(C, out):
    """{pretraining run: the config train_lm.py runs it with}."""
    return {name: parsed(pretrain_argv(C, out, name, run)) for name, run in pretraining_runs(C).items()}


def check(C):
    C["tokenizer"] = str(local(C["tokenizer"], "tokenizer"))
    splade_runs(C, configs_of(C, Path(C["out_dir"])))   # names a bad ablation, backbone or k now


def plan(C, out):
    """The corpus, the pretraining runs, and the SPLADE runs of each backbone whose pretraining has
    finished (the runner asks again once it has)."""
    texts = [str(local(t.strip(), "text")) for t in C["text"].split(",") if t.strip()]
    corpus = Job("corpus", "data/fineweb_edu.py", ["--out", str(out / "corpus"), "--input", *texts, "--tokenizer",
                                                   C["tokenizer"], "--delimiter", C["delimiter"], "--shard-tokens",
                                                   str(C["shard_tokens"]), "--workers", "0"],
                 done=lambda: corpus_done(out), log=out / "logs" / "corpus.log", output=out / "corpus")
    pretraining = {name: pretrain_job(f"pretrain {name}", pretrain_argv(C, out, name, run),
                                      out / "logs" / f"pretrain_{name}.log", needs=["corpus"])
                   for name, run in pretraining_runs(C).items()}
    jobs = [corpus, *pretraining.values()]
    ready = [r for r in splade_runs(C, configs_of(C, out))
             if corpus.finished() and pretraining[r["backbone"]].finished()]
    if ready:
        S, splade_out = splade_config(C, out), out / "splade"
        splade_out.mkdir(exist_ok=True)
        pairs = splade_out / "pairs.tsv"
        P.write_pairs(P.beir_folders(C["train_beir"]), pairs)
        step0 = P.prepare_step0(S, ready, splade_out, k_target_of(C, S))
        jobs += P.jobs(S, ready, splade_out, pairs, step0)
    return jobs


def report(C, out, outcome):
    if "corpus" in outcome.failed:
        raise SystemExit(f"error: the corpus failed (see {out / 'logs' / 'corpus.log'})")
    configs, S, splade_out = configs_of(C, out), splade_config(C, out), out / "splade"
    k_target = k_target_of(C, S)
    heads = record_heads(C, out, {n: c for n, c in configs.items() if (Path(c["out_dir"]) / "checkpoints").exists()},
                         k_target) if corpus_done(out) else {}
    ready = [r for r in splade_runs(C, configs) if (Path(r["init"]) / "model.safetensors").exists()]
    failed = {**{name: f"exit {rc}" for name, rc in outcome.failed.items()}, **P.failures(outcome)}
    srows = P.collect(ready, splade_out, P.known_step0(S, ready, splade_out, k_target), failed)
    prows = pretraining_rows(C, configs, heads, pretraining_runs(C))
    rules = rule_rows(srows)
    invocations = outcome.history.get("invocations", [])
    md = ("## Pretraining: the head at the last checkpoint (step 0: the initialisation)\n\n" + pretraining_table(prows)
          + "\n## SPLADE on each backbone (Cranfield, before -> after training)\n\n" + P.table(srows)
          + "\n## The rule for k against the grid\n\n" + rule_table(rules)
          + f"\nk_target = {k_target:g}; wall time {sum(i['seconds'] for i in invocations) / 60:.1f} min over "
            f"{len(invocations)} invocation(s).\n")
    record = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in C.items()}, "k_target": k_target,
              "pretraining": prows, "splade": srows, "rule_vs_grid": rules, "failed": failed}
    return Report(md, record, plots=lambda: plot(prows, srows, out))


DRIVER = Driver(__file__, DEFAULTS, plan, report, check=check)


def main(argv=None):
    return DRIVER.main(argv)


if __name__ == "__main__":
    cli.run_cli(main)
