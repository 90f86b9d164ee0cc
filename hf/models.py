"""Hugging Face checkpoints <-> model.py: one table of the families, read in both directions.

HF_FAMILIES has one entry per config.json model_type, each checked against transformers (logits to 1e-4) in
tests/test_model_parity.py.

    python -m hf.models --export SPEC OUT [--k K] [--max-len N]   # any loadable model as a transformers folder
                                                    # that is also a sentence-transformers SparseEncoder
"""
import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from cli import MissingInput, UserError, where
from data.atomic import ExclusiveLock, disk_full, disk_full_error, write_text
from data import manifest
from data.tokenizer import open_tokenizer
from hf.safetensors_io import (SafetensorsError, load_checkpoint_dir, read_header, read_weight_map, save_safetensors,
                              weight_files)
from model import (FAMILY_TRAITS, K_TARGET, SPLADE_POOLINGS, ModelConfig, SpladeSettings, Transformer, auto_k,
                   head_norms, rescale_mlm_head)


class UnsupportedModel(UserError, ValueError):
    """A config.json that names no family this project reads (the message lists those it does)."""


class ModelFileError(UserError, ValueError):
    """A JSON file of a model folder that cannot be read: truncated, not an object, lacking a key."""


def read_json(path, what="JSON file"):
    """The JSON object in `path`, or a ModelFileError that names the file and the fix."""
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}: not valid JSON ({e}); the file is truncated or corrupt: download it "
                             "again (a checkpoint's: resume from an older one)") from None
    if not isinstance(value, dict):
        raise ModelFileError(f"{path}: holds a JSON {type(value).__name__}, not the object a {what} is: replace it")
    return value


# ---------------- config.json <-> ModelConfig
# A family's table maps its config.json keys to our ModelConfig fields, read on loading and written
# back on saving: "field" where every config.json of the family has the key, ("field", default)
# where it may lack it. A tuple of fields takes one value (saved from the first). Keys of the field
# "dropout" are only written: a checkpoint's dropout is never the one a run trains with.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "silu": "silu", "swish": "silu", "relu": "relu"}
OUR_TO_HF_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu", "relu": "relu"}
ACT_FIELDS = ("act", "head_act")

SIZES = {"vocab_size": "vocab_size", "hidden_size": "d_model", "num_hidden_layers": "n_layers",
         "num_attention_heads": "n_heads", "intermediate_size": "d_ff"}
BERT_KEYS = {**SIZES, "max_position_embeddings": ("max_seq_len", 512), "type_vocab_size": ("type_vocab_size", 2),
             "layer_norm_eps": ("norm_eps", 1e-12), "hidden_act": (("act", "head_act"), "gelu"),
             "tie_word_embeddings": ("tie_embeddings", True),
             "hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "dropout"}
DISTILBERT_KEYS = {"vocab_size": "vocab_size", "dim": "d_model", "n_layers": "n_layers", "n_heads": "n_heads",
                   "hidden_dim": "d_ff", "max_position_embeddings": "max_seq_len",
                   "activation": (("act", "head_act"), "gelu"), "tie_word_embeddings": ("tie_embeddings", True),
                   "dropout": "dropout", "attention_dropout": "dropout"}
MODERNBERT_KEYS = {**SIZES, "max_position_embeddings": ("max_seq_len", 8192), "norm_eps": ("norm_eps", 1e-5),
                   "norm_bias": ("norm_bias", False), "attention_bias": ("attn_bias", False),
                   "mlp_bias": (("mlp_in_bias", "mlp_out_bias"), False), "hidden_activation": ("act", "gelu"),
                   "classifier_activation": ("head_act", "gelu"), "classifier_bias": ("head_dense_bias", False),
                   "decoder_bias": ("decoder_bias", True), "tie_word_embeddings": ("tie_embeddings", True),
                   "attention_dropout": "dropout", "embedding_dropout": "dropout", "mlp_dropout": "dropout"}
LLAMA_KEYS = {**SIZES, "num_key_value_heads": ("n_kv_heads", None), "head_dim": ("head_dim", None),
              "max_position_embeddings": ("max_seq_len", 2048), "rms_norm_eps": ("norm_eps", 1e-6),
              "hidden_act": ("act", "silu"), "attention_bias": ("attn_bias", False),
              "mlp_bias": (("mlp_in_bias", "mlp_out_bias"), False), "tie_word_embeddings": ("tie_embeddings", False)}


REQUIRED = object()


def _fields(spec):
    """A config-key table entry as (our fields, default); REQUIRED where config.json must have it."""
    fields, default = (spec, REQUIRED) if isinstance(spec, str) else spec
    return ((fields,) if isinstance(fields, str) else fields), default


def config_from_hf(hf: dict, where="config.json") -> ModelConfig:
    """Our ModelConfig from a config.json (old and v5 key styles), `hf` kept as its hf_config for saving."""
    t, eos = hf.get("model_type"), hf.get("eos_token_id")
    if t not in HF_FAMILIES:
        what = "has no model_type" if t is None else f"has model_type {t!r}, which this project does not read"
        raise UnsupportedModel(f"{where} {what}; give a checkpoint of one of {', '.join(sorted(HF_FAMILIES))} "
                               f"({supported_names()}), or add its entry to HF_FAMILIES (hf/models.py)")
    entry = HF_FAMILIES[t]
    fam = entry.family
    c = dict(FAMILY_TRAITS[fam], family=fam, variant=t if (entry.saved_as or t) != fam else None,
             eos_id=eos[0] if isinstance(eos, list) else eos,
             **{f"{role}_id": hf.get(f"{role}_token_id") for role in ("pad", "bos", "cls", "sep", "mask")})
    try:
        for key, spec in entry.keys.items():
            fields, default = _fields(spec)
            if fields[0] != "dropout":
                value = hf[key] if default is REQUIRED else hf.get(key, default)
                if fields[0] in ACT_FIELDS and value not in HF_ACTIVATIONS:
                    raise UnsupportedModel(f"activation {value!r} is not supported (known: {sorted(HF_ACTIVATIONS)})")
                c.update(dict.fromkeys(fields, HF_ACTIVATIONS[value] if fields[0] in ACT_FIELDS else value))
        if entry.read:
            entry.read(hf, c, entry)
    except KeyError as e:
        raise ModelFileError(f"{where}: no {e} key, which a {entry.name} config.json has; the file is incomplete "
                             "or was edited: download it again") from None
    except UnsupportedModel as e:
        raise UnsupportedModel(f"{where}: {e}") from None
    return ModelConfig(**c, hf_config=dict(hf))


def config_to_hf(cfg: ModelConfig) -> dict:
    """Our values as current transformers' config.json (hf_config_to_save adds the source's other settings);
    cls, sep and mask ids where the model has them (so that MLM training of any family resumes with its mask id)."""
    entry = HF_FAMILIES[cfg.model_type]
    out = dict(model_type=cfg.model_type, architectures=[entry.hf_class],
               pad_token_id=cfg.pad_id, bos_token_id=cfg.bos_id, eos_token_id=cfg.eos_id)
    out.update({f"{role}_token_id": getattr(cfg, f"{role}_id") for role in ("cls", "sep", "mask")
                if getattr(cfg, f"{role}_id") is not None})
    for key, spec in entry.keys.items():
        field = _fields(spec)[0][0]
        out[key] = OUR_TO_HF_ACT[getattr(cfg, field)] if field in ACT_FIELDS else getattr(cfg, field)
    if entry.write:
        entry.write(cfg, out)
    return out


def _read_rope(hf, c, entry):
    """rope_theta and rope_scaling from the v5 rope_parameters or the older rope_theta + rope_scaling."""
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "linear", "ntk", "llama3"):  # model.rope_frequencies' rules
            raise UnsupportedModel(f"rope type {kind!r} is not supported (supported: default, linear, ntk, llama3)")
        scaling = None if kind == "default" else {**scaling, "type": kind}
    theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", entry.rope_theta))
    c.update(rope_theta=float(theta), rope_scaling=scaling)


