"""Fast paths of model.py against their plain references (CPU, fp32 unless said otherwise).

- Unpadded batches reach SDPA without a mask (flash kernels on GPUs), whatever mask was passed.
- Padding-free attention ("packed", "flex", "varlen") equals the padded reference ("dense"): outputs
  and gradients, with padding, sliding windows, GQA, RoPE, learned positions, causal decoders.
- flex attention's block mask, built tile by tile, has create_block_mask's tiles without its N x N mask.
- The fused, chunked LM loss equals the plain cross-entropy on full fp32 logits.
- MoE experts run as one grouped matmul equal model.MoE's per-expert loop: outputs and gradients.
"""
import warnings

import pytest
import torch
import torch.nn.functional as F

import fast_paths
import model as M
from train_lm import masked_rows

pytestmark = pytest.mark.usefixtures("one_thread")
V = 97


def tiny(family, **over):
    torch.manual_seed(0)
    base = dict(family=family, vocab_size=V, d_model=32, n_layers=3, n_heads=4, d_ff=48, pad_id=0)
    m = M.Transformer(M.ModelConfig(**{**M.FAMILY_TRAITS[family], **base, **over}))
    with torch.no_grad():  # weights large enough that a wrong mask or position shows in the output
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


# every family trait the fast paths must carry over: windows and two RoPE thetas (modernbert),
# GQA + RoPE (eurobert), learned absolute positions + post-norm (bert), fairseq positions
# (roberta), causal GQA decoders (llama)
MODELS = {
    "modernbert": dict(window=3, local_layers=(0, 1), rope_theta=1000.0, rope_theta_local=100.0),
    "eurobert": dict(n_kv_heads=2),
    "bert": dict(max_seq_len=64, type_vocab_size=2),
    "roberta": dict(max_seq_len=64, pad_id=1),
    "llama": dict(n_kv_heads=2),
}


def padded(B=4, T=23, pad_id=0, left=False):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(2, V, (B, T), generator=g)
    lengths = torch.tensor([T, 9, 17, 1][:B])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if left:
        mask = mask.flip(1)
    ids[~mask] = pad_id
    return ids, mask.long()


def with_impl(m, impl):
    m.config.attn_impl = impl
    return m


def assert_grads_close(got, want, rtol=1e-4):
    """Each parameter's gradient to `rtol`, with a floor of rtol / 10 of its largest entry (fp32
    sums taken in another order differ by ~1e-7 of the largest term)."""
    assert got.keys() == want.keys()
    for name in want:
        scale = want[name].abs().max().item()
        torch.testing.assert_close(got[name], want[name], rtol=rtol, atol=rtol / 10 * scale, msg=name)


# ---------------------------------------------------------------- no mask where none is needed


def spy_on_sdpa(monkeypatch):
    """Records (attn_mask, is_causal) of every SDPA call, then runs the real SDPA."""
    calls, real = [], F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, is_causal=False, **kw):
        calls.append((attn_mask, is_causal))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    return calls


@pytest.mark.parametrize("impl", ["auto", "dense"])
@pytest.mark.parametrize("family", ["llama", "bert", "eurobert"])
@pytest.mark.parametrize("mask", ["none", "ones"])
def test_unpadded_batch_reaches_sdpa_without_a_mask(family, mask, impl, monkeypatch):
    m = with_impl(tiny(family, **MODELS[family]), impl)
    ids, _ = padded(B=3, T=16)
    ids[ids == 0] = 5
    calls = spy_on_sdpa(monkeypatch)
    with torch.no_grad():
        m(ids, attention_mask=None if mask == "none" else torch.ones_like(ids))
    causal = family == "llama"
    if impl == "auto" and mask == "ones":  # a masked batch always takes the padding-free path: one
        assert len(calls) == 3 and all(a is not None for a, _ in calls)  # compiled graph for all batches
        return
    assert [(a is None, c) for a, c in calls] == [(True, causal)] * 3, calls


@pytest.mark.parametrize("mask", ["none", "ones"])
def test_unpadded_window_layers_get_the_band_only(mask, monkeypatch):
    """ModernBERT without padding: global layers no mask, local layers the +-w band (T, T) alone."""
    m = with_impl(tiny("modernbert", **MODELS["modernbert"]), "dense")
    ids = torch.randint(2, V, (3, 16))
    calls = spy_on_sdpa(monkeypatch)
    with torch.no_grad():
        m(ids, attention_mask=None if mask == "none" else torch.ones_like(ids))
    i = torch.arange(16)
    band = (i[:, None] - i[None, :]).abs() <= 3
    local, glob = calls[:2], calls[2]
    assert glob == (None, False)
    for a, c in local:
        assert not c and a.shape == (16, 16) and torch.equal(a, band)


@pytest.mark.parametrize("causal", [False, True])
def test_padded_batch_masks_exactly_the_padding(causal, monkeypatch):
    """The reference path with padding: keys at padding positions are masked, nothing else."""
    m = with_impl(tiny("eurobert", **MODELS["eurobert"]), "dense")
    ids, mask = padded(T=12)
    calls = spy_on_sdpa(monkeypatch)
    with torch.no_grad():
        m(ids, attention_mask=mask, causal=causal)
    a, c = calls[0]
    assert not c
    i = torch.arange(12)
    want = mask.bool()[:, None, None, :].expand(4, 1, 12, 12)
    if causal:
        want = want & (i[:, None] >= i[None, :])
    real = mask.bool()[:, None, :, None].expand(4, 1, 12, 12)  # rows of padding queries are free
    assert torch.equal(a.expand(4, 1, 12, 12)[real], want[real])


