"""model.py on its own: SPLADE pooling (fused vs plain formula), MLM-head rescaling, tokenizers,
the causal switch, and the real tiny checkpoints of ../shared/data."""
import json
import struct

import pytest
import torch

import model as M
from hf.models import from_pretrained, load_tokenizer, save_pretrained
from data.tokenizer import encode_texts


def tiny_encoder(family="modernbert", **over):
    torch.manual_seed(0)
    base = dict(family=family, vocab_size=300, d_model=32, n_layers=2, n_heads=4, d_ff=48, pad_id=0)
    return M.Transformer(M.ModelConfig(**{**M.FAMILY_TRAITS[family], **base, **over})).eval()


def batch(B=4, T=19, V=300):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, V, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[1, 11:] = 0
    mask[3, 4:] = 0
    return ids, mask


# ---------------------------------------------------------------- SPLADE pooling


@pytest.mark.parametrize("chunk", [1, 4, 7, 19, 64])
def test_fused_splade_pool_equals_plain_formula(chunk):
    m = tiny_encoder()
    with torch.no_grad():  # make some logits positive so that the max is not trivially 0
        m.head.decoder.bias.normal_(0, 1)
    ids, mask = batch()
    fused = M.fast_paths.fused_splade_pool(m, ids, mask, chunk_size=chunk)
    plain = M.splade_pool(m, ids, mask)
    assert (plain > 0).float().mean() > 0.1, "test needs active dimensions"
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 5, None])  # None: the automatic chunk (here the whole text)
def test_fused_splade_pool_gradients_equal_plain_formula(chunk):
    ids, mask = batch()
    grads = []
    for fused in (True, False):
        m = tiny_encoder()
        with torch.no_grad():
            m.head.decoder.bias.normal_(0, 1)
        w = M.fast_paths.fused_splade_pool(m, ids, mask, chunk_size=chunk) if fused else M.splade_pool(m, ids, mask)
        # a loss that weights every dimension differently (like a dot product with another vector)
        (w * torch.linspace(-1, 2, w.shape[1])).sum().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


# the plain formula of each pooling, written here from the papers: a_tj = log(1 + relu(z_tj)) on the
# real tokens, then max (SPLADE v2) or sum (SPLADE v1) over t
PLAIN_POOLING = {"max": lambda a, mask: torch.where(mask[..., None].bool(), a, 0).amax(1),
                 "sum": lambda a, mask: (a * mask[..., None]).sum(1)}


@pytest.mark.parametrize("pooling", sorted(M.SPLADE_POOLINGS))
def test_every_pooling_is_its_plain_formula_and_so_is_the_fused_one_where_it_covers_it(pooling, capsys):
    """The pooling table: model.splade_pool of each entry equals the formula written here, and so
    does fast_paths.fused_splade_pool, values and gradients, for the entries it covers; for any
    other, `covers` says once that the plain formula runs."""
    assert set(PLAIN_POOLING) == set(M.SPLADE_POOLINGS), "a new pooling: its plain formula here too"
    ids, mask = batch()
    M.fast_paths._SAID.clear()   # as in a new process
    covered = [M.fast_paths.covers(M.fast_paths.fused_splade_pool, pooling) for _ in range(2)][0]
    assert covered == (pooling in M.fast_paths.fused_splade_pool.covers)
    out = []
    for pool in (M.splade_pool, M.fast_paths.fused_splade_pool)[:1 + covered]:
        m = tiny_encoder()
        m.splade.pooling = pooling
        with torch.no_grad():
            m.head.decoder.bias.normal_(0, 1)
        w = pool(m, ids, mask)
        (w * torch.linspace(-1, 2, w.shape[1])).sum().backward()
        out.append((w.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}))
    with torch.no_grad():
        a = torch.log1p(torch.relu(m(ids, attention_mask=mask).float()))
    for w, grads in out:
        torch.testing.assert_close(w, PLAIN_POOLING[pooling](a, mask), rtol=1e-5, atol=1e-5)
        for name, g in out[0][1].items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    said = capsys.readouterr().err.count(f"covers max; {pooling} runs model.py's plain formula")
    assert said == (0 if covered else 1), "one line, once"


def test_fused_splade_pool_under_bf16_autocast_is_close_and_finite():
    m = tiny_encoder()
    ids, mask = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w = M.fast_paths.fused_splade_pool(m, ids, mask, chunk_size=4)
        w.sum().backward()
    assert w.dtype == torch.float32 and torch.isfinite(w).all()
    ref = M.splade_pool(m, ids, mask)
    assert (w - ref).abs().max() < 0.05


