"""Fine-tuning evaluation of pretrained encoders (paper 3, "Should we still pretrain encoders with
MLM?"): sequence classification (SC), token classification (TC), extractive QA and retrieval (IR),
with the paper's learning-rate grid and seeds, resumable, into one table. Datasets and splits:
eval/finetune_data.py; the protocol and its numbers: docs/mlm_vs_clm.md.

    python eval/finetune.py --models out/mlm40/final,hf:EuroBERT/EuroBERT-210m \
        --tasks sst2,mnli,qqp,conll2003,ontonotes5,uner_en,squad,squad_v2,record,msmarco,nq,mldr \
        --out runs/ft
    python -m eval.finetune --models out/clm/final --tasks sst2=data/repro/labeled/sst2 \
        --lrs 5e-5,1e-4 --seeds 0,1 --steps 200 --out runs/quick

The learning rate is chosen by the mean validation score over seeds and the table reports the test
mean +- std (sample std over seeds) at that learning rate. Attention is bidirectional whatever the
pretraining objective (--causal keeps the causal mask, an ablation); the MLM/LM head is dropped.

Output: OUT/runs/<model>/<task>/lr<lr>_seed<seed>.json per run, and OUT/results.md + results.csv.
A rerun skips a finished run whose stamp (run_stamp) is the run's now; one of other inputs is kept as
NAME.<its key's digest> and run again. One grid at a time writes an --out (OUT/RUN.lock).
"""
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import collections
import copy
import csv
import dataclasses
import hashlib
import json
import math
import re
import statistics
import string
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

import model as M
from data import manifest
from data.atomic import atomic_write, write_text
from data.tokenizer import pad_batch, token_ids, truncated
from eval.dense import dense_search
from eval.finetune_data import TASKS, FinetuneDataError, TaskSpec, load_ir_eval, load_task, parse_task
from eval.metrics import evaluate, mean_metrics
from hf.models import from_pretrained, load_tokenizer, model_files, resolve_model_folder
from training import adamw, autocast, default_dtype, lr_at, pick_device, seed_everything

LR_GRID = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4)
SEEDS = (0, 1, 2, 3, 4)
IGNORE = M.IGNORE_INDEX  # -100: labels outside the loss (cross-entropy's ignore_index)


@dataclasses.dataclass
class FinetuneConfig:
    """The paper's protocol (EncodEval): batch 32, AdamW (0.9, 0.95), eps 1e-5, weight decay 0.1,
    linear schedule with 10 % warm-up, 1 000 steps for SC, QA and IR, one epoch for TC."""
    lr: float = 5e-5
    seed: int = 0
    batch_size: int = 32
    steps: int = 1000             # SC, QA, IR
    tc_epochs: float = 1.0        # TC trains for epochs instead of steps
    warmup_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-5
    grad_clip: float = 1.0
    max_len: int = 512
    pooling: str = "mean"         # mean | bos | late (SC)
    causal: bool = False          # keep the causal mask (ablation); default bidirectional
    bucket: bool = False          # length-bucketed training batches
    pad_to: int | None = None     # pad every batch to this length (benchmark); None = dynamic
    eval_batch_size: int = 64
    doc_stride: int = 128         # QA window overlap in tokens
    max_question_tokens: int = 64
    n_best: int = 20
    max_answer_tokens: int = 30
    max_train: int | None = None  # use only the first N training examples (quick runs)
    max_eval: int | None = None   # and the first N validation / test examples
    device: str = "auto"
    bf16: bool | None = None      # None: bf16 autocast on CUDA only
    progress: bool = True


def model_max_len(encoder, cfg):
    """cfg.max_len, capped by a learned position table (ModelConfig.position_limit)."""
    return min(cfg.max_len, encoder.config.position_limit or cfg.max_len)


def pad_id_of(tokenizer, encoder) -> int:
    """The tokenizer's pad id, else the model's, else the tokenizer's EOS (a causal model's), else 0."""
    special = getattr(tokenizer, "special", None)
    candidates = (special and special.pad, encoder.config.pad_id, special and special.eos)
    return next((int(pid) for pid in candidates if pid is not None), 0)


def mean_pool(h, mask):
    """Mean of the hidden states of the real (non-padding) tokens, in fp32."""
    m = mask.to(torch.float32).unsqueeze(-1)
    return (h.float() * m).sum(1) / m.sum(1).clamp(min=1.0)


def amp(device, cfg: FinetuneConfig):
    """bf16 autocast as cfg.bf16 says (None: training.default_dtype, bf16 on CUDA only)."""
    dtype = default_dtype(device) if cfg.bf16 is None else torch.bfloat16 if cfg.bf16 else torch.float32
    return autocast(device, dtype)