def test_all_ones_mask_reaches_sdpa_without_a_mask_under_torch_compile(monkeypatch):
    """The padding check runs outside the compiled graph, so a compiled model drops the mask too."""
    torch._dynamo.reset()
    m = with_impl(tiny("llama", **MODELS["llama"]), "dense")
    ids = torch.randint(2, V, (2, 16))
    calls = spy_on_sdpa(monkeypatch)
    with torch.no_grad():
        ref = m(ids)
        calls.clear()
        out = torch.compile(m, backend="eager")(ids, attention_mask=torch.ones_like(ids))
    assert calls and all(a is None and c for a, c in calls), calls
    torch.testing.assert_close(out, ref)


def test_auto_chooses_by_device_padding_and_dtype():
    m = tiny("modernbert", **MODELS["modernbert"])
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (fast_paths.choose_attn_impl(m, False, cpu), fast_paths.choose_attn_impl(m, True, cpu)) == ("dense", "packed")
    assert fast_paths.choose_attn_impl(m, True, cuda) == "flex"      # fp32 weights: flash varlen needs bf16/fp16
    assert fast_paths.choose_attn_impl(m, False, cuda) == "flex"     # no padding, but the window layers gain
    assert fast_paths.choose_attn_impl(tiny("llama"), False, cuda) == "dense"
    m.to(torch.bfloat16)
    assert fast_paths.choose_attn_impl(m, True, cuda) == ("varlen" if fast_paths.varlen_kernel() is not None else "flex")
    m.train().config.dropout = 0.1
    assert fast_paths.choose_attn_impl(m, True, cuda) == "packed", "flex and varlen have no attention dropout"
    with pytest.raises(ValueError, match="attn_impl"):
        M.ModelConfig(attn_impl="flash")


# ---------------------------------------------------------------- padding-free paths == dense


def outputs_and_grads(m, ids, mask, causal=None, seed=0):
    """Hidden states and logits at real positions, and every parameter's gradient of a loss that
    weights each real logit differently (padding positions take no part, as in every real loss)."""
    m.zero_grad(set_to_none=True)
    h, _, _ = m.body(ids, mask, causal=causal)
    logits = m.head(h).float()
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed)).to(logits.device)
    (logits * weights * mask[..., None]).sum().backward()
    real = mask.bool()
    return h[real].detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", list(MODELS))
def test_packed_equals_dense_outputs_and_gradients(family):
    m = tiny(family, **MODELS[family]).train()
    ids, mask = padded(pad_id=m.config.pad_id)
    h_dense, g_dense = outputs_and_grads(with_impl(m, "dense"), ids, mask)
    h_packed, g_packed = outputs_and_grads(with_impl(m, "packed"), ids, mask)
    torch.testing.assert_close(h_packed, h_dense, rtol=1e-5, atol=1e-5)
    assert_grads_close(g_packed, g_dense)


def test_packed_left_padded_decoder_keeps_rope_positions():
    """Left padding: a token's RoPE position is its column, as on the dense path; causal order holds."""
    m = tiny("llama", **MODELS["llama"]).train()
    ids, mask = padded(left=True)
    h_dense, g_dense = outputs_and_grads(with_impl(m, "dense"), ids, mask)
    h_packed, g_packed = outputs_and_grads(with_impl(m, "packed"), ids, mask)
    torch.testing.assert_close(h_packed, h_dense, rtol=1e-5, atol=1e-5)
    assert_grads_close(g_packed, g_dense)


def test_packed_leaves_zeros_at_padding_and_handles_an_empty_row():
    m = with_impl(tiny("modernbert", **MODELS["modernbert"]), "packed")
    ids, mask = padded()
    mask[3] = 0
    with torch.no_grad():
        h = m.encode(ids, mask)
        ref = with_impl(m, "dense").encode(ids, mask)
    assert torch.equal(h[~mask.bool()], torch.zeros_like(h[~mask.bool()]))
    torch.testing.assert_close(h[mask.bool()], ref[mask.bool()], rtol=1e-5, atol=1e-5)


def test_packed_moe_routes_real_tokens_only():
    """MoE on the packed path: same outputs at real tokens; the balance loss ignores padding."""
    m = tiny("llama", n_experts=4, expert_top_k=2)
    ids, mask = padded()
    with torch.no_grad():
        h_d, _, aux_d = with_impl(m, "dense").body(ids, mask)
        h_p, _, aux_p = with_impl(m, "packed").body(ids, mask)
        real = mask.bool()
        _, _, aux_real = with_impl(m, "dense").body(ids[:1], mask[:1])  # row 0 has no padding
    torch.testing.assert_close(h_p[real], h_d[real], rtol=1e-5, atol=1e-5)
    assert abs(aux_p.item() - aux_d.item()) > 1e-6
    assert torch.isfinite(aux_real)


def flex_vs_dense(family, T=40):
    m = tiny(family, **MODELS[family])
    ids, mask = padded(T=T)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is unfused (fine for a test)
        out = [with_impl(m, impl).encode(ids, a) for impl in ("flex", "dense") for a in (mask, None)]
    real = mask.bool()
    torch.testing.assert_close(out[0][real], out[2][real], rtol=1e-5, atol=1e-5)  # padded
    torch.testing.assert_close(out[1], out[3], rtol=1e-5, atol=1e-5)              # not padded


@pytest.mark.parametrize("family", ["modernbert", "eurobert", "llama"])
def test_flex_equals_dense_forward(family):
    """flex attention, one block mask for padding, window and causality (forward only: flex has no
    CPU backward; its gradients are PyTorch's, the packing around it is tested with "packed")."""
    flex_vs_dense(family)


