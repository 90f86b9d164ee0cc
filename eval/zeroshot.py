"""Zero-shot multiple-choice evaluation of a causal LM checkpoint by log-likelihood scoring, the
way lm-evaluation-harness does it (the SimReg paper's "zero-shot downstream average").

    python eval/zeroshot.py --model out/run/checkpoints/step_N/model --tasks hellaswag,piqa --out results.json
    python eval/zeroshot.py --model hf:org/name --tokenizer gpt2 --tasks my_items.jsonl --limit 200

Option i of a question scores continuation_i = " " + choice_i after context_i; with its tokens c_1..c_m,

    ll_i      = sum_t log p(c_t | context_i, c_<t)
    acc       = [argmax_i ll_i == gold]
    acc_norm  = [argmax_i ll_i / len(choice_i) == gold]             len in characters (the harness's)
    acc_bytes = [argmax_i ll_i / len(choice_i.encode()) == gold]

Ties go to the first option. As in the harness, trailing spaces of the context move into the
continuation, whose tokens are those of encode(context + continuation) after len(encode(context)),
and a sequence longer than max_seq_len keeps its last tokens; the log-softmax is taken in fp32.
Start token: every sequence starts with BOS (EOS when there is none, GPT-2's <|endoftext|>), which
matches the harness for a tokenizer whose template adds BOS; for one that adds nothing (GPT-2,
tiktoken) --no-start-token matches it (an empty context always gets the start token).
WinoGrande uses partial scoring: the option fills the blank, and the same text after the blank is the
scored continuation, so its acc_norm equals acc.

Benchmarks are `TASKS` (Hub parquet files, the harness's splits and prompts; the commit used is written
to the output), or a local JSONL file (the task is named after it), one question a line:

    {"context": "The cat sat on the", "choices": ["mat.", "moon."], "label": 0}
    {"contexts": ["... because the trophy", "... because the suitcase"], "continuation": "is too big.", "label": 0}
"""
import argparse
import fnmatch
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

if __package__ in (None, ""):  # run as a file: Python puts eval/ on sys.path, not the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tqdm import tqdm

from cli import UserError
from data.atomic import write_json
from data.ir_datasets import read_parquet
from data.tokenizer import pad_batch

TARGET_DELIMITER = " "


class ZeroshotError(UserError, ValueError):
    """A task, a file or a model that cannot be scored; the message names it and the fix."""


@dataclass
class Item:
    """One question: option i scores TARGET_DELIMITER + choices[i] after contexts[i]."""
    contexts: list
    choices: list
    label: int


# ---------------- Benchmarks: Hub rows -> Items, with the harness's prompts
def _hellaswag_clean(text):
    # WikiHow artefacts of HellaSwag: " [title]" ends a heading, other [tags] are noise.
    return re.sub(r"\[.*?\]", "", text.strip().replace(" [title]", ". ")).replace("  ", " ")


def hellaswag_item(row):
    query = _hellaswag_clean(f"{row['activity_label']}: {row['ctx_a']} {row['ctx_b'].capitalize()}")
    return Item([query] * len(row["endings"]), [_hellaswag_clean(e) for e in row["endings"]], int(row["label"]))


def piqa_item(row):
    query = f"Question: {row['goal']}\nAnswer:"
    return Item([query, query], [row["sol1"], row["sol2"]], int(row["label"]))


def arc_item(row):
    labels, texts = list(row["choices"]["label"]), list(row["choices"]["text"])
    if row["answerKey"] not in labels:
        raise ValueError(f"answerKey {row['answerKey']!r} is not one of the choice labels {labels}")
    return Item([f"Question: {row['question']}\nAnswer:"] * len(texts), texts, labels.index(row["answerKey"]))


def winogrande_item(row):
    sentence = row["sentence"]
    if sentence.count("_") != 1:
        raise ValueError(f"sentence must contain exactly one '_' blank: {sentence!r}")
    before, suffix = sentence.split("_")
    return Item([before + row["option1"], before + row["option2"]], [suffix.strip()] * 2,
                {"1": 0, "2": 1}[str(row["answer"])])


