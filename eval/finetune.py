"""Fine-tuning evaluation of pretrained encoders (paper 3, "Should we still pretrain encoders with
MLM?"): sequence classification, token classification, extractive QA and retrieval, with the
paper's learning-rate grid and seeds, resumable, into one table.

    python eval/finetune.py --models out/mlm40/final,hf:EuroBERT/EuroBERT-210m \
        --tasks sst2,mnli,qqp,conll2003,ontonotes5,uner_en,squad,squad_v2,record,msmarco,nq,mldr \
        --out runs/ft
    python -m eval.finetune --models out/clm/final --tasks sst2=../shared/data/labeled/sst2 \
        --lrs 5e-5,1e-4 --seeds 0,1 --steps 200 --out runs/quick

Protocol (EncodEval, the paper's code; docs/mlm_vs_clm.md): batch 32; AdamW betas (0.9, 0.95), eps
1e-5, weight decay 0.1; linear schedule with 10 % warm-up; 1 000 steps for SC, QA and IR, one epoch
for TC; learning rates {1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4} x seeds {0..4}; the learning rate is
chosen by the mean validation score over seeds and the table reports the test mean +- std (sample
std over seeds) at that learning rate. Splits and datasets: eval/finetune_data.py.

Encoders: anything `hf.models.from_pretrained` loads (our own pretraining outputs are saved in the
EuroBERT Hugging Face format). Attention is bidirectional during fine-tuning whatever the
pretraining objective (the paper fine-tunes CLM models bidirectionally); --causal keeps the causal
mask for the ablation. The MLM/LM head is dropped: only the final hidden states are used.

Heads (initialised N(0, 0.02) with zero bias, like the HF heads the paper used):
- SC: EuroBERT's classification head (transformers EuroBertForSequenceClassification,
  `classifier_pooling`): `mean` or `bos` pools the final hidden states (masked mean over real
  tokens, or the first token) and applies dense -> GELU -> dense to the pooled vector; `late`
  applies dense -> GELU -> dense to every token and takes the masked mean of the per-token
  logits. EuroBERT's default is `late`; we default to `mean`, which also suits causal ablations.
- TC: a linear layer per token; words are labelled on their first sub-word (the others get -100
  and no loss), and a word's prediction is read there; words cut off by max_len are predicted O.
- QA: a linear layer to (start, end) logits, post-processed as in eval/finetune_qa.py.
- IR: bi-encoder, mean pooling, cosine x 20 in-batch-negative loss (eval/finetune_ir.py).

Batches are padded to their own longest sequence (dynamic padding; `bucket=True` also groups
similar lengths) rather than to max_len: tests/benchmarks/bench_finetune_padding.py measures the
gain. On CUDA the forward/backward runs under bf16 autocast with fp32 weights.

Output: OUT/runs/<model>/<task>/lr<lr>_seed<seed>.json per run (written atomically), and
OUT/results.md + OUT/results.csv. A rerun skips a finished run only when its stamp (run_stamp: the
model by content - every file of its folder that loading reads, an hf: model's as downloaded - the
task's files by content, every setting of FinetuneConfig that shapes it) equals the run's now; a
run of other inputs is moved aside to NAME.stale-N and run again (data/stamp.py). One grid at a
time writes an --out (OUT/RUN.lock): a second is refused, naming the first's pid.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    # run as a file: put the repo root (model.py, data/, eval/) on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import copy
import csv
import dataclasses
import hashlib
import json
import math
import re
import statistics

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import model as M
from data import stamp as stamps
from data.atomic import atomic_write, write_text
from data.tokenizer import pad_batch, token_ids, truncated
from eval import finetune_metrics as metrics
from eval.finetune_data import TASKS, FinetuneDataError, TaskSpec, load_task, parse_task
from eval.finetune_qa import apply_null_threshold, best_spans, qa_features
from eval import finetune_ir
from hf.models import from_pretrained, load_tokenizer
from eval.finetune_loop import (FinetuneConfig, forward_all, mean_pool, model_max_len, pad_id_of,
                               resolve_device, train_loop, train_order)
from training import seed_everything

LR_GRID = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4)
SEEDS = (0, 1, 2, 3, 4)
IGNORE = M.IGNORE_INDEX  # -100: labels outside the loss (cross-entropy's ignore_index)


# ----------------------------------------------------------------------------- heads


def init_linear(layer: nn.Linear):
    nn.init.normal_(layer.weight, std=0.02)
    nn.init.zeros_(layer.bias)
    return layer


class PooledClassifier(nn.Module):
    """EuroBERT's sequence-classification head with its three poolings (module docstring)."""

    def __init__(self, d, num_labels, pooling="mean"):
        super().__init__()
        if pooling not in ("mean", "bos", "late"):
            raise ValueError(f"pooling {pooling!r}: use mean, bos or late")
        self.pooling = pooling
        self.dense, self.out = init_linear(nn.Linear(d, d)), init_linear(nn.Linear(d, num_labels))

    def forward(self, h, mask):
        if self.pooling == "late":
            return mean_pool(self.out(F.gelu(self.dense(h))), mask)
        pooled = h[:, 0] if self.pooling == "bos" else mean_pool(h, mask).to(h.dtype)
        return self.out(F.gelu(self.dense(pooled)))