# ---------------------------------------------------------------- flex attention's block mask


def packing_of(lengths, T=None, left=False, holes=False, seed=0):
    """fast_paths.Packing of a padded batch whose rows hold `lengths` real tokens (left or right
    padded; `holes`: some padding inside the rows too, so positions skip within a sequence)."""
    lengths = torch.as_tensor(lengths)
    T = T or int(lengths.max())
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if left:
        mask = mask.flip(1)
    if holes:
        mask &= torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed)) < 0.8
    return fast_paths.Packing(len(lengths), T, mask.flatten().nonzero().squeeze(1), mask.sum(1))


def packed_mask(packing, causal, window):
    """The token-level mask every padding-free kernel must apply: same sequence, causal, window."""
    seq, pos = packing.sequence, packing.positions
    ok = seq[:, None] == seq[None, :]
    if causal:
        ok &= pos[:, None] >= pos[None, :]
    if window is not None:
        ok &= (pos[:, None] - pos[None, :]).abs() <= window
    return ok


def create_block_mask_reference(packing, causal, window):
    """The former flex_block_mask: create_block_mask on the same mask_mod (an N x N mask first)."""
    from torch.nn.attention.flex_attention import create_block_mask
    n = packing.positions.numel()
    mask = packed_mask(packing, causal, window)
    # device explicit: left out, torch takes current_accelerator(), which a CUDA build names without a GPU
    return create_block_mask(lambda b, h, q, k: mask[q, k], None, None, n, n, device=packing.positions.device)


def block_sets(block_mask):
    """(partial, full) tiles of a BlockMask as dense (n_q_blocks, n_kv_blocks) 0/1 matrices."""
    from torch.nn.attention.flex_attention import _ordered_to_dense
    bm = block_mask
    return (_ordered_to_dense(bm.kv_num_blocks, bm.kv_indices, bm.kv_indices.shape[-1])[0, 0],
            _ordered_to_dense(bm.full_kv_num_blocks, bm.full_kv_indices, bm.full_kv_indices.shape[-1])[0, 0])


def tile_level_mask(block_mask, n):
    """What a block-sparse flex kernel applies: full tiles as they are, may_attend inside partial
    tiles, nothing elsewhere (eager flex applies may_attend everywhere and never reads the tiles)."""
    partial, full = (t.bool().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :n]
                     for t in block_sets(block_mask))
    i = torch.arange(n)
    return full | (partial & block_mask.mask_mod(0, 0, i[:, None], i[None, :]))


BLOCK_CASES = {  # lengths of the packed sequences, and how the padded batch lays them out
    "short sequences, several per block": dict(lengths=[5, 40, 17, 90, 3, 61, 33]),
    "lengths around 128, N not a multiple": dict(lengths=[128, 127, 129, 256, 1, 255]),
    "one long sequence": dict(lengths=[700]),
    "left padding": dict(lengths=[300, 37, 129, 200], left=True),
    "holes inside rows": dict(lengths=[400, 260, 300], holes=True),
}
# windows at the edges of the tile rules: 1 (the closest pair of two adjacent blocks), 127 and 255
# (the farthest pair of one block, of two adjacent blocks)
WINDOWS = [(False, None), (True, None), (False, 1), (True, 1), (False, 127), (True, 255)]


@pytest.mark.parametrize("causal, window", WINDOWS)
@pytest.mark.parametrize("case", list(BLOCK_CASES))
def test_flex_block_mask_equals_create_block_mask(case, causal, window):
    """Same partial and full tiles, same layout, as create_block_mask over the N x N mask; and the
    mask a block-sparse kernel applies from them is exactly the packed attention mask."""
    p = packing_of(**BLOCK_CASES[case])
    got, want = fast_paths.flex_block_mask(p, causal, window), create_block_mask_reference(p, causal, window)
    assert got.seq_lengths == want.seq_lengths and got.BLOCK_SIZE == want.BLOCK_SIZE
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                 "q_indices", "full_q_num_blocks", "full_q_indices"):
        g, w = getattr(got, name), getattr(want, name)
        assert g.dtype == w.dtype == torch.int32 and g.shape == w.shape, name
    (gp, gf), (wp, wf) = block_sets(got), block_sets(want)
    assert torch.equal(gp, wp), "partial tiles differ"
    assert torch.equal(gf, wf), "full tiles differ"
    assert torch.equal(got.to_dense(), want.to_dense())
    for name in ("q_num_blocks", "full_q_num_blocks"):  # derived by from_kv_blocks (flex's backward reads them)
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    n = p.positions.numel()
    assert torch.equal(tile_level_mask(got, n), packed_mask(p, causal, window))


def test_flex_block_mask_cases_have_full_and_partial_tiles():
    """Guards the test above: the cases reach every kind of tile, so a wrong rule would show."""
    kinds = set()
    for case in BLOCK_CASES.values():
        p = packing_of(**case)
        for causal, window in WINDOWS:
            partial, full = block_sets(fast_paths.flex_block_mask(p, causal, window))
            kinds |= {("partial", causal, window)} if partial.any() else set()
            kinds |= {("full", causal, window)} if full.any() else set()
    assert {("full", c, w) for c, w in WINDOWS if w != 1} <= kinds  # a window of 1 leaves no full 128 x 128 tile
    assert {("partial", c, w) for c, w in WINDOWS} <= kinds