def test_padding_never_activates_terms():
    m = tiny_encoder()
    ids, mask = batch()
    ids2 = ids.clone()
    ids2[mask == 0] = 7  # different tokens at padding positions must not change anything
    for pool in (M.splade_pool, M.fast_paths.fused_splade_pool):
        torch.testing.assert_close(pool(m, ids2, mask), pool(m, ids, mask))


# ---------------------------------------------------------------- MLM head rescaling


def test_rescale_untied_head_scales_logits_exactly():
    m = tiny_encoder("eurobert", decoder_bias=True, tie_embeddings=False)
    with torch.no_grad():
        m.head.decoder.bias.normal_()
    ids, mask = batch()
    with torch.no_grad():
        before = m(ids, attention_mask=mask)
        emb = m.embed.tok.weight.clone()
        bias = m.head.decoder.bias.clone()
        M.rescale_mlm_head(m, 16)
        after = m(ids, attention_mask=mask)
    torch.testing.assert_close(after - bias, (before - bias) / 16, rtol=1e-5, atol=1e-6)
    assert torch.equal(m.embed.tok.weight, emb), "an untied head must not touch the input embeddings"
    with torch.no_grad():
        M.rescale_mlm_head(m, 0.5, bias=True)  # bias too: every logit doubles
        torch.testing.assert_close(m(ids, attention_mask=mask), 2 * after, rtol=1e-5, atol=1e-5)


def test_rescale_tied_head_keeps_the_tie(tmp_path):
    m = tiny_encoder("modernbert")
    w0 = M.mlm_head_weight(m).detach().clone()
    M.rescale_mlm_head(m, 16)
    assert m.head.decoder.weight is m.embed.tok.weight
    torch.testing.assert_close(M.mlm_head_weight(m), w0 / 16)
    n = M.head_norms(m)
    assert n["tied"] and abs(n["frobenius"] - w0.norm().item() / 16) < 1e-4
    # the tie (and the rescaled matrix) survive a save/load round trip
    back = from_pretrained(save_pretrained(m, tmp_path))
    assert back.head.decoder.weight is back.embed.tok.weight
    torch.testing.assert_close(M.mlm_head_weight(back), w0 / 16)


@pytest.mark.parametrize("k", [0, -2, float("nan"), float("inf")])
def test_rescale_rejects_bad_k(k):
    with pytest.raises(ValueError, match="k="):
        M.rescale_mlm_head(tiny_encoder(), k)


# ---------------------------------------------------------------- attention modes


def test_causal_switch_changes_only_what_it_should():
    m = tiny_encoder("eurobert", pad_id=None)
    ids, _ = batch()
    with torch.no_grad():
        bi = m(ids)
        ca = m(ids, causal=True)
        ca_prefix = m(ids[:, :5], causal=True)
    assert (bi - ca).abs().max() > 1e-3
    # causal: a position never sees the future, so a prefix gives the same logits
    torch.testing.assert_close(ca[:, :5], ca_prefix, rtol=1e-5, atol=1e-5)


def test_mask_with_all_padding_row_stays_finite():
    m = tiny_encoder(window=2, local_layers=(1,))
    ids, mask = batch()
    mask[2] = 0
    assert torch.isfinite(m(ids, attention_mask=mask)).all()


def test_moe_balance_loss_is_the_switch_formula_per_layer():
    """aux = sum over layers of n * sum_e f_e P_e (Switch Transformer eq. 4, top-k slots): f_e the
    share of the N*k routed slots that expert e received, P_e its mean router probability;
    counted by hand here from the captured router logits."""
    m = tiny_encoder("llama", n_experts=4, expert_top_k=2, pad_id=None)
    logits = []
    for block in m.layers:
        block.mlp.router.register_forward_hook(lambda mod, inp, out: logits.append(out.detach()))
    ids, _ = batch()
    with torch.no_grad():
        h, _, aux = m.body(ids)
    want = 0.0
    for z in logits:
        probs = torch.softmax(z, dim=-1).tolist()
        counts = [0] * 4
        for p in probs:
            for e in sorted(range(4), key=lambda e: -p[e])[:2]:
                counts[e] += 1
        want += 4 * sum(counts[e] / (2 * len(probs)) * sum(p[e] for p in probs) / len(probs) for e in range(4))
    assert torch.isfinite(h).all()
    assert abs(aux.item() - want) < 1e-5


# ---------------------------------------------------------------- tokenizers