class TokenClassifier(nn.Module):
    def __init__(self, d, num_labels):
        super().__init__()
        self.out = init_linear(nn.Linear(d, num_labels))

    def forward(self, h, mask):
        return self.out(h)


class SpanHead(nn.Module):
    """(start, end) logits per token; padding positions can never be a start or an end."""

    def __init__(self, d):
        super().__init__()
        self.out = init_linear(nn.Linear(d, 2))

    def forward(self, h, mask):
        logits = self.out(h).float().masked_fill(~mask.bool()[..., None], torch.finfo(torch.float32).min)
        return logits[..., 0], logits[..., 1]


class FinetuneModel(nn.Module):
    def __init__(self, encoder: M.Transformer, head: nn.Module, causal=False):
        super().__init__()
        encoder.head = nn.Identity()  # the vocabulary projection is unused here (V x d parameters)
        self.encoder, self.head, self.causal = encoder, head, causal

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        if (self.encoder.config.type_vocab_size or 0) < 2:
            token_type_ids = None  # no segment embeddings (or one segment, as RoBERTa): all type 0
        h = self.encoder.encode(input_ids, attention_mask, causal=self.causal, token_type_ids=token_type_ids)
        return self.head(h, attention_mask)


def build_model(encoder, spec: TaskSpec, cfg: FinetuneConfig, num_labels=None):
    d = encoder.config.d_model
    torch.manual_seed(cfg.seed)  # the head's initialisation is part of the seed
    head = {"sc": lambda: PooledClassifier(d, num_labels, cfg.pooling),
            "tc": lambda: TokenClassifier(d, num_labels),
            "qa": lambda: SpanHead(d)}[spec.kind]()
    return FinetuneModel(encoder, head, cfg.causal)


# ----------------------------------------------------------------------------- tokenisation


def encode_sc(tokenizer, examples, max_len, label_ids: dict):
    ids = token_ids(tokenizer, [ex["text"] for ex in examples], max_len)
    unknown = next((ex["label"] for ex in examples if ex["label"] not in label_ids), None)
    if unknown is not None:
        raise FinetuneDataError(f"label {unknown!r} does not occur in the training set (labels: "
                                f"{sorted(label_ids, key=str)}); GLUE marks unlabelled rows with -1, so a "
                                f"split with -1 labels cannot be scored")
    return [{"ids": x, "label": label_ids[ex["label"]]} for x, ex in zip(ids, examples)]


def sc_label_ids(spec: TaskSpec, train) -> dict:
    """Label value -> class id: integer labels are their own ids; string labels are numbered in
    sorted order (or by the spec's label names)."""
    values = sorted({ex["label"] for ex in train}, key=str)
    if not values:
        raise FinetuneDataError(f"task {spec.name}: no training examples (an empty training file, or one so "
                                "small that the 5 % held out for validation took it all). Fix: give more examples.")
    if all(isinstance(v, int) for v in values):
        if min(values) < 0:
            raise FinetuneDataError(f"task {spec.name}: negative label {min(values)} in the training set "
                                    f"(GLUE marks unlabelled test rows with -1; they cannot be trained on)")
        n = max(max(values) + 1, spec.num_labels or 0)
        return {i: i for i in range(n)}
    names = spec.label_names or values
    return {v: i for i, v in enumerate(names)}