@pytest.mark.parametrize("causal, window", [(False, None), (True, 300)])
def test_flex_attention_with_the_block_mask_equals_sdpa(causal, window):
    """Eager flex attention (it applies may_attend to all N x N scores) equals SDPA on the packed mask."""
    from torch.nn.attention.flex_attention import flex_attention
    p = packing_of(**BLOCK_CASES["lengths around 128, N not a multiple"])
    n = p.positions.numel()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = flex_attention(q, k, v, block_mask=fast_paths.flex_block_mask(p, causal, window))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=packed_mask(p, causal, window))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # ~40 s of inductor C++ compilation on 2 cores with a cold cache
def test_compiled_flex_attention_reads_the_tiles_of_the_block_mask():
    """torch.compile's flex kernel (C++ on the CPU, Triton on GPUs) skips the tiles the mask rules
    out and applies no mask inside full tiles: with our block mask it equals SDPA on the packed mask,
    and with the full tiles dropped from the same mask it does not (so the tiles are really read)."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    p = packing_of(**BLOCK_CASES["left padding"])
    n = p.positions.numel()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for _ in range(3))
    bm = fast_paths.flex_block_mask(p, True, 300)  # causal with a window: full, partial and empty tiles
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=packed_mask(p, True, 300))
    torch.testing.assert_close(compiled(q, k, v, block_mask=bm), want, rtol=1e-5, atol=1e-5)
    assert bm.full_kv_num_blocks.sum() > 0
    no_full = BlockMask.from_kv_blocks(bm.kv_num_blocks, bm.kv_indices, torch.zeros_like(bm.full_kv_num_blocks),
                                       bm.full_kv_indices.clone(), BLOCK_SIZE=128, mask_mod=bm.mask_mod,
                                       seq_lengths=bm.seq_lengths)
    assert (compiled(q, k, v, block_mask=no_full) - want).abs().max() > 0.1


class TensorBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Peak bytes of the tensors that the ops run inside it allocate and keep alive (views of a
    tensor count once; memory internal to a kernel is not seen)."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.sizes = 0, 0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import weakref
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t._base is None:
                key, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
                if size and key not in self.sizes:
                    self.sizes[key] = size
                    self.live += size
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(t, self.release, key)
        return out

    def release(self, key):
        self.live -= self.sizes.pop(key)


def peak_rss_growth(fn):
    """Growth of the process's peak resident memory while fn runs (Linux: /proc/self/clear_refs
    resets the peak), or None where that cannot be measured."""
    def kib(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = kib("VmRSS:")
    except OSError:
        return None
    fn()
    return (kib("VmHWM:") - before) * 1024


def random_packing(n_tokens, n_seqs, seed=0):
    """n_seqs sequences of random lengths >= 1 that add up to n_tokens, right padded."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(n_tokens - 1, generator=g)[:n_seqs - 1].sort().values + 1
    lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([n_tokens])]))
    return packing_of(lengths)


@pytest.mark.parametrize("causal, window", [(True, None), (False, 64)])
def test_flex_block_mask_memory_is_per_block_not_per_token_pair(causal, window):
    """16 384 packed tokens (64 sequences): the mask takes well under 100 MB to build (the N x N
    mask of create_block_mask would take ~17 bytes per token pair, 4.6 GB here)."""
    p = random_packing(16384, 64)
    with TensorBytes() as seen:
        bm = fast_paths.flex_block_mask(p, causal, window)
    assert bm.kv_indices.shape == (1, 1, 128, 128)
    assert seen.peak < 100e6, f"{seen.peak / 1e6:.0f} MB of tensors"
    rss = peak_rss_growth(lambda: fast_paths.flex_block_mask(p, causal, window))
    assert rss is None or rss < 100e6, f"peak resident memory grew by {rss / 1e6:.0f} MB"
    # the measurement sees N x N allocations: create_block_mask at N = 2 048 allocates >= 3 bytes per pair
    small = random_packing(2048, 8)
    with TensorBytes() as seen:
        create_block_mask_reference(small, causal, window)
    assert seen.peak >= 3 * 2048 ** 2, f"{seen.peak} bytes"


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size, enable_gqa):
    """FlashAttention's documented varlen semantics, sequence by sequence: query i of a sequence sees
    keys j of the same sequence with i - left <= j <= i + right (-1: unbounded)."""
    assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and max_q == max_k
    assert q.dim() == 3 and max_q >= int((cu_q[1:] - cu_q[:-1]).max())
    out = []
    for s, e in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
        i = torch.arange(e - s)
        allowed = torch.ones(e - s, e - s, dtype=torch.bool)
        left, right = window_size
        if left >= 0:
            allowed &= i[None, :] >= i[:, None] - left
        if right >= 0:
            allowed &= i[None, :] <= i[:, None] + right
        qs, ks, vs = (t[s:e].transpose(0, 1) for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, enable_gqa=enable_gqa).transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("family", ["modernbert", "eurobert", "llama"])
def test_varlen_plumbing_equals_dense(family, monkeypatch):
    """The FlashAttention varlen kernel is CUDA-only; here it is replaced by its documented
    semantics, which tests everything around it: packing, offsets, window, causality, GQA, RoPE."""
    monkeypatch.setattr(fast_paths, "varlen_kernel", lambda: reference_varlen)
    m = tiny(family, **MODELS[family]).train()
    ids, mask = padded()
    h_dense, g_dense = outputs_and_grads(with_impl(m, "dense"), ids, mask)
    h_var, g_var = outputs_and_grads(with_impl(m, "varlen"), ids, mask)
    torch.testing.assert_close(h_var, h_dense, rtol=1e-5, atol=1e-5)
    assert_grads_close(g_var, g_dense)


def test_fast_paths_refuse_attention_dropout():
    m = tiny("bert", dropout=0.1).train()
    ids, mask = padded()
    with pytest.raises(ValueError, match="dropout"):
        with_impl(m, "flex").encode(ids, mask)