@dataclass(frozen=True)
class HubTask:
    repo: str
    file: str
    pattern: str     # fallback: the first file matching this glob, if `file` has moved
    columns: tuple
    to_item: object


TASKS = {
    "hellaswag": HubTask("Rowan/hellaswag", "data/validation-00000-of-00001.parquet", "*validation*.parquet",
                         ("activity_label", "ctx_a", "ctx_b", "endings", "label"), hellaswag_item),
    "piqa": HubTask("baber/piqa", "piqa_validation.parquet", "*validation*.parquet",
                    ("goal", "sol1", "sol2", "label"), piqa_item),
    "arc_easy": HubTask("allenai/ai2_arc", "ARC-Easy/test-00000-of-00001.parquet", "ARC-Easy/test*.parquet",
                        ("question", "choices", "answerKey"), arc_item),
    "arc_challenge": HubTask("allenai/ai2_arc", "ARC-Challenge/test-00000-of-00001.parquet",
                             "ARC-Challenge/test*.parquet", ("question", "choices", "answerKey"), arc_item),
    "winogrande": HubTask("allenai/winogrande", "winogrande_xl/validation-00000-of-00001.parquet",
                          "winogrande_xl/validation*.parquet", ("sentence", "option1", "option2", "answer"),
                          winogrande_item),
}


def hub_parquet(task: HubTask, revision="main"):
    """(local path, source string naming repo@commit:file) of the task's parquet file."""
    from hf import hub
    try:
        path = hub.hf_hub_download(task.repo, task.file, repo_type="dataset", revision=revision)
    except hub.EntryNotFoundError:
        files = sorted(fnmatch.filter(hub.list_repo_files(task.repo, repo_type="dataset", revision=revision),
                                      task.pattern))
        if not files:
            raise ZeroshotError(f"dataset {task.repo}@{revision}: no {task.file} and no file matching {task.pattern}. "
                                "Fix: export the split as JSONL (eval/zeroshot.py's format) for --tasks.") from None
        return hub_parquet(replace(task, file=files[0]), revision)
    commit = path.parents[len(Path(task.file).parts) - 1].name  # snapshots/<commit>/<file>
    return path, f"{task.repo}@{commit}:{task.file}"


def read_parquet_items(path, task: HubTask, limit=None):
    fix = f"the Hub layout of {task.repo} changed: update TASKS in eval/zeroshot.py or use a local JSONL"
    rows = [r for batch in read_parquet(path, task.columns, error=ZeroshotError, fix=fix) for r in batch.to_pylist()]
    items = []
    for i, row in enumerate(rows[:limit] if limit else rows):
        try:
            items.append(task.to_item(row))
        except (ValueError, KeyError, TypeError) as e:
            raise ZeroshotError(f"{path}: row {i + 1}: {e}") from None
    return items


def read_jsonl_items(path, limit=None):
    """Items from the documented JSONL format; errors name the file, line and key."""
    items = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ZeroshotError(f"{where}: not valid JSON ({e})") from None
            if isinstance(obj, dict) and "choices" in obj and "context" in obj:
                choices = obj["choices"]
                contexts = [obj["context"]] * (len(choices) if isinstance(choices, list) else 0)
            elif isinstance(obj, dict) and "contexts" in obj and "continuation" in obj:
                contexts = obj["contexts"]
                choices = [obj["continuation"]] * (len(contexts) if isinstance(contexts, list) else 0)
            else:
                raise ZeroshotError(f"{where}: needs a JSON object with 'context' + 'choices' (or 'contexts' + "
                                    f"'continuation') and 'label'; found {str(obj)[:80]}")
            if not contexts or not all(isinstance(s, str) for s in contexts + choices):
                raise ZeroshotError(f"{where}: 'choices'/'contexts' must be a non-empty list of strings")
            label = obj.get("label")
            if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
                raise ZeroshotError(f"{where}: 'label' must be an index in 0..{len(choices) - 1}, got {label!r}")
            items.append(Item(contexts, choices, label))
            if limit and len(items) >= limit:
                break
    return items


