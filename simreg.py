"""SimReg: embedding-similarity regularisation for language-model pretraining (Paper 2).

Next-token prediction is a classification over context-dependent token embeddings: the final-layer
hidden state h_i of position i is the feature, its next token y_i is the class. Cross-entropy
tightens the classes early and then plateaus; SimReg keeps widening the margins by adding, for every
token, a contrastive term over the other tokens of the same chunk of the sequence, split by label:

    L_i    = L_ce_i + λ · softplus(L_sr_i)
    L_sr_i = log Σ_{j∈N_i} φ_ij − log Σ_{j∈P_i} φ_ij,        φ_ij = exp(cos(h_i, h_j) / τ)
    P_i    = {j : y_j = y_i}   (i itself included, so P_i is never empty)
    N_i    = {j : y_j ≠ y_i}

softplus keeps the term non-negative. It is averaged per *group* (one label inside one chunk), not
per token, so that frequent tokens ("the", ",") do not drown out rare ones:

    R    = (1/|G|) Σ_{g∈G} (1/|g|) Σ_{i∈g} softplus(L_sr_i)          loss = CE + λ·R

Similarities are only taken inside chunks of c consecutive positions: O(T·c) instead of O(T²) per
sequence, and a chunk never needs tokens held by another sequence-parallel rank. The paper applies it
to the last layer, after the final norm (the vectors the LM head sees). This file implements the
project's exact reading of the paper, written out in docs/simreg.md (tests/test_simreg.py holds
simreg_loss to the same R written token by token); interclass_angle is the paper's analysis metric.
"""

import torch
import torch.nn.functional as F

from fast_paths import IGNORE_INDEX  # -100: the label of positions outside the loss


def simreg_loss(h, labels, tau=0.01, chunk_size=None, ignore_index=IGNORE_INDEX):
    """SimReg regulariser R of one batch (docs/simreg.md); add λ·R to the cross-entropy.

    h: (B, T, d) final-layer hidden states after the final norm; any float dtype (bf16 is fine).
    labels: (B, T) next-token targets; positions equal to ignore_index take no part at all.
    tau: temperature of the cosine similarities (paper: 0.01).
    chunk_size: similarities only between positions of the same chunk of chunk_size consecutive
        positions (the last chunk of a sequence may be shorter); None = the whole sequence (the
        paper's "full" SimReg).
    Returns a 0-dim fp32 tensor (fp64 for fp64 h); 0, still attached to h's graph, when no position
    is valid. Time O(B·T·c·d), memory O(B·T·c) for chunk length c. No data-dependent Python control
    flow, so it compiles with torch.compile(fullgraph=True).

    On CPU, call torch.set_flush_denormal(True) once in the training script: at τ = 0.01 the softmax
    weights exp(s − lse) of distant tokens are fp32 denormals, which x86 multiplies ~100× slower
    (measured: 4.5 s instead of 0.05 s for one (1, 2048, 1024) step). GPUs have no such penalty.
    """
    _check_inputs(h, labels, tau, chunk_size)
    h, labels = _split_into_chunks(h, labels, chunk_size, ignore_index)  # (G, c, d), (G, c)
    c = labels.shape[1]

    # s_ij = cos(h_i, h_j) / τ, always in fp32 (autocast off): at τ = 0.01 the logits span ±100, and a
    # bf16 cosine (8 mantissa bits, error ~4e-3) would move them by ~0.4 before exp.
    with torch.autocast(h.device.type, enabled=False):
        z = F.normalize(h.to(torch.promote_types(h.dtype, torch.float32)), dim=-1)
        s = z @ z.transpose(1, 2) / tau  # (G, c, c): one batched matmul covers every chunk

    valid = labels != ignore_index
    valid_pair = valid[:, :, None] & valid[:, None, :]
    same_label = (labels[:, :, None] == labels[:, None, :]) & valid_pair
    # The anchor is its own positive (paper), so P_i is never empty. The diagonal is added for ignored
    # anchors too: their (zero-weighted) L_sr is then −∞ − finite, not −∞ − (−∞) = nan, and 0·nan
    # would poison the sum.
    positives = same_label | torch.eye(c, dtype=torch.bool, device=labels.device)
    negatives = valid_pair & ~same_label

    # L_sr_i = logsumexp_{j∈N_i} s_ij − logsumexp_{j∈P_i} s_ij;  empty N_i → −∞ → softplus(−∞) = 0
    l_sr = _masked_logsumexp(s, negatives) - _masked_logsumexp(s, positives)
    r = F.softplus(l_sr)  # (G, c)

    # Group averaging without looping over groups: token i weighs 1/|g(i)|, so each group's weights
    # sum to one and Σ_i w_i·r_i = Σ_g mean_{i∈g} r_i; dividing by the number of groups gives R.
    group_size = same_label.sum(-1)
    w = valid.to(r.dtype) / group_size.clamp(min=1)
    n_groups = _count_groups(labels, ignore_index)
    # clamp: with no valid position every w is 0 and R is an exact, differentiable 0.
    return (w * r).sum() / n_groups.clamp(min=1)