def encode_tc(tokenizer, examples, max_len, tag_ids: dict):
    """Token ids, per-token labels (first sub-word of each word, else -100), and the position of
    each word's first sub-word (-1 when max_len cut the word off)."""
    # Every word but the first gets a leading space, so that byte-level BPE and SentencePiece
    # tokenizers see words as they appear in running text (WordPiece drops the space anyway).
    words = [[w if i == 0 else " " + w for i, w in enumerate(ex["tokens"])] for ex in examples]
    with truncated(tokenizer, max_len):
        encs = tokenizer.encode_batch(words, is_pretokenized=True)
    out = []
    for enc, ex in zip(encs, examples):
        labels, first = [IGNORE] * len(enc.ids), [-1] * len(ex["tokens"])
        for pos, w in enumerate(enc.word_ids):
            if w is not None and first[w] == -1:
                first[w] = pos
                labels[pos] = tag_ids.get(ex["tags"][w], IGNORE)
        out.append({"ids": enc.ids, "labels": labels, "first": first})
    return out


def tc_tag_ids(train, spec: TaskSpec) -> dict:
    names = list(spec.label_names) if spec.label_names else sorted({t for ex in train for t in ex["tags"]})
    if "O" in names:  # O is class 0, as in the Hub's ClassLabels
        names.remove("O")
        names.insert(0, "O")
    return {t: i for i, t in enumerate(names)}


# ----------------------------------------------------------------------------- one task


def _limit(items, n):
    return items if n is None else items[:n]


def finetune_sc(encoder, tokenizer, spec, data, cfg, device):
    label_ids = sc_label_ids(spec, data["train"])
    max_len = model_max_len(encoder, cfg)
    feats = {s: encode_sc(tokenizer, _limit(data[s], cfg.max_train if s == "train" else cfg.max_eval),
                          max_len, label_ids) for s in ("train", "validation", "test")}
    pad = pad_id_of(tokenizer, encoder)
    model = build_model(encoder, spec, cfg, len(set(label_ids.values()))).to(device)
    train = feats["train"]

    def loss_of_batch(idx):
        ids, mask = pad_batch([train[i]["ids"] for i in idx], pad, cfg.pad_to, device)
        labels = torch.tensor([train[i]["label"] for i in idx], device=device)
        return F.cross_entropy(model(ids, mask).float(), labels)

    batches = train_order([len(f["ids"]) for f in train], cfg.batch_size, cfg.steps, cfg.seed, cfg.bucket)
    stats = train_loop(model, loss_of_batch, batches, cfg, device, f"{spec.name} lr={cfg.lr:g} seed={cfg.seed}")
    result = {"train": stats}
    for split in ("validation", "test"):
        logits = forward_all(model, [f["ids"] for f in feats[split]], pad, cfg, device)
        preds = [int(np.argmax(l[0])) for l in logits]
        gold = [f["label"] for f in feats[split]]
        scores = {"accuracy": metrics.accuracy(preds, gold)}
        if len(label_ids) == 2:
            scores["f1"] = metrics.binary_f1(preds, gold)
        result[split] = scores
    return result


def finetune_tc(encoder, tokenizer, spec, data, cfg, device):
    tag_ids = tc_tag_ids(data["train"], spec)
    tag_names = {i: t for t, i in tag_ids.items()}
    max_len = model_max_len(encoder, cfg)
    examples = {s: _limit(data[s], cfg.max_train if s == "train" else cfg.max_eval)
                for s in ("train", "validation", "test")}
    feats = {s: encode_tc(tokenizer, ex, max_len, tag_ids) for s, ex in examples.items()}
    pad = pad_id_of(tokenizer, encoder)
    model = build_model(encoder, spec, cfg, len(tag_ids)).to(device)
    train = feats["train"]

    def loss_of_batch(idx):
        ids, mask = pad_batch([train[i]["ids"] for i in idx], pad, cfg.pad_to, device)
        labels, _ = pad_batch([train[i]["labels"] for i in idx], pad, cfg.pad_to, device, fill=IGNORE)
        logits = model(ids, mask).float()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)

    steps = max(1, math.ceil(cfg.tc_epochs * len(train) / cfg.batch_size))
    batches = train_order([len(f["ids"]) for f in train], cfg.batch_size, steps, cfg.seed, cfg.bucket)
    stats = train_loop(model, loss_of_batch, batches, cfg, device, f"{spec.name} lr={cfg.lr:g} seed={cfg.seed}")
    result = {"train": stats}
    for split in ("validation", "test"):
        logits = forward_all(model, [f["ids"] for f in feats[split]], pad, cfg, device, per_token=True)
        preds = [[tag_names[int(np.argmax(l[0][p]))] if p >= 0 else "O" for p in f["first"]]
                 for l, f in zip(logits, feats[split])]
        result[split] = metrics.ner_scores([ex["tags"] for ex in examples[split]], preds)
    return result


