"""The rescaling paper's real case at CPU scale: MLM heads made large by how they were pretrained, not by
a multiplication. Tiny BERT, ModernBERT and EuroBERT backbones, each with its family's published recipe
scaled down (configs/repro_heads_*.py say where each value comes from), are pretrained with train_lm.py on
the same text, tokenizer, token budget, batches and seed; the head's norms and the logits' scale are
measured at every checkpoint; then SPLADE (experiments/splade_protocol.py: CACM + CISI title -> abstract
pairs, Cranfield) runs on each backbone for the grid of k and for train_splade.py's rule (--k=auto).

    python experiments/repro_heads.py configs/repro_heads.py
    python experiments/repro_heads.py configs/repro_heads.py --action=table     # collect only

Under out_dir: corpus/, pretrain/<run>/, transplant/<name>/, heads.json (per run and checkpoint: the head's
norms, the logits' scale, the terms a SPLADE vector activates, the rule's k, the MLM loss on a fixed probe),
splade/, results.json, results.md and the plots. Resumable: the same command continues.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

import hashlib
import json
import math

import numpy as np
import torch
import torch.nn.functional as F

import cli
import train_lm
from checkpoint import read_log
from cli import ConfigError
from data import manifest
from data.atomic import write_json
from data.shards import read_shard, shard_paths
from eval.plots import save
from experiments import splade_protocol as P
from experiments.pretraining import checkpoint, parsed, pretrain_job, pretrained
from experiments.runner import Driver, Job, Report, cell, committed_rows, markdown_table, pyplot, time_line
from model import scale_problem

ROOT = Path(__file__).resolve().parents[1]

DEFAULTS = dict(
    out_dir="out/repro_heads",
    # pretraining data: the same text and tokenizer for every recipe
    text="data/repro/text/movie_reviews.txt,data/repro/ir/cacm/corpus.jsonl,data/repro/ir/cisi/corpus.jsonl",
    tokenizer="data/repro/models/splade-tiny",  # a tokenizer.json or its folder (SPLADE reads its vocabulary)
    delimiter="[CLS]",        # written before every document
    shard_tokens=200_000,     # the first shard is the held-out one
    # the backbones
    recipes={"bert": "configs/repro_heads_bert.py", "modernbert": "configs/repro_heads_modernbert.py",
             "eurobert": "configs/repro_heads_eurobert.py"},
    ablations={},             # name -> (recipe, [train_lm flags]): one recipe value switched
    init="",                  # a checkpoint every run continues (train_lm --init_from); "": from scratch
    transplants={},           # name -> (body run, head run[, [head_transplant.py flags]]): a backbone
    pretrain_args=[],         # extra train_lm.py flags for every pretraining run, e.g. ["--max_steps=20"]
    heads_tokens=4096,        # held-out tokens the logits' scale is measured on (sequences of 128)
    # SPLADE on the backbones (experiments/splade_protocol.py)
    splade_backbones=["bert", "modernbert", "eurobert"],   # runs or transplants; "run@step": that checkpoint of a run
    ks=[1, 4, 16, "auto"],    # "auto": train_splade.py's rule, k = the head's mean row L2 / k_target
    splade_seeds=[],          # more train_splade.py seeds per condition (--seed=S: runs <run>_s<S>)
    backbone_ks={},           # backbone -> its own ks instead of `ks` (a diagnosis needs fewer)
    backbone_seeds={},        # backbone -> its own splade_seeds (a diagnosis may run the config's seed alone)
    k_bias_backbones=[],      # backbones run again with k dividing the decoder bias too (condition <b>+k_bias)
    dev_beir="",              # BEIR folders (comma-separated) every run is evaluated on too, to choose k on
    dev_max_len=0,            # tokens per document of the dev_beir evaluations (0: eval_max_len)
    eval_every_k=True,        # False (with dev_beir): eval_beir at k = 1, the rule's k and the chosen k only
    step0_eval=True,          # evaluate every distinct starting model (step 0) on eval_beir too
    long_arm={},              # dict(backbones=[...], max_steps=400, ks=[1, "dev"]): trained longer at each k
                              # ("dev": the k chosen on dev_beir), once dev_beir has chosen
    rule_k_registered={},     # backbone -> the k the rule gives it, written down before its SPLADE runs
    untie_head=False,         # untie a tied head before dividing it, so that k changes the head alone
    gate_nats=1.0, gate_ndcg=0.15,   # a backbone's gate: its MLM loss this far below the unigram model's, and
                                     # SPLADE from it at least this Cranfield nDCG@10 in its best condition
    train_beir="data/repro/ir/cacm,data/repro/ir/cisi", eval_beir="data/repro/ir/cranfield",
    train_config="configs/repro_splade_train.py",
    train_args=[],            # extra train_splade.py flags for every SPLADE run
    k_bias=False,
    eval_max_len=128, eval_query_max_len=64, eval_batch_size=32,
    # execution
    jobs=1, threads=1,        # processes at a time (0: everything in this process, in order); threads of each
    action="all",             # all | table (collect what exists, run nothing)
)
SEQ = 128  # tokens per held-out text of the logits' measurement (at most the model's max_seq_len)
CHOSEN_FROM = ("grid", "k_bias")   # the variants whose runs the dev benchmarks choose a k among


def local(value, what):
    return P.local_path(value if Path(value).is_absolute() or Path(value).exists() else ROOT / value, what)


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


def pretrain_argv(C, out, name, run):
    corpus = out / "corpus"
    return [run[1], f"--out_dir={out / 'pretrain' / name}", f"--train_shards={corpus / 'corpus_train_*.bin'}",
            f"--val_shards={corpus / 'corpus_val_*.bin'}", f"--tokenizer={C['tokenizer']}",
            *([f"--init_from={C['init']}"] if C["init"] else []), *C["pretrain_args"], *run[2]]


def transplant_runs(C, configs):
    """{name: (body run, head run, [head_transplant flags])}, checked against the pretraining runs."""
    found = {}
    for name, spec in C["transplants"].items():
        if not (isinstance(spec, (list, tuple)) and len(spec) in (2, 3) and all(r in configs for r in spec[:2])
                and (len(spec) == 2 or isinstance(spec[2], (list, tuple)))) or name in configs:
            raise ConfigError(f"transplants[{name!r}] = {spec!r}: give (body run, head run[, [head_transplant.py "
                              f"flags]]) of the pretraining runs {sorted(configs)}, under a name none of them has")
        found[name] = (spec[0], spec[1], list(spec[2]) if len(spec) == 3 else [])
    return found


def backbones(C, out, configs):
    """{backbone: its model folder}: each pretraining run's final checkpoint, transplant, and "run@step"."""
    found = {name: str(checkpoint(cfg, cfg["max_steps"]) / "model") for name, cfg in configs.items()}
    found.update({name: str(out / "transplant" / name / "model") for name in transplant_runs(C, configs)})
    for b in C["splade_backbones"]:
        run, at, step = b.partition("@")
        if not (at and run in configs):
            continue
        cfg = configs[run]
        every, last, keep = cfg["ckpt_interval"], cfg["max_steps"], cfg["keep_checkpoints"]
        if not (step.isdigit() and 0 < int(step) <= last and int(step) % every == 0):
            raise ConfigError(f"splade_backbones: {b!r}: {run} keeps a checkpoint every {every} steps up to {last}; "
                              "give one of them")
        # said before pretraining: the run deletes all but its newest keep_checkpoints as it goes
        saved = sorted({*range(every, last + 1, every), last})
        gone = pretrained(cfg) and not checkpoint(cfg, int(step)).is_dir()
        if int(step) not in saved[-keep:] or gone:
            raise ConfigError(f"splade_backbones: {b!r}: {run}'s checkpoint of step {step} is pruned "
                              f"{'(it is gone from its out_dir)' if gone else 'while it pretrains'} (keep_checkpoints="
                              f"{keep}: steps {', '.join(map(str, saved[-keep:]))}); give one of those, or set "
                              f"keep_checkpoints={len(saved) - saved.index(int(step))} in its recipe"
                              + (" and pretrain it again (a new out_dir)" if gone else ""))
        found[b] = str(checkpoint(cfg, int(step)) / "model")
    return found