# ----------------------------------------------------------------------------- the loop
def train_order(lengths, batch_size, steps, seed, bucket=False):
    """`steps` batches of example indices: each epoch a seeded permutation cut into batches (the last
    may be smaller: a DataLoader without drop_last). bucket: each window of 64 batches is sorted by
    length, then its batches shuffled: a batch holds similar lengths, the order stays random."""
    rng = np.random.default_rng(seed)
    batches = []
    while len(batches) < steps:
        order = rng.permutation(len(lengths))
        window = 64 * batch_size if bucket else len(order)
        for s in range(0, len(order), window):
            part = order[s:s + window]
            if bucket:
                part = part[np.argsort([lengths[i] for i in part], kind="stable")]
            groups = [part[k:k + batch_size].tolist() for k in range(0, len(part), batch_size)]
            if bucket:
                rng.shuffle(groups)
            batches += groups
    return batches[:steps]


def train_loop(model, loss_of_batch, lengths, steps, cfg: FinetuneConfig, device, desc):
    """Plain AdamW loop over `steps` batches of train_order. Returns timing and losses."""
    batches = train_order(lengths, cfg.batch_size, steps, cfg.seed, cfg.bucket)
    model.train()
    opt = adamw(model, cfg.lr, cfg.weight_decay, betas=cfg.betas, eps=cfg.eps, device=device)
    warmup, losses = math.ceil(cfg.warmup_ratio * len(batches)), []
    start = time.perf_counter()
    for step, idx in enumerate(tqdm(batches, desc=f"{desc} lr={cfg.lr:g} seed={cfg.seed}",
                                    disable=not cfg.progress, leave=False)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, lr=cfg.lr, warmup=warmup, total=len(batches), schedule="linear")
        with amp(device, cfg):
            loss = loss_of_batch(idx)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())  # no .item() here: it would wait for the GPU every step
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    losses = torch.stack(losses).float().cpu().tolist() if losses else []
    seen = sum(map(len, batches))
    return {"steps": len(batches), "examples": seen, "seconds": seconds, "examples_per_s": seen / max(seconds, 1e-9),
            "first_loss": losses[0] if losses else None,
            "last_loss": float(np.mean(losses[-10:])) if losses else None}


@torch.no_grad()
def forward_all(model, seqs, pad_id, cfg, device, per_token=False, types=None):
    """Model outputs (numpy tuples) per sequence in input order; per_token: cut to its length; types: segment ids."""
    model.eval()
    outs = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    batches = [order[k:k + cfg.eval_batch_size] for k in range(0, len(order), cfg.eval_batch_size)]
    for idx in tqdm(batches, desc="evaluate", disable=not cfg.progress or len(batches) < 10, leave=False):
        ids, mask = pad_batch([seqs[i] for i in idx], pad_id, device=device)
        kw = {} if types is None else {"token_type_ids": pad_batch([types[i] for i in idx], 0, device=device)[0]}
        with amp(device, cfg):
            y = model(ids, mask, **kw)
        ys = [t.float().cpu().numpy() for t in (y if isinstance(y, tuple) else (y,))]
        for row, i in enumerate(idx):
            outs[i] = tuple(t[row, :len(seqs[i])] if per_token else t[row] for t in ys)
    return outs


# ----------------------------------------------------------------------------- heads
# initialised N(0, 0.02) with zero bias, like the Hugging Face heads the paper used
def init_linear(layer: nn.Linear):
    nn.init.normal_(layer.weight, std=0.02)
    nn.init.zeros_(layer.bias)
    return layer


class PooledClassifier(nn.Module):
    """EuroBERT's sequence-classification head (`classifier_pooling`): `mean` or `bos` pools the final
    hidden states (masked mean, or the first token), then dense -> GELU -> dense; `late` applies those
    to every token and averages the logits. EuroBERT's default is `late`; ours `mean`, fit for causal ablations."""
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
    """A linear layer per token: a word is labelled and predicted on its first sub-word."""
    def __init__(self, d, num_labels):
        super().__init__()
        self.out = init_linear(nn.Linear(d, num_labels))

    def forward(self, h, mask):
        return self.out(h)


class SpanHead(TokenClassifier):
    """(start, end) logits per token; padding positions can never be a start or an end."""
    def __init__(self, d):
        super().__init__(d, 2)

    def forward(self, h, mask):
        logits = self.out(h).float().masked_fill(~mask.bool()[..., None], torch.finfo(torch.float32).min)
        return logits[..., 0], logits[..., 1]


def unit_mean(h, mask):
    """The bi-encoder's text vector: the mean of its token states, of length 1 (cosine = dot product)."""
    return F.normalize(mean_pool(h, mask), dim=-1)


class FinetuneModel(nn.Module):
    def __init__(self, encoder: M.Transformer, head, causal=False):
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
    head = (PooledClassifier(d, num_labels, cfg.pooling) if spec.kind == "sc" else
            TokenClassifier(d, num_labels) if spec.kind == "tc" else SpanHead(d))
    return FinetuneModel(encoder, head, cfg.causal)


# ----------------------------------------------------------------------------- metrics
# Every score is a fraction in [0, 1]; the tables multiply by 100.
def accuracy(preds, labels) -> float:
    return sum(p == y for p, y in zip(preds, labels, strict=True)) / len(labels)


def binary_f1(preds, labels, positive=1) -> float:
    """F1 of the positive class: 2 TP / (2 TP + FP + FN); 0 when there is no positive at all."""
    tp = sum(p == y == positive for p, y in zip(preds, labels))
    wrong = sum((p == positive) != (y == positive) for p, y in zip(preds, labels))   # FP + FN
    return 2 * tp / (2 * tp + wrong) if tp else 0.0