def test_load_tokenizer_finds_special_tokens(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", "<mask>", "hello", "world"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"mask_token": {"content": "<mask>"}}))
    t = load_tokenizer(tmp_path)
    assert (t.special.pad, t.special.cls, t.special.sep, t.special.mask, t.special.unk) == (0, 1, 2, 4, 3)
    ids, mask = encode_texts(t, ["hello world", "hello world hello world hello"], max_len=5)
    assert ids.tolist()[0][:4] == [1, 5, 6, 2] and mask[0].sum() == 4
    assert ids[1, -1] == 2, "truncation must keep the closing special token"


# ---------------------------------------------------------------- real checkpoints (../shared/data)


def test_real_splade_tiny_activates_the_query_terms(shared_data):
    path = shared_data / "models" / "splade-tiny"
    m, tok = from_pretrained(path), load_tokenizer(path)
    ids, mask = encode_texts(tok, ["heat transfer in supersonic flow"], 64)
    with torch.no_grad():
        w = M.splade_pool(m, ids, mask)[0]
    terms = {tok.id_to_token(int(i)) for i in w.topk(5).indices}
    assert {"heat", "transfer", "flow"} <= terms
    assert 5 <= int((w > 0).sum()) <= 30


def test_real_splade_tiny_matches_transformers(shared_data):
    tf = pytest.importorskip("transformers")
    path = shared_data / "models" / "splade-tiny"
    ref = tf.AutoModelForMaskedLM.from_pretrained(path).eval()
    m, tok = from_pretrained(path), load_tokenizer(path)
    ids, mask = encode_texts(tok, ["heat transfer in supersonic flow", "boundary layer"], 64)
    with torch.no_grad():
        diff = ((ref(input_ids=ids, attention_mask=mask).logits - m(ids, attention_mask=mask)).abs() * mask[..., None]).max()
    assert diff < 1e-4


def test_real_stories260k_greedy_story(shared_data):
    """The real tiny LLaMA, decoded greedily from BOS, tells its known story."""
    folder = shared_data / "models" / "stories260K"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent (experiments/fetch_data.py does not fetch it)")
    m = from_pretrained(folder)
    data = (folder / "tok512.bin").read_bytes()  # llama2.c tokenizer: max_len, then (score, len, bytes)*
    pieces, off = [], 4
    while off < len(data):
        _, n = struct.unpack_from("<fi", data, off)
        pieces.append(data[off + 8: off + 8 + n].decode("utf-8", "replace"))
        off += 8 + n
    ids = [1]
    with torch.no_grad():
        for _ in range(24):
            ids.append(int(m(torch.tensor([ids]))[0, -1].argmax()))
    text = "".join(pieces[i] for i in ids[1:]).strip()
    assert text.startswith("Once upon a time, there was a little girl named Lily."), text


def test_flops_per_token_matches_a_hand_count_at_the_llama_350m_shape():
    """LLaMA-350M (24 layers, d 1024, 16 heads, SwiGLU 2736, vocabulary 50 304), T = 2048, counted
    by hand: per layer q,k,v 3 x 1024 x 1024 = 3 145 728, output 1 048 576, MLP 3 x 1024 x 2736 =
    8 404 992 -> 12 599 296 x 24 = 302 383 104, head 1024 x 50 304 = 51 511 296; 6 N = 2 123 366 400;
    attention 12 x 24 x 16 x 64 x 2048 = 603 979 776."""
    from model import ModelConfig
    from throughput import flop_terms, flops_per_token
    cfg = ModelConfig(family="llama", vocab_size=50304, d_model=1024, n_layers=24, n_heads=16, d_ff=2736)
    terms = flop_terms(cfg, 2048)
    assert terms["qkv_projection"] == 6 * 24 * 3_145_728 and terms["attention_output"] == 6 * 24 * 1_048_576
    assert terms["mlp"] == 6 * 24 * 8_404_992 and terms["vocabulary_projection"] == 6 * 51_511_296
    assert terms["attention_scores"] == 603_979_776 and terms["router"] == terms["head_transform"] == 0
    assert flops_per_token(cfg, 2048) == 2_123_366_400 + 603_979_776
    # MLM computing logits for 30 % of the tokens only: the vocabulary term shrinks, nothing else
    assert flops_per_token(cfg, 2048, head_fraction=0.3) == 2_727_346_176 - 0.7 * 6 * 51_511_296
    # a Mixtral-style layer runs top-2 of 8 experts per token, plus the router
    moe = ModelConfig(family="mixtral", vocab_size=50304, d_model=1024, n_layers=24, n_heads=16, d_ff=2736,
                      n_experts=8, expert_top_k=2)
    assert flop_terms(moe, 2048)["mlp"] == 2 * terms["mlp"] and flop_terms(moe, 2048)["router"] == 6 * 24 * 1024 * 8