def corpus_done(out):
    return (manifest.read_json(out / "corpus" / "corpus_progress.json") or {}).get("done") is True


def condition_runs(C, models, condition, backbone, ks, extra=None, args=(), seeds=None):
    """The runs of one condition: its backbone at each k and seed, named <condition>_k<k>_s<S> (--seed=S)."""
    runs = []
    seeds = C["backbone_seeds"].get(backbone, C["splade_seeds"]) if seeds is None else seeds
    for k in ks:
        if k != "auto" and scale_problem(k):
            raise ConfigError(f"ks of {condition}: {k!r}: a number > 0 or 'auto'")
        for seed in [None, *seeds]:
            name = f"{condition}_k{'auto' if k == 'auto' else format(k, 'g')}" + ("" if seed is None else f"_s{seed}")
            runs.append(dict(name=name, condition=condition, backbone=backbone, init=models[backbone], head_scale=1.0,
                             k=k, untie=C["untie_head"], seed=seed, **(extra or {}),
                             args=[*args, *([] if seed is None else [f"--seed={seed}"])]))
    return runs


def long_arm(C):
    """(backbones, max_steps, ks, seeds or None: the backbones' own) of the long arm (none without one)."""
    arm = C["long_arm"]
    if not arm:
        return [], 0, [], None
    if not (isinstance(arm, dict) and set(arm) <= {"backbones", "max_steps", "ks", "seeds"} and arm.get("backbones")
            and isinstance(arm.get("max_steps"), int) and arm.get("ks")
            and isinstance(arm.get("seeds", []), (list, tuple))) or ("dev" in arm["ks"] and not C["dev_beir"]):
        raise ConfigError(f"long_arm={arm!r}: give dict(backbones=[...], max_steps=N, ks=[numbers, or 'dev' (the k "
                          "chosen on dev_beir: give dev_beir)], and optionally seeds=[...])")
    return list(arm["backbones"]), arm["max_steps"], list(arm["ks"]), list(arm["seeds"]) if "seeds" in arm else None


def dev_choice(grid, dev_rows):
    """The k of a backbone's grid whose runs score the best mean nDCG@10 on dev_beir over the seeds (a smaller
    k wins a tie); None until every one is scored. dev_rows: {run name: its dev numbers}."""
    means = {}
    for r in grid:
        if r["k"] == "auto":
            continue
        score = (dev_rows.get(r["name"]) or {}).get("nDCG@10")
        if score is None:
            return None
        means.setdefault(r["k"], []).append(score)
    return min(means, key=lambda k: (-sum(means[k]) / len(means[k]), k)) if means else None