def test_packed_path_compiles_with_varying_padding():
    """Under torch.compile the padding search runs eagerly; the rest sees a new N every batch."""
    torch._dynamo.reset()
    m = tiny("modernbert", **MODELS["modernbert"])
    batches = []
    for cut in (9, 4):  # a different number of real tokens per batch
        ids, mask = padded()
        mask[1, :] = (torch.arange(23) < cut).long()
        with torch.no_grad():
            batches.append((ids, mask, with_impl(m, "dense").encode(ids, mask)))
    compiled = torch.compile(with_impl(m, "packed").encode, backend="eager")
    with torch.no_grad():
        for ids, mask, ref in batches:
            real = mask.bool()
            torch.testing.assert_close(compiled(ids, mask)[real], ref[real], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- fused, chunked LM loss


def lm_model(family):
    over = {"bert": dict(max_seq_len=64), "llama": dict(tie_embeddings=True),
            "eurobert": dict(decoder_bias=True)}[family]
    return tiny(family, **over).train()


def masked(h, labels, masked_only, bucket=8):
    """(h, labels) of every position, or of the masked rows only as train_lm.py selects them."""
    if not masked_only:
        return h, labels
    rows, row_labels = masked_rows(labels.cpu(), bucket)
    return h.flatten(0, 1)[rows.to(h.device)], row_labels.to(h.device)


def plain_loss(m, h, labels):
    return M.lm_losses(m, h, labels)["ce"]


def fused_loss(m, h, labels, chunk_size=None):
    return fast_paths.fused_lm_losses(m, h, labels, chunk_size=chunk_size)["ce"]


def loss_and_grads(m, ids, labels, fn):
    m.zero_grad(set_to_none=True)
    h = m.encode(ids)
    loss = fn(m, h, labels)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["bert", "llama", "eurobert"])   # transform head; tied; bias
@pytest.mark.parametrize("chunk", [1, 7, 64, None])
@pytest.mark.parametrize("masked_only", [False, True])
def test_lm_loss_equals_plain_cross_entropy(family, chunk, masked_only):
    """The fused loss over every position, or over the masked rows only (padded to a bucket with
    IGNORE labels, as masked LM runs it), equals the plain cross-entropy over every position."""
    m = lm_model(family)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, V, (3, 21), generator=g)
    labels = torch.where(torch.rand(3, 21, generator=g) < 0.3, torch.randint(0, V, (3, 21), generator=g), -100)
    ref, g_ref = loss_and_grads(m, ids, labels, plain_loss)
    out, g_out = loss_and_grads(m, ids, labels, lambda m, h, y: fused_loss(m, *masked(h, y, masked_only),
                                                                             chunk_size=chunk))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert_grads_close(g_out, g_ref, rtol=1e-5)


def test_lm_loss_with_nothing_labelled_is_zero_and_finite():
    m = lm_model("llama")
    ids = torch.randint(2, V, (2, 9))
    labels = torch.full_like(ids, -100)
    for masked_only in (False, True):
        loss = fused_loss(m, *masked(m.encode(ids), labels, masked_only))
        loss.backward()
        assert loss.item() == 0.0
        assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_lm_loss_without_grad_matches_plain():
    m = lm_model("eurobert")
    ids = torch.randint(2, V, (2, 9))
    with torch.no_grad():
        h = m.encode(ids)
        torch.testing.assert_close(fused_loss(m, h, ids, chunk_size=4), plain_loss(m, h, ids))