def _write_rope(cfg, out):
    scaling, theta = dict(cfg.rope_scaling or {}), cfg.rope_theta
    if scaling.get("type") == "ntk":  # GTE's
        if "mixed_b" in scaling:
            raise UnsupportedModel("GTE mixed NTK scaling has no native transformers form to save")
        # static NTK == linear scaling of base theta*f by f^(2/d) (checked numerically against transformers' GTE)
        f = scaling["factor"]
        theta, scaling = theta * f, {"type": "linear", "factor": f ** (2 / cfg.head_dim)}
    kind = scaling.pop("type", "default")
    out["rope_parameters"] = {**scaling, "rope_type": kind, "rope_theta": theta}


def _read_gte(hf, c, entry):
    """GTE's original `new` config (rope_theta + rope_scaling {"type": "ntk"}) or the v5 `gte` one."""
    if hf.get("logn_attention_scale"):
        raise UnsupportedModel("GTE checkpoints with logn_attention_scale=true are not supported")
    c["norm"] = "rmsnorm" if hf.get("layer_norm_type") == "rms_norm" else "layernorm"
    _read_rope(hf, c, entry)


def _read_modernbert(hf, c, entry):
    """The sliding-window layers and the two RoPE thetas, in the v5 keys or the older ones."""
    if hf.get("layer_types"):
        local = [i for i, t in enumerate(hf["layer_types"]) if t == "sliding_attention"]
    else:
        local = [i for i in range(c["n_layers"]) if i % hf.get("global_attn_every_n_layers", 3)]
    rope = hf.get("rope_parameters") or {}
    full, sliding = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    c.update(local_layers=local, window=hf.get("local_attention", 128) // 2,
             rope_theta=float(full.get("rope_theta", hf.get("global_rope_theta", 160000.0))),
             rope_theta_local=float(sliding.get("rope_theta", hf.get("local_rope_theta", 10000.0))))


def _write_modernbert(cfg, out):
    out.update(local_attention=2 * (cfg.window or 64), cls_token_id=cfg.cls_id, sep_token_id=cfg.sep_id,
               layer_types=["sliding_attention" if i in cfg.local_layers else "full_attention"
                            for i in range(cfg.n_layers)],
               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                                "sliding_attention": {"rope_type": "default",
                                                      "rope_theta": cfg.rope_theta_local or cfg.rope_theta}})


# Keys of a source config.json that saving drops: what describes the file rather than the model,
# and the older forms of what we write in the v5 form (rope_parameters, layer_types); a stale
# rope_scaling beside our rope_parameters could be read instead of it.
SUPERSEDED_KEYS = {"architectures", "model_type", "auto_map", "transformers_version", "_name_or_path", "dtype",
                   "torch_dtype", "rope_theta", "rope_scaling", "global_rope_theta", "local_rope_theta",
                   "global_attn_every_n_layers"}


def hf_config_to_save(cfg: ModelConfig) -> dict:
    """config.json to write: the source's settings (cfg.hf_config), ours over them, except its dropout values
    (kept for those who fine-tune it elsewhere) and an eos_token_id list that starts with our eos id."""
    ours = config_to_hf(cfg)
    source = {k: v for k, v in (cfg.hf_config or {}).items() if k not in SUPERSEDED_KEYS}
    dropout = {k for k, spec in HF_FAMILIES[cfg.model_type].keys.items() if _fields(spec)[0][0] == "dropout"}
    keep = dropout & source.keys()
    eos = source.get("eos_token_id")
    if isinstance(eos, list) and eos[:1] == [cfg.eos_id]:
        keep.add("eos_token_id")
    return {"model_type": ours["model_type"], "architectures": ours["architectures"], **source,
            **{k: v for k, v in ours.items() if k not in keep}}


# ---------------- Tensor names: one table per family, read in both directions
# A table maps our module names to Hugging Face names; entries of a layer are relative to the HF
# path of layer {i}, "layers" ({g}, {j}: ALBERT's group and layer inside it). {p} is the model's
# prefix. An entry for a module serves both its .weight and .bias, for those our model has: a bias,
# a LayerNorm bias, ModernBERT's layer-0 attention norm and the token-type table exist exactly when
# the config says so, and so the tables need no conditions. Entries for a whole tensor (a head's
# bias, Mixtral's experts) carry their full name. Where ours is made of several HF tensors:
# ("cat", names) concatenated along dim 0 (fused q|k|v, gate|up), ("swap_halves", (name,)) one whose
# two halves along dim 0 we store in the other order, ("experts", (spec,)) Mixtral's `spec` once per
# expert {x}, stacked along a new dim 0.
BERT_EMBEDDINGS = {"embed.tok": "{p}.embeddings.word_embeddings", "embed.pos": "{p}.embeddings.position_embeddings",
                   "embed.typ": "{p}.embeddings.token_type_embeddings", "embed.norm": "{p}.embeddings.LayerNorm"}