def splade_runs(C, configs, out):
    """The protocol's runs: per backbone x k x seed the grid's and the k_bias conditions', each backbone's
    followed by its long arm's once dev_beir has chosen its k. Without eval_every_k, a grid run is evaluated
    on eval_beir at k = 1, the rule's k and the chosen k only."""
    models, runs = backbones(C, out, configs), []
    arm, arm_steps, arm_ks, arm_seeds = long_arm(C)
    for b in C["splade_backbones"]:
        if b not in models:
            raise ConfigError(f"splade_backbones: {b!r} is not a pretraining run or a transplant ({sorted(models)})")
    for key, names in (("backbone_ks", C["backbone_ks"]), ("backbone_seeds", C["backbone_seeds"]),
                       ("k_bias_backbones", C["k_bias_backbones"]), ("long_arm", arm)):
        for b in names:
            if b not in C["splade_backbones"]:
                raise ConfigError(f"{key}: {b!r} is not one of splade_backbones {C['splade_backbones']}")
    for b in C["splade_backbones"]:
        ks = C["backbone_ks"].get(b, C["ks"])
        runs += condition_runs(C, models, b, b, ks, dict(variant="grid"))
        if b in C["k_bias_backbones"]:
            runs += condition_runs(C, models, f"{b}+k_bias", b, ks, dict(variant="k_bias", k_bias=True))
    chosen = {}
    if C["dev_beir"]:
        # a run's dev numbers from its metrics.json, else from its committed row: a later session (whose out/ lost
        # them) still knows the chosen k, so it plans the long arm and the chosen k's evaluation
        committed = {r.get("run"): r.get("dev") for r in committed_rows(out)}
        dev = {r["name"]: P.eval_numbers(manifest.read_json(out / "splade" / r["name"] / "dev" / "metrics.json"))
               or committed.get(r["name"]) for r in runs}
        chosen = {c: dev_choice([r for r in runs if r["condition"] == c], dev)
                  for c in dict.fromkeys(r["condition"] for r in runs)}
        for r in [] if C["eval_every_k"] else runs:
            r["eval"] = r["k"] in (1, "auto") or r["k"] == chosen[r["condition"]]
    for b in arm:
        wanted = [chosen.get(b) if k == "dev" else k for k in arm_ks]
        if None in wanted:
            continue  # dev_beir has not chosen this backbone's k yet
        after = max(i for i, r in enumerate(runs) if r["backbone"] == b) + 1
        runs[after:after] = condition_runs(C, models, f"{b}_{arm_steps}steps", b, list(dict.fromkeys(wanted)),
                                           dict(variant="long", chosen_k=chosen.get(b), dev=False),
                                           args=[f"--max_steps={arm_steps}"], seeds=arm_seeds)
    return runs


def splade_config(C, out):
    """The settings the protocol reads, for this experiment's SPLADE runs."""
    S = dict(C, out_dir=str(out / "splade"))
    S["train_config"], S["eval_beir"] = local(C["train_config"], "train_config"), local(C["eval_beir"], "eval_beir")
    if C["dev_beir"]:
        S["dev_beir"] = ",".join(str(local(f.strip(), "dev_beir")) for f in C["dev_beir"].split(",") if f.strip())
        S["dev_max_len"] = C["dev_max_len"] or C["eval_max_len"]
    return S


# The yardstick of every backbone's MLM loss, whatever its recipe masked: BERT's rule (15 % of the
# non-special tokens, 80 % [MASK] / 10 % random / 10 % unchanged), one draw for every backbone
PROBE_MASKING = dict(ratio=0.15, selection="token", replacement="80_10_10")
PROBE_SEED = 0
HEAD_RECORD = 2  # the version of head_record's fields (2: the shared part of the rows); another is measured again


def mlm_probe(ids, cfg):
    """(inputs, labels) of the held-out texts `ids` under PROBE_MASKING, the same for every backbone."""
    never = torch.tensor(sorted({i for i in (cfg["bos_id"], cfg["eos_id"], cfg["pad_id"], cfg["mask_id"]) if i >= 0}))
    spec = train_lm.Masking(mask_id=cfg["mask_id"], never_mask=never, vocab_size=cfg["vocab_size"], **PROBE_MASKING)
    return train_lm.mlm_mask(ids, spec, torch.Generator().manual_seed(PROBE_SEED))


def unigram_loss(train_glob, labels, vocab_size):
    """The loss of the training tokens' unigram model (add-one counts) on the probe's masked tokens."""
    counts = np.zeros(vocab_size, dtype=np.float64)
    for path in shard_paths(train_glob):
        counts += np.bincount(read_shard(path), minlength=vocab_size)[:vocab_size]
    y = labels[labels != -100].numpy()
    return float(-np.log((counts[y] + 1) / (counts.sum() + vocab_size)).mean())


@torch.no_grad()
def head_record(model, ids, k_target, probe):
    """The head's norms, the logits' scale on held-out texts `ids` (n, SEQ), the terms a SPLADE vector
    of one text activates and the MLM loss on `probe` (mlm_probe's inputs and labels)."""
    from model import auto_k, head_norms, mlm_head_weight, splade_pool
    model.eval()
    n = head_norms(model)
    rows = mlm_head_weight(model).float()
    shared = rows.mean(0)   # what every row holds in common: a head can grow by it alone, not by a scale
    sq, top, pos, count, active, nll, masked = 0.0, 0.0, 0.0, 0, [], 0.0, 0
    for i, chunk in enumerate(ids.split(4)):  # 4 x 128 x V logits at a time
        logits = model(chunk).float()
        sq += (logits ** 2).sum().item()
        top += logits.max(-1).values.sum().item()
        pos += (logits > 0).sum().item()
        count += logits.shape[0] * logits.shape[1]
        active += (splade_pool(model, chunk, torch.ones_like(chunk)) > 0).sum(1).tolist()
        x, y = (t.split(4)[i] for t in probe)
        nll += F.cross_entropy(model(x).float().flatten(0, 1), y.flatten(), reduction="sum").item()
        masked += int((y != -100).sum())
    V = logits.shape[-1]
    return {"mean_row_l2": n["mean_row_l2"], "frobenius": n["frobenius"], "bias_l2": n["bias_l2"], "tied": n["tied"],
            "shared_row_l2": shared.norm().item(), "centred_row_l2": (rows - shared).norm(dim=1).mean().item(),
            "logit_rms": math.sqrt(sq / (count * V)), "logit_max_mean": top / count,
            "logit_positive": pos / (count * V),
            "splade_active_terms": sum(active) / len(active), "rule_k": auto_k(model, k_target),
            "family": model.config.model_type, **({"mlm_loss": nll / masked} if masked else {})}