def test_lm_loss_under_bf16_autocast_is_close_to_plain():
    """bf16 logits upcast per chunk, as the plain path upcasts the whole tensor: same numbers up to
    the order of the fp32 gradient sums."""
    m = lm_model("eurobert")
    ids = torch.randint(2, V, (4, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, g_ref = loss_and_grads(m, ids, ids, plain_loss)
        out, g_out = loss_and_grads(m, ids, ids, lambda m, h, y: fused_loss(m, h, y, chunk_size=16))
    assert abs(out.item() - ref.item()) < 1e-3 * ref.item()
    for name in g_ref:
        rel = (g_out[name] - g_ref[name]).norm() / g_ref[name].norm().clamp(min=1e-12)
        assert rel < 2e-2, f"{name}: relative gradient difference {rel:.3g}"


@pytest.mark.parametrize("causal", [True, False])
def test_lm_objective_equals_plain_cross_entropy(causal):
    """train_lm.LMObjective (fused loss, MoE aux term, the named terms) against CE on full fp32 logits."""
    import train_lm
    torch.manual_seed(0)
    C = {**train_lm.DEFAULTS, "moe_aux_weight": 0.01}
    m = tiny("llama", n_experts=4, expert_top_k=2).train()
    obj = train_lm.LMObjective(m, C)
    g = torch.Generator().manual_seed(4)
    x = torch.randint(2, V, (2, 16), generator=g)
    y = torch.randint(0, V, (2, 16), generator=g) if causal else \
        torch.where(torch.rand(2, 16, generator=g) < 0.3, x, -100)
    loss, stats = obj(x, y, causal, False)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    h, _, aux = m.body(x, causal=causal)
    ref = plain_loss(m, h, y)
    (ref + 0.01 * aux).backward()
    torch.testing.assert_close(stats["ce"], ref.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(stats["moe_aux"], aux.detach())
    torch.testing.assert_close(loss.detach(), (ref + 0.01 * aux).detach(), rtol=1e-6, atol=1e-6)
    assert_grads_close(grads, {n: p.grad for n, p in m.named_parameters()}, rtol=1e-5)


# the plain formula of each term of model.LM_TERMS on a row's fp32 logits z (V,) and label y, written
# here from its paper: a new term is its entry there and its formula here
PLAIN_TERMS = {
    "ce": lambda z, y: -(z[y] - torch.log(torch.exp(z - z.max()).sum()) - z.max()),
    "z": lambda z, y: (torch.log(torch.exp(z - z.max()).sum()) + z.max()) ** 2,     # PaLM's z-loss
}


@pytest.mark.parametrize("name", sorted(PLAIN_TERMS))
def test_each_lm_term_equals_its_formula_and_so_does_the_fused_loss_where_it_covers_it(name, capsys):
    """Every LM_TERMS entry of model.lm_losses equals its formula averaged over the labelled rows, in
    value and gradients, and so does fast_paths.fused_lm_losses for the terms it covers (ce); for
    any other, `covers` says once that the plain formula runs."""
    assert set(PLAIN_TERMS) == set(M.LM_TERMS), "a new term of the LM loss: its formula here too"
    m = lm_model("eurobert")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, V, (3, 13), generator=g)
    labels = torch.where(torch.rand(3, 13, generator=g) < 0.4, torch.randint(0, V, (3, 13), generator=g), -100)

    def formula(m, h, y):
        z, rows = m.head(h).float().flatten(0, 1), (y != -100).flatten().nonzero().flatten()
        return torch.stack([PLAIN_TERMS[name](z[r], y.flatten()[r]) for r in rows]).mean()
    ref, g_ref = loss_and_grads(m, ids, labels, formula)
    fast_paths._SAID.clear()
    covered = [fast_paths.covers(fast_paths.fused_lm_losses, name) for _ in range(2)][0]
    assert covered == (name in fast_paths.fused_lm_losses.covers)
    for losses in (M.lm_losses, fast_paths.fused_lm_losses)[:1 + covered]:
        out, g_out = loss_and_grads(m, ids, labels, lambda m, h, y: losses(m, h, y, (name,))[name])
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        assert_grads_close(g_out, g_ref, rtol=1e-4)
    said = capsys.readouterr().err.count(f"fused_lm_losses covers ce; {name} runs model.py's plain formula")
    assert said == (0 if covered else 1), "one line, once"


@pytest.mark.slow
@pytest.mark.parametrize("causal, z_loss", [(True, 0.0), (False, 0.0), (True, 1e-3)])
def test_lm_objective_under_inductor_equals_eager(causal, z_loss):
    """torch.compile (inductor) of LMObjective with the fused loss: same loss and gradients as eager,
    for CLM (traced with static shapes) and MLM (the labelled-rows loss runs outside the graph), and
    with z-loss (the plain formula). (torch 2.15's inductor returned the fused loss without its
    grad_fn when the objective wrote it as 1.0 * ce or ce + 0.)"""
    import train_lm
    torch._dynamo.reset()
    m = tiny("llama", **MODELS["llama"]).train()
    obj = train_lm.LMObjective(m, {**train_lm.DEFAULTS, "z_loss": z_loss})
    compiled = torch.compile(obj)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(2, V, (2, 32), generator=g)
    for _ in range(2):  # MLM: a different number of labelled rows the second time
        y = torch.randint(0, V, (2, 32), generator=g) if causal else \
            torch.where(torch.rand(2, 32, generator=g) < 0.3, x, -100)
        results = []
        for f in (obj, compiled):
            m.zero_grad(set_to_none=True)
            loss, _ = f(x, y, causal, False)
            loss.backward()
            results.append((loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
        torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-6, atol=1e-6)
        assert_grads_close(results[1][1], results[0][1], rtol=1e-4)  # inductor reorders fp32 sums


# ---------------------------------------------------------------- MoE: experts as one grouped matmul


def moe_layer(k, n=6, d=32, d_ff=20, idle=(2, 5), dtype=torch.float32):
    """A MoE layer (d_ff not a multiple of 8, as LLaMA-1B's 5461) and tokens (N = 26) whose router
    never picks the experts in `idle`: feature 0 of every token is 1, and weighs -100 for them."""
    torch.manual_seed(0)
    moe = M.MoE(M.ModelConfig(family="mixtral", d_model=d, d_ff=d_ff, n_experts=n, expert_top_k=k))
    with torch.no_grad():
        moe.w_in.normal_(0, 0.2)
        moe.w_out.normal_(0, 0.2)
        moe.router.weight.normal_(0, 1)
        moe.router.weight[:, 0] = 0.0
        moe.router.weight[list(idle), 0] = -100.0
    x = torch.randn(2, 13, d, generator=torch.Generator().manual_seed(1))
    x[..., 0] = 1.0
    return moe.to(dtype), x.to(dtype)


def moe_outputs_and_grads(moe, x, path):
    """y, aux and the gradients (x, router, w_in, w_out) of a weighted sum of y, along `path`:
    "loop" (model.py's per-expert loop), "slices" or "grouped_mm" (fast_paths.grouped_experts)."""
    moe.zero_grad(set_to_none=True)
    moe.grouped = path != "loop"
    x = x.clone().requires_grad_()
    if path == "grouped_mm":  # on the CPU, torch._grouped_mm's reference kernel (it checks the strides)
        real = fast_paths.grouped_experts
        fast_paths.grouped_experts = lambda *a: real(*a, use_grouped_mm=True)
    try:
        y, aux = moe(x)
    finally:
        if path == "grouped_mm":
            fast_paths.grouped_experts = real
    (y.float() * torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(y.device)).sum().backward()
    return dict(y=y.detach(), aux=aux.detach(), x=x.grad, router=moe.router.weight.grad,
                w_in=moe.w_in.grad, w_out=moe.w_out.grad)


def routed_counts(moe, x):
    with torch.no_grad():
        chosen = moe.router(x.flatten(0, 1)).topk(moe.k, dim=-1).indices
    return torch.bincount(chosen.flatten(), minlength=moe.n)


@pytest.mark.parametrize("path", ["slices", "grouped_mm"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_grouped_experts_equal_the_per_expert_loop(k, path):
    """fast_paths.grouped_experts against model.MoE's loop, fp32: output, balance loss and gradients
    w.r.t. x, router, w_in and w_out, with two experts that receive no token (zero gradients)."""
    moe, x = moe_layer(k)
    counts = routed_counts(moe, x)
    assert counts[[2, 5]].tolist() == [0, 0] and (counts[[0, 1, 3, 4]] > 0).all(), counts
    want = moe_outputs_and_grads(moe, x, "loop")
    got = moe_outputs_and_grads(moe, x, path)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-6, msg=name)
    assert got["w_in"][[2, 5]].abs().max() == 0 and got["w_out"][[2, 5]].abs().max() == 0


@pytest.mark.parametrize("path", ["slices", "grouped_mm"])
@pytest.mark.parametrize("precision", ["bf16 weights", "bf16 autocast"])
def test_grouped_experts_equal_the_loop_in_bf16(precision, path):
    """bf16 on the CPU: a bf16 layer, or an fp32 layer under bf16 autocast (F.linear casts by itself,
    grouped_experts casts for _grouped_mm): same dtypes as the loop, values to bf16 rounding."""
    moe, x = moe_layer(2, dtype=torch.bfloat16 if precision == "bf16 weights" else torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16 autocast"):
        want = moe_outputs_and_grads(moe, x, "loop")
        got = moe_outputs_and_grads(moe, x, path)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert relative_error(got[name], want[name]) < 1e-2, name


def test_grouped_experts_are_the_default_and_the_model_equals_the_loop():
    """A whole MoE decoder (padded batch, packed path): grouped by default, same hidden states and
    gradients of every parameter as with the per-expert loop."""
    m = tiny("llama", n_experts=4, expert_top_k=2).train()
    assert all(block.mlp.grouped for block in m.layers)
    ids, mask = padded()
    h_grouped, g_grouped = outputs_and_grads(m, ids, mask)
    for block in m.layers:
        block.mlp.grouped = False
    h_loop, g_loop = outputs_and_grads(m, ids, mask)
    torch.testing.assert_close(h_grouped, h_loop, rtol=1e-5, atol=1e-5)
    assert_grads_close(g_grouped, g_loop)


def data_dependent_values(fn, *args):
    """The values in fn's torch.compile graph (one graph, fullgraph=True) that the host must read
    from the data: a shape or a number that depends on it (a GPU -> CPU sync each on a GPU)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    found = []

    def backend(gm, example_inputs):
        found.extend(node.format_node() for node in gm.graph.nodes
                     if free_unbacked_symbols(node.meta.get("example_value")))
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend, dynamic=False)(*args)
    return found


def test_grouped_mm_path_reads_nothing_from_the_data_on_the_host(monkeypatch):
    """The MoE layer on the _grouped_mm path compiles into one graph with no data-dependent shape or
    number (no sync, no graph break); the per-expert loop (torch.where) and the slice loop (the
    bounds read on the host) have such values, which shows that the check can fail. And compiled
    (aot_eager: autograd traced too), the _grouped_mm path gives eager's outputs and gradients."""
    moe, x = moe_layer(2, dtype=torch.bfloat16)  # torch._grouped_mm's compile-time (Meta) kernel is bf16-only
    moe.grouped = False
    assert data_dependent_values(moe, x), "the per-expert loop"
    moe.grouped = True
    assert data_dependent_values(moe, x), "the slice loop"
    real = fast_paths.grouped_experts
    monkeypatch.setattr(fast_paths, "grouped_experts", lambda *a: real(*a, use_grouped_mm=True))
    assert data_dependent_values(moe, x) == []
    torch._dynamo.reset()
    eager = moe_outputs_and_grads(moe, x, "grouped")
    moe.forward = torch.compile(moe.forward, fullgraph=True, backend="aot_eager", dynamic=False)
    compiled = moe_outputs_and_grads(moe, x, "grouped")
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name], msg=name)


# ---------------------------------------------------------------- GPU benchmark harness, dry run


def test_bench_train_lm_tiny_dry_run(monkeypatch):
    """The tokens/s + MFU benchmark runs train_lm's step end to end (CPU, tiny shape); MFU is the
    model's FLOPs per token times tokens/s over the peak (a made-up peak here: the CPU has none)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))
    import bench_train_lm
    import throughput
    monkeypatch.setattr(throughput, "peak_flops", lambda device: 1e12)
    rows = bench_train_lm.main(["--tiny", "--steps", "1", "--warmup", "0", "--configs", "configs/llama_350m_simreg.py"])
    (r,) = rows
    assert r["simreg"] and r["tokens_per_step"] == 4 * 64 and r["tokens_per_s"] > 0
    cfg = M.ModelConfig(**{**M.FAMILY_TRAITS["llama"], **{k: bench_train_lm.TINY[k] for k in
                                                          ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_size")}})
    assert r["mfu"] == pytest.approx(throughput.flops_per_token(cfg, 64) * r["tokens_per_s"] / 1e12, rel=1e-3)


# ---------------------------------------------------------------- on a GPU (skipped on the CPU)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-12)).item()


@cuda
@pytest.mark.parametrize("impl", ["packed", "flex", "varlen", "auto"])
@pytest.mark.parametrize("family", ["modernbert", "eurobert", "llama"])
def test_cuda_fast_paths_equal_dense_under_bf16(family, impl):
    """The real kernels (FlashAttention varlen, compiled flex attention) against the dense path, bf16
    autocast, sequences longer than flex's 128-token blocks; outputs and gradients."""
    if impl == "varlen" and fast_paths.varlen_kernel() is None:
        pytest.skip("this torch has no torch.nn.attention.varlen with window and GQA support")
    m = tiny(family, **{**MODELS[family], "d_model": 64}).cuda().train()
    ids, mask = padded(T=300)
    ids, mask = ids.cuda(), mask.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h_dense, g_dense = outputs_and_grads(with_impl(m, "dense"), ids, mask)
        h_fast, g_fast = outputs_and_grads(with_impl(m, impl), ids, mask)
    assert relative_error(h_fast, h_dense) < 2e-2
    for name in g_dense:
        assert relative_error(g_fast[name], g_dense[name]) < 5e-2, name


@cuda
@pytest.mark.parametrize("impl", ["flex", "varlen", "auto"])
def test_cuda_compiled_fast_paths_with_varying_padding(impl):
    """torch.compile of the whole model: a new number of real tokens every batch must neither fail
    nor recompile without end (dynamic N after the second batch)."""
    if impl == "varlen" and fast_paths.varlen_kernel() is None:
        pytest.skip("this torch has no torch.nn.attention.varlen with window and GQA support")
    torch._dynamo.reset()
    m = tiny("modernbert", **{**MODELS["modernbert"], "d_model": 64}).cuda().train()
    compiled = torch.compile(m)
    for cut in (200, 150, 90, 260):
        ids, mask = padded(T=300)
        mask[1, :] = (torch.arange(300) < cut).long()
        ids, mask = ids.cuda(), mask.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            want = with_impl(m, "dense")(ids, attention_mask=mask).float()
            m.config.attn_impl = impl
            got = compiled(ids, attention_mask=mask).float()
            got.sum().backward()
        real = mask.bool()
        assert relative_error(got[real], want[real]) < 2e-2


@cuda
def test_cuda_lm_loss_equals_plain_under_bf16():
    m = lm_model("eurobert").cuda()
    ids = torch.randint(2, V, (8, 256), device="cuda")
    for masked_only, labels in ((False, ids), (True, torch.where(torch.rand(8, 256, device="cuda") < 0.3, ids, -100))):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ref, g_ref = loss_and_grads(m, ids, labels, plain_loss)
            out, g_out = loss_and_grads(m, ids, labels, lambda m, h, y: fused_loss(m, *masked(h, y, masked_only),
                                                                                 chunk_size=300))
        assert abs(out.item() - ref.item()) < 1e-3 * ref.item()
        for name in g_ref:
            assert relative_error(g_out[name], g_ref[name]) < 2e-2, name


@cuda
@pytest.mark.parametrize("precision", ["bf16 autocast", "bf16 weights"])
def test_cuda_grouped_experts_equal_the_loop(precision):
    """On the GPU, the experts as grouped_experts runs them (torch._grouped_mm's kernel on Hopper,
    the slice loop elsewhere) against the per-expert loop in bf16, d_ff = 44 (padded to 48 for
    _grouped_mm); the two experts that receive no token get zero gradients (on sm100 _grouped_mm's
    backward has given them non-zero ones, pytorch/pytorch#172439)."""
    moe, x = moe_layer(2, d=64, d_ff=44, dtype=torch.bfloat16 if precision == "bf16 weights" else torch.float32)
    moe, x = moe.cuda(), x.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16 autocast"):
        want = moe_outputs_and_grads(moe, x, "loop")
        got = moe_outputs_and_grads(moe, x, "grouped")
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert relative_error(got[name], want[name]) < 2e-2, name
    for name in ("w_in", "w_out"):
        assert got[name][[2, 5]].abs().max() == 0, name


@cuda
def test_cuda_grouped_mm_path_runs_without_a_sync_and_compiles():
    """Hopper: grouped_experts picks torch._grouped_mm by itself under bf16 autocast; forward and
    backward make no GPU -> CPU sync (the per-expert loop makes one per expert); the MoE layer
    compiles into one graph without a data-dependent value, and inductor's graph equals eager."""
    if not fast_paths.grouped_mm_applies(torch.device("cuda"), torch.bfloat16, 64):
        pytest.skip("torch._grouped_mm's fast kernel runs on Hopper (sm90) GPUs")
    moe, x = moe_layer(2, d=64, d_ff=44, dtype=torch.bfloat16)
    moe, x = moe.cuda(), x.cuda()
    tokens = x.flatten(0, 1)
    with torch.no_grad():
        weight, chosen = torch.softmax(moe.router(tokens).float(), -1).topk(2, dim=-1)
    weight = weight.to(tokens.dtype)
    grad = torch.randn(tokens.shape, device="cuda", dtype=tokens.dtype)
    tokens.requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = fast_paths.grouped_experts(tokens, chosen, weight, moe.w_in, moe.w_out, moe.act)
        y.backward(grad)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert data_dependent_values(moe, x) == []
    torch._dynamo.reset()
    eager = moe_outputs_and_grads(moe, x, "grouped")
    moe.forward = torch.compile(moe.forward, fullgraph=True)
    compiled = moe_outputs_and_grads(moe, x, "grouped")
    for name in eager:
        assert relative_error(compiled[name], eager[name]) < 2e-2, name
