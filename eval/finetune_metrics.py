"""The metrics of the fine-tuning evaluation (eval/finetune.py), each as its task defines it.

- Sequence classification: accuracy; binary F1 of the positive class (QQP reports both, as GLUE).
- Token classification (NER): entity-level micro precision / recall / F1 with conlleval semantics.
  An entity is a maximal run of tags of one type that starts at a `B-X`, or at an `I-X` that does
  not continue an entity of type X (after `O`, after another type, or at the sentence start):
  conlleval counts such a stray `I-` as the start of a new entity rather than dropping it, which is
  also what makes one function right for IOB1 (CoNLL-2003's original files) and IOB2 (its Hub
  copies). An entity ends before the next `B-`, `O`, or tag of another type. A predicted entity is
  correct only when its first word, last word and type all equal a gold entity's.
- Extractive QA (SQuAD v1.1 / v2.0 official scripts): answers are normalised (lower case, ASCII
  punctuation removed, the articles a/an/the removed, whitespace collapsed); EM is string equality
  and F1 is the bag-of-tokens overlap of the normalised strings; each question takes the max over
  its gold answers. For v2, an unanswerable question has the single gold answer "" and scores 1
  exactly when the prediction is empty too. `best_null_threshold` picks the no-answer threshold
  on a development set the way the official v2 script's best_f1/best_exact do.
- Retrieval: nDCG@10 and MRR@10 come from eval/metrics.py (trec_eval semantics).

Every score is returned as a fraction in [0, 1]; the tables multiply by 100.
"""
import collections
import re
import string

# ----------------------------------------------------------------------------- classification


def accuracy(preds, labels) -> float:
    preds, labels = list(preds), list(labels)
    if len(preds) != len(labels):
        raise ValueError(f"accuracy: {len(preds)} predictions for {len(labels)} labels")
    if not labels:
        raise ValueError("accuracy of an empty set is undefined")
    return sum(p == y for p, y in zip(preds, labels)) / len(labels)


def binary_f1(preds, labels, positive=1) -> float:
    """F1 of the positive class: 2 TP / (2 TP + FP + FN); 0 when there is no positive at all."""
    tp = sum(p == positive and y == positive for p, y in zip(preds, labels))
    fp = sum(p == positive and y != positive for p, y in zip(preds, labels))
    fn = sum(p != positive and y == positive for p, y in zip(preds, labels))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


# ----------------------------------------------------------------------------- NER (conlleval)


def _split_tag(tag: str):
    if tag == "O":
        return "O", None
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I") or not kind:
        raise ValueError(f"tag {tag!r} is not BIO: expected 'O', 'B-TYPE' or 'I-TYPE' "
                         f"(IOBES and bare types are not supported; convert the tags first)")
    return prefix, kind


def entity_spans(tags) -> list[tuple[str, int, int]]:
    """(type, first word, last word) of every entity in one sentence's BIO tags (module docstring)."""
    spans, start, kind = [], None, None
    for i, tag in enumerate(list(tags) + ["O"]):  # a sentinel O closes an entity at the end
        prefix, this = _split_tag(tag)
        continues = prefix == "I" and this == kind
        if start is not None and not continues:
            spans.append((kind, start, i - 1))
            start, kind = None, None
        if prefix == "B" or (prefix == "I" and not continues):
            start, kind = i, this
    return spans


def ner_scores(gold_sentences, pred_sentences) -> dict:
    """Entity-level micro precision, recall and F1 over sentences of BIO tag strings."""
    gold_sentences, pred_sentences = list(gold_sentences), list(pred_sentences)
    if len(gold_sentences) != len(pred_sentences):
        raise ValueError(f"ner_scores: {len(pred_sentences)} predicted sentences for "
                         f"{len(gold_sentences)} gold ones")
    n_gold = n_pred = n_correct = 0
    for i, (gold, pred) in enumerate(zip(gold_sentences, pred_sentences)):
        if len(gold) != len(pred):
            raise ValueError(f"ner_scores: sentence {i} has {len(gold)} gold tags but "
                             f"{len(pred)} predicted ones")
        g, p = set(entity_spans(gold)), set(entity_spans(pred))
        n_gold, n_pred, n_correct = n_gold + len(g), n_pred + len(p), n_correct + len(g & p)
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1,
            "gold_entities": n_gold, "predicted_entities": n_pred}


# ----------------------------------------------------------------------------- SQuAD

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lower, drop punctuation, drop articles, squash spaces.
    (Order matters: punctuation goes before the article regex, so "the-end" keeps "theend".)"""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:  # v2: both empty is a match, one empty is a miss
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_texts(answers) -> list[str]:
    """The gold strings of a question: its answer texts, or [""] when it has none (v2)."""
    texts = [a["text"] if isinstance(a, dict) else a for a in answers]
    texts = [t for t in texts if normalize_answer(t)]
    return texts or [""]


def question_scores(prediction: str, answers) -> tuple[float, float]:
    """(EM, F1) of one prediction, each the max over the gold answers."""
    golds = gold_texts(answers)
    return max(exact_match(prediction, g) for g in golds), max(token_f1(prediction, g) for g in golds)


def squad_scores(predictions: dict, golds: dict) -> dict:
    """Mean EM and F1 over the questions of `golds` ({id: answers}); a question without a
    prediction counts as a miss, as in the official script. HasAns / NoAns breakdowns when both
    kinds of question are present (v2)."""
    if not golds:
        raise ValueError("squad_scores: no gold questions")
    per = {qid: question_scores(predictions.get(qid, None) or "", answers)
           for qid, answers in golds.items()}
    out = {"exact": _mean(s[0] for s in per.values()), "f1": _mean(s[1] for s in per.values()),
           "total": len(per)}
    has = {qid for qid, answers in golds.items() if gold_texts(answers) != [""]}
    if has and len(has) < len(golds):
        for name, ids in (("HasAns", has), ("NoAns", set(golds) - has)):
            out[f"{name}_exact"] = _mean(per[q][0] for q in ids)
            out[f"{name}_f1"] = _mean(per[q][1] for q in ids)
            out[f"{name}_total"] = len(ids)
    return out


def _mean(values):
    values = list(values)
    return sum(values) / len(values)


def best_null_threshold(best_spans: dict, null_margins: dict, golds: dict, metric="f1"):
    """The threshold t that maximises the mean EM or F1 when a question is answered "" exactly
    when its null margin (null score minus best span score) is > t.

    This is the official v2 script's sweep: sort the questions by margin and move them one by one
    from "answered" to "empty"; the best cut is between two consecutive margins. Returns
    (threshold, best mean score). With no question, returns (0.0, 0.0)."""
    if not golds:
        return 0.0, 0.0
    k = 1 if metric == "f1" else 0
    answered = {q: question_scores(best_spans.get(q, ""), golds[q])[k] for q in golds}
    empty = {q: question_scores("", golds[q])[k] for q in golds}
    # start with every question answered by its span (threshold above every margin) and lower
    # the threshold past one margin at a time, largest first
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