def entity_spans(tags) -> list[tuple[str, int, int]]:
    """(type, first word, last word) of every entity in one sentence's BIO tags, as conlleval sees
    them: an entity is a maximal run of tags of one type that starts at a `B-X`, or at an `I-X` that
    does not continue an entity of type X (so IOB1 and IOB2 both read right); it ends before the
    next `B-`, `O`, or tag of another type."""
    spans, start, kind = [], None, None
    for i, tag in enumerate(list(tags) + ["O"]):  # a sentinel O closes an entity at the end
        prefix, _, this = tag.partition("-")
        if tag != "O" and (prefix not in ("B", "I") or not this):
            raise ValueError(f"tag {tag!r} is not BIO ('O', 'B-TYPE' or 'I-TYPE'): convert the tags first")
        continues = prefix == "I" and this == kind
        if start is not None and not continues:
            spans.append((kind, start, i - 1))
            start, kind = None, None
        if prefix == "B" or (prefix == "I" and not continues):
            start, kind = i, this
    return spans


def ner_scores(gold_sentences, pred_sentences) -> dict:
    """Entity-level micro precision, recall and F1 over sentences of BIO tag strings: a predicted
    entity is correct only when its first word, last word and type all equal a gold entity's."""
    n_gold = n_pred = n_correct = 0
    for gold, pred in zip(gold_sentences, pred_sentences, strict=True):
        g, p = set(entity_spans(gold)), set(entity_spans(pred))
        n_gold, n_pred, n_correct = n_gold + len(g), n_pred + len(p), n_correct + len(g & p)
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "gold_entities": n_gold, "predicted_entities": n_pred}


