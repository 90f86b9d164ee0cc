"""Tests of simreg.py: the vectorised SimReg regulariser against its loop reference and the formula,
its numerics (bf16, autocast, torch.compile), memory bound, and the inter-class angle metric."""
import math
import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from simreg import _check_inputs, interclass_angle, simreg_loss


def simreg_loss_reference(h, labels, tau=0.01, chunk_size=None, ignore_index=-100):
    """R of docs/simreg.md computed token by token in fp64, straight from the definition (slow):
    the reference simreg_loss is held to. Same arguments as simreg_loss; a 0-dim fp64 tensor."""
    _check_inputs(h, labels, tau, chunk_size)
    h = h.double()
    B, T, _ = h.shape
    c = T if chunk_size is None else chunk_size
    group_means = []
    for b in range(B):
        for start in range(0, T, c):
            chunk = [t for t in range(start, min(start + c, T)) if labels[b, t] != ignore_index]
            r_by_label = {}
            for i in chunk:
                y_i = int(labels[b, i])
                s = {j: F.cosine_similarity(h[b, i], h[b, j], dim=0) / tau for j in chunk}
                pos = [s[j] for j in chunk if int(labels[b, j]) == y_i]  # contains s[i]
                neg = [s[j] for j in chunk if int(labels[b, j]) != y_i]
                if neg:
                    l_sr = torch.logsumexp(torch.stack(neg), 0) - torch.logsumexp(torch.stack(pos), 0)
                    r_i = F.softplus(l_sr)
                else:
                    r_i = h[b, i].sum() * 0  # softplus(−∞) = 0, kept in the graph
                r_by_label.setdefault(y_i, []).append(r_i)
            group_means += [torch.stack(rs).mean() for rs in r_by_label.values()]
    if not group_means:
        return h.sum() * 0
    return torch.stack(group_means).mean()


def anisotropic_states(B, T, d, seed=0, dtype=torch.float64):
    """Hidden states sharing a common direction, like real LM states (cosines mostly well above 0).

    With isotropic random vectors and τ = 0.01 every negative is ~100 below the anchor's
    self-similarity and R underflows to ~0, which would make comparisons vacuous.
    """
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(d, generator=g, dtype=dtype)
    return torch.randn(B, T, d, generator=g, dtype=dtype) + 2 * common


