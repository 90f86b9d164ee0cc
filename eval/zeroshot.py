"""Zero-shot multiple-choice evaluation of a causal LM checkpoint by log-likelihood scoring, the
way lm-evaluation-harness does it (the SimReg paper's "zero-shot downstream average").

    python eval/zeroshot.py --model out/run/checkpoints/step_N/model \
        --tasks hellaswag,piqa,arc_easy,arc_challenge,winogrande --out results.json
    python eval/zeroshot.py --model out/run/checkpoints/step_N/model --tokenizer gpt2 --tasks piqa --limit 200
    python eval/zeroshot.py --model hf:org/name --tasks my_items.jsonl

Scoring. Every option i of a question is a (context_i, continuation_i) pair, continuation_i =
" " + choice_i (the harness's target delimiter). With the tokens of the continuation c_1..c_m,

    ll_i      = sum_t log p(c_t | context_i, c_<t)
    acc       = [argmax_i ll_i == gold]
    acc_norm  = [argmax_i ll_i / len(choice_i) == gold]      len in characters
    acc_bytes = [argmax_i ll_i / len(choice_i.encode()) == gold]

acc_norm divides by the choice's length in characters (Python `len`, the delimiter excluded):
that is the harness's `completion_len`; its byte-length variant is the separate `acc_bytes`. The
two agree on ASCII text, which these benchmarks nearly all are. Ties go to the first option
(numpy argmax). Token boundaries follow the harness too: trailing spaces of the context move into
the continuation, and the continuation's tokens are those of encode(context + continuation)
after the first len(encode(context)) tokens, so a tokenizer that merges across the boundary
scores the text it would really see. Sequences longer than the model's max_seq_len keep their
last tokens. Requests are sorted by length, batched, right-padded with an attention mask; the
model runs in fp32 on CPU and bf16 on GPU, and the log-softmax is always taken in fp32.

Start token. By default every sequence starts with the tokenizer's BOS token (EOS when it has
none, e.g. GPT-2's <|endoftext|>): train_lm.py's shards mark document boundaries with it. The
harness (0.4.13) encodes a context with the tokenizer's own template and puts BOS (else EOS)
before an empty context only: with a template that adds BOS (Llama-style) the default here matches
it; with one that adds nothing (GPT-2, tiktoken), --no-start-token does. An empty context starts
with the start token in both settings.

WinoGrande uses partial scoring (Sakaguchi et al.; the harness's default): the option fills the
blank, the text before the blank + option is the context, and the SAME text after the blank is
the scored continuation. Its acc_norm therefore equals acc.

Benchmarks: `TASKS` (Hub dataset repos, the split the harness scores; a file that has moved is
found by its glob), with the harness's prompts; the commit each run used is written to the output.

Local JSONL (--tasks path/to/items.jsonl; the task is named after the file), one question a line:

    {"context": "The cat sat on the", "choices": ["mat.", "moon."], "label": 0}
    {"contexts": ["... because the trophy", "... because the suitcase"], "continuation": "is too big.", "label": 0}

The first form scores " " + choice after the context; the second (partial scoring, WinoGrande
style) scores " " + continuation after each context. label is the 0-based index of the answer.
"""
import argparse
import fnmatch
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file (python eval/zeroshot.py): Python puts eval/ on sys.path, not the repo root
    # where model.py and data/ live.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tqdm import tqdm

from data.atomic import write_json

TARGET_DELIMITER = " "


@dataclass
class Item:
    """One question: option i scores TARGET_DELIMITER + choices[i] after contexts[i]."""
    contexts: list
    choices: list
    label: int


# ------------------------------------------------------------------------------------------------
# Benchmarks: Hub rows -> Items, with the harness's prompts
# ------------------------------------------------------------------------------------------------


def _hellaswag_clean(text):
    # WikiHow artefacts of HellaSwag: " [title]" ends a heading, other [tags] are noise.
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


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
    query = f"Question: {row['question']}\nAnswer:"
    return Item([query] * len(texts), texts, labels.index(row["answerKey"]))