def finetune_qa(encoder, tokenizer, spec, data, cfg, device):
    max_len = model_max_len(encoder, cfg)
    examples = {s: _limit(data[s], cfg.max_train if s == "train" else cfg.max_eval)
                for s in ("train", "validation", "test")}
    feats = {s: qa_features(tokenizer, ex, max_len, cfg.doc_stride, cfg.max_question_tokens)
             for s, ex in examples.items()}
    pad = pad_id_of(tokenizer, encoder)
    model = build_model(encoder, spec, cfg).to(device)
    train = feats["train"]

    def loss_of_batch(idx):
        ids, mask = pad_batch([train[i].input_ids for i in idx], pad, cfg.pad_to, device)
        types, _ = pad_batch([train[i].type_ids for i in idx], 0, cfg.pad_to, device)
        start, end = model(ids, mask, token_type_ids=types)
        gold_s = torch.tensor([train[i].start for i in idx], device=device)
        gold_e = torch.tensor([train[i].end for i in idx], device=device)
        return (F.cross_entropy(start, gold_s) + F.cross_entropy(end, gold_e)) / 2

    batches = train_order([len(f.input_ids) for f in train], cfg.batch_size, cfg.steps, cfg.seed, cfg.bucket)
    stats = train_loop(model, loss_of_batch, batches, cfg, device, f"{spec.name} lr={cfg.lr:g} seed={cfg.seed}")
    result = {"train": stats}
    # SQuAD v2 style when the training set has unanswerable questions
    with_null = any(not ex["answers"] for ex in examples["train"])
    threshold = 0.0
    for split in ("validation", "test"):
        outs = forward_all(model, [f.input_ids for f in feats[split]], pad, cfg, device, per_token=True,
                           types=[f.type_ids for f in feats[split]])
        texts, margins = best_spans(examples[split], feats[split], [o[0] for o in outs], [o[1] for o in outs],
                                    cfg.n_best, cfg.max_answer_tokens)
        golds = {str(ex["id"]): ex["answers"] for ex in examples[split]}
        if not with_null:
            result[split] = metrics.squad_scores(texts, golds)
            continue
        if split == "validation":  # tuned on validation, applied unchanged to test
            threshold, _ = metrics.best_null_threshold(texts, margins, golds, "f1")
        scores = metrics.squad_scores(apply_null_threshold(texts, margins, threshold), golds)
        at_zero = metrics.squad_scores(apply_null_threshold(texts, margins, 0.0), golds)
        result[split] = {**scores, "null_threshold": threshold,
                         "exact_at_threshold_0": at_zero["exact"], "f1_at_threshold_0": at_zero["f1"]}
    return result


FINETUNE = {"sc": finetune_sc, "tc": finetune_tc, "qa": finetune_qa}


def finetune(encoder, tokenizer, spec: TaskSpec, data: dict, cfg: FinetuneConfig) -> dict:
    """Fine-tune `encoder` (consumed: its weights change) on one task and score validation + test."""
    device = resolve_device(cfg)
    seed_everything(cfg.seed)
    return FINETUNE[spec.kind](encoder, tokenizer, spec, data, cfg, device)


# ----------------------------------------------------------------------------- the grid


def model_slug(spec: str) -> str:
    """A folder name for a checkpoint: org--name for hf:org/name[@rev]; for a local folder its last
    two path parts and a hash of the whole path (runs/mlm40/final -> mlm40--final-3f2a9c1e), so that
    the step_N/model folders of two runs never share results."""
    def clean(text):
        return re.sub(r"[^\w.@-]+", "--", text).strip("-")
    if spec.startswith("hf:"):
        return clean(spec[3:])
    path = Path(spec).resolve()
    return clean("/".join(path.parts[-2:])) + "-" + hashlib.sha1(str(path).encode()).hexdigest()[:8]


def run_path(out, model_spec, task, lr, seed) -> Path:
    return Path(out) / "runs" / model_slug(model_spec) / task / f"lr{lr:g}_seed{seed}.json"


def write_json_atomic(path: Path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(obj, indent=2, default=float), unique=True)