_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lower, drop punctuation, drop articles, squash spaces.
    (Order matters: punctuation goes before the article regex, so "the-end" keeps "theend".)"""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD's F1: the bag-of-tokens overlap of the normalised strings."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:  # v2: both empty is a match, one empty is a miss
        return float(pred_tokens == gold_tokens)
    overlap = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    return 2 * overlap / (len(pred_tokens) + len(gold_tokens))  # 2PR / (P + R), P = overlap / |pred|, R = ... / |gold|


def gold_texts(answers) -> list[str]:
    """The gold strings of a question: its answer texts, or [""] when it has none (v2)."""
    texts = [a["text"] if isinstance(a, dict) else a for a in answers]
    return [t for t in texts if normalize_answer(t)] or [""]


def question_scores(prediction: str, answers) -> tuple[float, float]:
    """(EM, F1) of one prediction, each the max over the gold answers."""
    golds = gold_texts(answers)
    exact = max(float(normalize_answer(prediction) == normalize_answer(g)) for g in golds)
    return exact, max(token_f1(prediction, g) for g in golds)


def squad_scores(predictions: dict, golds: dict) -> dict:
    """Mean EM and F1 over `golds` ({id: answers}), a missing prediction a miss (the official script's);
    HasAns / NoAns breakdowns when both kinds of question are present (v2)."""
    per = {qid: question_scores(predictions.get(qid) or "", answers) for qid, answers in golds.items()}
    has = {qid for qid, answers in golds.items() if gold_texts(answers) != [""]}
    groups = {"": set(golds)}
    if has and len(has) < len(golds):
        groups.update(HasAns_=has, NoAns_=set(golds) - has)
    out = {}
    for name, ids in groups.items():
        out.update({f"{name}exact": statistics.fmean(per[q][0] for q in ids),
                    f"{name}f1": statistics.fmean(per[q][1] for q in ids), f"{name}total": len(ids)})
    return out


def best_null_threshold(best_spans: dict, null_margins: dict, golds: dict):
    """(t, best mean F1) when a question is answered "" iff its null margin (null score minus
    best span score) is > t: the official v2 script's sweep, moving the questions one by one, largest
    margin first, from "answered" to "empty"; the best cut lies between two consecutive margins."""
    if not golds:
        return 0.0, 0.0
    answered = {q: question_scores(best_spans.get(q, ""), golds[q])[1] for q in golds}
    empty = {q: question_scores("", golds[q])[1] for q in golds}
    # every question answered (threshold above every margin), then the threshold past one margin at a time
    order = sorted(golds, key=lambda q: null_margins.get(q, float("-inf")), reverse=True)
    total = sum(answered.values())
    best_total, best_t = total, (null_margins.get(order[0], 0.0) + 1.0) if order else 0.0
    for i, q in enumerate(order):
        total += empty[q] - answered[q]
        nxt = null_margins.get(order[i + 1], float("-inf")) if i + 1 < len(order) else float("-inf")
        here = null_margins.get(q, float("-inf"))
        if total > best_total and here != nxt:
            # every question with margin >= here is now empty: any t in [nxt, here) does that
            best_total = total
            best_t = nxt if nxt != float("-inf") else here - 1.0
    return float(best_t), best_total / len(golds)


# ----------------------------------------------------------------------------- tokenisation
def encode_sc(tokenizer, examples, max_len, label_ids: dict):
    ids = token_ids(tokenizer, [ex["text"] for ex in examples], max_len)
    unknown = next((ex["label"] for ex in examples if ex["label"] not in label_ids), None)
    if unknown is not None:
        raise FinetuneDataError(f"label {unknown!r} does not occur in the training set ({sorted(label_ids, key=str)}); "
                                "GLUE's unlabelled rows have -1: a split of them cannot be scored")
    return [{"ids": x, "label": label_ids[ex["label"]]} for x, ex in zip(ids, examples)]


def sc_label_ids(spec: TaskSpec, train) -> dict:
    """Label value -> class id: integers are their own; strings numbered in sorted order (or the spec's names)."""
    values = sorted({ex["label"] for ex in train}, key=str)
    if not values:
        raise FinetuneDataError(f"task {spec.name}: no training examples (an empty training file, or one so "
                                "small that the 5 % held out for validation took it all). Fix: give more examples.")
    if all(isinstance(v, int) for v in values):
        if min(values) < 0:
            raise FinetuneDataError(f"task {spec.name}: negative label {min(values)} in the training set "
                                    f"(GLUE marks unlabelled test rows with -1; they cannot be trained on)")
        return {i: i for i in range(max(max(values) + 1, spec.num_labels or 0))}
    return {v: i for i, v in enumerate(spec.label_names or values)}


def encode_tc(tokenizer, examples, max_len, tag_ids: dict):
    """Token ids, labels on each word's first sub-word (else -100), and its position (-1 if cut off: O)."""
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
    return {t: i for i, t in enumerate(sorted(names, key=lambda t: t != "O"))}  # O is class 0, as on the Hub


# ----------------------------------------------------------------------------- extractive QA
# A context longer than the model's input is cut into windows that each hold the whole question and
# overlap by `stride` context tokens, so an answer near a cut is whole in at least one window; a
# training window without the whole gold answer is labelled with the null position. Token 0 ([CLS],
# <s>, <|begin_of_text|>) scores "no answer"; an example's null score is the smallest start_0 + end_0
# over its windows. Post-processing pairs the n_best start and end logits of each window (end >=
# start, at most max_answer_tokens), scores start + end, and cuts the best span's text from the
# context by the tokens' character offsets. SQuAD v2: "" when null score - best span score > a
# threshold tuned on validation (best_null_threshold) and applied unchanged to test.
NULL_INDEX = 0


@dataclasses.dataclass
class QAFeature:
    input_ids: list
    example: int              # index of the example this window comes from
    offsets: list             # (char start, char end) in the context, None outside the context
    type_ids: list            # segment ids (0 question, 1 context) for models with segment embeddings
    start: int = NULL_INDEX   # training labels: answer start/end token, NULL_INDEX when absent
    end: int = NULL_INDEX


def truncate_question(tokenizer, question: str, max_tokens: int) -> str:
    """The question cut to its first `max_tokens` tokens, at a character boundary."""
    enc = tokenizer.encode(question, add_special_tokens=False)
    return question if len(enc.ids) <= max_tokens else question[:enc.offsets[max_tokens - 1][1]]


def answer_tokens(offsets, start_char: int, end_char: int):
    """(first, last) context token of the span [start_char, end_char) in one window, or None if not all in it."""
    ctx = [i for i, o in enumerate(offsets) if o is not None]
    if not ctx or start_char < offsets[ctx[0]][0] or end_char > offsets[ctx[-1]][1]:
        return None
    first = max(i for i in ctx if offsets[i][0] <= start_char)
    last = min(i for i in ctx if offsets[i][1] >= end_char)
    return (first, last) if last >= first else None


def qa_features(tokenizer, examples, max_len=384, stride=128, max_question_tokens=64) -> list:
    """Windows of every example, labelled with the first gold answer."""
    pair_specials = tokenizer.num_special_tokens_to_add(True)
    room = max_len - max_question_tokens - pair_specials
    if room <= stride:
        raise ValueError(f"max_len={max_len} leaves {room} context tokens after a {max_question_tokens}-token question "
                         f"and {pair_specials} special tokens, not more than the stride {stride}: raise max_len")
    # Our lengths, never the tokenizer.json's: its own max_length would cut questions before they
    # are measured, its padding would put pad ids into the windows.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    questions = [truncate_question(tokenizer, ex["question"], max_question_tokens) for ex in examples]
    with truncated(tokenizer, max_len, stride=stride, strategy="only_second"):
        encodings = tokenizer.encode_batch([(q, ex["context"]) for q, ex in zip(questions, examples)])
    features = []
    for i, (ex, enc) in enumerate(zip(examples, encodings)):
        for window in [enc] + list(enc.overflowing):
            offsets = [o if s == 1 else None for o, s in zip(window.offsets, window.sequence_ids)]
            feature = QAFeature(list(window.ids), i, offsets, list(window.type_ids))
            if ex["answers"]:
                a = ex["answers"][0]
                span = answer_tokens(offsets, a["start"], a["start"] + len(a["text"]))
                feature.start, feature.end = span or (NULL_INDEX, NULL_INDEX)
            features.append(feature)
    return features


def best_spans(examples, features, start_logits, end_logits, n_best=20, max_answer_tokens=30):
    """({id: best span text}, {id: null score - best span score}); start/end_logits[k]: over features[k]'s tokens."""
    best = {i: ("", -np.inf) for i in range(len(examples))}
    null = {i: np.inf for i in range(len(examples))}
    for f, s_log, e_log in zip(features, start_logits, end_logits):
        s_log, e_log = np.asarray(s_log, np.float64), np.asarray(e_log, np.float64)
        null[f.example] = min(null[f.example], s_log[NULL_INDEX] + e_log[NULL_INDEX])
        ctx = np.array([i for i, o in enumerate(f.offsets) if o is not None], dtype=np.int64)
        starts = ctx[np.argsort(-s_log[ctx], kind="stable")[:n_best]]
        ends = ctx[np.argsort(-e_log[ctx], kind="stable")[:n_best]]
        context = examples[f.example]["context"]
        for s in starts:
            for e in ends:
                if s <= e < s + max_answer_tokens and s_log[s] + e_log[e] > best[f.example][1]:
                    best[f.example] = (context[f.offsets[s][0]:f.offsets[e][1]], s_log[s] + e_log[e])
    ids = [str(ex["id"]) for ex in examples]
    return ({ids[i]: text for i, (text, _) in best.items()},
            {ids[i]: float(null[i] - score) for i, (_, score) in best.items()})


def apply_null_threshold(texts: dict, margins: dict, threshold: float) -> dict:
    """SQuAD v2 answers: "" where the null margin is above the threshold, else the best span."""
    return {q: "" if margins[q] > threshold else t for q, t in texts.items()}


# ----------------------------------------------------------------------------- one task
def finetune_classifier(encoder, tokenizer, spec, data, examples, cfg, device):
    """SC (one label per text) or TC (one tag per word, read on its first sub-word)."""
    tc = spec.kind == "tc"
    labels = tc_tag_ids(data["train"], spec) if tc else sc_label_ids(spec, data["train"])
    encode = encode_tc if tc else encode_sc
    feats = {s: encode(tokenizer, ex, model_max_len(encoder, cfg), labels) for s, ex in examples.items()}
    pad = pad_id_of(tokenizer, encoder)
    model = build_model(encoder, spec, cfg, len(set(labels.values()))).to(device)
    train = feats["train"]

    def loss_of_batch(idx):
        ids, mask = pad_batch([train[i]["ids"] for i in idx], pad, cfg.pad_to, device)
        if not tc:
            gold = torch.tensor([train[i]["label"] for i in idx], device=device)
            return F.cross_entropy(model(ids, mask).float(), gold)
        gold, _ = pad_batch([train[i]["labels"] for i in idx], pad, cfg.pad_to, device, fill=IGNORE)
        return F.cross_entropy(model(ids, mask).float().flatten(0, 1), gold.flatten(), ignore_index=IGNORE)

    steps = max(1, math.ceil(cfg.tc_epochs * len(train) / cfg.batch_size)) if tc else cfg.steps
    result = {"train": train_loop(model, loss_of_batch, [len(f["ids"]) for f in train], steps, cfg, device, spec.name)}
    names = {i: t for t, i in labels.items()}
    for split in ("validation", "test"):
        logits = forward_all(model, [f["ids"] for f in feats[split]], pad, cfg, device, per_token=tc)
        if tc:
            preds = [[names[int(np.argmax(l[0][p]))] if p >= 0 else "O" for p in f["first"]]
                     for l, f in zip(logits, feats[split])]
            result[split] = ner_scores([ex["tags"] for ex in examples[split]], preds)
            continue
        preds, gold = [int(np.argmax(l[0])) for l in logits], [f["label"] for f in feats[split]]
        result[split] = {"accuracy": accuracy(preds, gold)}
        if len(labels) == 2:
            result[split]["f1"] = binary_f1(preds, gold)
    return result


def finetune_qa(encoder, tokenizer, spec, data, examples, cfg, device):
    feats = {s: qa_features(tokenizer, ex, model_max_len(encoder, cfg), cfg.doc_stride, cfg.max_question_tokens)
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

    lengths = [len(f.input_ids) for f in train]
    result = {"train": train_loop(model, loss_of_batch, lengths, cfg.steps, cfg, device, spec.name)}
    with_null = any(not ex["answers"] for ex in examples["train"])  # SQuAD v2: unanswerable questions
    threshold = 0.0
    for split in ("validation", "test"):
        outs = forward_all(model, [f.input_ids for f in feats[split]], pad, cfg, device, per_token=True,
                           types=[f.type_ids for f in feats[split]])
        texts, margins = best_spans(examples[split], feats[split], [o[0] for o in outs], [o[1] for o in outs],
                                    cfg.n_best, cfg.max_answer_tokens)
        golds = {str(ex["id"]): ex["answers"] for ex in examples[split]}
        if not with_null:
            result[split] = squad_scores(texts, golds)
            continue
        if split == "validation":  # tuned on validation, applied unchanged to test
            threshold, _ = best_null_threshold(texts, margins, golds)
        at_zero = squad_scores(apply_null_threshold(texts, margins, 0.0), golds)
        result[split] = {**squad_scores(apply_null_threshold(texts, margins, threshold), golds),
                         "null_threshold": threshold, "exact_at_threshold_0": at_zero["exact"],
                         "f1_at_threshold_0": at_zero["f1"]}
    return result


def finetune(encoder, tokenizer, spec: TaskSpec, data: dict, cfg: FinetuneConfig) -> dict:
    """Fine-tune `encoder` (consumed: its weights change) on one task and score validation + test."""
    seed_everything(cfg.seed)
    examples = {s: data[s][:cfg.max_train if s == "train" else cfg.max_eval] for s in ("train", "validation", "test")}
    run = finetune_qa if spec.kind == "qa" else finetune_classifier
    return run(encoder, tokenizer, spec, data, examples, cfg, pick_device(cfg.device))


# ----------------------------------------------------------------------------- retrieval
# EncodEval's sentence-transformers bi-encoder: mean pooling, and MultipleNegativesRankingLoss: for
# B (query, passage) pairs the B x B cosine similarities x 20 are the logits of a B-way
# classification whose answer for query i is passage i (in-batch negatives). The paper computes it
# with gradient caching in mini-batches of 4, which gives the same gradients as the whole batch.
# Texts are prefixed as in the paper's code. One bi-encoder per (model, lr, seed) serves every set.
QUERY_PREFIX, DOC_PREFIX = "Query: ", "Document: "
SCALE = 20.0          # sentence-transformers MultipleNegativesRankingLoss: cos_sim x 20
TOP_K = 100
MEASURES = ("nDCG@10", "RR@10")


def contrastive_loss(q, d):
    """In-batch negatives: query i must pick passage i among the batch's passages."""
    return F.cross_entropy((SCALE * q @ d.T).float(), torch.arange(len(q), device=q.device))


def train_biencoder(encoder, tokenizer, pairs, cfg: FinetuneConfig):
    device = pick_device(cfg.device)
    seed_everything(cfg.seed)
    max_len = model_max_len(encoder, cfg)
    pairs = pairs[:cfg.max_train]
    q_ids = token_ids(tokenizer, [QUERY_PREFIX + p["query"] for p in pairs], max_len)
    d_ids = token_ids(tokenizer, [DOC_PREFIX + p["positive"] for p in pairs], max_len)
    pad = pad_id_of(tokenizer, encoder)
    model = FinetuneModel(encoder, unit_mean, cfg.causal).to(device)

    def loss_of_batch(idx):
        q = model(*pad_batch([q_ids[i] for i in idx], pad, cfg.pad_to, device))
        d = model(*pad_batch([d_ids[i] for i in idx], pad, cfg.pad_to, device))
        return contrastive_loss(q, d)

    return model, train_loop(model, loss_of_batch, [len(x) for x in d_ids], cfg.steps, cfg, device, "ir")


def evaluate_set(model, tokenizer, evalset, cfg):
    """nDCG@10 and MRR@10 of each split: its judged queries against the judged-document corpus."""
    device = pick_device(cfg.device)

    def embed(prefix, texts):
        ids = token_ids(tokenizer, [prefix + t for t in texts], model_max_len(model.encoder, cfg))
        vectors = forward_all(model, ids, pad_id_of(tokenizer, model.encoder), cfg, device)
        return torch.from_numpy(np.stack([v[0] for v in vectors])).to(device)

    docids = list(evalset.corpus)
    doc_vectors = embed(DOC_PREFIX, [evalset.corpus[d] for d in docids])
    out = {}
    for split in ("validation", "test"):
        qrels = evalset.qrels[split]
        qids = [q for q in qrels if q in evalset.queries]
        q_vectors = embed(QUERY_PREFIX, [evalset.queries[q] for q in qids])
        run = dense_search(q_vectors, doc_vectors, qids, docids, k=TOP_K, similarity="dot")  # unit vectors
        means = mean_metrics(evaluate(qrels, run, MEASURES))
        out[split] = {"nDCG@10": means.get("nDCG@10", 0.0), "MRR@10": means.get("RR@10", 0.0),
                      "queries": len(qids), "documents": len(docids)}
    return out


# ----------------------------------------------------------------------------- the grid
def model_slug(spec: str) -> str:
    """A checkpoint's folder name: org--name for hf:org/name[@rev]; a local folder's last two parts and
    a hash of its path (runs/mlm40/final -> mlm40--final-3f2a9c1e): two runs' step_N/model differ."""
    if spec.startswith("hf:"):
        return re.sub(r"[^\w.@-]+", "--", spec[3:]).strip("-")
    path = Path(spec).resolve()
    name = re.sub(r"[^\w.@-]+", "--", "/".join(path.parts[-2:])).strip("-")
    return name + "-" + hashlib.sha1(str(path).encode()).hexdigest()[:8]


def run_path(out, model_spec, task, lr, seed) -> Path:
    return Path(out) / "runs" / model_slug(model_spec) / task / f"lr{lr:g}_seed{seed}.json"


def write_json_atomic(path: Path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(obj, indent=2, default=float), unique=True)


def finished(path: Path, stamp: dict | None = None) -> bool:
    """A run file that parses, says done, and (given `stamp`, its key) was computed from the same inputs."""
    record = manifest.read_json(path)
    return isinstance(record, dict) and record.get("done") is True and stamp in (None, record.get("stamp"))


# what a FinetuneConfig holds that does not shape a result (the device counts through its autocast)
NOT_SHAPING = ("progress", "device")


def local_files(spec_or_path) -> list | None:
    """A task's (or the IR training pairs') local file or folder; None for Hub data, which its name identifies."""
    local = spec_or_path and not str(spec_or_path).startswith("hf:") and Path(spec_or_path).exists()
    return [spec_or_path] if local else None


def run_stamp(model_spec, model_files, spec: TaskSpec, task_files, cfg: FinetuneConfig, extra=None) -> dict:
    """What one run's result is computed from (a data/manifest.py key): the model, the task, every FinetuneConfig
    field that shapes the run, bf16 autocast or not, and the files (keys ending in _files) by content."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_SHAPING}
    settings["bf16_autocast"] = cfg.bf16 if cfg.bf16 is not None else pick_device(cfg.device).type == "cuda"
    named = {"model_files": model_files, "task_files": task_files, **(extra or {})}
    files = {k: v for k, v in named.items() if k.endswith("_files") and v is not None}
    plain = {k: v for k, v in named.items() if k not in files}
    return manifest.key({"model": model_spec, "task": dataclasses.asdict(spec), "config": settings, **plain}, files)


def pending_runs(out, model_spec, task, keys, stamp_of) -> dict:
    """{(lr, seed): stamp} of `keys` without a finished run of that stamp (others are set aside, with a line)."""
    todo, stale = {}, []
    for lr, seed in keys:
        path, stamp = run_path(out, model_spec, task, lr, seed), stamp_of(lr, seed)
        if finished(path, stamp):
            continue
        if isinstance(record := manifest.read_json(path), dict):
            stale.append((path, record.get("stamp"), stamp))
        todo[lr, seed] = stamp
    if stale:
        asides = [path.rename(path.with_name(f"{path.name}.{manifest.digest(old)}")) for path, old, _ in stale]
        more = ", ..." if len(asides) > 1 else ""
        manifest.note(f"note: {len(stale)} finished run(s) of {model_spec} on {task} came from other inputs "
                      f"({manifest.differences(*stale[0][1:])}); moved aside ({asides[0]}{more}), running them again")
    return todo


def run_grid(models, tasks, lrs=LR_GRID, seeds=SEEDS, out="runs/finetune", cfg=None, ir_train=None):
    """Fine-tune every model on every task for every (lr, seed), skipping finished runs, then write the table;
    the retrieval sets share one bi-encoder per (model, lr, seed). Returns {"executed", "skipped", "rows"}."""
    from checkpoint import RunLock
    cfg = cfg or FinetuneConfig()
    parsed = [parse_task(t) if isinstance(t, str) else t for t in tasks]
    # one group per task, one for every retrieval set: a group's runs of one (lr, seed) train once
    groups = [[t] for t in parsed if t[0].kind != "ir"] + [[t for t in parsed if t[0].kind == "ir"]]
    ir_stamp = {"ir_train": ir_train, "ir_train_files": local_files(ir_train)}
    grid, cache, executed, skipped = [(lr, seed) for lr in lrs for seed in seeds], {}, 0, 0
    with RunLock(out, what="fine-tuning grid", option="--out"):  # one writer per --out
        for model_spec in models:
            files, loaded = model_files(resolve_model_folder(model_spec)), []
            for group in filter(None, groups):
                stamps = {spec.name: lambda lr, seed, spec=spec, path=path: run_stamp(
                    model_spec, files, spec, local_files(path), dataclasses.replace(cfg, lr=lr, seed=seed),
                    ir_stamp if spec.kind == "ir" else None) for spec, path in group}
                pending = {spec.name: pending_runs(out, model_spec, spec.name, grid, stamps[spec.name])
                           for spec, _ in group}
                for lr, seed in grid:
                    todo = [(spec, path) for spec, path in group if (lr, seed) in pending[spec.name]]
                    skipped += len(group) - len(todo)
                    if not todo:
                        continue
                    loaded = loaded or [load_tokenizer(model_spec), from_pretrained(model_spec)]  # once, if needed
                    run_cfg = dataclasses.replace(cfg, lr=lr, seed=seed)
                    for spec, result in run_group(todo, *loaded, run_cfg, cache, ir_train):
                        write_json_atomic(run_path(out, model_spec, spec.name, lr, seed), {
                            "model": model_spec, "task": spec.name, "kind": spec.kind, "metric": spec.metric, "lr": lr,
                            "seed": seed, **result, "config": dataclasses.asdict(run_cfg),
                            "stamp": pending[spec.name][lr, seed], "done": True})
                        executed += 1
        rows = summarize(out, models, [s for s, _ in parsed], lrs, seeds)
        write_table(out, rows)
    return {"executed": executed, "skipped": skipped, "rows": rows}


def run_group(tasks, tokenizer, base, cfg, cache, ir_train):
    """(spec, result) of each of `tasks` (one task, or retrieval sets: one bi-encoder), on a copy of `base`."""
    def cached(key, load):
        if key not in cache:
            cache[key] = load()
        return cache[key]

    if tasks[0][0].kind != "ir":
        spec, path = tasks[0]
        data = cached((spec.name, path), lambda: load_task(spec, path))
        yield spec, finetune(copy.deepcopy(base), tokenizer, spec, data, cfg)
        return
    pairs = cached(("msmarco-pairs", ir_train), lambda: load_task(TASKS["msmarco-pairs"], ir_train)["train"])
    model, stats = train_biencoder(copy.deepcopy(base), tokenizer, pairs, cfg)
    for spec, path in tasks:
        evalset = cached(("ir-eval", spec.name, path), lambda: load_ir_eval(spec.name, path))
        yield spec, {"train": stats, **evaluate_set(model, tokenizer, evalset, cfg)}


def summarize(out, models, specs, lrs, seeds) -> list[dict]:
    """Per (model, task): the lr of the best mean validation score, the test mean +- std there (x 100), per_lr."""
    rows = []
    for model_spec in models:
        for spec in specs:
            per_lr, val = {}, {}
            for lr in lrs:
                runs = [json.loads(path.read_text()) for seed in seeds
                        if finished(path := run_path(out, model_spec, spec.name, lr, seed))]
                if runs:
                    val[lr] = statistics.mean(r["validation"][spec.metric] for r in runs)
                    test = [100 * r["test"][spec.metric] for r in runs]
                    per_lr[lr] = {"n_seeds": len(test), "val_mean": 100 * val[lr], "test_mean": statistics.mean(test),
                                  "test_std": statistics.stdev(test) if len(test) > 1 else 0.0}
            if per_lr:
                best = max(val, key=lambda lr: (val[lr], -lr))
                rows.append({"model": model_spec, "task": spec.name, "metric": spec.metric, "best_lr": best,
                             **per_lr[best], "per_lr": per_lr})
    return rows


def write_table(out, rows):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fields = ["model", "task", "metric", "best_lr", "n_seeds", "val_mean", "test_mean", "test_std"]
    with atomic_write(out / "results.csv", "w") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    write_text(out / "results.md", format_table(rows))


def format_table(rows) -> str:
    """Markdown: one row per model, one column per task, test mean +- std at the best lr."""
    tasks = {r["task"]: r["metric"] for r in rows}
    cell = {(r["model"], r["task"]): f"{r['test_mean']:.1f} ± {r['test_std']:.1f} (lr {r['best_lr']:g})"
            for r in rows}
    lines = ["| model | " + " | ".join(f"{t} ({m})" for t, m in tasks.items()) + " |", "|---|" + "---|" * len(tasks)]
    for m in dict.fromkeys(r["model"] for r in rows):
        lines.append(f"| {m} | " + " | ".join(cell.get((m, t), "–") for t in tasks) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- CLI
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="comma-separated checkpoints (folders or hf:org/name)")
    ap.add_argument("--tasks", required=True, help=f"comma-separated tasks: {', '.join(TASKS)}, msmarco, nq, "
                    "mldr; NAME=PATH reads local files; KIND:NAME=PATH defines a new task")
    ap.add_argument("--out", required=True)
    ap.add_argument("--lrs", type=lambda text: tuple(float(x) for x in text.split(",") if x), default=LR_GRID)
    ap.add_argument("--seeds", type=lambda text: tuple(int(x) for x in text.split(",") if x), default=SEEDS)
    d = FinetuneConfig()
    for name, text in (("steps", "SC, QA and IR training steps"), ("tc_epochs", None), ("batch_size", None),
                       ("max_len", None), ("doc_stride", None), ("device", None)):
        ap.add_argument("--" + name.replace("_", "-"), type=type(getattr(d, name)), default=getattr(d, name), help=text)
    ap.add_argument("--pooling", choices=("mean", "bos", "late"), default=d.pooling)
    ap.add_argument("--causal", action="store_true", help="keep the causal mask (ablation)")
    ap.add_argument("--bucket", action="store_true", help="length-bucketed training batches")
    ap.add_argument("--max-train", type=int, default=None, help="first N training examples only")
    ap.add_argument("--max-eval", type=int, default=None, help="first N validation/test examples only (SC/TC/QA)")
    ap.add_argument("--no-bf16", dest="bf16", action="store_const", const=False, help="fp32 even on CUDA")
    ap.add_argument("--ir-train", default=None, help="local query/positive pairs instead of the Hub's")
    args = vars(ap.parse_args(argv))
    cfg = FinetuneConfig(**{k: v for k, v in args.items() if k in FinetuneConfig.__dataclass_fields__})
    result = run_grid([m for m in args["models"].split(",") if m], [t for t in args["tasks"].split(",") if t],
                      args["lrs"], args["seeds"], args["out"], cfg, args["ir_train"])
    print(f"runs executed {result['executed']}, skipped (already done) {result['skipped']}")
    print(format_table(result["rows"]))
    print(f"table: {Path(args['out']) / 'results.md'} and results.csv")


if __name__ == "__main__":
    from cli import run_cli
    run_cli(main)