def load_task(name, limit=None, revision="main"):
    """(items, source) for a task name of TASKS or a path to a JSONL file."""
    if name.endswith(".jsonl"):
        return read_jsonl_items(name, limit), str(Path(name).resolve())
    if name not in TASKS:
        raise ZeroshotError(f"unknown task {name!r}; choose from {sorted(TASKS)} or give a .jsonl path")
    path, source = hub_parquet(TASKS[name], revision)
    return read_parquet_items(path, TASKS[name], limit), source


# ---------------- Tokenizers: anything with encode(text) -> ids, a start_id and a name
class HFTokenizer:
    """A checkpoint's tokenizer.json: encode adds no special token, neither truncates nor pads (score_requests cuts)."""
    def __init__(self, spec):
        from hf.models import load_tokenizer
        self.tok = load_tokenizer(spec)
        self.start_id = self.tok.special.bos if self.tok.special.bos is not None else self.tok.special.eos
        self.name = f"tokenizer.json of {spec}"

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


class TiktokenTokenizer:
    """A tiktoken encoding (gpt2 by default). tiktoken downloads its BPE file on first use."""
    def __init__(self, name="gpt2"):
        import tiktoken
        self.enc = tiktoken.get_encoding(name)
        self.start_id, self.name = self.enc.eot_token, f"tiktoken {name}"

    def encode(self, text):
        return self.enc.encode_ordinary(text)


def encode_pair(tokenizer, context, continuation):
    """(context ids, continuation ids) split as the harness does (see the module docstring)."""
    n_space = len(context) - len(context.rstrip())
    if n_space:
        context, continuation = context[:-n_space], context[-n_space:] + continuation
    ctx = tokenizer.encode(context) if context else []
    return ctx, tokenizer.encode(context + continuation)[len(ctx):]


def item_requests(tokenizer, items, add_start=True):
    """One (context ids, continuation ids) request per option of every item, in order."""
    requests = []
    for item in items:
        for context, choice in zip(item.contexts, item.choices):
            ctx, cont = encode_pair(tokenizer, context, TARGET_DELIMITER + choice)
            if add_start or not ctx:  # an empty context still needs one token to predict from
                if tokenizer.start_id is None:
                    raise ZeroshotError("the tokenizer has neither a BOS nor an EOS token to start sequences with")
                ctx = [tokenizer.start_id] + ctx
            requests.append((ctx, cont))
    return requests


# ---------------- Scoring
@torch.no_grad()
def score_requests(model, requests, batch_size=32, max_len=None, progress=True, desc="score"):
    """sum_t log p(continuation_t | context, continuation_<t) for each (context ids, continuation ids)."""
    max_len = max_len or model.config.max_seq_len
    device = next(model.parameters()).device
    # Longest first: similar lengths share a batch (little padding) and a too-large batch fails at once.
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
    scores = [0.0] * len(requests)
    for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
        idx = order[start:start + batch_size]
        inputs = []
        for i in idx:
            ctx, cont = requests[i]
            full = (ctx + cont)[-(max_len + 1):]  # the harness keeps the last max_len + 1 tokens
            if not 0 < len(cont) < len(full):
                raise ZeroshotError(f"request {i}: a continuation of {len(cont)} tokens; 1 to max_len={max_len} fit")
            if max(full) >= model.config.vocab_size:
                raise ZeroshotError(f"request {i}: token id {max(full)} >= the model's vocab_size "
                                    f"{model.config.vocab_size}: another model's tokenizer (see --tokenizer)")
            inputs.append(full[:-1])
        h = model.encode(*pad_batch(inputs, 0, device=device))  # right-padded, masked
        for b, i in enumerate(idx):
            cont, end = requests[i][1], len(inputs[b])
            # the vocabulary projection only where a continuation token is predicted: (B, T, V) logits would
            # dominate memory for a 50k vocabulary
            logp = model.head(h[b, end - len(cont):end]).float().log_softmax(-1)
            scores[i] = logp.gather(1, torch.tensor(cont, device=device)[:, None]).double().sum()
    return [float(s) for s in scores]


NORMS = {"acc": lambda choice: 1, "acc_norm": len, "acc_bytes": lambda choice: len(choice.encode("utf-8"))}