def winogrande_item(row):
    sentence = row["sentence"]
    if sentence.count("_") != 1:
        raise ValueError(f"sentence must contain exactly one '_' blank: {sentence!r}")
    blank = sentence.index("_")
    suffix = sentence[blank + 1:].strip()
    contexts = [sentence[:blank] + row["option1"], sentence[:blank] + row["option2"]]
    return Item(contexts, [suffix, suffix], {"1": 0, "2": 1}[str(row["answer"])])


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
        name, path = task.file, hub.hf_hub_download(task.repo, task.file, repo_type="dataset", revision=revision)
    except hub.EntryNotFoundError:
        files = sorted(f for f in hub.list_repo_files(task.repo, repo_type="dataset", revision=revision)
                       if fnmatch.fnmatch(f, task.pattern))
        if not files:
            raise FileNotFoundError(
                f"dataset {task.repo}@{revision}: no {task.file} and no file matching {task.pattern}; the repo "
                "has been reorganised. Export the split to the JSONL format of eval/zeroshot.py and pass its path "
                "to --tasks.") from None
        name, path = files[0], hub.hf_hub_download(task.repo, files[0], repo_type="dataset", revision=revision)
    commit = path.parents[len(Path(name).parts) - 1].name  # snapshots/<commit>/<file>
    return path, f"{task.repo}@{commit}:{name}"


def read_parquet_items(path, task: HubTask, limit=None):
    import pyarrow.parquet as pq
    try:
        have = pq.read_schema(path).names
    except Exception as e:
        raise ValueError(f"{path}: not a readable parquet file ({e}); delete it from the Hub cache to re-download") from e
    missing = [c for c in task.columns if c not in have]
    if missing:
        raise ValueError(f"{path}: missing columns {missing} (has {have}); the Hub layout of {task.repo} changed — "
                         "update TASKS in eval/zeroshot.py or use a local JSONL")
    rows = pq.read_table(path, columns=list(task.columns)).to_pylist()
    items = []
    for i, row in enumerate(rows[:limit] if limit else rows):
        try:
            items.append(task.to_item(row))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: row {i + 1}: {e}") from None
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
                raise ValueError(f"{where}: not valid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: each line must be a JSON object")
            if "choices" in obj and "context" in obj:
                choices = obj["choices"]
                contexts = [obj["context"]] * (len(choices) if isinstance(choices, list) else 0)
            elif "contexts" in obj and "continuation" in obj:
                contexts = obj["contexts"]
                choices = [obj["continuation"]] * (len(contexts) if isinstance(contexts, list) else 0)
            else:
                raise ValueError(f"{where}: needs 'context' + 'choices' (or 'contexts' + 'continuation') and "
                                 f"'label'; found keys {sorted(obj)}")
            if not contexts or not all(isinstance(s, str) for s in contexts + choices):
                raise ValueError(f"{where}: 'choices'/'contexts' must be a non-empty list of strings")
            label = obj.get("label")
            if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
                raise ValueError(f"{where}: 'label' must be an integer index in 0..{len(choices) - 1}, got {label!r}")
            items.append(Item(contexts, choices, label))
            if limit and len(items) >= limit:
                break
    return items


def load_task(name, limit=None, revision="main"):
    """(items, source) for a task name of TASKS or a path to a JSONL file."""
    if name.endswith(".jsonl"):
        return read_jsonl_items(name, limit), str(Path(name).resolve())
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)} or give a .jsonl path")
    path, source = hub_parquet(TASKS[name], revision)
    return read_parquet_items(path, TASKS[name], limit), source


# ------------------------------------------------------------------------------------------------
# Tokenizers: anything with encode(text) -> ids and a start_id
# ------------------------------------------------------------------------------------------------


class HFTokenizer:
    """A checkpoint's tokenizer.json (hf/models.py load_tokenizer); special tokens are never added by encode,
    and texts are neither truncated nor padded (load_tokenizer switches off the file's own settings:
    a context cut at its max_length would score the wrong continuation; score_requests truncates)."""

    def __init__(self, spec):
        from hf.models import load_tokenizer
        self.tok = load_tokenizer(spec)
        s = self.tok.special
        self.start_id = s.bos if s.bos is not None else s.eos
        self.name = f"tokenizer.json of {spec}"

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


class TiktokenTokenizer:
    """A tiktoken encoding (gpt2 by default). tiktoken downloads its BPE file on first use."""

    def __init__(self, name="gpt2"):
        import tiktoken
        self.enc = tiktoken.get_encoding(name)
        self.start_id = self.enc.eot_token
        self.name = f"tiktoken {name}"

    def encode(self, text):
        return self.enc.encode_ordinary(text)


