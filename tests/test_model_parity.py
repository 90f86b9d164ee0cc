"""model.py against transformers (the numerical reference): tiny random-weight models of every
family are built and saved by transformers, loaded by our from_pretrained, and compared in fp32 at
non-padding positions; our save_pretrained output is loaded back by transformers."""
import json

import pytest
import torch

import fast_paths
import model as M
from hf.models import from_pretrained, save_pretrained
from hf import models as hf_models
from hf.safetensors_io import load_safetensors, save_safetensors

tf = pytest.importorskip("transformers")
V = 101


def tiny_hf(family, **over):
    """A tiny transformers model of `family` with random weights."""
    torch.manual_seed(0)
    small = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if family == "bert":
        m = tf.BertForMaskedLM(tf.BertConfig(**small, **over))
    elif family == "roberta":
        m = tf.RobertaForMaskedLM(tf.RobertaConfig(**small, **over))
    elif family == "xlm-roberta":
        m = tf.XLMRobertaForMaskedLM(tf.XLMRobertaConfig(**small, **over))
    elif family == "distilbert":
        m = tf.DistilBertForMaskedLM(tf.DistilBertConfig(vocab_size=V, dim=32, n_layers=2, n_heads=4,
                                                         hidden_dim=64, **over))
    elif family == "albert":
        # 4 layer positions served by 2 groups of 2 inner layers: exercises the sharing rule
        m = tf.AlbertForMaskedLM(tf.AlbertConfig(**{**small, "num_hidden_layers": 4}, embedding_size=16,
                                                 num_hidden_groups=2, inner_group_num=2, **over))
    elif family == "gte":
        m = tf.GteForMaskedLM(tf.GteConfig(**small, type_vocab_size=0, pad_token_id=0, **over))
    elif family == "modernbert":
        # a window of +-4 tokens and sequences of 30: the sliding window really cuts attention
        m = tf.ModernBertForMaskedLM(tf.ModernBertConfig(**{**small, "num_hidden_layers": 4, "intermediate_size": 48},
                                                         local_attention=8, pad_token_id=0, bos_token_id=1,
                                                         eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                                         global_rope_theta=1000.0, local_rope_theta=100.0, **over))
    elif family == "eurobert":
        m = tf.EuroBertForMaskedLM(tf.EuroBertConfig(**small, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
                                                     eos_token_id=2, mask_token_id=3, **over))
    elif family == "llama":
        m = tf.LlamaForCausalLM(tf.LlamaConfig(**{**small, "num_key_value_heads": 2, "pad_token_id": 0, **over}))
    elif family == "mixtral":
        m = tf.MixtralForCausalLM(tf.MixtralConfig(**{**small, "num_key_value_heads": 2, "num_local_experts": 4,
                                                      "num_experts_per_tok": 2, "pad_token_id": 0, **over}))
    else:
        raise ValueError(family)
    # Larger weights than the 0.02 init (logits of order 1, so that a wrong mask or rotation shows)
    # and random LayerNorm/bias values (so that a swapped weight/bias pair cannot go unnoticed).
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.normal_(0, 0.15)
    return m.eval()


def padded_batch(pad_id, T=30, B=3):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 17:] = 0
    mask[2, 6:] = 0
    ids[mask == 0] = pad_id
    return ids, mask


def max_diff(ref, ours, mask):
    return ((ref - ours).abs() * mask[..., None]).max().item()


FAMILIES = sorted(M.FAMILY_TRAITS)   # tiny_hf builds each (a new family: its entry there)
PAD = {"roberta": 1}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family, tmp_path):
    hf = tiny_hf(family)
    hf.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert ours.config.family == family
    ids, mask = padded_batch(PAD.get(family, 0))
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        out = ours(ids, attention_mask=mask)
    assert out.shape == ref.shape
    assert max_diff(ref, out, mask) < 1e-4, f"{family}: logits differ from transformers"