def accuracy(items, lls):
    """acc, acc_norm, acc_bytes (+ stderr) from one log-likelihood per option, items in order."""
    hits, k = {name: [] for name in NORMS}, 0
    for item in items:
        ll, k = lls[k:k + len(item.choices)], k + len(item.choices)
        for name, norm in NORMS.items():
            normed = [x / max(norm(c), 1) for x, c in zip(ll, item.choices)]
            hits[name].append(max(range(len(normed)), key=normed.__getitem__) == item.label)  # first among ties
    out = {"n": len(items)}
    for name, h in hits.items():
        out[name] = sum(h) / len(h) if h else None
        # the harness's mean_stderr: sample std (ddof=1) / sqrt(n)
        out[f"{name}_stderr"] = statistics.stdev(h) / math.sqrt(len(h)) if len(h) > 1 else None
    return out


def evaluate_items(model, tokenizer, items, batch_size=32, max_len=None, add_start=True, progress=True, desc="score"):
    """(metrics, per-option log-likelihoods) for a list of Items."""
    lls = score_requests(model, item_requests(tokenizer, items, add_start), batch_size, max_len, progress, desc)
    return accuracy(items, lls), lls


# ---------------- CLI
def make_tokenizer(choice, model_spec):
    """--tokenizer: "model" (the checkpoint's), a tokenizer.json or its folder, else a tiktoken encoding."""
    if choice == "model" or Path(choice).exists():
        return HFTokenizer(model_spec if choice == "model" else choice)
    return TiktokenTokenizer(choice)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model folder (a checkpoint's model/) or hf:org/name[@rev]")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated: {', '.join(TASKS)} or .jsonl paths")
    ap.add_argument("--limit", type=int, help="only the first N questions of each task")
    ap.add_argument("--tokenizer", default="model", help="model (its own), a tokenizer.json or a tiktoken name")
    ap.add_argument("--batch-size", type=int, default=32, help="sequences (options) per forward pass")
    ap.add_argument("--max-len", type=int, help="longest sequence fed to the model (default: its max_seq_len)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--no-start-token", action="store_true", help="no BOS/EOS before a context (GPT-2, tiktoken)")
    ap.add_argument("--data-revision", default="main", help="revision of the benchmark dataset repos")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    from hf.models import from_pretrained
    from training import default_dtype, pick_device
    device = pick_device(args.device)
    model = from_pretrained(args.model, device=device, dtype=default_dtype(device))
    if not model.config.causal:
        raise ZeroshotError(f"{args.model}: a {model.config.family} model, not a causal decoder; give a causal LM")
    tokenizer = make_tokenizer(args.tokenizer, args.model)
    results = {"model": args.model, "tokenizer": tokenizer.name, "start_token": not args.no_start_token,
               "limit": args.limit, "max_len": args.max_len or model.config.max_seq_len,
               "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "tasks": {}}
    for name in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        items, source = load_task(name, args.limit, args.data_revision)
        if not items:
            raise ZeroshotError(f"task {name} ({source}) has no questions")
        task = Path(name).stem if name.endswith(".jsonl") else name
        print(f"{task}: {len(items)} questions from {source}", file=sys.stderr)
        metrics, _ = evaluate_items(model, tokenizer, items, args.batch_size, args.max_len, not args.no_start_token,
                                    desc=task)
        results["tasks"][task] = {**metrics, "source": source}
    tasks = results["tasks"].values()
    results["mean"] = m = {k: sum(t[k] for t in tasks) / len(tasks) for k in NORMS}
    lines = [f"{'task':<16}{'n':>7}  {'acc':>7} {'± se':>7}  {'acc_norm':>8} {'± se':>7}"]
    lines += [f"{name:<16}{r['n']:>7}  {r['acc']:>7.4f} {r['acc_stderr'] or 0:>7.4f}  {r['acc_norm']:>8.4f} "
              f"{r['acc_norm_stderr'] or 0:>7.4f}" for name, r in results["tasks"].items()]
    print("\n".join(lines + [f"{'mean':<16}{'':>7}  {m['acc']:>7.4f} {'':>7}  {m['acc_norm']:>8.4f}"]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, results, indent=2)
    return results


if __name__ == "__main__":
    from cli import run_cli
    run_cli(main)