BERT = {**BERT_EMBEDDINGS, "prefix": "bert", "layers": "{p}.encoder.layer.{i}",
        "attn.qkv": ("cat", ("attention.self.query", "attention.self.key", "attention.self.value")),
        "attn.out": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
        "mlp.w_in": "intermediate.dense", "mlp.w_out": "output.dense", "mlp_norm": "output.LayerNorm",
        "head.transform.0": "cls.predictions.transform.dense",
        "head.transform.2": "cls.predictions.transform.LayerNorm",
        "head.decoder.bias": "cls.predictions.bias", "head.decoder.weight": "cls.predictions.decoder.weight"}
# RoBERTa and XLM-R: BERT's body under `roberta.`, and a head of other names
ROBERTA = {**BERT, "prefix": "roberta", "head.transform.0": "lm_head.dense", "head.transform.2": "lm_head.layer_norm",
           "head.decoder.bias": "lm_head.bias", "head.decoder.weight": "lm_head.decoder.weight"}
DISTILBERT = {**BERT_EMBEDDINGS, "prefix": "distilbert", "layers": "{p}.transformer.layer.{i}",
              "attn.qkv": ("cat", ("attention.q_lin", "attention.k_lin", "attention.v_lin")),
              "attn.out": "attention.out_lin", "attn_norm": "sa_layer_norm",
              "mlp.w_in": "ffn.lin1", "mlp.w_out": "ffn.lin2", "mlp_norm": "output_layer_norm",
              "head.transform.0": "vocab_transform", "head.transform.2": "vocab_layer_norm",
              "head.decoder.bias": "vocab_projector.bias", "head.decoder.weight": "vocab_projector.weight"}
# ALBERT: our layer i is layer j of group g, (g, j) = divmod(i, inner_group_num)
ALBERT = {**BERT_EMBEDDINGS, "prefix": "albert",
          "embed.proj": "{p}.encoder.embedding_hidden_mapping_in",  # the factorised embeddings' e -> d
          "layers": "{p}.encoder.albert_layer_groups.{g}.albert_layers.{j}",
          "attn.qkv": ("cat", ("attention.query", "attention.key", "attention.value")),
          "attn.out": "attention.dense", "attn_norm": "attention.LayerNorm",
          "mlp.w_in": "ffn", "mlp.w_out": "ffn_output", "mlp_norm": "full_layer_layer_norm",
          "head.transform.0": "predictions.dense", "head.transform.2": "predictions.LayerNorm",
          "head.decoder.bias": "predictions.bias", "head.decoder.weight": "predictions.decoder.weight"}
# GTE: prefix `new` (Alibaba's remote code) or `gte` (transformers v5), whichever the file has
GTE = {**BERT_EMBEDDINGS, "prefix": "gte", "layers": "{p}.encoder.layer.{i}",
       "attn.qkv": "attention.qkv_proj", "attn.out": "attention.o_proj", "attn_norm": "attn_ln",
       # GTE stores [up; gate] with the *second* half activated; ours is [activated; linear]
       "mlp.w_in": ("swap_halves", ("mlp.up_gate_proj",)), "mlp.w_out": "mlp.down_proj", "mlp_norm": "mlp_ln",
       "head.transform.0": "lm_head.dense", "head.transform.2": "lm_head.norm",
       "head.decoder.bias": "lm_head.decoder.bias", "head.decoder.weight": "lm_head.decoder.weight"}
# ModernBERT: layer 0 has no attention norm (the embeddings are normed), so our model has none either
MODERNBERT = {"prefix": "model", "embed.tok": "{p}.embeddings.tok_embeddings", "embed.norm": "{p}.embeddings.norm",
              "layers": "{p}.layers.{i}", "attn_norm": "attn_norm", "attn.qkv": "attn.Wqkv", "attn.out": "attn.Wo",
              "mlp_norm": "mlp_norm", "mlp.w_in": "mlp.Wi", "mlp.w_out": "mlp.Wo", "final_norm": "{p}.final_norm",
              "head.transform.0": "head.dense", "head.transform.2": "head.norm",
              "head.decoder.bias": "decoder.bias", "head.decoder.weight": "decoder.weight"}