def test_modernbert_window_really_restricts_attention(tmp_path):
    """Guards the parity test above: with the window disabled the logits must change."""
    tiny_hf("modernbert").save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    ids, mask = padded_batch(0)
    with torch.no_grad():
        windowed = ours(ids, attention_mask=mask)
        ours.config.window = None
        full = ours(ids, attention_mask=mask)
    assert max_diff(windowed, full, mask) > 1e-2


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_round_trip_through_transformers(family, tmp_path):
    tiny_hf(family).save_pretrained(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    save_pretrained(ours, tmp_path / "ours")
    auto = tf.AutoModelForCausalLM if hf_models.HF_FAMILIES[family].causal else tf.AutoModelForMaskedLM
    back = auto.from_pretrained(tmp_path / "ours").eval()
    ids, mask = padded_batch(PAD.get(family, 0))
    with torch.no_grad():
        assert max_diff(back(input_ids=ids, attention_mask=mask).logits, ours(ids, attention_mask=mask), mask) < 1e-4
    # and our own loader reads what we wrote
    again = from_pretrained(tmp_path / "ours")
    assert again.config == ours.config


def test_xlm_roberta_keeps_its_model_type_on_export(tmp_path):
    """XLM-R is read as the RoBERTa family, and saved back as XLM-R (model_type and class)."""
    tiny_hf("xlm-roberta").save_pretrained(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    assert (ours.config.family, ours.config.model_type) == ("roberta", "xlm-roberta"), "the block built, the name"
    assert "model_type  xlm-roberta (a variant of the roberta family" in hf_models.describe(ours)
    save_pretrained(ours, tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == ("xlm-roberta", ["XLMRobertaForMaskedLM"])
    back = tf.AutoModelForMaskedLM.from_pretrained(tmp_path / "ours").eval()
    assert type(back) is tf.XLMRobertaForMaskedLM
    ids, mask = padded_batch(PAD["roberta"])
    with torch.no_grad():
        assert max_diff(back(input_ids=ids, attention_mask=mask).logits, ours(ids, attention_mask=mask), mask) < 1e-4
    assert from_pretrained(tmp_path / "ours").config == ours.config


def _rewrite(folder, rename=None, add=None, config=None):
    """Edit a saved HF folder in place: rename tensors, add tensors, patch config.json."""
    sd = dict(load_safetensors(folder / "model.safetensors"))
    for old, new in (rename or {}).items():
        for k in [k for k in sd if old in k]:
            sd[k.replace(old, new)] = sd.pop(k)
    sd.update(add or {})
    save_safetensors({k: v.clone() for k, v in sd.items()}, folder / "model.safetensors")
    if config:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(config)
        for k in [k for k, v in config.items() if v is None]:
            cfg.pop(k)
        (folder / "config.json").write_text(json.dumps(cfg))


def _same_logits(hf, folder, pad_id=0):
    ours = from_pretrained(folder)
    ids, mask = padded_batch(pad_id)
    with torch.no_grad():
        return max_diff(hf(input_ids=ids, attention_mask=mask).logits, ours(ids, attention_mask=mask), mask), ours


def test_legacy_gamma_beta_names(tmp_path):
    hf = tiny_hf("bert")
    hf.save_pretrained(tmp_path)
    _rewrite(tmp_path, rename={"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"})
    assert any(k.endswith("gamma") for k in load_safetensors(tmp_path / "model.safetensors"))
    assert _same_logits(hf, tmp_path)[0] < 1e-4


def test_tied_decoder_stored_in_file_equal_keeps_tie(tmp_path):
    hf = tiny_hf("bert")
    hf.save_pretrained(tmp_path)
    emb = hf.bert.embeddings.word_embeddings.weight.detach()
    _rewrite(tmp_path, add={"cls.predictions.decoder.weight": emb.clone(),
                            "cls.predictions.decoder.bias": hf.cls.predictions.bias.detach().clone()})
    diff, ours = _same_logits(hf, tmp_path)
    assert diff < 1e-4
    assert ours.head.decoder.weight is ours.embed.tok.weight


def test_tied_decoder_stored_different_is_untied(tmp_path):
    """transformers v5: a decoder matrix present and different from the embeddings is not tied."""
    hf = tiny_hf("modernbert")
    hf.save_pretrained(tmp_path)
    other = torch.randn_like(hf.decoder.weight)
    _rewrite(tmp_path, add={"decoder.weight": other})
    ref = tf.ModernBertForMaskedLM.from_pretrained(tmp_path).eval()
    assert not torch.equal(ref.decoder.weight, ref.model.embeddings.tok_embeddings.weight)
    diff, ours = _same_logits(ref, tmp_path)
    assert diff < 1e-4
    assert ours.head.decoder.weight is not ours.embed.tok.weight and not ours.config.tie_embeddings


def test_modernbert_old_config_keys(tmp_path):
    """Hub configs of ModernBERT use global_attn_every_n_layers / global_rope_theta / local_rope_theta."""
    hf = tiny_hf("modernbert")
    hf.save_pretrained(tmp_path)
    _rewrite(tmp_path, config={"layer_types": None, "rope_parameters": None, "global_attn_every_n_layers": 3,
                               "global_rope_theta": 1000.0, "local_rope_theta": 100.0})
    diff, ours = _same_logits(hf, tmp_path)
    assert ours.config.local_layers == (1, 2) and ours.config.rope_theta_local == 100.0
    assert diff < 1e-4


def test_gte_original_new_layout_with_ntk_rope(tmp_path):
    """Alibaba's remote-code layout: prefix `new.`, model_type "new", rope_scaling {"type": "ntk"}.
    Static NTK(theta, f) equals transformers' linear rope with theta*f and factor f^(2/d)."""
    theta, f, d = 5000.0, 2.0, 8
    hf = tiny_hf("gte", rope_parameters={"rope_type": "linear", "rope_theta": theta * f, "factor": f ** (2 / d)})
    hf.save_pretrained(tmp_path)
    _rewrite(tmp_path, rename={"gte.": "new."},
             config={"model_type": "new", "rope_parameters": None, "rope_theta": theta,
                     "rope_scaling": {"type": "ntk", "factor": f}, "layer_norm_type": "layer_norm"})
    assert all(k.startswith(("new.", "lm_head")) for k in load_safetensors(tmp_path / "model.safetensors"))
    diff, ours = _same_logits(hf, tmp_path)
    assert ours.config.rope_scaling == {"type": "ntk", "factor": f}
    assert diff < 1e-4


def test_bare_encoder_without_head_is_a_clear_error(tmp_path):
    torch.manual_seed(0)
    tf.BertModel(tf.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=64)).save_pretrained(tmp_path)
    with pytest.raises(KeyError, match="no masked-LM/LM head"):
        from_pretrained(tmp_path)


def test_llama3_rope_scaling(tmp_path):
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    hf = tiny_hf("llama", rope_parameters=rope, head_dim=16, num_attention_heads=2, num_key_value_heads=1)
    hf.save_pretrained(tmp_path)
    diff, ours = _same_logits(hf, tmp_path)
    assert ours.config.rope_scaling["type"] == "llama3"
    assert diff < 1e-4
    plain = M.rope_frequencies(M.ModelConfig(head_dim=16, n_heads=2), 10000.0, "cpu")
    assert not torch.allclose(M.rope_frequencies(ours.config, 10000.0, "cpu"), plain)


def test_sharded_safetensors_checkpoint(tmp_path):
    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert _same_logits(hf, tmp_path)[0] < 1e-4


def test_pytorch_bin_fallback(tmp_path):
    hf = tiny_hf("bert")
    hf.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    assert _same_logits(hf, tmp_path)[0] < 1e-4


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("path", ["per-expert loop", "grouped, slice loop", "grouped, torch._grouped_mm"])
def test_mixtral_experts_match_transformers_on_every_path(path, top_k, tmp_path, monkeypatch):
    """MixtralForCausalLM's logits from each way our MoE layer can run its experts: model.py's
    per-expert loop, and fast_paths.grouped_experts (the default) with its loop over contiguous slices
    or with torch._grouped_mm (its CPU kernel here; the GPU's is tested in test_fast_paths.py)."""
    hf = tiny_hf("mixtral", num_experts_per_tok=top_k)
    hf.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    assert all(block.mlp.grouped for block in ours.layers), "the grouped experts are the default"
    for block in ours.layers:
        block.mlp.grouped = path != "per-expert loop"
    if path == "grouped, torch._grouped_mm":
        real = fast_paths.grouped_experts
        monkeypatch.setattr(fast_paths, "grouped_experts", lambda *a: real(*a, use_grouped_mm=True))
    ids, mask = padded_batch(0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        out = ours(ids, attention_mask=mask)
    assert max_diff(ref, out, mask) < 1e-4


def router_logits_of(model):
    """Our MoE router logits per layer (N, n_experts), captured by forward hooks."""
    logits = []
    for block in model.layers:
        block.mlp.router.register_forward_hook(lambda mod, inp, out: logits.append(out.detach()))
    return logits


@pytest.mark.parametrize("layers", [1, 2])
def test_moe_balance_loss_matches_transformers_mixtral(layers, tmp_path):
    """Our MoE load-balancing loss against transformers' Mixtral aux loss (load_balancing_loss_func,
    what MixtralForCausalLM returns with output_router_logits=True), on the same router logits.

    Two documented differences, both exact: transformers counts the k routed slots of a token
    (its f_e sum to k, ours to 1), so per layer its loss is k times ours; and it pools counts and
    probabilities over all layers before multiplying, where ours (Switch Transformer, eq. 4, one
    loss per MoE layer) sums the per-layer losses. With one layer the two are k times apart; with
    more, ours equals the sum of transformers' loss applied to each layer alone, divided by k."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    hf = tiny_hf("mixtral", num_hidden_layers=layers)
    hf.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    k, n = hf.config.num_experts_per_tok, hf.config.num_local_experts
    ids = padded_batch(0)[0]
    with torch.no_grad():
        ref = hf(input_ids=ids, output_router_logits=True)
        logits = router_logits_of(ours)
        _, _, aux = ours.body(ids)
    assert len(ref.router_logits) == len(logits) == layers
    for a, b in zip(logits, ref.router_logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)   # same routing inputs
    per_layer = sum(load_balancing_loss_func((r,), n, k) for r in ref.router_logits) / k
    torch.testing.assert_close(aux, per_layer, rtol=1e-6, atol=1e-6)
    if layers == 1:
        torch.testing.assert_close(aux * k, ref.aux_loss, rtol=1e-6, atol=1e-6)
    else:  # pooled over layers, transformers' loss is another function of the same logits
        assert abs(aux.item() * k - ref.aux_loss.item()) > 1e-4
