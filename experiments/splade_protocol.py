"""The SPLADE rescaling protocol at CPU scale, shared by experiments/repro_splade_rescaling.py (a real
checkpoint, heads scaled by hand) and experiments/repro_heads.py (backbones pretrained here): title ->
text pairs of BEIR corpora, the model each run starts from (step 0), a train_splade.py run and an
eval/retrieval.py evaluation per run (and one per distinct starting model), and the table of them.

A run is a dict: name, condition (its group in the tables), head_scale m, k (a number or "auto"), untie,
and optionally init and k_bias (its own instead of C's), args (extra train_splade.py flags of this run),
eval=False / dev=False (not evaluated there). C holds init, train_config, train_args, k_bias, eval_beir,
eval_max_len, eval_query_max_len, eval_batch_size, and optionally dev_beir and dev_max_len: benchmarks
every trained run is also evaluated on, so that a choice among runs (a k) is made there.
"""
import hashlib
import json
import math
import shutil
from pathlib import Path

from checkpoint import read_log
from data import manifest
from data.atomic import write_json, write_text
from experiments.runner import Job, cell, markdown_table  # noqa: F401 (cell, markdown_table: the drivers' too)

METRICS = ("nDCG@10", "R@100")


def local_path(value, what):
    path = Path(value)
    if not path.exists():
        raise FileNotFoundError(f"{what}={value!r} does not exist (relative paths are from {Path.cwd()}). "
                                f"Give it with --{what}=PATH")
    return path.resolve()


def pseudo_query_pairs(folder):
    """(title, text) of a BEIR corpus' documents with a title and another text, whitespace runs squashed."""
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
    """pairs.tsv (query<TAB>positive) of the folders, left as it is when it holds them; the number of pairs."""
    pairs = [pair for folder in folders for pair in pseudo_query_pairs(folder)]
    if not pairs:
        raise FileNotFoundError(f"train_beir {[str(f) for f in folders]}: no document has both a title and a "
                                "text other than it, so there is no pseudo-query pair to train on")
    text = "".join(f"{q}\t{d}\n" for q, d in pairs)
    if not (path.is_file() and path.read_text() == text):
        write_text(path, text)
    return len(pairs)


def beir_folders(value):
    return [local_path(f.strip(), "train_beir") for f in value.split(",") if f.strip()]


def k_bias(C, run):
    """Whether k divides the run's decoder bias too (train_splade.py --k_bias)."""
    return run.get("k_bias", C["k_bias"])


def step0_key(C, run, k_target=None, identities=None):
    """What decides a run's starting weights: the backbone's files by content, m, k, the tie."""
    init = str(run.get("init") or C["init"])
    identities = {} if identities is None else identities   # {init: digest}, computed once per call
    if init not in identities:
        identities[init] = manifest.digest(manifest.identity(init))
    return json.dumps([init, run["head_scale"], run["k"], run["untie"], k_bias(C, run),
                       *([k_target] if run["k"] == "auto" else []), identities[init]])


