"""Diagnostics of SPLADE training: what a batch's sparse vectors look like, and the collapse monitor that
says, once, when training fails and why (an MLM head whose scale does not suit dot products: the rescaling paper).
"""
import collections
import math
import sys

import torch
import torch.nn.functional as F

import cli
from cli import UserError
from data.atomic import write_json


@torch.no_grad()
def batch_sparsity(q, d):
    """Statistics of a batch's vectors for the log and the collapse checks: mean active dims per side,
    the batch FLOPS estimate sum_j p_j q_j (p_j, q_j: fraction of documents / queries using term j; the
    cost metric of naver/splade's splade/flops.py), the fraction of all-zero vectors, and the mean cosine
    between distinct documents, from |sum_i u_i|^2 = sum_i |u_i|^2 + sum_{i != j} u_i . u_j (u_i = unit
    vectors): O(M V) instead of the O(M^2 V) Gram matrix."""
    qa, da = q > 0, d > 0
    u = F.normalize(d.float(), dim=1)                                 # all-zero rows stay zero
    M = d.shape[0]
    cos = ((u.sum(0) ** 2).sum() - (u ** 2).sum()) / max(M * (M - 1), 1)
    return {"q_active_dims": qa.sum(1).float().mean(), "d_active_dims": da.sum(1).float().mean(),
            "batch_flops": (qa.float().mean(0) * da.float().mean(0)).sum(),
            "zero_q": (~qa.any(1)).float().mean(), "zero_d": (~da.any(1)).float().mean(), "doc_cosine": cos}


class SpladeCollapse(UserError, RuntimeError):
    """collapse_patience collapsed steps in a row: the run stops (a user-facing outcome, not a bug)."""


class CollapseMonitor:
    """Watches every step's global-batch statistics for the ways SPLADE training fails, the first signal that
    matches (docs/splade_rescaling.md, "Collapse"): zero (MIN_TERMS), dense (DENSE_FRACTION), identical
    (SAME_COSINE), large (LARGE_STEPS, LARGE_FACTOR) and chance (CHANCE_STEPS, CHANCE_FRACTION); the last two
    need `candidates` (documents each query is ranked against; None: InfoNCE unused). An episode ends only
    after RECOVER_STEPS steps in a row without a signal and with a loss under the chance line, so vectors that
    flicker at chance are one episode. Messages go to `out` (None: silent); patience > 0 stops the run after
    that many bad steps in a row."""
    ZERO_FRACTION, MIN_TERMS = 0.5, 2.0
    DENSE_FRACTION, SAME_COSINE = 0.5, 0.9
    LARGE_FACTOR, LARGE_STEPS = 2.0, 5
    CHANCE_FRACTION, CHANCE_STEPS = 0.9, 50
    RECOVER_STEPS = 50

    def __init__(self, vocab_size, patience=0, head=None, out=sys.stderr, candidates=None):
        self.vocab, self.patience, self.head, self.out = vocab_size, patience, head, out
        self.candidates = candidates if candidates and candidates > 1 else None
        self.chance = math.log(self.candidates) if self.candidates else None
        self.losses = collections.deque(maxlen=self.CHANCE_STEPS)  # recent ranking losses
        self.state, self.since, self.in_a_row, self.clear = None, None, 0, 0

    def diagnose(self, s, lambdas):
        """(kind, why) of this step's first signal (with the recent losses), or (None, "")."""
        head = f" (mean row L2 of W_head: {self.head:.4f})" if self.head else ""
        if max(s["zero_q"], s["zero_d"]) > self.ZERO_FRACTION or min(s["q_active_dims"], s["d_active_dims"]) < \
                self.MIN_TERMS:
            return "zero", (f"{s['zero_q']:.0%} of query and {s['zero_d']:.0%} of document vectors are all zero; "
                            f"they hold {s['q_active_dims']:.1f} and {s['d_active_dims']:.1f} terms on average. "
                            f"Likely causes: a FLOPS regulariser too strong (lambda_q={lambdas[0]:.3g}, "
                            f"lambda_d={lambdas[1]:.3g}: lower lambda_q/lambda_d or lengthen lambda_warmup), or a "
                            f"head scaled down too far{head} (a smaller --k)")
        dense = max(s["q_active_dims"], s["d_active_dims"]) / self.vocab
        if dense > self.DENSE_FRACTION:
            return "dense", (f"{dense:.0%} of the vocabulary is active (documents' mean cosine {s['doc_cosine']:.3f}). "
                             f"Likely cause: the MLM head's scale{head}: too large (rescale it with --k; the paper: 16 "
                             f"for ModernBERT/Ettin), or so small after a large --k that most terms turn on weakly "
                             f"(a smaller --k)")
        if s["doc_cosine"] > self.SAME_COSINE:
            return "identical", (f"documents use the same few terms ({s['d_active_dims']:.0f} on average, mean cosine "
                                 f"{s['doc_cosine']:.3f}). Likely cause: the MLM head was scaled down too far{head}: "
                                 f"try a smaller --k")
        if self.chance is None or not self.losses:
            return None, ""
        recent = list(self.losses)[-self.LARGE_STEPS:]
        loss, ln = sum(recent) / len(recent), f"ln {self.candidates} = {self.chance:.2f}"
        if loss >= self.LARGE_FACTOR * self.chance:
            return "large", (f"the ranking loss ({loss:.3g} over the last {len(recent)} step(s)) is "
                             f"{loss / self.chance:.1f}x a random ranking's ({ln}): the softmax is confidently "
                             f"wrong. Likely cause: the MLM head's scale is too large{head}: rescale it with --k")
        loss = sum(self.losses) / len(self.losses)
        if len(self.losses) == self.CHANCE_STEPS and loss >= self.CHANCE_FRACTION * self.chance:
            return "chance", (f"the ranking loss has averaged {loss:.3f} over the last {self.CHANCE_STEPS} steps, "
                              f"{loss / self.chance:.0%} of a random ranking's {ln} (documents hold "
                              f"{s['d_active_dims']:.0f} terms, mean cosine {s['doc_cosine']:.2f}). Likely causes: "
                              f"the MLM head's scale{head} (too small after a large --k, or too large), or the "
                              f"learning rate")
        return None, ""

    def say(self, text):
        if self.out is not None:
            cli.say(text, file=self.out)   # never at the end of the progress bar's line

    def check(self, step, s, lambdas):
        if self.chance is not None:
            self.losses.append(s["infonce"])
        kind, why = self.diagnose(s, lambdas)
        if kind and self.state is None:
            self.say(f"warning: step {step}: SPLADE collapse ({kind}): {why}")
            self.state, self.since, self.in_a_row, self.clear = kind, step, 0, 0
        if self.state is None:
            return
        if kind or (self.chance is not None and s["infonce"] >= self.CHANCE_FRACTION * self.chance):
            self.in_a_row, self.clear = self.in_a_row + 1, 0
        else:
            self.in_a_row, self.clear = 0, self.clear + 1
            if self.clear >= self.RECOVER_STEPS:
                loss = f" and a ranking loss under {self.CHANCE_FRACTION:.0%} of ln {self.candidates}"
                self.say(f"step {step}: recovered from the {self.state} collapse of step {self.since}: "
                         f"{self.RECOVER_STEPS} steps in a row without a collapse signal{loss if self.chance else ''}")
                self.state, self.since = None, None
                return
        if self.patience and self.in_a_row >= self.patience:
            raise SpladeCollapse(f"step {step}: SPLADE collapse ({kind or self.state}) for {self.in_a_row} steps in "
                                 f"a row; stopping with the last checkpoint kept. {why or 'The loss is at chance.'}")