def initial_model(cfg):
    """The model every run of this recipe starts from: train_lm's initialisation from its seed."""
    from model import Transformer
    model = Transformer(train_lm.model_config(cfg))
    model.init_weights(torch.Generator().manual_seed(cfg["seed"]))
    return model


def held_out_texts(C, out, cfg):
    """The first heads_tokens held-out tokens as texts of SEQ tokens (n, SEQ)."""
    val = read_shard(out / "corpus" / "corpus_val_000000.bin")
    seq = min(SEQ, cfg["max_seq_len"])
    n = min(C["heads_tokens"], len(val)) // seq
    if n < 1:
        raise ConfigError(f"the held-out shard has {len(val)} tokens, fewer than one text of {seq}")
    return torch.from_numpy(val[:n * seq].astype("int64")).view(n, seq)


def content_key(folder, measured, train_lm_config=None):
    """What a head record was measured on, by content: a model folder's files (None: the initialisation a
    train_lm config draws), the held-out texts, the probe and k_target (`measured`), the record's version."""
    model = (manifest.identity(folder) if folder is not None
             else [repr(train_lm.model_config(train_lm_config)), train_lm_config["seed"]])
    ids, probe, k_target = measured
    tensors = hashlib.sha256(b"".join(t.numpy().tobytes() for t in (ids, *probe))).hexdigest()
    what = [model, tensors, k_target, HEAD_RECORD]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def record_heads(C, out, configs, k_target):
    """heads.json: {run: {step: record}}, each checkpoint measured once (content_key); step 0 is the
    model the run started from (init, or the seed's initialisation); a transplant is measured at its
    body's last step. "unigram": {run: the unigram model's loss on its probe's tokens}."""
    from hf.models import from_pretrained
    path, models = out / "heads.json", backbones(C, out, configs)
    heads = manifest.read_json(path) or {}
    arch = from_pretrained(C["init"]).config if C["init"] else None  # a continued run's model is the checkpoint's
    todo = {}   # {name: (config, {step: model folder, None: the seed's initialisation})}
    for name, cfg in configs.items():
        ckpts = Path(cfg["out_dir"]) / "checkpoints"
        steps = sorted(int(p.name.split("_")[1]) for p in ckpts.glob("step_*")
                       if p.name.split("_")[1].isdigit() and (p / "model" / "model.safetensors").exists())
        if ckpts.exists():
            todo[name] = (cfg, {0: C["init"] or None, **{s: checkpoint(cfg, s) / "model" for s in steps}})
    for name, (body, _, _) in transplant_runs(C, configs).items():
        if (Path(models[name]) / "model.safetensors").exists():
            todo[name] = (configs[body], {configs[body]["max_steps"]: Path(models[name])})
    for name, (cfg, folders) in todo.items():
        if arch is not None:
            cfg = {**cfg, "vocab_size": arch.vocab_size, "max_seq_len": arch.max_seq_len}
        ids = held_out_texts(C, out, cfg)
        probe = mlm_probe(ids, cfg)
        mine = heads.setdefault(name, {})
        for step, folder in folders.items():
            source = content_key(folder, (ids, probe, k_target), train_lm_config=None if folder else cfg)
            if mine.get(str(step), {}).get("source") != source:
                model = from_pretrained(folder) if folder else initial_model(cfg)
                mine[str(step)] = {**head_record(model, ids, k_target, probe), "source": source}
        if name in configs:
            heads.setdefault("unigram", {})[name] = unigram_loss(cfg["train_shards"], probe[1], cfg["vocab_size"])
        else:
            heads[name] = {str(step): mine[str(step)] for step in folders}
        write_json(path, heads)
    return heads


def pretraining_rows(C, configs, heads, runs):
    """One row per pretraining run and per transplant: its settings, the head at every recorded step."""
    rows, unigram = [], heads.get("unigram", {})
    described = {name: (runs[name][0], runs[name][2], name, cfg, cfg) for name, cfg in configs.items()}
    described.update({name: (f"body {b}, head {h}" + "".join(f" {f}" for f in flags), [], b, configs[b], configs[h])
                      for name, (b, h, flags) in transplant_runs(C, configs).items()})
    for name, (recipe, flags, body, cfg, head_cfg) in described.items():
        mine = heads.get(name, {})
        steps = sorted(int(s) for s in mine)
        first, last = (mine[str(steps[0])], mine[str(steps[-1])]) if steps else ({}, {})
        log = Path(cfg["out_dir"]) / "log.jsonl"
        losses = ({r["step"]: r["val_loss"] for r in read_log(log) if "val_loss" in r}
                  if name in configs and log.exists() else {})
        rows.append(dict(run=name, recipe=recipe, flags=flags, family=last.get("family", cfg["family"]),
                         transplant=name not in configs, tied=last.get("tied"), lr=head_cfg["lr"],
                         weight_decay=head_cfg["weight_decay"], decay_params=head_cfg["decay_params"],
                         decay_per_step=head_cfg["lr"] * head_cfg["weight_decay"],
                         mask=f"{head_cfg['mask_ratio']:g} {head_cfg['mask_replacement']}",
                         steps=steps[-1] if steps else 0, start=first, final=last,
                         final_val_loss=losses[max(losses)] if losses else None,
                         unigram_loss=unigram.get(body), curve={str(s): mine[str(s)] for s in steps}))
    return rows


