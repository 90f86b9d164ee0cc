"""Extractive question answering for the fine-tuning evaluation: question + context windows in,
start/end logits out, and the standard SQuAD post-processing back to answer strings.

Windows ("doc stride"). A context longer than the model's input is cut into overlapping windows,
each holding the whole question: the tokenizer truncates only the context (`only_second`) and
returns the rest as overflowing encodings that overlap by `stride` tokens, so an answer near a cut
is whole in at least one window. A training window whose context does not contain the whole gold
answer is labelled with the null position, as for an unanswerable question.

Null position. Start and end logits at token 0 (the tokenizer's first token: [CLS], <s> or
<|begin_of_text|>) score "no answer" (Devlin et al. 2019, SQuAD 2.0 section). An example's null
score is the smallest start_0 + end_0 over its windows (the window most sure there is an answer
decides), as in the reference `run_qa.py` post-processing.

Post-processing. For each window, the n_best highest start and end logits over context tokens are
paired; a pair is kept when end >= start and the span has at most max_answer_tokens tokens; its
score is start + end and its text is cut from the original context with the tokens' character
offsets (so the prediction keeps the context's own spacing and case). The example's best span is
the top-scoring pair over all its windows. SQuAD v2: the answer is "" when null score - best span
score > threshold; the threshold is 0, or tuned on the validation set (finetune_metrics
.best_null_threshold) and then applied unchanged to the test set.
"""
from dataclasses import dataclass

import numpy as np

from data.tokenizer import truncated

NULL_INDEX = 0


@dataclass
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
    if len(enc.ids) <= max_tokens:
        return question
    return question[:enc.offsets[max_tokens - 1][1]]


def answer_tokens(offsets, start_char: int, end_char: int):
    """(first, last) token of the character span [start_char, end_char) among the context tokens
    of one window, or None when the window does not hold the whole span."""
    ctx = [i for i, o in enumerate(offsets) if o is not None]
    if not ctx or start_char < offsets[ctx[0]][0] or end_char > offsets[ctx[-1]][1]:
        return None
    first = max(i for i in ctx if offsets[i][0] <= start_char)
    last = min(i for i in ctx if offsets[i][1] >= end_char)
    return (first, last) if last >= first else None


def qa_features(tokenizer, examples, max_len=384, stride=128, max_question_tokens=64) -> list:
    """Windows of every example (see the module docstring), labelled with the first gold answer."""
    pair_specials = tokenizer.num_special_tokens_to_add(True)
    room = max_len - max_question_tokens - pair_specials
    if room <= stride:
        raise ValueError(f"max_len={max_len} leaves {room} context tokens per window after a "
                         f"{max_question_tokens}-token question and {pair_specials} special tokens; "
                         f"the stride ({stride}) must be smaller. Raise max_len or lower the stride.")
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
                if span is not None:
                    feature.start, feature.end = span
            features.append(feature)
    return features


def best_spans(examples, features, start_logits, end_logits, n_best=20, max_answer_tokens=30):
    """({id: best span text}, {id: null score - best span score}) for every example.

    start_logits[k], end_logits[k]: 1-D arrays over the tokens of features[k]."""
    best = {i: ("", -np.inf) for i in range(len(examples))}
    null = {i: np.inf for i in range(len(examples))}
    for f, s_log, e_log in zip(features, start_logits, end_logits):
        s_log, e_log = np.asarray(s_log, np.float64), np.asarray(e_log, np.float64)
        null[f.example] = min(null[f.example], s_log[NULL_INDEX] + e_log[NULL_INDEX])
        ctx = np.array([i for i, o in enumerate(f.offsets) if o is not None], dtype=np.int64)
        if ctx.size == 0:
            continue
        starts = ctx[np.argsort(-s_log[ctx], kind="stable")[:n_best]]
        ends = ctx[np.argsort(-e_log[ctx], kind="stable")[:n_best]]
        context = examples[f.example]["context"]
        for s in starts:
            for e in ends:
                if e < s or e - s + 1 > max_answer_tokens:
                    continue
                score = s_log[s] + e_log[e]
                if score > best[f.example][1]:
                    best[f.example] = (context[f.offsets[s][0]:f.offsets[e][1]], score)
    ids = [str(ex["id"]) for ex in examples]
    texts = {ids[i]: text for i, (text, _) in best.items()}
    margins = {ids[i]: float(null[i] - score) for i, (_, score) in best.items()}
    return texts, margins


def apply_null_threshold(texts: dict, margins: dict, threshold: float) -> dict:
    """SQuAD v2 answers: "" where the null margin is above the threshold, else the best span."""
    return {q: "" if margins[q] > threshold else t for q, t in texts.items()}