def encode_pair(tokenizer, context, continuation):
    """(context ids, continuation ids) split as the harness does (see the module docstring)."""
    n_space = len(context) - len(context.rstrip())
    if n_space:
        context, continuation = context[:-n_space], context[-n_space:] + continuation
    ctx = tokenizer.encode(context) if context else []
    whole = tokenizer.encode(context + continuation)
    return ctx, whole[len(ctx):]


def item_requests(tokenizer, items, add_start=True):
    """One (context ids, continuation ids) request per option of every item, in order."""
    requests = []
    for item in items:
        for context, choice in zip(item.contexts, item.choices):
            ctx, cont = encode_pair(tokenizer, context, TARGET_DELIMITER + choice)
            if add_start or not ctx:  # an empty context still needs one token to predict from
                if tokenizer.start_id is None:
                    raise ValueError("the tokenizer has neither a BOS nor an EOS token to start sequences with")
                ctx = [tokenizer.start_id] + ctx
            requests.append((ctx, cont))
    return requests


# ------------------------------------------------------------------------------------------------
# Scoring
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def score_requests(model, requests, batch_size=32, max_len=None, progress=True, desc="score"):
    """sum_t log p(continuation_t | context, continuation_<t) for each (context ids, continuation ids)."""
    max_len = max_len or model.config.max_seq_len
    vocab = model.config.vocab_size
    device = next(model.parameters()).device
    # Longest first: similar lengths share a batch (little padding) and a too-large batch fails at once.
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
    scores = [0.0] * len(requests)
    for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
        idx = order[start:start + batch_size]
        rows = []
        for i in idx:
            ctx, cont = requests[i]
            if not cont:
                raise ValueError(f"request {i}: the continuation encodes to no tokens")
            full = (ctx + cont)[-(max_len + 1):]  # the harness keeps the last max_len + 1 tokens
            if len(cont) >= len(full):
                raise ValueError(f"request {i}: continuation of {len(cont)} tokens does not fit max_len={max_len}")
            if max(full) >= vocab:
                raise ValueError(f"request {i}: token id {max(full)} >= the model's vocab_size {vocab}: the tokenizer "
                                 "does not belong to this model (see --tokenizer)")
            rows.append((full[:-1], full[1:], len(cont)))
        T = max(len(inp) for inp, _, _ in rows)
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        mask = torch.zeros(len(rows), T, dtype=torch.long)
        pos_b, pos_t, targets = [], [], []
        for b, (inp, tgt, n) in enumerate(rows):
            ids[b, :len(inp)] = torch.tensor(inp)
            mask[b, :len(inp)] = 1
            pos_b += [b] * n
            pos_t += range(len(inp) - n, len(inp))
            targets += tgt[-n:]
        h = model.encode(ids.to(device), attention_mask=mask.to(device))
        # The vocabulary projection only at the positions that predict continuation tokens: a full
        # (B, T, V) logits tensor would dominate memory for a 50k vocabulary.
        pos_b = torch.tensor(pos_b, device=device)
        logits = model.head(h[pos_b, torch.tensor(pos_t, device=device)]).float()
        logp = logits.log_softmax(-1).gather(1, torch.tensor(targets, device=device)[:, None])[:, 0]
        sums = torch.zeros(len(rows), dtype=torch.float64, device=device).index_add_(0, pos_b, logp.double())
        for b, i in enumerate(idx):
            scores[i] = float(sums[b])
    return scores


def _argmax(values):
    return max(range(len(values)), key=lambda i: (values[i], -i))  # first index among ties, like numpy


def _stderr(hits):
    n = len(hits)
    if n < 2:
        return None
    p = sum(hits) / n
    return math.sqrt(p * (1 - p) / (n - 1))  # the harness's mean_stderr: sample std (ddof=1) / sqrt(n)