def arrow(a, b, key, spec):
    return f"{cell(a.get(key), spec)} -> {cell(b.get(key), spec)}"


def heads_table(rows):
    """The head of each pretraining run and transplant at its last checkpoint, beside where it started."""
    head = ["backbone", "recipe", "head row L2, step 0 -> end", "its shared part (the mean row)", "bias L2",
            "MLM loss (15 % probe)", "the rule's k"]
    cells = []
    for r in rows:
        a, b = {} if r["transplant"] else r["start"], r["final"]
        flags = " ".join(f.removeprefix("--") for f in r["flags"])
        cells.append([r["run"], r["recipe"] + (f", {flags}" if flags else ""),
                      *(arrow(a, b, key, ".3f") if a else cell(b.get(key), ".3f")
                        for key in ("mean_row_l2", "shared_row_l2")),
                      cell(b.get("bias_l2"), ".0f"), cell(b.get("mlm_loss"), ".3f"), cell(b.get("rule_k"), ".2f")])
    return markdown_table(head, cells)


def pretraining_table(rows):
    head = ["run", "family", "tied", "lr", "decay per step (lr x wd)", "decayed", "mask", "steps",
            "head row L2, step 0 -> end", "its shared part (mean row), step 0 -> end", "centred row L2",
            "Frobenius", "bias L2", "logit RMS", "mean max logit", "logits > 0",
            "SPLADE terms / text", "rule's k", "MLM loss (15 % probe), step 0 -> end", "final val loss (own masking)"]
    cells = []
    for r in rows:
        a, b = {} if r["transplant"] else r["start"], r["final"]
        cells.append([f"{r['run']} ({r['recipe']})" if r["transplant"] else r["run"], r["family"],
                      "-" if r["tied"] is None else ("tied" if r["tied"] else "untied"),
                      f"{r['lr']:g}", f"{r['decay_per_step']:.1e}", r["decay_params"], r["mask"], str(r["steps"]),
                      arrow(a, b, "mean_row_l2", ".3f"), arrow(a, b, "shared_row_l2", ".3f"),
                      cell(b.get("centred_row_l2"), ".3f"), cell(b.get("frobenius"), ".1f"),
                      cell(b.get("bias_l2"), ".2f"), arrow(a, b, "logit_rms", ".2f"),
                      cell(b.get("logit_max_mean"), ".2f"), cell(b.get("logit_positive"), ".3f"),
                      arrow(a, b, "splade_active_terms", ".0f"), cell(b.get("rule_k"), ".2f"),
                      arrow(a, b, "mlm_loss", ".3f"), cell(r["final_val_loss"], ".3f")])
    return markdown_table(head, cells)


def mean_sd(values):
    """(mean, sample standard deviation or None for one value) of the values that exist."""
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return mean, sd


STATS = {"ndcg_before": lambda r: r["before"].get("nDCG@10"), "ndcg": lambda r: r["after"].get("nDCG@10"),
         "recall": lambda r: r["after"].get("R@100"), "flops": lambda r: r["after"].get("flops"),
         "dev_ndcg": lambda r: (r.get("dev") or {}).get("nDCG@10"),
         "dev_flops": lambda r: (r.get("dev") or {}).get("flops"),
         "step0_loss": lambda r: r["step0_loss"],
         "final_loss": lambda r: r["final_loss"]}


def condition_rows(srows):
    """One row per condition x k: its seeds' runs as mean (<stat>_0) and sd (<stat>_1) of STATS."""
    groups = {}
    for r in srows:
        groups.setdefault((r["condition"], "auto" if r["k_rule"] else r["k"]), []).append(r)
    out = []
    for (condition, k), rows in groups.items():
        done = [r for r in rows if r["status"] == "done"]
        stat = {name: mean_sd([get(r) for r in done]) for name, get in STATS.items()}
        out.append(dict(backbone=condition, of=rows[0].get("backbone", condition),
                        variant=rows[0].get("variant", "grid"), k=k,
                        rule_k=rows[0]["k"] if k == "auto" else None, steps=max(r["steps"] for r in rows),
                        head_row_l2=rows[0]["head_row_l2"], seeds=[r.get("seed") for r in done],
                        runs=len(rows), done=len(done), collapse=sorted({r["collapse"] or "-" for r in done}),
                        **{f"{n}_{i}": v[i] for n, v in stat.items() for i in (0, 1)}))
    return out


def _pm(mean, sd, spec=".3f"):
    return "-" if mean is None else format(mean, spec) + ("" if sd is None else f" ± {format(sd, spec)}")


def pm(row, stat, spec=".3f"):
    """A condition row's mean ± sd of `stat`."""
    return _pm(row.get(f"{stat}_0"), row.get(f"{stat}_1"), spec)


def condition_table(rows):
    head = ["condition", "k", "steps", "head row L2", "seeds", "step-0 loss", "loss, last 10 steps", "nDCG@10 step 0",
            "nDCG@10 after", "dev nDCG@10 after", "R@100 after", "FLOPS after", "dev FLOPS after",
            "collapse flag (steps)"]
    return markdown_table(head, [
        [r["backbone"], f"rule: {r['rule_k']:.2f}" if r["k"] == "auto" and r["rule_k"] else f"{r['k']}",
         str(r["steps"]), cell(r["head_row_l2"], ".3f"), f"{r['done']}/{r['runs']}",
         *(pm(r, s) for s in ("step0_loss", "final_loss", "ndcg_before", "ndcg", "dev_ndcg", "recall")),
         pm(r, "flops", ".1f"), pm(r, "dev_flops", ".1f"), "; ".join(r["collapse"])] for r in rows])