# LLaMA and EuroBERT; Mixtral swaps the MLP for a router and experts (w1: gate, w3: up, w2: down)
LLAMA = {"prefix": "model", "embed.tok": "{p}.embed_tokens", "layers": "{p}.layers.{i}",
         "attn_norm": "input_layernorm",
         "attn.qkv": ("cat", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
         "attn.out": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm",
         "mlp.w_in": ("cat", ("mlp.gate_proj", "mlp.up_proj")), "mlp.w_out": "mlp.down_proj", "final_norm": "{p}.norm",
         "head.decoder.bias": "lm_head.bias", "head.decoder.weight": "lm_head.weight"}
MIXTRAL = {**LLAMA, "mlp.router": "block_sparse_moe.gate",
           "mlp.w_in": ("experts", (("cat", ("block_sparse_moe.experts.{x}.w1.weight",
                                             "block_sparse_moe.experts.{x}.w3.weight")),)),
           "mlp.w_out": ("experts", ("block_sparse_moe.experts.{x}.w2.weight",))}


# ---------------- The families: one entry per config.json model_type
@dataclass(frozen=True)
class HFFamily:
    """How the checkpoints of one config.json model_type are read and saved back."""
    family: str             # our architecture: a FAMILY_TRAITS key of model.py
    hf_class: str           # the transformers class, saved in config.json's "architectures"
    name: str               # what messages call it
    keys: dict              # its config.json keys (the tables above)
    tensors: dict           # its tensor names (the tables above)
    read: object = None     # (config.json, our config dict, this entry) -> None: what else the family reads
    write: object = None    # (ModelConfig, config.json dict) -> None: and writes back
    saved_as: str | None = None    # the model_type saved, when not this one (None: this one)
    rope_theta: float = 10000.0    # where config.json names none
    prefixes: tuple = ()           # the model prefixes files of it use, when there are several

    @property
    def causal(self):
        """A decoder (next-token head) rather than a masked-LM encoder."""
        return FAMILY_TRAITS[self.family].get("causal", False)


_ROBERTA = HFFamily("roberta", "RobertaForMaskedLM", "RoBERTa", {**BERT_KEYS, "hidden_act": ("act", "gelu")},
                    ROBERTA)  # the head's activation is always exact GELU
_GTE = HFFamily("gte", "GteForMaskedLM", "GTE-MLM", {**BERT_KEYS, "type_vocab_size": ("type_vocab_size", 1)}, GTE,
                read=_read_gte, write=_write_rope, prefixes=("gte", "new"))
_LLAMA = HFFamily("llama", "LlamaForCausalLM", "LLaMA", LLAMA_KEYS, LLAMA, read=_read_rope, write=_write_rope)
# A new model_type is one entry here (CamemBERT: dataclasses.replace(_ROBERTA, hf_class="CamembertForMaskedLM",
# name="CamemBERT")); a new architecture also needs its FAMILY_TRAITS row, its tables, and read/write.
HF_FAMILIES = {
    "bert": HFFamily("bert", "BertForMaskedLM", "BERT", BERT_KEYS, BERT),
    "roberta": _ROBERTA,
    # XLM-R is RoBERTa with another vocabulary; saved back as XLM-R, so that tools keyed on the model_type know it
    "xlm-roberta": dataclasses.replace(_ROBERTA, hf_class="XLMRobertaForMaskedLM", name="XLM-R"),
    "distilbert": HFFamily("distilbert", "DistilBertForMaskedLM", "DistilBERT", DISTILBERT_KEYS, DISTILBERT),
    "albert": HFFamily("albert", "AlbertForMaskedLM", "ALBERT", {**BERT_KEYS, "embedding_size": "embed_dim",
                       "num_hidden_groups": ("albert_groups", 1), "inner_group_num": ("albert_inner", 1)}, ALBERT),
    "gte": _GTE,
    # Alibaba's remote-code GTE: read, and saved back, as transformers' own GTE
    "new": dataclasses.replace(_GTE, hf_class="NewForMaskedLM", saved_as="gte",
                               keys={**BERT_KEYS, "type_vocab_size": ("type_vocab_size", 0)}),
    "modernbert": HFFamily("modernbert", "ModernBertForMaskedLM", "ModernBERT/Ettin", MODERNBERT_KEYS, MODERNBERT,
                           read=_read_modernbert, write=_write_modernbert),
    # EuroBERT: the LLaMA block, and its decoder has a bias where its MLP has
    "eurobert": dataclasses.replace(_LLAMA, family="eurobert", hf_class="EuroBertForMaskedLM", name="EuroBERT",
                                    keys={**LLAMA_KEYS, "mlp_bias": (("mlp_in_bias", "mlp_out_bias", "decoder_bias"),
                                                                     False)}, rope_theta=250000.0),
    "llama": _LLAMA,
    "mixtral": dataclasses.replace(_LLAMA, family="mixtral", hf_class="MixtralForCausalLM", name="Mixtral",
                                   keys={**LLAMA_KEYS, "num_local_experts": "n_experts",
                                         "num_experts_per_tok": ("expert_top_k", 2)}, tensors=MIXTRAL),
}


def supported_names(mlm_only=False, last="and"):
    """The families' names, each once, in the table's order: "BERT, RoBERTa, ... and Mixtral"."""
    names = list(dict.fromkeys(e.name for e in HF_FAMILIES.values() if not (mlm_only and e.causal)))
    return ", ".join(names[:-1]) + f" {last} {names[-1]}" if len(names) > 1 else "".join(names)


def tensor_names(cfg: ModelConfig, prefix=None, keys=None):
    """[(our state_dict key, HF spec)] for every tensor but the vocabulary projection (head_names'); `keys`:
    the model's state_dict keys when one is at hand, by default those of the model `cfg` builds."""
    table = HF_FAMILIES[cfg.model_type].tensors
    p = prefix or table["prefix"]
    if keys is None:
        with torch.device("meta"):  # the names, without allocating the tensors
            keys = Transformer(cfg).state_dict().keys()
    names = []
    for key in (k for k in keys if k != "head.decoder.weight"):
        path, entry = "", key
        if key.startswith("layers."):
            _, i, entry = key.split(".", 2)
            g, j = divmod(int(i), cfg.albert_inner)
            path = table["layers"].format(p=p, i=i, g=g, j=j) + "."
        module, _, param = entry.rpartition(".")
        spec, suffix = (table[entry], "") if entry in table else (table[module], "." + param)
        names.append((key, _fill(spec, cfg, path, suffix, p=p)))
    return names


def _fill(spec, cfg, path, suffix, **fields):
    """A table entry with its {fields} filled in, and `path` before and `suffix` after each name."""
    if isinstance(spec, str):
        return path + spec.format(**fields) + suffix
    kind, parts = spec
    if kind == "experts":
        return "stack", tuple(_fill(parts[0], cfg, path, suffix, **fields, x=x) for x in range(cfg.n_experts))
    return kind, tuple(_fill(part, cfg, path, suffix, **fields) for part in parts)


def head_names(cfg: ModelConfig, prefix=None):
    """HF names of the vocabulary projection, the input embedding it may be tied to, and the projection's bias."""
    table = HF_FAMILIES[cfg.model_type].tensors
    decoder, embedding = table["head.decoder.weight"], table["embed.tok"].format(p=prefix or table["prefix"])
    return decoder, embedding + ".weight", decoder.removesuffix("weight") + "bias"


def _swap_halves(t):
    return torch.cat(t.chunk(2, dim=0)[::-1], dim=0)


def _gather(spec, ckpt, missing):
    """Our tensor made of the HF tensors `spec` names; None (their names added to `missing`) if one is absent."""
    if isinstance(spec, str):
        if spec not in ckpt:
            missing.append(spec)
        return ckpt.get(spec)
    kind, parts = spec
    tensors = [_gather(p, ckpt, missing) for p in parts]
    if any(t is None for t in tensors):
        return None
    if kind == "swap_halves":
        return _swap_halves(tensors[0])
    return torch.cat(tensors, 0) if kind == "cat" else torch.stack(tensors, 0)


def _scatter(cfg, spec, tensor, out):
    """Inverse of _gather: split one of our tensors into the HF tensors it was made of."""
    if isinstance(spec, str):
        out[spec] = tensor
        return
    kind, parts = spec
    if kind == "swap_halves":
        pieces = [_swap_halves(tensor)]
    elif kind == "stack":
        pieces = tensor.unbind(0)
    else:  # "cat": q | k | v (GQA: k and v are smaller) or gate | up
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        pieces = tensor.split((q, kv, kv) if len(parts) == 3 else (cfg.d_ff, cfg.d_ff), dim=0)
    for part, piece in zip(parts, pieces):
        _scatter(cfg, part, piece, out)


def _normalise_keys(ckpt):
    """Legacy names: LayerNorm gamma/beta -> weight/bias; drop buffers and heads we never use."""
    renamed = {re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", k)): v for k, v in ckpt.items()}
    return {k: v for k, v in renamed.items() if ".pooler." not in k and not k.endswith((".position_ids", "inv_freq"))
            and not k.startswith(("cls.seq_relationship", "sop_classifier"))}


class MissingTensors(UserError, KeyError):
    """A weights file without tensors its config.json implies (the message names some, and why)."""
    def __str__(self):  # KeyError would print the message in quotes
        return self.args[0]


def state_dict_from_hf(cfg: ModelConfig, ckpt: dict, where="checkpoint"):
    """(our state dict, cfg): tie_embeddings off where the file's decoder differs from the embeddings (v5's rule)."""
    ckpt = _normalise_keys(ckpt)
    prefix = next((p for p in HF_FAMILIES[cfg.model_type].prefixes if any(k.startswith(p + ".") for k in ckpt)), None)
    dec_key, emb_key, bias_key = head_names(cfg, prefix)
    body = emb_key.split(".")[0] + "."
    if emb_key not in ckpt and emb_key[len(body):] in ckpt:
        # a bare encoder saved without its task head (BertModel, ModernBertModel...): keys lack the prefix
        ckpt = {(k if k.startswith(body) else body + k): v for k, v in ckpt.items()}
    missing = []  # a tensor not found is None in sd, and its name here: the error below
    sd = {ours: _gather(spec, ckpt, missing) for ours, spec in tensor_names(cfg, prefix)}
    if dec_key in ckpt and (not cfg.tie_embeddings or not torch.equal(ckpt[dec_key], ckpt.get(emb_key, ckpt[dec_key]))):
        cfg = dataclasses.replace(cfg, tie_embeddings=False)
        sd["head.decoder.weight"] = ckpt[dec_key]
    elif not cfg.tie_embeddings:
        missing.append(dec_key)
    elif "embed.tok.weight" in sd:
        sd["head.decoder.weight"] = sd["embed.tok.weight"]  # tied: re-tied after loading
    if "head.decoder.bias" in sd and bias_key in ckpt:
        sd["head.decoder.bias"] = ckpt[bias_key]
    if missing:
        only_head = all("layers" not in m and "layer." not in m and "embeddings" not in m for m in missing)
        hint = (" The file has no masked-LM/LM head: use the *ForMaskedLM (or *ForCausalLM) checkpoint of this "
                "model, not the bare encoder.") if only_head else ""
        raise MissingTensors(f"{where}: {len(missing)} tensors missing, e.g. {missing[:4]}.{hint}")
    return sd, cfg


def check_shapes(sd: dict, expected: dict, cfg: ModelConfig, where="checkpoint"):
    """A tensor of a wrong shape (a corrupt header, another size's checkpoint), named with its file and HF name."""
    hf_name = dict(tensor_names(cfg, keys=expected))
    for key, tensor in sd.items():
        want = expected.get(key)
        if want is not None and tuple(tensor.shape) != tuple(want.shape):
            spec = hf_name.get(key, key)
            name = spec if isinstance(spec, str) else key   # a fused tensor: ours
            raise ModelFileError(f"{where}: tensor {name} has shape {list(tensor.shape)}, config.json implies "
                                 f"{list(want.shape)}; a file is corrupt or another model's: download it again")


def state_dict_to_hf(model):
    """Our weights under the family's Hugging Face tensor names (tied decoders omitted, as v5 saves)."""
    cfg, ours, out = model.config, model.state_dict(), {}
    for our_key, spec in tensor_names(cfg, keys=ours):
        _scatter(cfg, spec, ours[our_key], out)
    if not cfg.tie_embeddings:
        dec_key, _, bias_key = head_names(cfg)
        out[dec_key] = ours["head.decoder.weight"]
        if "head.decoder.bias" in ours:
            # transformers ties decoder.bias to the head's `bias` only when it ties the weights too
            out[bias_key] = ours["head.decoder.bias"]
    return {k: v.contiguous() for k, v in out.items()}


# ---------------- Where the files come from: a local folder or the Hub
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# what makes a folder a SPLADE model beside its weights, where sentence-transformers reads it: its one
# length and its pooling (splade_settings; the k its head was divided by is config.json's splade_k)
SPLADE_FILES = ("sentence_bert_config.json", "1_SpladePooling/config.json")


def read_tokenizer_files(folder):
    """A model folder's tokenizer files, kept in memory: every checkpoint carries them once the folder is gone."""
    return {n: (Path(folder) / n).read_text() for n in TOKENIZER_FILES if (Path(folder) / n).exists()}


def check_tokenizer_fits(folder, text, vocab_size):
    """Refuse a tokenizer.json (`text`) with ids beyond `vocab_size`: they would index past the embeddings
    mid-run (an IndexError), or ship in an export that cannot encode."""
    from tokenizers import Tokenizer
    try:
        n = max(Tokenizer.from_str(text).get_vocab(with_added_tokens=True).values()) + 1
    except Exception:  # noqa: BLE001 - none, or unreadable: data/tokenizer.py says so where one is needed
        return
    if n > vocab_size:
        raise ModelFileError(f"{folder / 'tokenizer.json'} holds ids up to {n - 1}, but config.json's vocab_size is "
                             f"{vocab_size}: another model's tokenizer; put this model's own tokenizer.json there")


def model_files(folder) -> list[Path]:
    """The files of a model folder that loading it reads: config.json, the weights, tokenizer and SPLADE files."""
    folder = Path(folder)
    named = [folder / n for n in ("config.json", *TOKENIZER_FILES, *SPLADE_FILES)]
    return [p for p in named if p.exists()] + weight_files(folder)


def _hub_file(repo, name, rev):
    """The cached path of a Hub repository's file, downloaded if need be; None if none (or not cached offline)."""
    from hf import hub
    try:
        return hub.hf_hub_download(repo, name, revision=rev)
    except (hub.EntryNotFoundError, hub.OfflineCacheMissError):
        return None


def resolve_model_folder(spec, need_weights=True):
    """A local folder for `spec`: a directory path, or `hf:org/name[@revision]` fetched from the Hub."""
    if not spec.startswith("hf:"):
        folder = Path(spec)
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise MissingInput(f"model folder {where(spec)} {what}; give a local Hugging Face model folder "
                               "or hf:org/name[@revision] to download from the Hub", path=spec)
        if not (folder / "config.json").exists():
            raise MissingInput(f"model {where(spec)}: no config.json (is this a Hugging Face model folder?)")
        return folder
    from hf import hub
    repo, rev = hub.parse_spec(spec)
    folder = hub.hf_hub_download(repo, "config.json", revision=rev).parent
    for name in (*TOKENIZER_FILES, *SPLADE_FILES):
        _hub_file(repo, name, rev)
    if not need_weights:
        return folder
    names = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    weights = next(filter(None, (_hub_file(repo, n, rev) for n in names)), None)
    if weights is None:
        raise FileNotFoundError(f"{spec}: the repository has no model.safetensors(.index.json) or "
                                "pytorch_model.bin (or they are not cached while offline)")
    if weights.name.endswith(".index.json"):
        for shard in sorted(set(read_weight_map(weights).values())):
            hub.hf_hub_download(repo, shard, revision=rev)
    return folder


# the special tokens our code needs, and their strings in the families we load (when the files name none)
KNOWN_SPECIALS = {"pad": ("[PAD]", "<pad>", "<|pad|>"), "cls": ("[CLS]", "<s>"), "sep": ("[SEP]", "</s>"),
                  "mask": ("[MASK]", "<mask>", "<|mask|>"), "bos": ("<|begin_of_text|>", "<s>", "<|endoftext|>"),
                  "eos": ("<|end_of_text|>", "</s>", "<|endoftext|>"), "unk": ("[UNK]", "<unk>")}


def load_tokenizer(spec):
    """The tokenizer.json of `spec` (a model folder, hf:org/name[@rev], or a tokenizer.json) as open_tokenizer's,
    with `.special.pad`, `.cls`... (KNOWN_SPECIALS) from tokenizer_config.json, config.json, or the usual strings."""
    if str(spec).startswith("hf:"):
        spec = resolve_model_folder(str(spec), need_weights=False)
    elif Path(spec).suffix != ".json" and not Path(spec).exists():  # a mistyped path, not a missing tokenizer
        raise MissingInput(f"model folder {where(spec)} does not exist; give a local model folder or "
                           "hf:org/name[@revision]", path=spec)
    path = Path(spec) if Path(spec).suffix == ".json" else Path(spec) / "tokenizer.json"
    folder = path.parent
    if not path.exists():
        raise FileNotFoundError(f"{folder}: no {path.name} (this project reads only the fast-tokenizer "
                                "format; convert the tokenizer with transformers once and save it)")
    tok = open_tokenizer(path)
    named = {k.removesuffix("_token"): v["content"] if isinstance(v, dict) else v
             for fname in ("special_tokens_map.json", "tokenizer_config.json") if (folder / fname).exists()
             for k, v in read_json(folder / fname, fname).items() if k.endswith("_token") and v}
    cfg = read_json(folder / "config.json", "config.json") if (folder / "config.json").exists() else {}
    ids = {}
    for role, usual in KNOWN_SPECIALS.items():  # the token the files name, else config.json's id, else a usual string
        configured = cfg.get(f"{role}_token_id")
        found = [tok.token_to_id(named[role]) if role in named else None,
                 configured[0] if isinstance(configured, list) else configured, *map(tok.token_to_id, usual)]
        ids[role] = next((i for i in found if i is not None), None)
    tok.special = SimpleNamespace(**ids)
    return tok


# ---------------- sentence-transformers: the files that make a saved SPLADE model a SparseEncoder
ST_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
              {"idx": 1, "name": "1", "path": "1_SpladePooling",
               "type": "sentence_transformers.sparse_encoder.models.SpladePooling"}]


# Inputs longer than this are cut by a RoPE model's SparseEncoder: the longest context of the RoPE
# encoders read here (ModernBERT/Ettin, GTE, EuroBERT: 8192). A config that claims more (a LLaMA's
# 131072) names no length a document needs, and SPLADE max-pools over (tokens x vocabulary) logits:
# 131072 x 128256 floats are 67 GB for one document.
ROPE_MAX_SEQ_LENGTH = 8192


def sparse_encoder_max_seq_length(cfg: ModelConfig):
    """The longest input the model reads: its position table's (RoBERTa's 514 rows are 512 tokens), or with
    RoPE the config's max_position_embeddings, at most ROPE_MAX_SEQ_LENGTH."""
    if cfg.position_limit is not None:
        return cfg.position_limit
    return min(cfg.max_seq_len, ROPE_MAX_SEQ_LENGTH)


def model_max_seq_length(spec, cfg: ModelConfig) -> tuple[int, str]:
    """The one length a model comes with, and where it was read: (tokens, source).

    A SPLADE model's numbers depend on where its texts are cut (splade-tiny on Cranfield, where 413
    of 1 398 documents are longer than 256 tokens: nDCG@10 0.3634 at 256, 0.3548 at 512), so every
    reader of a folder takes the same length: our evaluator, sentence-transformers' SparseEncoder and
    every export. It is sentence_bert_config.json's max_seq_length, where train_splade.py writes the
    length its evaluations used (the longest input would send ModernBERT to 8 192 tokens, a length no run
    measured, at 32 times the cost of 256). Without that file: as sentence-transformers reads it, the
    model's longest input, or tokenizer_config.json's model_max_length if smaller. spec None: the config alone."""
    longest = sparse_encoder_max_seq_length(cfg)
    folder = resolve_model_folder(str(spec), need_weights=False) if str(spec).startswith("hf:") else spec

    def setting(name, key):
        path = None if folder is None else Path(folder, name)
        return json.loads(path.read_text()).get(key) if path is not None and path.exists() else None
    length = setting("sentence_bert_config.json", "max_seq_length")
    if isinstance(length, int) and length > 0:
        return min(length, longest), "its sentence_bert_config.json"
    length = setting("tokenizer_config.json", "model_max_length")
    if isinstance(length, (int, float)) and 0 < length < longest:
        return int(length), "its tokenizer_config.json's model_max_length"
    return longest, "the longest input the model reads"


def splade_settings(folder):
    """The SpladeSettings a model folder holds: its 1_SpladePooling/config.json's pooling (none: max, as naver/splade
    and sentence-transformers default to) and its config.json's splade_k (1: the head as pretrained)."""
    folder, settings = Path(folder), SpladeSettings()
    pooling_file = folder / "1_SpladePooling" / "config.json"
    if pooling_file.exists():
        pooling = read_json(pooling_file, "1_SpladePooling/config.json").get("pooling_strategy", "max")
        if pooling not in SPLADE_POOLINGS:
            raise UnsupportedModel(f"{pooling_file}: pooling_strategy {pooling!r}; use {' or '.join(SPLADE_POOLINGS)}")
        settings.pooling = pooling
    hf = read_json(folder / "config.json", "config.json") if (folder / "config.json").exists() else {}
    settings.k, settings.k_bias = float(hf.get("splade_k", 1.0)), bool(hf.get("splade_k_bias", False))
    return settings


def write_sparse_encoder_files(folder, model, max_seq_length=None):
    """The files with which sentence-transformers' SparseEncoder(folder) loads `folder` as MLMTransformer +
    SpladePooling; max_seq_length (None: the longest input the model reads) is returned."""
    cfg = model.config
    max_seq_length = sparse_encoder_max_seq_length(cfg) if max_seq_length is None else int(max_seq_length)
    files = {
        "modules.json": ST_MODULES,
        "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False},
        "config_sentence_transformers.json": {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""},
                                              "default_prompt_name": None, "similarity_fn_name": "dot"},
        "1_SpladePooling/config.json": {"pooling_strategy": model.splade.pooling, "activation_function": "relu",
                                        "word_embedding_dimension": cfg.vocab_size},
    }
    for name, content in files.items():
        (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_text(json.dumps(content, indent=2) + "\n")
    return max_seq_length


# ---------------- Loading and saving a whole model
def manifest_problem(folder, reads=lambda name: True):
    """None if the files of `folder` that `reads` picks are those its manifest records and parse, else why not."""
    why = manifest.problem(folder, check=reads)
    if why is None:
        for name in (manifest.read(folder) or {}).get("files", {}):
            if name.endswith(".safetensors") and reads(name):
                try:
                    read_header(Path(folder) / name)
                except SafetensorsError as e:
                    return str(e)
    return why


def from_pretrained(spec, device=None, dtype=None, dropout=0.0):
    """A Hugging Face checkpoint (`hf:org/name[@rev]` or a folder) as our Transformer, in eval mode, fp32 unless
    `dtype`. `dropout` is the caller's, never the checkpoint's (those are kept in hf_config to be saved back)."""
    folder = resolve_model_folder(str(spec))
    # a model folder of ours (a checkpoint's model/, an export with its own manifest) used as a model
    # elsewhere (init_from, a driver's backbone, a retrieval): loaded only as it was saved
    for top, inside in ((folder, ""), (folder.parent, f"{folder.name}/")):
        if (top / manifest.MANIFEST).is_file():
            if why := manifest_problem(top, lambda name: name.startswith(inside)):
                raise ModelFileError(f"model {folder}: {why}. Use another checkpoint of that run, or save it again")
            break
    cfg = config_from_hf(read_json(folder / "config.json", "config.json"), where=folder / "config.json")
    cfg = dataclasses.replace(cfg, dropout=dropout)
    sd, cfg = state_dict_from_hf(cfg, load_checkpoint_dir(folder), where=str(folder))
    with torch.device("meta"):
        model = Transformer(cfg)
    check_shapes(sd, model.state_dict(), cfg, where=str(folder))
    # assign=True adopts the (memory-mapped) tensors instead of copying into fresh ones
    model.load_state_dict(sd, strict=True, assign=True)
    model.tie_weights()
    model.to(device=device, dtype=dtype or torch.float32)
    model.source = str(folder)
    model.tokenizer_files = read_tokenizer_files(folder)  # saved with it, even once `folder` is gone
    check_tokenizer_fits(folder, model.tokenizer_files.get("tokenizer.json"), cfg.vocab_size)
    model.splade = splade_settings(folder)
    return model.eval()


def save_pretrained(model, out_dir, tokenizer=None):
    """Write config.json + model.safetensors (+ tokenizer files) that transformers loads directly."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(state_dict_to_hf(model), out / "model.safetensors")
    hf = hf_config_to_save(model.config)
    hf["dtype"] = hf["torch_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")  # v5, v4 names
    hf.pop("splade_k", None), hf.pop("splade_k_bias", None)   # the source's, if any: this model's below
    if model.splade.k != 1:   # the k its head was divided by travels with it (splade_settings reads it)
        hf.update(splade_k=model.splade.k, splade_k_bias=model.splade.k_bias)
    write_text(out / "config.json", json.dumps(hf, indent=2))
    if tokenizer is not None:
        tokenizer.save(str(out / "tokenizer.json"))
    else:  # the files of the folder it was loaded from, read then (a resumed checkpoint may be pruned since)
        files = getattr(model, "tokenizer_files", None)
        for name, text in (read_tokenizer_files(model.source) if files is None and model.source else files or {}).items():
            write_text(out / name, text)
    return out


# ---------------- python -m hf.models --export SPEC OUT [--k K]: any loadable model as a Hugging Face folder
def export_model(spec, out, k=None, k_bias=False, max_len=None):
    """The model `spec` as the new Hugging Face folder `out` with its tokenizer files and, for a masked-LM
    encoder, the SparseEncoder files of `max_len` tokens (default: the source's); `k`: the MLM head divided
    by k first, as train_splade.py --k. Written as OUT.tmp and renamed. Returns (out, length or None)."""
    out = Path(out)
    _refuse_filled(out)
    model = from_pretrained(spec)
    entry = HF_FAMILIES[model.config.model_type]
    if entry.causal and (k is not None or max_len is not None):
        option = "--k" if k is not None else "--max-len"
        raise UnsupportedModel(f"{option} applies to a masked-LM encoder (its head, its SparseEncoder files), but "
                               f"{spec} is a {entry.name} model, a causal decoder; export it without {option}")
    longest = sparse_encoder_max_seq_length(model.config)
    if max_len is not None and not 0 < max_len <= longest:
        raise MissingInput(f"--max-len {max_len}: give 1 to {longest}, the longest input {spec} reads")
    # --max-len, else the source's one length (model_max_seq_length), travels with the export
    length = None if entry.causal else max_len or model_max_seq_length(spec, model.config)[0]
    # one export per target (OUT.lock beside it), so a fixed OUT.tmp is enough: one there is a killed export's
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = ExclusiveLock(out.with_name(f"{out.name}.lock"), label="export", remove=True)
    if not lock.acquire():
        raise UserError(f"--export: {out} is being written by another export (pid {lock.holder}, lock file "
                        f"{lock.path}); wait for it to finish or stop it, or give another folder")
    tmp = out.with_name(f"{out.name}.tmp")
    try:
        _refuse_filled(out)  # written meanwhile
        if tmp.exists():
            print(f"removing {tmp}: an unfinished export of a killed run", file=sys.stderr)
            shutil.rmtree(tmp, ignore_errors=True)
        if k is not None:
            rescale_mlm_head(model, k, bias=k_bias)
        save_pretrained(model, tmp)
        if length is not None:
            write_sparse_encoder_files(tmp, model, length)
        os.replace(tmp, out)  # an empty folder there is replaced (checked above)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed or interrupted export leaves nothing
        if disk_full(e):
            size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
            raise disk_full_error(out.parent, size, f"the export {out}",
                                  "Free some space and run the same command again (nothing was written)") from e
        raise
    finally:
        lock.release()
    return out, length


def _refuse_filled(out):
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MissingInput(f"--export: {where(out)} already exists, not empty; give a new folder (nothing was written)")


def export_main(argv=None):
    """python -m hf.models --export SPEC OUT [--k K] [--k-bias] [--max-len N]"""
    ap = argparse.ArgumentParser(prog="python -m hf.models", description="Export any model this project loads as a "
                                 "Hugging Face folder, for a masked-LM encoder also a SparseEncoder (SPLADE untrained)")
    ap.add_argument("--export", nargs=2, metavar=("SPEC", "OUT"), required=True, help="the model, and a new folder")
    ap.add_argument("--k", type=float, default=None, help="divide the MLM head by k first (train_splade's --k)")
    ap.add_argument("--k-bias", action="store_true", help="with --k: divide the decoder bias too")
    ap.add_argument("--max-len", type=int, default=None, help="its max_seq_length (default: the source's one length)")
    args = ap.parse_args(argv)
    if args.k_bias and args.k is None:
        ap.error("--k-bias needs --k")
    spec, out = args.export
    folder, length = export_model(spec, out, args.k, args.k_bias, args.max_len)
    what = "a causal LM (no SparseEncoder files)" if length is None else \
        f"a masked LM and a sentence-transformers SparseEncoder reading {length} tokens per text"
    scaled = f", MLM head divided by {args.k:g}" if args.k is not None else ""
    warning = "" if (folder / "tokenizer.json").exists() else \
        "; warning: the source has no tokenizer.json, so the folder has none (add one before using it)"
    print(f"{folder}: {spec} as {what}{scaled}{warning}")
    return folder


# ---------------- python model.py --inspect SPEC
def describe(model):
    cfg = model.config
    variant = f" (a variant of the {cfg.family} family, whose block it builds)" if cfg.variant else ""
    lines = [f"source      {model.source}", f"model_type  {cfg.model_type}{variant}",
             f"parameters  {model.num_params() / 1e6:.1f}M ({model.num_params(embeddings=False) / 1e6:.1f}M without "
             "embeddings)"]
    lines += [f"  {f.name:<18} {getattr(cfg, f.name)}" for f in dataclasses.fields(cfg) if f.name != "hf_config"]
    n = head_norms(model)
    head = "LM head (next-token prediction)" if cfg.causal else "MLM head"
    lines += [f"{head} W_head (V x e)" + (" [tied to the input embeddings]" if n["tied"] else ""),
              f"  Frobenius norm     {n['frobenius']:.4f}",
              f"  mean row L2 norm   {n['mean_row_l2']:.4f}",
              f"  bias L2 norm       {n['bias_l2'] if n['bias_l2'] is None else round(n['bias_l2'], 4)}"]
    if not cfg.causal:  # what its folder says it computes as a SPLADE model (splade_settings)
        s = model.splade
        bias = " with its bias" if s.k_bias else ""
        lines.append(f"as SPLADE    {s.pooling} pooling, its head divided by k = {s.k:g}{bias} "
                     "(1_SpladePooling/config.json, config.json's splade_k)")
    return "\n".join(lines)


def inspect_main(argv=None):
    """python model.py --inspect SPEC [--k K]"""
    ap = argparse.ArgumentParser(prog="model.py", description="A checkpoint's architecture, size and MLM-head norms")
    ap.add_argument("--inspect", metavar="SPEC", required=True, help="hf:org/name[@rev] or a local folder")
    ap.add_argument("--k", type=float, default=None, help="also show the head norms after dividing by k")
    ap.add_argument("--k-target", type=float, default=K_TARGET, help="the mean row L2 --k=auto aims at (k_target)")
    args = ap.parse_args(argv)
    m = from_pretrained(args.inspect)
    if m.config.causal and args.k:  # SPLADE's k divides a masked-LM head: a decoder has none to rescale
        raise UnsupportedModel(f"--k divides an MLM head, but {args.inspect} is a causal decoder; drop --k")
    print(describe(m))
    if m.config.causal:
        print("a causal decoder: SPLADE's k (train_splade.py --k) applies to a masked-LM encoder's head")
        return
    print(f"k the rule picks (train_splade.py --k=auto): {auto_k(m, args.k_target):.4f} = mean row L2 "
          f"{head_norms(m)['mean_row_l2']:.4f} / k_target {args.k_target:g}")
    if args.k:
        rescale_mlm_head(m, args.k)
        n = head_norms(m)
        print(f"after W_head / {args.k:g}: Frobenius {n['frobenius']:.4f}, mean row L2 {n['mean_row_l2']:.4f}")


if __name__ == "__main__":  # python -m hf.models --export SPEC OUT [--k K]
    from cli import run_cli
    run_cli(export_main)