def labels_with_groups(B, T, n_labels=4, seed=0, n_ignored=5):
    """Labels from a small alphabet (so each chunk has groups of several tokens) with ignored spots."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, n_labels, (B, T), generator=g)
    labels.view(-1)[torch.randperm(B * T, generator=g)[:n_ignored]] = -100
    return labels


# 23 positions: chunk 5 and 7 leave a shorter last chunk, 1 leaves every token alone in its chunk,
# 23 is the whole sequence, 100 is longer than the sequence.
@pytest.mark.parametrize("chunk_size", [None, 1, 4, 5, 7, 23, 100])
@pytest.mark.parametrize("tau", [0.01, 0.3])
def test_matches_loop_reference(chunk_size, tau):
    h = anisotropic_states(2, 23, 8)
    labels = labels_with_groups(2, 23)
    fast = simreg_loss(h, labels, tau=tau, chunk_size=chunk_size)
    ref = simreg_loss_reference(h, labels, tau=tau, chunk_size=chunk_size)
    if chunk_size != 1:
        assert ref > 1e-4, "test data too easy: R is ~0 and the comparison would prove nothing"
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-14,
                               msg=f"simreg_loss differs from the loop reference (chunk {chunk_size}, τ {tau})")


def test_fp32_input_matches_fp64_reference():
    h = anisotropic_states(2, 23, 8)
    labels = labels_with_groups(2, 23)
    fast = simreg_loss(h.float(), labels, chunk_size=5)
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast.double(), simreg_loss_reference(h, labels, chunk_size=5), rtol=1e-4, atol=1e-7,
                               msg="fp32 simreg_loss drifts from the fp64 reference")


def test_chunk_equal_to_sequence_is_full_simreg():
    h = anisotropic_states(3, 16, 8, seed=1)
    labels = labels_with_groups(3, 16, seed=1)
    assert torch.equal(simreg_loss(h, labels, chunk_size=16), simreg_loss(h, labels, chunk_size=None)), \
        "chunk_size = T must be exactly the unchunked (full) SimReg"


def test_chunks_do_not_see_each_other():
    """Chunking = running each chunk as its own sequence, with groups counted per chunk."""
    h = anisotropic_states(1, 12, 8, seed=2)
    labels = labels_with_groups(1, 12, seed=2, n_ignored=0)
    chunked = simreg_loss(h, labels, chunk_size=4)
    as_batch = simreg_loss(h.reshape(3, 4, 8), labels.reshape(3, 4))
    torch.testing.assert_close(chunked, as_batch, msg="chunk_size=4 on (1,12) must equal (3,4) unchunked")


@pytest.mark.parametrize("chunk_size", [None, 5])
def test_gradients_match_reference(chunk_size):
    h = anisotropic_states(2, 17, 6, seed=3).requires_grad_()
    labels = labels_with_groups(2, 17, seed=3)
    (g_fast,) = torch.autograd.grad(simreg_loss(h, labels, tau=0.05, chunk_size=chunk_size), h)
    (g_ref,) = torch.autograd.grad(simreg_loss_reference(h, labels, tau=0.05, chunk_size=chunk_size), h)
    assert g_ref.abs().max() > 1e-3, "test data too easy: reference gradient is ~0"
    torch.testing.assert_close(g_fast, g_ref, rtol=1e-9, atol=1e-12, msg="gradient differs from the reference")
    ignored = labels == -100
    assert torch.all(g_fast[ignored] == 0), "ignored positions must receive no gradient"


def test_gradcheck_against_finite_differences():
    h = anisotropic_states(1, 9, 4, seed=4).requires_grad_()
    labels = torch.tensor([[1, 2, 1, 1, -100, 2, 3, 1, 2]])
    assert torch.autograd.gradcheck(lambda x: simreg_loss(x, labels, tau=0.2, chunk_size=4), (h,)), \
        "analytic gradient disagrees with finite differences"


def test_invariant_to_rescaling_each_vector():
    h = anisotropic_states(2, 20, 8, seed=5)
    labels = labels_with_groups(2, 20, seed=5)
    scales = torch.rand(2, 20, 1, dtype=h.dtype, generator=torch.Generator().manual_seed(5)) * 10 + 0.1
    torch.testing.assert_close(simreg_loss(h * scales, labels, chunk_size=6), simreg_loss(h, labels, chunk_size=6),
                               msg="SimReg uses cosines: a positive scale per vector must not change it")


def test_bf16_input_is_computed_in_fp32():
    h = anisotropic_states(2, 32, 16, seed=6, dtype=torch.float32).bfloat16().requires_grad_()
    labels = labels_with_groups(2, 32, seed=6)
    r = simreg_loss(h, labels, chunk_size=8)
    r.backward()
    assert r.dtype == torch.float32 and torch.isfinite(r), f"bf16 input gave {r.dtype} {r}"
    assert torch.isfinite(h.grad).all(), "non-finite gradient for bf16 input"
    # same value as fp32 on the same (bf16-rounded) numbers: nothing after the input is bf16
    torch.testing.assert_close(r, simreg_loss(h.detach().float(), labels, chunk_size=8), rtol=1e-6, atol=0,
                               msg="bf16 input is not upcast to fp32 before the similarities")


def test_bf16_autocast_does_not_lower_the_similarities():
    h = anisotropic_states(2, 64, 32, seed=7, dtype=torch.float32).requires_grad_()
    labels = labels_with_groups(2, 64, n_labels=6, seed=7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r = simreg_loss(h, labels, chunk_size=16)
    r.backward()
    assert torch.isfinite(r) and torch.isfinite(h.grad).all(), "non-finite under bf16 autocast"
    # a bf16 cosine matmul at τ = 0.01 moves s_ij by ~0.5 and would miss this tolerance by far
    torch.testing.assert_close(r, simreg_loss(h.detach(), labels, chunk_size=16), rtol=1e-6, atol=0,
                               msg="autocast changed the result: the cosine matmul ran in bf16")


def test_all_positions_ignored_gives_differentiable_zero():
    h = anisotropic_states(2, 8, 4, dtype=torch.float32).requires_grad_()
    r = simreg_loss(h, torch.full((2, 8), -100), chunk_size=3)
    r.backward()
    assert r.item() == 0.0, f"expected 0 with every position ignored, got {r.item()}"
    assert h.grad is not None and torch.all(h.grad == 0), "gradient must exist and be exactly zero"


def test_single_valid_token_chunk_and_single_label_chunk_contribute_zero():
    # chunk 1 = positions 0..2: only one valid token; chunk 2 = positions 3..5: all the same label.
    # Both have empty N_i (softplus(−∞) = 0) but still count as groups in the average.
    h = anisotropic_states(1, 9, 4, seed=8).requires_grad_()
    labels = torch.tensor([[-100, 7, -100, 3, 3, 3, 1, 2, 1]])
    r = simreg_loss(h, labels, tau=0.1, chunk_size=3)
    only_last = simreg_loss(h[:, 6:], labels[:, 6:], tau=0.1)
    # groups: {7}, {3}, {1}, {2} → R = (0 + 0 + Σ_last-chunk group means) / 4
    torch.testing.assert_close(r, only_last * 2 / 4, msg="zero-contribution groups are not counted as groups")
    (g,) = torch.autograd.grad(r, h)
    assert torch.isfinite(g).all() and torch.all(g[0, :6] == 0), "empty-N_i tokens must get a finite zero gradient"


def test_hand_computed_three_tokens():
    """Three 2-D vectors at 0°, 90° and 45°, labels (5, 5, 7), τ = 0.5, formula written out by hand."""
    tau = 0.5
    h = torch.tensor([[[1.0, 0.0], [0.0, 3.0], [2.0, 2.0]]], dtype=torch.float64)
    labels = torch.tensor([[5, 5, 7]])
    c01, c02, c12 = 0.0, math.sqrt(0.5), math.sqrt(0.5)
    s = lambda cos: cos / tau  # noqa: E731
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    # token 0: P = {0, 1}, N = {2};  token 1: P = {1, 0}, N = {2};  token 2: P = {2}, N = {0, 1}
    r0 = softplus(s(c02) - math.log(math.exp(s(1.0)) + math.exp(s(c01))))
    r1 = softplus(s(c12) - math.log(math.exp(s(1.0)) + math.exp(s(c01))))
    r2 = softplus(math.log(math.exp(s(c02)) + math.exp(s(c12))) - s(1.0))
    expected = ((r0 + r1) / 2 + r2) / 2  # groups {0, 1} (label 5) and {2} (label 7)
    got = simreg_loss(h, labels, tau=tau).item()
    assert got == pytest.approx(expected, rel=1e-12), f"simreg_loss {got} != hand formula {expected}"


def test_pulling_classes_together_lowers_the_regulariser():
    # samples = fixed, well-separated class centres + noise; shrinking the noise pulls same-label
    # embeddings together without moving the classes closer to each other.
    g = torch.Generator().manual_seed(9)
    labels = torch.randint(0, 5, (2, 40), generator=g)
    centres = torch.randn(5, 16, generator=g, dtype=torch.float64)
    noise = torch.randn(2, 40, 16, generator=g, dtype=torch.float64)
    before = simreg_loss(centres[labels] + noise, labels, tau=0.1, chunk_size=10)
    after = simreg_loss(centres[labels] + 0.25 * noise, labels, tau=0.1, chunk_size=10)
    assert after < 0.5 * before, f"tighter classes should lower R: {before.item()} → {after.item()}"


def test_memory_is_linear_in_sequence_length():
    """No intermediate tensor larger than O(B·T·c): the T×T similarity matrix is never built."""
    B, T, c, d = 1, 4096, 64, 16

    class LargestTensor(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    LargestTensor.largest = max(LargestTensor.largest, t.numel())
            return out

    h = torch.randn(B, T, d, requires_grad=True)
    labels = torch.randint(0, 50, (B, T))
    with LargestTensor():
        simreg_loss(h, labels, chunk_size=c).backward()
    assert LargestTensor.largest <= B * T * c, \
        f"largest intermediate has {LargestTensor.largest} elements > B·T·c = {B * T * c} (T² = {T * T})"


def test_bad_inputs_name_the_problem():
    h = torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match="labels must be"):
        simreg_loss(h, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"h must be \(B, T, d\)"):
        simreg_loss(h[0], torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size"):
        simreg_loss(h, torch.zeros(2, 5, dtype=torch.long), chunk_size=0)
    with pytest.raises(ValueError, match="tau"):
        simreg_loss(h, torch.zeros(2, 5, dtype=torch.long), tau=0.0)


def test_torch_compile_fullgraph_agrees():
    h = anisotropic_states(2, 24, 16, seed=10, dtype=torch.float32)
    labels = labels_with_groups(2, 24, seed=10)
    labels[0, 20:] = 3  # a chunk whose tokens all share one label: every N_i empty
    labels[1, 10:20] = -100  # a chunk with no valid position

    def regulariser(x):
        return simreg_loss(x, labels, chunk_size=10)

    h_eager, h_comp = h.clone().requires_grad_(), h.clone().requires_grad_()
    regulariser(h_eager).backward()
    start = time.perf_counter()
    r = torch.compile(regulariser, fullgraph=True)(h_comp)
    r.backward()
    print(f"compile + first step: {time.perf_counter() - start:.1f} s")
    torch.testing.assert_close(r, regulariser(h_eager.detach()), rtol=1e-5, atol=1e-7,
                               msg="compiled SimReg value differs from eager")
    assert torch.isfinite(h_comp.grad).all(), "compiled backward produced non-finite gradients"
    torch.testing.assert_close(h_comp.grad, h_eager.grad, rtol=1e-4, atol=1e-7,
                               msg="compiled SimReg gradient differs from eager")


# --- inter-class angle -------------------------------------------------------------------------

def test_interclass_angle_orthogonal_centres_is_90_degrees():
    # 3 classes along the axes, each sample = centre + noise that cancels within the class
    axes = torch.eye(3)
    noise = torch.tensor([[0.3, -0.2, 0.1], [-0.3, 0.2, -0.1]])
    h = torch.cat([axes[k] + noise for k in range(3)])  # (6, 3)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    angle, n = interclass_angle(h, labels, min_count=2)
    assert n == 3 and angle == pytest.approx(90.0, abs=1e-9), f"orthogonal centres gave {angle}° over {n} classes"


def test_interclass_angle_known_plane_angles_and_filters():
    # centres at 0°, 60°, 120° in a plane → pair angles 60, 60, 120 → mean 80°;
    # label 9 (seen once) is below min_count and the ignored position is excluded.
    rad = torch.deg2rad(torch.tensor([0.0, 60.0, 120.0], dtype=torch.float64))
    centres = torch.stack([torch.cos(rad), torch.sin(rad)], dim=1)
    h = torch.cat([centres.repeat(2, 1) * 5, torch.tensor([[0.0, -1.0], [-1.0, 0.0]], dtype=torch.float64)])
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 9, -100])
    angle, n = interclass_angle(h.reshape(2, 4, 2), labels.reshape(2, 4), min_count=2)
    assert n == 3, f"expected 3 classes (label 9 rare, -100 ignored), got {n}"
    assert angle == pytest.approx(80.0, abs=1e-9), f"expected mean angle 80°, got {angle}"


def test_interclass_angle_blocks_cover_every_pair_once():
    # enough classes that the pairwise loop runs in several row blocks
    g = torch.Generator().manual_seed(11)
    k, d = 4500, 8
    h = torch.randn(2 * k, d, generator=g)
    labels = torch.arange(k).repeat(2)
    angle, n = interclass_angle(h, labels, min_count=2)
    u = F.normalize(h.double().reshape(2, k, d).mean(0), dim=-1)
    cos = (u @ u.T)[torch.triu(torch.ones(k, k, dtype=torch.bool), diagonal=1)]
    expected = torch.rad2deg(torch.arccos(cos.clamp(-1, 1))).mean().item()
    assert n == k and angle == pytest.approx(expected, rel=1e-9), f"blocked mean {angle} != dense {expected}"


def test_interclass_angle_too_few_classes_is_nan():
    angle, n = interclass_angle(torch.randn(4, 3), torch.tensor([1, 1, 1, 2]), min_count=2)
    assert n == 1 and math.isnan(angle), f"one class cannot have a pairwise angle, got {angle} over {n}"