def chosen_ks(C, srows):
    """{condition of CHOSEN_FROM: the k dev_choice picks once all its runs are done, else None}."""
    if not C["dev_beir"]:
        return {}
    out = {}
    for c in dict.fromkeys(r["condition"] for r in srows if r.get("variant") in CHOSEN_FROM):
        mine = [r for r in srows if r["condition"] == c]
        done = all(r["status"] == "done" for r in mine)
        out[c] = dev_choice([dict(name=r["run"], k="auto" if r["k_rule"] else r["k"]) for r in mine],
                            {r["run"]: r.get("dev") for r in mine}) if done else None
    return out


def gate_rows(C, prows, crows, chosen):
    """Per SPLADE backbone, the gate it must pass before its rescaling table says anything: (a) its MLM
    loss at least gate_nats below the unigram model's (it uses context), (b) SPLADE from it reaches
    gate_ndcg nDCG@10 on eval_beir in its best condition (the k chosen on dev_beir, with it)."""
    out = []
    for b in C["splade_backbones"]:
        run, at, step = b.partition("@")
        p = next((r for r in prows if r["run"] == run), {})
        mlm = (p.get("curve", {}).get(str(step), {}) if at else p.get("final", {})).get("mlm_loss")
        unigram = p.get("unigram_loss")
        grid = [r for r in crows if r["backbone"] == b and r["variant"] == "grid" and r["ndcg_0"] is not None]
        best = (next((r for r in grid if r["k"] == chosen.get(b)), None) if C["dev_beir"]
                else max(grid, key=lambda r: r["ndcg_0"], default=None))
        margin = unigram - mlm if mlm is not None and unigram is not None else None
        out.append(dict(backbone=b, mlm_loss=mlm, unigram_loss=unigram, margin=margin,
                        best_k=None if best is None else (f"rule: {best['rule_k']:.2f}" if best["k"] == "auto"
                                                          else best["k"]),
                        best_ndcg=None if best is None else best["ndcg_0"],
                        best_sd=None if best is None else best["ndcg_1"],
                        context=None if margin is None else margin >= C["gate_nats"],
                        retrieves=None if best is None else best["ndcg_0"] >= C["gate_ndcg"]))
    return out


def gate_table(C, rows):
    def yes(v):
        return "-" if v is None else ("yes" if v else "**no**")
    which = "chosen on dev_beir" if C["dev_beir"] else "best condition"
    head = ["backbone", "MLM loss (15 % probe)", "unigram model", "nats below it",
            f"(a) >= {C['gate_nats']:g}", f"k {which}", "its nDCG@10", f"(b) >= {C['gate_ndcg']:g}"]
    return markdown_table(head, [[r["backbone"], cell(r["mlm_loss"], ".3f"), cell(r["unigram_loss"], ".3f"),
                                  cell(r["margin"], ".2f"), yes(r["context"]),
                                  "-" if r["best_k"] is None else f"k = {r['best_k']}",
                                  _pm(r["best_ndcg"], r.get("best_sd")), yes(r["retrieves"])] for r in rows])


def grid_table(C, crows, chosen, metric="ndcg"):
    """Backbone x k, mean ± sd over the seeds of nDCG@10 on eval_beir (metric "ndcg") or on dev_beir
    ("dev_ndcg"); the rule's k and, with dev_beir, the k chosen there and the metric at it."""
    grid = [r for r in crows if r["variant"] in CHOSEN_FROM]
    ks = sorted({r["k"] for r in grid if r["k"] != "auto"})
    head = ["backbone", "seeds", *[f"k = {k:g}" for k in ks], "the rule's k"]
    if C["dev_beir"]:
        head += ["k chosen on dev", "its nDCG@10" if metric == "ndcg" else "its dev nDCG@10"]
    cells = []
    for b in dict.fromkeys(r["backbone"] for r in grid):
        mine = {r["k"]: r for r in grid if r["backbone"] == b}
        auto = mine.get("auto")
        row = [b, str(max(r["runs"] for r in mine.values())), *[pm(mine[k], metric) if k in mine else "-" for k in ks],
               f"{auto['rule_k']:.2f}: {pm(auto, metric)}" if auto and auto["rule_k"] else "-"]
        if C["dev_beir"]:
            k = chosen.get(b)
            row += ["-" if k is None else f"{k:g}", pm(mine[k], metric) if k in mine else "-"]
        cells.append(row)
    return markdown_table(head, cells)


def rule_rows(C, crows, chosen):
    """Per backbone: the k the rule was registered to pick before the runs, the k it picked, the grid's
    k nearest to it (in log k), and the k dev_beir chose (or the grid's best), each with its nDCG@10."""
    out = []
    for b in dict.fromkeys(r["backbone"] for r in crows if r["variant"] == "grid"):
        mine = {r["k"]: r for r in crows if r["backbone"] == b and r["variant"] == "grid"}
        auto, grid = mine.get("auto") or {}, sorted(k for k in mine if k != "auto")
        rule_k = auto.get("rule_k")
        nearest = min(grid, key=lambda k: abs(math.log(k / rule_k))) if grid and rule_k else None
        k = chosen.get(b) if C["dev_beir"] else max(grid, key=lambda k: mine[k]["ndcg_0"] or 0, default=None)
        pick = mine.get(k) or {}
        out.append(dict(backbone=b, registered=C["rule_k_registered"].get(b), rule_k=rule_k,
                        rule_ndcg=auto.get("ndcg_0"), rule_sd=auto.get("ndcg_1"), rule_dev=auto.get("dev_ndcg_0"),
                        nearest_k=nearest, chosen_k=k, chosen_dev=pick.get("dev_ndcg_0"),
                        chosen_ndcg=pick.get("ndcg_0"), chosen_sd=pick.get("ndcg_1")))
    return out