def finished(path: Path, stamp: dict | None = None) -> bool:
    """A run file that parses, says done, and (given `stamp`) was computed from the same inputs."""
    record = stamps.read(path)
    return (record is not None and record.get("done") is True
            and (stamp is None or stamps.same(record.get("stamp"), stamp)))


# what a FinetuneConfig holds that does not shape a result (the device counts through its autocast)
NOT_SHAPING = ("progress", "device")


def local_files(spec_or_path) -> list | None:
    """A task's (or the IR training pairs') local file or folder, None for Hub data, which its name
    (and revision) identifies."""
    if not spec_or_path or str(spec_or_path).startswith("hf:") or not Path(spec_or_path).exists():
        return None
    return [spec_or_path]


def model_inputs(model_spec) -> list[Path]:
    """The files the model is read from (hf.models.model_files); an hf: spec is resolved first (the
    files its revision names now)."""
    from hf.models import model_files, resolve_model_folder
    return model_files(resolve_model_folder(model_spec))


def run_stamp(model_spec, model_files, spec: TaskSpec, task_files, cfg: FinetuneConfig, extra=None) -> dict:
    """What one run's result is computed from: the model and its files, the task's definition and
    files, every FinetuneConfig field that shapes the run (steps, max_train, max_len, pooling,
    batch size, lr, seed, ...) and whether it runs under bf16 autocast. Files (model_files,
    task_files, and `extra`'s lists of paths under names ending in _files) by content (data/stamp.py:
    size and SHA-256 of every file, cached); None: no local files."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_SHAPING}
    settings["bf16_autocast"] = cfg.bf16 if cfg.bf16 is not None else resolve_device(cfg).type == "cuda"
    named = {"model_files": model_files, "task_files": task_files, **(extra or {})}
    files = {k: v for k, v in named.items() if k.endswith("_files") and v is not None}
    plain = {k: v for k, v in named.items() if k not in files}
    return stamps.make({"model": model_spec, "task": dataclasses.asdict(spec), "config": settings, **plain}, files)


def pending_runs(out, model_spec, task, keys, stamp_of) -> list:
    """The (lr, seed) of `keys` that have no finished run of the same stamp. Finished runs of other
    inputs (another --steps, --max-train, data file, model...) are moved aside to NAME.stale-N and
    run again; one line per task says so and what changed."""
    todo, stale = [], []
    for lr, seed in keys:
        path = run_path(out, model_spec, task, lr, seed)
        if finished(path, stamp_of(lr, seed)):
            continue
        record = stamps.read(path)
        if record is not None:
            stale.append((path, record.get("stamp"), stamp_of(lr, seed)))
        todo.append((lr, seed))
    if stale:
        asides = [stamps.move_aside(path) for path, _, _ in stale]
        stamps.note(f"note: {len(stale)} finished fine-tuning run(s) of {model_spec} on {task} were computed from "
                    f"other inputs ({stamps.differences(stale[0][1], stale[0][2])}); moved aside "
                    f"({asides[0]}{', ...' if len(asides) > 1 else ''}), running them again")
    return todo


def run_grid(models, tasks, lrs=LR_GRID, seeds=SEEDS, out="runs/finetune", cfg=None, ir_train=None):
    """Fine-tune every model on every task for every (lr, seed), skipping finished runs, then
    write the table. `tasks`: names or `name=PATH` strings (eval/finetune_data.parse_task).
    Returns {"executed": n, "skipped": n, "rows": table rows}."""
    from checkpoint import RunLock
    cfg = cfg or FinetuneConfig()
    parsed = [parse_task(t) if isinstance(t, str) else t for t in tasks]
    with RunLock(out, what="fine-tuning grid", option="--out"):  # one writer per --out
        return _run_grid(models, parsed, lrs, seeds, out, cfg, ir_train)


def _run_grid(models, parsed, lrs, seeds, out, cfg, ir_train):
    ir_tasks = [(s, p) for s, p in parsed if s.kind == "ir"]
    data_cache, executed, skipped = {}, 0, 0
    task_files = {path: local_files(path) for _, path in parsed}
    for model_spec in models:
        loaded, model_files = {}, model_inputs(model_spec)

        def load_model():  # once per model, and only when some run of it is not finished
            if not loaded:
                loaded["tok"], loaded["base"] = load_tokenizer(model_spec), from_pretrained(model_spec)
            return loaded["tok"], loaded["base"]

        for spec, path in parsed:
            if spec.kind == "ir":
                continue
            stamp_of = lambda lr, seed, spec=spec, path=path: run_stamp(
                model_spec, model_files, spec, task_files[path], dataclasses.replace(cfg, lr=lr, seed=seed))
            todo = pending_runs(out, model_spec, spec.name, [(lr, seed) for lr in lrs for seed in seeds], stamp_of)
            skipped += len(lrs) * len(seeds) - len(todo)
            if not todo:
                continue
            tokenizer, base = load_model()
            if (spec.name, path) not in data_cache:
                data_cache[(spec.name, path)] = load_task(spec, path)
            for lr, seed in todo:
                run_cfg = dataclasses.replace(cfg, lr=lr, seed=seed)
                result = finetune(copy.deepcopy(base), tokenizer, spec, data_cache[(spec.name, path)], run_cfg)
                write_result(out, model_spec, spec, run_cfg, result, stamp_of(lr, seed))
                executed += 1
        if ir_tasks:
            n_exec, n_skip = run_ir_grid(model_spec, ir_tasks, lrs, seeds, out, cfg, ir_train, data_cache, load_model,
                                         model_files, task_files)
            executed, skipped = executed + n_exec, skipped + n_skip
    rows = summarize(out, models, [s for s, _ in parsed], lrs, seeds)
    write_table(out, rows)
    return {"executed": executed, "skipped": skipped, "rows": rows}


def ir_training_pairs(ir_train, data_cache):
    key = ("msmarco-pairs", ir_train)
    if key not in data_cache:
        data_cache[key] = load_task(TASKS["msmarco-pairs"], ir_train)["train"]
    return data_cache[key]


def run_ir_grid(model_spec, ir_tasks, lrs, seeds, out, cfg, ir_train, data_cache, load_model, model_files=None,
                task_files=None):
    """Retrieval (eval/finetune_ir.py): train one bi-encoder per (lr, seed) with any retrieval
    result missing, and evaluate it on every missing set. Returns (runs executed, runs skipped),
    one run per (set, lr, seed). A run's stamp also holds the training pairs' identity."""
    executed = skipped = 0
    task_files = task_files or {}
    train = {"ir_train": ir_train, "ir_train_files": local_files(ir_train)}
    stamp_of = {spec.name: (lambda lr, seed, spec=spec, path=path: run_stamp(
        model_spec, model_files, spec, task_files.get(path), dataclasses.replace(cfg, lr=lr, seed=seed), train))
        for spec, path in ir_tasks}
    pending = {spec.name: set(pending_runs(out, model_spec, spec.name, [(lr, seed) for lr in lrs for seed in seeds],
                                           stamp_of[spec.name])) for spec, _ in ir_tasks}
    for lr in lrs:
        for seed in seeds:
            missing = [(s, p) for s, p in ir_tasks if (lr, seed) in pending[s.name]]
            skipped += len(ir_tasks) - len(missing)
            if not missing:
                continue
            tokenizer, base = load_model()
            run_cfg = dataclasses.replace(cfg, lr=lr, seed=seed)
            pairs = ir_training_pairs(ir_train, data_cache)
            model, stats = finetune_ir.train_biencoder(copy.deepcopy(base), tokenizer, pairs, run_cfg)
            for spec, path in missing:
                key = ("ir-eval", spec.name, path)
                if key not in data_cache:
                    data_cache[key] = finetune_ir.load_ir_eval(spec.name, path)
                scores = finetune_ir.evaluate_set(model, tokenizer, data_cache[key], run_cfg, resolve_device(run_cfg))
                write_result(out, model_spec, spec, run_cfg, {"train": stats, **scores}, stamp_of[spec.name](lr, seed))
                executed += 1
    return executed, skipped


def write_result(out, model_spec, spec: TaskSpec, cfg: FinetuneConfig, result: dict, stamp: dict | None = None):
    record = {"model": model_spec, "task": spec.name, "kind": spec.kind, "metric": spec.metric,
              "lr": cfg.lr, "seed": cfg.seed, **result, "config": dataclasses.asdict(cfg), "stamp": stamp,
              "done": True}
    write_json_atomic(run_path(out, model_spec, spec.name, cfg.lr, cfg.seed), record)


def summarize(out, models, specs, lrs, seeds) -> list[dict]:
    """Per (model, task): the lr with the best mean validation score, and the test mean +- std
    over the seeds at that lr (scores x 100)."""
    rows = []
    for model_spec in models:
        for spec in specs:
            per_lr = {}
            for lr in lrs:
                runs = []
                for seed in seeds:
                    path = run_path(out, model_spec, spec.name, lr, seed)
                    if finished(path):
                        runs.append(json.loads(path.read_text()))
                if runs:
                    per_lr[lr] = runs
            if not per_lr:
                continue
            val = {lr: statistics.mean(r["validation"][spec.metric] for r in runs) for lr, runs in per_lr.items()}
            best = max(val, key=lambda lr: (val[lr], -lr))
            test = [100 * r["test"][spec.metric] for r in per_lr[best]]
            rows.append({"model": model_spec, "task": spec.name, "metric": spec.metric, "best_lr": best,
                         "n_seeds": len(test), "val_mean": 100 * val[best], "test_mean": statistics.mean(test),
                         "test_std": statistics.stdev(test) if len(test) > 1 else 0.0})
    return rows


def write_table(out, rows):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fields = ["model", "task", "metric", "best_lr", "n_seeds", "val_mean", "test_mean", "test_std"]
    with atomic_write(out / "results.csv", "w") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    write_text(out / "results.md", format_table(rows))


def format_table(rows) -> str:
    """Markdown: one row per model, one column per task, test mean +- std at the best lr."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    cell = {(r["model"], r["task"]): f"{r['test_mean']:.1f} ± {r['test_std']:.1f} (lr {r['best_lr']:g})"
            for r in rows}
    metric = {r["task"]: r["metric"] for r in rows}
    lines = ["| model | " + " | ".join(f"{t} ({metric[t]})" for t in tasks) + " |",
             "|---|" + "---|" * len(tasks)]
    for m in models:
        lines.append(f"| {m} | " + " | ".join(cell.get((m, t), "–") for t in tasks) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- CLI


def _floats(text):
    return tuple(float(x) for x in text.split(",") if x)


def _ints(text):
    return tuple(int(x) for x in text.split(",") if x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="comma-separated checkpoints (folders or hf:org/name)")
    ap.add_argument("--tasks", required=True, help=f"comma-separated tasks: {', '.join(TASKS)}, msmarco, nq, "
                    "mldr; NAME=PATH reads local files; KIND:NAME=PATH defines a new task")
    ap.add_argument("--out", required=True)
    ap.add_argument("--lrs", type=_floats, default=LR_GRID)
    ap.add_argument("--seeds", type=_ints, default=SEEDS)
    d = FinetuneConfig()
    ap.add_argument("--steps", type=int, default=d.steps, help="SC, QA and IR training steps")
    ap.add_argument("--tc-epochs", type=float, default=d.tc_epochs)
    ap.add_argument("--batch-size", type=int, default=d.batch_size)
    ap.add_argument("--max-len", type=int, default=d.max_len)
    ap.add_argument("--pooling", choices=("mean", "bos", "late"), default=d.pooling)
    ap.add_argument("--causal", action="store_true", help="keep the causal mask (ablation)")
    ap.add_argument("--bucket", action="store_true", help="length-bucketed training batches")
    ap.add_argument("--doc-stride", type=int, default=d.doc_stride)
    ap.add_argument("--max-train", type=int, default=None, help="first N training examples only")
    ap.add_argument("--max-eval", type=int, default=None, help="first N validation/test examples only (SC/TC/QA)")
    ap.add_argument("--device", default=d.device)
    ap.add_argument("--no-bf16", action="store_true", help="fp32 even on CUDA")
    ap.add_argument("--ir-train", default=None, help="local query/positive pairs instead of the Hub's")
    args = ap.parse_args(argv)
    cfg = FinetuneConfig(steps=args.steps, tc_epochs=args.tc_epochs, batch_size=args.batch_size,
                         max_len=args.max_len, pooling=args.pooling, causal=args.causal, bucket=args.bucket,
                         doc_stride=args.doc_stride, max_train=args.max_train, max_eval=args.max_eval,
                         device=args.device, bf16=False if args.no_bf16 else None)
    result = run_grid([m for m in args.models.split(",") if m], [t for t in args.tasks.split(",") if t],
                      args.lrs, args.seeds, args.out, cfg, args.ir_train)
    print(f"runs executed {result['executed']}, skipped (already done) {result['skipped']}")
    print(format_table(result["rows"]))
    print(f"table: {Path(args.out) / 'results.md'} and results.csv")


if __name__ == "__main__":
    from cli import run_cli
    run_cli(main)