def weights_digest(model):
    """A hash of every weight, a tied matrix under both of its names, so a tied model and an untied one
    with the same values (which compute the same function) get the same digest."""
    h = hashlib.sha1()
    for name, p in model.named_parameters(remove_duplicate=False):
        h.update(name.encode() + str(tuple(p.shape)).encode() + p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def prepare_step0(C, runs, out, k_target=None):
    """{run name: step0/<digest>}: each distinct starting model, the backbone as train_splade.py prepares it
    before its first step (k="auto": k_target is the rule's target), saved once."""
    from hf.models import from_pretrained, save_pretrained
    import train_splade as S
    where, digest_file, identities = {}, out / "step0" / "digests.json", {}
    known = manifest.read_json(digest_file) or {}
    for run in runs:
        key = step0_key(C, run, k_target, identities)
        if key not in known or manifest.problem(out / "step0" / known[key] / "model") is not None:
            model = from_pretrained(run.get("init") or C["init"])
            S.rescale_backbone(model, run["k"], k_bias(C, run), run["head_scale"], run["untie"], k_target=k_target)
            known[key] = weights_digest(model)
            folder = out / "step0" / known[key] / "model"
            if (why := manifest.problem(folder)) is not None:
                if folder.exists():
                    manifest.note(f"note: {folder} is not the model its save wrote ({why}); saving it again")
                tmp = folder.with_name("model.tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                model.source = str(run.get("init") or C["init"])  # save_pretrained copies its tokenizer files
                save_pretrained(model, tmp)
                manifest.finish(tmp, folder, {"weights": known[key]})
            write_json(digest_file, known)
        where[run["name"]] = out / "step0" / known[key]
    return where


def known_step0(C, runs, out, k_target=None):
    """{run name: step0/<digest>} of the runs whose starting model was saved (step0/missing for the others)."""
    known, identities = manifest.read_json(out / "step0" / "digests.json") or {}, {}
    return {r["name"]: out / "step0" / known.get(step0_key(C, r, k_target, identities), "missing") for r in runs}


def train_argv(C, run, pairs, out):
    return [str(C["train_config"]), f"--init={run.get('init') or C['init']}", f"--train_data={pairs}",
            f"--out_dir={out}", f"--head_scale={run['head_scale']}", f"--k={run['k']}", f"--untie_head={run['untie']}",
            f"--k_bias={k_bias(C, run)}", f"--eval_max_len={C['eval_max_len']}",  # the checkpoints' length
            *C["train_args"], *run.get("args", [])]


def eval_argv(C, model, out, bench=None, max_len=None):
    return ["--model", str(model), "--bench", str(bench or C["eval_beir"]), "--out", str(out),
            "--max-len", str(max_len or C["eval_max_len"]), "--query-max-len", str(C["eval_query_max_len"]),
            "--batch-size", str(C["eval_batch_size"]), "--device", "cpu", "--dtype", "fp32", "--no-progress"]


def jobs(C, runs, out, pairs, step0):
    """Per run "<name> train" (out/<name>/), "<name> eval" (out/<name>/eval/) and, with dev_beir,
    "<name> dev" (out/<name>/dev/); then "step0/<digest> eval" per distinct starting model of `step0`."""
    def evaluation(model, dest, key, needs=(), what="eval", bench=None, max_len=None):
        return Job(f"{key} {what}", "eval/retrieval.py", eval_argv(C, model, dest, bench, max_len), needs=list(needs),
                   done=lambda: manifest.read_json(dest / "metrics.json") is not None, log=dest.parent / f"{what}.out",
                   output=dest)

    planned = []
    for run in runs:
        folder, trained = out / run["name"], [f"{run['name']} train"]
        planned.append(Job(f"{run['name']} train", "train_splade.py", train_argv(C, run, pairs, folder),
                           done=lambda folder=folder: (folder / "model" / "model.safetensors").exists(),
                           log=folder / "train.out", output=folder))
        if run.get("eval", True):
            planned.append(evaluation(folder / "model", folder / "eval", run["name"], needs=trained))
        if C.get("dev_beir") and run.get("dev", True):
            planned.append(evaluation(folder / "model", folder / "dev", run["name"], trained, "dev", C["dev_beir"],
                                      C.get("dev_max_len")))
    for folder in dict.fromkeys(step0.values()):
        planned.append(evaluation(folder / "model", folder / "eval", f"step0/{folder.name}"))
    return planned


def failures(outcome):
    """{run name or step0/<digest>: problem} of the protocol's jobs that failed."""
    failed = {}
    for name, rc in outcome.failed.items():
        key, what = name.rsplit(" ", 1)
        if what in ("train", "eval", "dev"):
            failed[key] = f"{'training' if what == 'train' else 'evaluation'} exited with {rc} (see {what}.out)"
    return failed


def collapse_episodes(records):
    """[(kind, first step, last step or None while it lasts)] from the log's per-step `collapse` field."""
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


def eval_numbers(metrics):
    """The mean measures of an evaluation's metrics.json, and for several datasets each one's nDCG@10."""
    if not metrics:
        return {}
    numbers = {**{m: metrics.get("mean", {}).get(m) for m in METRICS}, "flops": metrics.get("flops"),
               "q_dims": metrics.get("mean_query_active_dims"), "d_dims": metrics.get("mean_doc_active_dims"),
               "empty_queries": metrics.get("num_empty_queries")}
    datasets = metrics.get("datasets") or {}
    if len(datasets) > 1:
        numbers["per_dataset"] = {name: d.get("mean", {}).get("nDCG@10") for name, d in datasets.items()}
    return numbers


def collect(runs, out, step0, failed, dev=False):
    """One row per run: its settings, its loss curve's summary, the evaluations before (`step0`) and after
    training, and with `dev` on dev_beir; "done" once each of those the run has is there."""
    rows = []
    for run in runs:
        folder, start = out / run["name"], step0.get(run["name"])
        norms = manifest.read_json(folder / "head_norms.json") or {}
        steps = [r for r in read_log(folder / "log.jsonl") if "loss" in r] if (folder / "log.jsonl").exists() else []
        losses = [r["loss"] for r in steps]
        head, tail = losses[:10], losses[-10:]  # one batch is noisy (16 in-batch candidates): 10-step means
        rule = run["k"] == "auto"  # the k train_splade.py's rule picked is in its record
        row = dict(run=run["name"], condition=run["condition"], head_scale=run["head_scale"],
                   k=norms.get("k") if rule else run["k"], k_rule=rule, untied=run["untie"],
                   head_row_l2=norms.get("after", {}).get("mean_row_l2"),
                   embedding_cosine=norms.get("embedding_cosine"),
                   step0_loss=losses[0] if losses else None,   # the first step's loss: before any update
                   first_loss=sum(head) / len(head) if head else None,
                   final_loss=sum(tail) / len(tail) if tail else None, steps=steps[-1]["step"] if steps else 0,
                   collapse=("; ".join(f"{k} {a}-{'end' if b is None else b}" for k, a, b in collapse_episodes(steps))
                             or "none") if steps else None,
                   step0_eval=None if start is None else str(start.relative_to(out)),
                   before={} if start is None else eval_numbers(manifest.read_json(start / "eval" / "metrics.json")),
                   after=eval_numbers(manifest.read_json(folder / "eval" / "metrics.json")),
                   **({"dev": eval_numbers(manifest.read_json(folder / "dev" / "metrics.json"))} if dev else {}))
        row.update({key: run[key] for key in ("backbone", "variant", "seed", "k_bias", "chosen_k") if key in run})
        complete = ((row["after"] or not run.get("eval", True)) and (row["before"] or start is None)
                    and (row.get("dev") or not (dev and run.get("dev", True))))
        row["status"] = (failed.get(run["name"]) or (start is not None and failed.get(f"step0/{start.name}"))
                         or ("done" if complete else "incomplete"))
        rows.append(row)
    return rows


def k_text(row):
    """k as the table shows it: the number, or the rule's pick (auto, then the k once the run has chosen it)."""
    if not row.get("k_rule"):
        return f"{row['k']:g}"
    return "auto" if row["k"] is None else f"auto: {row['k']:.2f}"


def fmt(value, spec):
    """`value` by `spec`; a diverged run's NaN loss shows as missing, not as "nan"."""
    return cell(None if isinstance(value, float) and math.isnan(value) else value, spec)


def arrow(before, after, spec):
    return f"{fmt(before, spec)} -> {fmt(after, spec)}"


def table(rows):
    head = ["run", "m", "k", "head row L2", "emb. cos", "step-0 loss", "loss, first -> last 10 steps",
            "nDCG@10 before", "nDCG@10 after", "R@100 before", "R@100 after",
            "q dims", "d dims", "FLOPS", "collapse (steps)", "status"]
    cells = []
    for r in rows:
        b, a = r["before"], r["after"]
        cells.append([r["run"], f"{r['head_scale']:g}", k_text(r), fmt(r["head_row_l2"], ".3f"),
                      fmt(r["embedding_cosine"], ".3f"), fmt(r["step0_loss"], ".3f"),
                      arrow(r["first_loss"], r["final_loss"], ".3f"),
                      *(fmt(x.get(m), ".3f") for m in METRICS for x in (b, a)),
                      arrow(b.get("q_dims"), a.get("q_dims"), ".0f"), arrow(b.get("d_dims"), a.get("d_dims"), ".0f"),
                      arrow(b.get("flops"), a.get("flops"), ".2f"), r["collapse"] or "-", r["status"]])
    return markdown_table(head, cells)