def rule_table(C, rules):
    dev = C["dev_beir"]
    head = ["backbone", "k registered before the runs", "the rule's k", "nDCG@10 with it",
            *(["dev nDCG@10 with it"] if dev else []), "grid's k nearest it",
            "k chosen on dev" if dev else "grid's best k", "its nDCG@10"]
    cells = []
    for r in rules:
        chosen = _pm(r["chosen_ndcg"], r["chosen_sd"])
        cells.append([r["backbone"], cell(r["registered"], ".2f"), cell(r["rule_k"], ".2f"),
                      _pm(r["rule_ndcg"], r["rule_sd"]), *([cell(r["rule_dev"], ".3f")] if dev else []),
                      cell(r["nearest_k"], "g"), cell(r["chosen_k"], "g"),
                      f"{chosen} (dev {cell(r['chosen_dev'], '.3f')})" if dev else chosen])
    return markdown_table(head, cells)


def long_table(C, crows):
    """The long arm beside the grid: the same backbone and k after the grid's steps and after max_steps."""
    arm, steps, _, _ = long_arm(C)
    head = ["backbone", "k", "nDCG@10 after the grid's steps", f"after {steps}", "loss, last 10 steps: grid's",
            f"{steps}", "FLOPS: grid's", f"{steps}"]
    cells = []
    for r in [r for r in crows if r["variant"] == "long"]:
        short = next((g for g in crows if g["variant"] == "grid" and g["backbone"] == r["of"] and g["k"] == r["k"]), {})
        cells.append([r["of"], f"{r['k']:g}", pm(short, "ndcg"), pm(r, "ndcg"), pm(short, "final_loss"),
                      pm(r, "final_loss"), _pm(short.get("flops_0"), None, ".1f"), _pm(r["flops_0"], None, ".1f")])
    return markdown_table(head, cells) if arm else ""


def plot(prows, crows, out):
    plt = pyplot()
    if plt is None:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for r in prows:
        steps = sorted(r["curve"], key=int)
        ls = "--" if r["flags"] else ":" if r["transplant"] else "-"
        for ax, key in zip(axes, ("mean_row_l2", "logit_rms", "splade_active_terms")):
            ax.plot([int(s) for s in steps], [r["curve"][s][key] for s in steps], marker=".", ls=ls, label=r["run"])
    for ax, title in zip(axes, ("MLM head: mean row L2 of W_head", "logit RMS on held-out text",
                                "terms a SPLADE vector of one text activates")):
        ax.set(xlabel="pretraining step", title=title)
    axes[0].legend(fontsize=7)
    written = [save(fig, out / "head_norms.png", dpi=110)]
    if not crows:
        return written
    # the grid runs every k on the dev queries (Cranfield only at a few), so the curves are dev's: nDCG@10 against
    # k, and against FLOPS (the expected multiplications per query-document pair, the sparsity's cost)
    fig, (by_k, by_flops) = plt.subplots(1, 2, figsize=(13, 4.4))
    for b in dict.fromkeys(r["backbone"] for r in crows):
        grid = sorted((r["k"], r["dev_ndcg_0"], r["dev_ndcg_1"] or 0, r["dev_flops_0"]) for r in crows
                      if r["backbone"] == b and r["k"] != "auto" and r["dev_ndcg_0"] is not None)
        if not grid:
            continue
        line = by_k.errorbar([g[0] for g in grid], [g[1] for g in grid], yerr=[g[2] for g in grid],
                             marker="o", capsize=3, label=b)
        by_flops.plot([g[3] for g in grid], [g[1] for g in grid], marker="o", color=line[0].get_color(), label=b)
        for k, ndcg, _, flops in grid:
            by_flops.annotate(f"k={k}", (flops, ndcg), fontsize=6, xytext=(3, 3), textcoords="offset points")
        for r in crows:
            if r["backbone"] == b and r["k"] == "auto" and r["dev_ndcg_0"] is not None and r["rule_k"]:
                by_k.scatter([r["rule_k"]], [r["dev_ndcg_0"]], marker="*", s=160, color=line[0].get_color(), zorder=3)
    by_k.set(xscale="log", xlabel="k (star: the rule's; bars: sd over seeds)", ylabel="dev nDCG@10 after SPLADE",
             title="SPLADE on the pretrained backbones: k")
    by_flops.set(xscale="log", xlabel="FLOPS on the dev collections (mean over seeds)", ylabel="dev nDCG@10",
                 title="effectiveness against sparsity")
    by_flops.minorticks_off()
    if by_k.get_legend_handles_labels()[0]:   # no dev rows yet: no curves
        by_k.legend(fontsize=7)
    return [*written, save(fig, out / "splade_ndcg.png", dpi=110)]


def k_target_of(C, S):
    """The rule's target of the SPLADE recipe (train_splade.py's k_target)."""
    import train_splade
    return cli.parse_config(train_splade.DEFAULTS, [str(S["train_config"]), *C["train_args"]],
                            words={"k": ("auto",)})["k_target"]


def configs_of(C, out):
    return {name: parsed(pretrain_argv(C, out, name, run)) for name, run in pretraining_runs(C).items()}


def check(C):
    C["tokenizer"] = str(local(C["tokenizer"], "tokenizer"))
    if C["init"]:
        C["init"] = str(local(C["init"], "init"))
    splade_runs(C, configs_of(C, Path(C["out_dir"])), Path(C["out_dir"]))   # names a bad run, backbone or k now