def accuracy(items, lls):
    """acc, acc_norm, acc_bytes (+ stderr) from one log-likelihood per option, items in order."""
    hits = {"acc": [], "acc_norm": [], "acc_bytes": []}
    k = 0
    for item in items:
        ll = lls[k:k + len(item.choices)]
        k += len(item.choices)
        chars = [max(len(c), 1) for c in item.choices]
        nbytes = [max(len(c.encode("utf-8")), 1) for c in item.choices]
        hits["acc"].append(_argmax(ll) == item.label)
        hits["acc_norm"].append(_argmax([x / n for x, n in zip(ll, chars)]) == item.label)
        hits["acc_bytes"].append(_argmax([x / n for x, n in zip(ll, nbytes)]) == item.label)
    if k != len(lls):
        raise ValueError(f"{len(lls)} scores for {k} options")
    out = {"n": len(items)}
    for name, h in hits.items():
        out[name] = sum(h) / len(h) if h else None
        out[f"{name}_stderr"] = _stderr(h)
    return out


def evaluate_items(model, tokenizer, items, batch_size=32, max_len=None, add_start=True, progress=True, desc="score"):
    """(metrics, per-option log-likelihoods) for a list of Items."""
    lls = score_requests(model, item_requests(tokenizer, items, add_start), batch_size, max_len, progress, desc)
    return accuracy(items, lls), lls


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def load_model(spec, device="auto"):
    from hf.models import from_pretrained
    from training import default_dtype, pick_device
    device = pick_device(device)
    model = from_pretrained(spec, device=device, dtype=default_dtype(device))
    if not model.config.causal:
        raise ValueError(f"{spec}: a {model.config.family} model is not a causal decoder; log-likelihood scoring "
                         "needs next-token predictions")
    return model


def make_tokenizer(choice, model_spec):
    if choice == "model":
        return HFTokenizer(model_spec)
    if Path(choice).exists():
        return HFTokenizer(choice)  # a tokenizer.json or a folder holding one
    return TiktokenTokenizer(choice)


def format_table(results):
    lines = [f"{'task':<16}{'n':>7}  {'acc':>7} {'± se':>7}  {'acc_norm':>8} {'± se':>7}"]
    for name, r in results["tasks"].items():
        lines.append(f"{name:<16}{r['n']:>7}  {r['acc']:>7.4f} {r['acc_stderr'] or 0:>7.4f}  "
                     f"{r['acc_norm']:>8.4f} {r['acc_norm_stderr'] or 0:>7.4f}")
    m = results["mean"]
    lines.append(f"{'mean':<16}{'':>7}  {m['acc']:>7.4f} {'':>7}  {m['acc_norm']:>8.4f}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model folder (e.g. a train_lm.py checkpoint's "
                    "model/) or hf:org/name[@rev]")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated: {', '.join(TASKS)} or .jsonl paths")
    ap.add_argument("--limit", type=int, help="only the first N questions of each task")
    ap.add_argument("--tokenizer", default="model", help="model (the checkpoint's tokenizer.json), a tokenizer.json "
                    "path, or a tiktoken encoding such as gpt2")
    ap.add_argument("--batch-size", type=int, default=32, help="sequences (options) per forward pass")
    ap.add_argument("--max-len", type=int, help="longest sequence fed to the model (default: its max_seq_len)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--no-start-token", action="store_true",
                    help="no BOS/EOS before non-empty contexts: what the harness does with a tokenizer whose "
                    "template adds no BOS (GPT-2, tiktoken); with one that adds BOS (Llama-style) the default "
                    "matches the harness")
    ap.add_argument("--data-revision", default="main", help="revision of the benchmark dataset repos")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    model = load_model(args.model, args.device)
    tokenizer = make_tokenizer(args.tokenizer, args.model)
    results = {"model": args.model, "tokenizer": tokenizer.name, "start_token": not args.no_start_token,
               "limit": args.limit, "max_len": args.max_len or model.config.max_seq_len, "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "tasks": {}}
    for name in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        items, source = load_task(name, args.limit, args.data_revision)
        if not items:
            raise ValueError(f"task {name} ({source}) has no questions")
        task = Path(name).stem if name.endswith(".jsonl") else name
        print(f"{task}: {len(items)} questions from {source}", file=sys.stderr)
        metrics, _ = evaluate_items(model, tokenizer, items, args.batch_size, args.max_len, not args.no_start_token,
                                    desc=task)
        results["tasks"][task] = {**metrics, "source": source}
    tasks = results["tasks"].values()
    results["mean"] = {k: sum(t[k] for t in tasks) / len(tasks) for k in ("acc", "acc_norm", "acc_bytes")}
    print(format_table(results))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_json(args.out, results, indent=2)
    return results


if __name__ == "__main__":
    from cli import run_cli
    run_cli(main)