def _check_inputs(h, labels, tau, chunk_size):
    if h.dim() != 3:
        raise ValueError(f"simreg_loss: h must be (B, T, d) final hidden states, got shape {tuple(h.shape)}")
    if labels.shape != h.shape[:2]:
        raise ValueError(f"simreg_loss: labels must be (B, T) = {tuple(h.shape[:2])} to match h, "
                         f"got {tuple(labels.shape)}")
    if not tau > 0:
        raise ValueError(f"simreg_loss: tau must be > 0 (paper: 0.01), got {tau}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"simreg_loss: chunk_size must be a positive int or None (whole sequence), "
                         f"got {chunk_size}")


def _split_into_chunks(h, labels, chunk_size, ignore_index):
    """(B, T, d), (B, T) → (B·n, c, d), (B·n, c): chunks become rows of the batch dimension.

    The last chunk of each sequence is padded to length c with ignored positions, which take no part.
    """
    B, T, d = h.shape
    c = T if chunk_size is None else min(chunk_size, T)
    n = -(-T // c)
    pad = n * c - T
    if pad:
        h = F.pad(h, (0, 0, 0, pad))
        labels = F.pad(labels, (0, pad), value=ignore_index)
    return h.reshape(B * n, c, d), labels.reshape(B * n, c)


def _masked_logsumexp(s, mask):
    """log Σ_{j: mask_ij} exp(s_ij) over the last dim; −∞ for rows whose mask is empty.

    Excluded terms are set to −∞, so exp gives exactly 0 (a large negative constant would not).
    For an empty row, logsumexp's backward computes exp(−∞ − (−∞)) = nan, but only at filled
    entries, whose gradient masked_fill sets to zero: nothing non-finite reaches h.
    """
    return torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1)


def _count_groups(labels, ignore_index):
    """|G|: number of distinct valid labels summed over chunks ((G, c) labels → 0-dim tensor)."""
    sorted_labels = labels.sort(dim=-1).values
    starts_new_label = torch.ones_like(sorted_labels, dtype=torch.bool)
    starts_new_label[:, 1:] = sorted_labels[:, 1:] != sorted_labels[:, :-1]
    return (starts_new_label & (sorted_labels != ignore_index)).sum()


def interclass_angle(h, labels, min_count=10, ignore_index=IGNORE_INDEX):
    """Mean pairwise angle, in degrees, between class centres; returns (angle, number of classes).

    The paper's analysis of final embeddings (≈61.3° with CE alone, ≈74° with SimReg): a class is a
    next-token label, its centre the mean final hidden state over the positions that predict it.
    Only labels seen at least min_count times count: a centre averaged over a handful of contexts is
    mostly context noise. h: (..., d) with labels (...), e.g. (B, T, d)/(B, T), or held-out batches
    concatenated as (N, d)/(N,). The angle is nan when fewer than two classes qualify.
    """
    if labels.shape != h.shape[:-1]:
        raise ValueError(f"interclass_angle: labels shape {tuple(labels.shape)} must equal h's shape "
                         f"without the last dim, {tuple(h.shape[:-1])}")
    h = h.reshape(-1, h.shape[-1]).double()
    labels = labels.reshape(-1).to(h.device)
    keep = labels != ignore_index
    classes, class_of_token, counts = torch.unique(labels[keep], return_inverse=True, return_counts=True)
    sums = h.new_zeros(len(classes), h.shape[1]).index_add_(0, class_of_token, h[keep])
    frequent = counts >= min_count
    centres = sums[frequent] / counts[frequent, None]
    k = len(centres)
    if k < 2:
        return float("nan"), k
    u = F.normalize(centres, dim=-1)
    # k can be the vocabulary size (k² cosines): go through the pairs i < j a block of rows at a time.
    block = max(1, 2**24 // k)
    total = 0.0
    for start in range(0, k, block):
        cos = u[start:start + block] @ u.T
        i = torch.arange(start, start + len(cos), device=u.device)[:, None]
        upper = torch.arange(k, device=u.device)[None, :] > i
        total += torch.rad2deg(torch.arccos(cos[upper].clamp(-1.0, 1.0))).sum().item()
    return total / (k * (k - 1) / 2), k