def plan(C, out):
    """The corpus, the pretraining runs, the transplants, and the SPLADE runs of each backbone that is ready."""
    texts = [str(local(t.strip(), "text")) for t in C["text"].split(",") if t.strip()]
    corpus = Job("corpus", "data/fineweb_edu.py", ["--out", str(out / "corpus"), "--input", *texts, "--tokenizer",
                                                   C["tokenizer"], "--delimiter", C["delimiter"], "--shard-tokens",
                                                   str(C["shard_tokens"]), "--workers", "0"],
                 done=lambda: corpus_done(out), log=out / "logs" / "corpus.log", output=out / "corpus")
    configs = configs_of(C, out)
    made = {name: pretrain_job(f"pretrain {name}", pretrain_argv(C, out, name, run),
                               out / "logs" / f"pretrain_{name}.log", needs=["corpus"])
            for name, run in pretraining_runs(C).items()}
    models = backbones(C, out, configs)
    for name, (body, head, flags) in transplant_runs(C, configs).items():
        folder = Path(models[name])
        made[name] = Job(f"transplant {name}", "experiments/head_transplant.py",
                         ["--body", models[body], "--head", models[head], "--out", str(folder), *flags],
                         needs=[made[body].name, made[head].name], output=folder.parent,
                         done=lambda folder=folder: (folder / "model.safetensors").exists(),
                         log=out / "logs" / f"transplant_{name}.log")
    jobs = [corpus, *made.values()]
    finished = {name for name, job in made.items() if job.finished()} if corpus.finished() else set()  # hashes
    ready = [r for r in splade_runs(C, configs, out) if r["backbone"].partition("@")[0] in finished]
    if ready:
        S, splade_out = splade_config(C, out), out / "splade"
        splade_out.mkdir(exist_ok=True)
        pairs = splade_out / "pairs.tsv"
        P.write_pairs(P.beir_folders(C["train_beir"]), pairs)
        step0 = P.prepare_step0(S, ready, splade_out, k_target_of(C, S)) if C["step0_eval"] else {}
        jobs += P.jobs(S, ready, splade_out, pairs, step0)
    return jobs


STAGES = {"corpus": "corpus", "pretrain": "pretraining", "transplant": "transplants", "train": "SPLADE training",
          "eval": "SPLADE evaluations", "dev": "SPLADE dev evaluations"}


def stage(job):
    """The stage of a job of plan() (its first word, or a SPLADE job's last), for the report's time line."""
    words = job.split(" ")
    return "SPLADE step-0 evaluations" if job.startswith("step0/") else STAGES.get(words[0], STAGES.get(words[-1]))


TITLES = {"heads": "The heads: each backbone's at its last checkpoint",
          "pretraining": "Pretraining: the head at the last checkpoint, every column",
          "gate": "The gate: does the backbone use context, and does SPLADE from it retrieve?",
          "grid": "nDCG@10 on eval_beir after SPLADE, per backbone and k (mean ± sd over the seeds; +k_bias: k "
                  "divides the decoder bias too)",
          "dev grid": "nDCG@10 on dev_beir (the mean over its datasets), per backbone and k",
          "rule": "The rule for k against the grid", "long arm": "The long arm: more SPLADE steps",
          "conditions": "Every condition (mean ± sd over the seeds)",
          "runs": "Every SPLADE run (before -> after training)"}


def tables(record):
    """{name: markdown} from a results record alone (results.json, or the rows committed under docs/results/)."""
    C, srows, prows = record["config"], record["splade"], record["pretraining"]
    crows, chosen = condition_rows(srows), chosen_ks(C, srows)
    made = {"heads": heads_table(prows), "pretraining": pretraining_table(prows),
            "gate": gate_table(C, gate_rows(C, prows, crows, chosen)), "grid": grid_table(C, crows, chosen),
            "dev grid": grid_table(C, crows, chosen, "dev_ndcg") if C["dev_beir"] else "",
            "rule": rule_table(C, rule_rows(C, crows, chosen)), "long arm": long_table(C, crows),
            "conditions": condition_table(crows), "runs": P.table(srows)}
    return {name: text for name, text in made.items() if text}   # dev grid without dev_beir, long arm without one


def report(C, out, outcome):
    configs, S, splade_out = configs_of(C, out), splade_config(C, out), out / "splade"
    k_target = k_target_of(C, S)
    heads = record_heads(C, out, configs, k_target) if corpus_done(out) else {}
    ready = [r for r in splade_runs(C, configs, out) if (Path(r["init"]) / "model.safetensors").exists()]
    failed = {**{name: f"exit {rc}" for name, rc in outcome.failed.items()}, **P.failures(outcome)}
    step0 = P.known_step0(S, ready, splade_out, k_target) if C["step0_eval"] else {}
    srows = P.collect(ready, splade_out, step0, failed, dev=bool(C["dev_beir"]))
    prows = pretraining_rows(C, configs, heads, pretraining_runs(C))
    record = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in C.items()}, "k_target": k_target,
              "pretraining": prows, "splade": srows, "failed": failed}
    made = tables(record)
    crows, chosen = condition_rows(srows), chosen_ks(C, srows)
    record.update(gate=gate_rows(C, prows, crows, chosen), splade_conditions=crows, chosen_k=chosen,
                  rule_vs_grid=rule_rows(C, crows, chosen))
    md = "".join(f"## {TITLES[name]}\n\n{text}\n" for name, text in made.items())
    md += f"k_target = {k_target:g}. {time_line(outcome.history, stage)}\n"
    for r in record["rule_vs_grid"]:
        if r["registered"] is not None and r["rule_k"] is not None and abs(r["registered"] - r["rule_k"]) > 0.005:
            md += f"\nnote: {r['backbone']}: the rule picked k = {r['rule_k']:.2f}, not the {r['registered']:.2f} " \
                  "registered before its runs\n"
    return Report(md, record, plots=lambda: plot(prows, crows, out), rows="splade", tables=tables)


main = Driver(__file__, DEFAULTS, plan, report, check=check).main


if __name__ == "__main__":
    cli.run_cli(main)