# ---------------- What a SPLADE run is: printed by train_splade.py before its first step
def _norms(n):
    bias = "none" if n["bias_l2"] is None else f"{n['bias_l2']:.4f}"
    return f"Frobenius {n['frobenius']:.2f}, mean row L2 {n['mean_row_l2']:.4f}, bias L2 {bias}"


def describe_rescaling(h):
    b, a, m = h["before"], h["after"], h.get("head_scale", 1.0)
    lines = [f"MLM head W_head{' (tied to the input embeddings)' if b['tied'] else ''}: {_norms(b)}"]
    if h.get("untie_head", False) and b["tied"]:
        lines.append("  untied: the decoder got its own copy of the matrix (untie_head=True)")
    if m != 1:
        lines.append(f"  x head_scale {m:g} (emulating a larger head): {_norms(h['scaled'])}")
    rule = (f" (--k=auto: mean row L2 {h['scaled']['mean_row_l2']:.4f} / k_target {h['k_target']:g})"
            if h.get("k_target") else "")
    lines.append(f"  / k={h['k']:g}{rule}{' (bias too)' if h['k_bias'] else ''}: {_norms(a)}")
    if h.get("embedding_cosine") is not None:
        lines.append(f"  input embedding layer output, after vs before: mean cosine {h['embedding_cosine']:.3f} over "
                     f"{h['embedding_probe_tokens']} tokens of the first documents")
        if a["tied"] and m != h["k"]:  # a net scaling of the shared matrix
            lines.append("  (the head is tied, so the input word embeddings were scaled too: a LayerNorm right after them, "
                         "as in ModernBERT, absorbs that; BERT's input changes; untie_head=True leaves it)")
    return "\n".join(lines)


def announce(cfg, proc, model, data, rescaling, resume, state, log, out):
    """What this run is (rank 0): the recipe, the model, the data, the head before and after."""
    arch = model.config
    print("recipe (train_splade.py DEFAULTS + overrides):\n" + "\n".join(f"  {k} = {v!r}" for k, v in cfg.items()))
    print(f"{arch.model_type}: {model.num_params() / 1e6:.1f}M parameters, vocabulary {arch.vocab_size}; "
          f"{proc.world_size} process(es) on {proc.device}; {len(data):,} training examples from {data.source}"
          f"{' (with teacher scores)' if data.has_teacher else ''}")
    print(describe_rescaling(rescaling))
    if resume is None:
        write_json(out / "head_norms.json", rescaling)  # read by the drivers: never half-written
        log.write(step=0, init=cfg["init"], rescaling=rescaling)
    elif state.get("train_examples") != len(data):
        print(f"warning: the training data has {len(data)} examples, the checkpoint was trained on "
              f"{state.get('train_examples')}: the example order differs from the original run", file=sys.stderr)
