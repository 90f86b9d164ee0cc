"""Hugging Face folders as others use them (issues 28.3, 28.4, 29): one table of the families
(hf/models.py HF_FAMILIES) that reading, saving, the error for an unknown model_type and
train_splade's list of backbones all go through, so that a new model_type is one entry; saving
keeps the source config.json's settings (dropout, ids, keys we never read) without training with
them; every checkpoint folder carries its tokenizer; and `python -m hf.models --export` turns any
loadable model into a transformers folder that is also a sentence-transformers SparseEncoder."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import model as M
import train_lm as L
import train_splade as S
from data.shards import write_shard
from data.tokenizer import encode_texts
from hf import models as hf_models
from hf.models import HF_FAMILIES, from_pretrained, load_tokenizer, save_pretrained
from test_splade import ROOT, SPECIALS, WORDS, losses, run_args, tiny, write_tiny_model, write_tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py
V = len(SPECIALS) + len(WORDS)


def tiny_config(family):
    """A small ModelConfig of `family` as train_lm.py builds one from scratch."""
    over = dict(vocab_size=V, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=64, pad_id=0, cls_id=2,
                sep_id=3, mask_id=4)
    if family == "modernbert":
        over.update(window=8, local_layers=(1,), rope_theta_local=10000.0)  # None reads back as rope_theta
    if family == "albert":
        over.update(embed_dim=16, albert_groups=1)
    if family == "mixtral":
        over.update(n_experts=4)
    if family == "distilbert":
        over.update(norm_eps=1e-12)  # fixed in transformers' DistilBERT: config.json has no key for it
    return M.ModelConfig(**{**M.FAMILY_TRAITS[family], "family": family, **over})


# ---------------------------------------------------------------- one family table


def test_every_family_of_model_py_has_its_entry_and_every_entry_is_complete():
    assert set(M.FAMILY_TRAITS) <= set(HF_FAMILIES), "each architecture saves as the model_type of its name"
    for model_type, entry in HF_FAMILIES.items():
        assert entry.family in M.FAMILY_TRAITS, model_type
        fields = {f.name for f in dataclasses.fields(M.ModelConfig)}
        assert all(set(hf_models._fields(spec)[0]) <= fields for spec in entry.keys.values()), model_type
        assert entry.hf_class.endswith("ForCausalLM" if entry.causal else "ForMaskedLM"), model_type
        assert entry.saved_as is None or HF_FAMILIES[entry.saved_as].family == entry.family


@pytest.mark.parametrize("family", sorted(M.FAMILY_TRAITS))
def test_config_json_round_trips_for_every_family(family):
    cfg = tiny_config(family)
    hf = hf_models.config_to_hf(cfg)
    assert (hf["model_type"], hf["architectures"]) == (family, [HF_FAMILIES[family].hf_class])
    assert hf_models.config_from_hf(json.loads(json.dumps(hf))) == cfg


def test_transformers_knows_every_model_type_and_class_we_save():
    tf = pytest.importorskip("transformers")
    for model_type, entry in HF_FAMILIES.items():
        if entry.saved_as is None:  # `new` (remote code) is saved as gte
            assert model_type in tf.CONFIG_MAPPING, model_type
            assert hasattr(tf, entry.hf_class), entry.hf_class


def test_train_splade_names_every_masked_lm_family_and_no_decoder():
    listed = S.MLM_BACKBONES
    for entry in HF_FAMILIES.values():
        assert (entry.name in listed) != entry.causal, entry.name
    assert "XLM-R" in listed, "the hand-written list left XLM-R out"


def test_a_new_model_type_is_one_entry(tmp_path, monkeypatch):
    """CamemBERT, as the table's comment says: read with transformers' logits, saved back as
    CamemBERT, and the unknown-model_type error and train_splade's list follow the table."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    theirs = tf.CamembertForMaskedLM(tf.CamembertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=64)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    with pytest.raises(hf_models.UnsupportedModel, match="'camembert'"):
        from_pretrained(tmp_path / "hf")
    monkeypatch.setitem(HF_FAMILIES, "camembert", dataclasses.replace(
        HF_FAMILIES["roberta"], hf_class="CamembertForMaskedLM", name="CamemBERT"))  # the one entry
    ours = from_pretrained(tmp_path / "hf")
    ids = torch.randint(5, V, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    save_pretrained(ours, tmp_path / "ours")
    back = tf.AutoModelForMaskedLM.from_pretrained(tmp_path / "ours").eval()
    assert type(back).__name__ == "CamembertForMaskedLM"
    assert "CamEMBERT".lower() in hf_models.supported_names(mlm_only=True).lower()


# ---------------------------------------------------------------- saving keeps the source's settings


def test_saving_keeps_the_source_config_but_training_does_not_take_its_dropout(tmp_path):
    tf = pytest.importorskip("transformers")
    config = tf.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.15,
                           classifier_dropout=0.2, id2label={0: "no", 1: "yes"}, eos_token_id=[3, 2])
    tf.BertForMaskedLM(config).save_pretrained(tmp_path / "src")
    src = json.loads((tmp_path / "src" / "config.json").read_text())
    src["our_unread_setting"] = {"kept": True}
    (tmp_path / "src" / "config.json").write_text(json.dumps(src))
    ours = from_pretrained(tmp_path / "src")
    assert ours.config.dropout == 0.0, "a checkpoint's dropout never becomes the dropout we train with"
    assert all(m.p == 0.0 for m in ours.modules() if isinstance(m, torch.nn.Dropout))
    save_pretrained(ours, tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (saved["hidden_dropout_prob"], saved["attention_probs_dropout_prob"]) == (0.1, 0.15)  # 0.0 before
    assert saved["classifier_dropout"] == 0.2 and saved["our_unread_setting"] == {"kept": True}
    assert saved["id2label"] == {"0": "no", "1": "yes"} and saved["eos_token_id"] == [3, 2]
    assert "transformers_version" not in saved and saved["dtype"] == "float32"
    back = tf.AutoConfig.from_pretrained(tmp_path / "ours")
    assert (back.hidden_dropout_prob, back.attention_probs_dropout_prob) == (0.1, 0.15)
    # settings we change on purpose are ours: an untied head, the ids a run sets
    ours.config = dataclasses.replace(ours.config, tie_embeddings=False, pad_id=5)
    save_pretrained(ours, tmp_path / "changed")
    changed = json.loads((tmp_path / "changed" / "config.json").read_text())
    assert (changed["tie_word_embeddings"], changed["pad_token_id"], changed["hidden_dropout_prob"]) == (False, 5, 0.1)


def test_a_model_without_a_source_config_saves_the_dropout_it_has():
    cfg = dataclasses.replace(tiny_config("bert"), dropout=0.1)
    assert hf_models.hf_config_to_save(cfg)["hidden_dropout_prob"] == 0.1


def test_a_splade_checkpoint_keeps_its_backbones_dropout_and_trains_without_it(tiny, tmp_path):
    model, data, _, _ = tiny
    with_dropout = tmp_path / "backbone"
    with_dropout.mkdir()
    for f in model.iterdir():
        (with_dropout / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((model / "config.json").read_text())
    (with_dropout / "config.json").write_text(json.dumps({**cfg, "attention_dropout": 0.1, "mlp_dropout": 0.1}))
    S.main(run_args(model, data / "train.tsv", tmp_path / "a", max_steps=3))
    S.main(run_args(with_dropout, data / "train.tsv", tmp_path / "b", max_steps=3))
    assert losses(tmp_path / "a") == losses(tmp_path / "b"), "the checkpoint's dropout was trained with"
    for folder in (tmp_path / "b" / "checkpoints" / "step_00000003" / "model", tmp_path / "b" / "model"):
        saved = json.loads((folder / "config.json").read_text())
        assert (saved["attention_dropout"], saved["mlp_dropout"]) == (0.1, 0.1)
        assert (folder / "tokenizer.json").exists()


# ---------------------------------------------------------------- train_lm checkpoints carry a tokenizer


def lm_args(shards, out, **over):
    base = dict(train_shards=str(shards / "c_train_*.bin"), val_shards=str(shards / "c_val_*.bin"), out_dir=str(out),
                vocab_size=V, eos_id=1, log_interval=1, eval_interval=0, ckpt_interval=1000, max_steps=2,
                warmup_steps=1, batch_size=2, seq_len=16, objective="clm")
    base.update(over)
    return [str(ROOT / "configs" / "tiny_lm.py")] + [f"--{k}={v}" for k, v in base.items()]


@pytest.fixture
def shards_with_tokenizer(tmp_path):
    """Shards prepared from text with the test tokenizer, by data/fineweb_edu.py (which keeps the
    tokenizer.json beside them)."""
    from data.fineweb_edu import prepare
    write_tokenizer(tmp_path)
    docs = tmp_path / "docs.jsonl"
    rng = np.random.default_rng(0)
    docs.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS, 30))}) + "\n" for _ in range(200)))
    prepare(tmp_path / "shards", inputs=[str(docs)], tokenizer=str(tmp_path / "tokenizer.json"), delimiter="[UNK]",
            shard_tokens=1500, prefix="c", workers=0)
    return tmp_path / "shards"


def test_a_train_lm_checkpoint_carries_the_tokenizer_its_shards_were_made_with(shards_with_tokenizer, tmp_path):
    shards = shards_with_tokenizer
    assert (shards / "tokenizer.json").read_bytes() == (shards.parent / "tokenizer.json").read_bytes()
    L.main(lm_args(shards, tmp_path / "run"))
    folder = tmp_path / "run" / "checkpoints" / "step_00000002" / "model"
    tok = load_tokenizer(folder)
    assert tok.get_vocab() == load_tokenizer(shards.parent / "tokenizer.json").get_vocab()
    again = from_pretrained(folder)
    with torch.no_grad():
        assert again(*encode_texts(tok, ["w1 w2"], 8)).shape[-1] == V


def test_shards_without_a_tokenizer_json_give_checkpoints_without_one(tmp_path):
    """tiktoken encodings or headers alone: nothing known, nothing shipped (and no error)."""
    rng = np.random.default_rng(0)
    write_shard(tmp_path / "c_val_000000.bin", rng.integers(1, V, 400), delimiter=1, vocab_size=V)
    write_shard(tmp_path / "c_train_000001.bin", rng.integers(1, V, 2000), delimiter=1, vocab_size=V)
    L.main(lm_args(tmp_path, tmp_path / "run"))
    assert not (tmp_path / "run" / "checkpoints" / "step_00000002" / "model" / "tokenizer.json").exists()


def test_preparing_beside_another_tokenizer_is_refused(shards_with_tokenizer, tmp_path):
    from data.fineweb_edu import PreparationError, prepare
    other = tmp_path / "other"
    other.mkdir()
    write_tokenizer(other)
    text = json.loads((other / "tokenizer.json").read_text())
    text["model"]["vocab"]["zz_other"] = V
    (other / "tokenizer.json").write_text(json.dumps(text))
    with pytest.raises(PreparationError, match="another tokenizer"):
        prepare(shards_with_tokenizer, inputs=[str(tmp_path / "docs.jsonl")], tokenizer=str(other / "tokenizer.json"),
                delimiter="[UNK]", shard_tokens=1500, prefix="d", workers=0)


# ---------------------------------------------------------------- python -m hf.models --export


def test_export_writes_a_folder_our_loader_and_transformers_read_rescaled(tmp_path):
    src = write_tiny_model(tmp_path / "src", family="bert", type_vocab_size=2)
    hf_models.export_main(["--export", str(src), str(tmp_path / "out"), "--k", "4"])
    out = tmp_path / "out"
    a, b = from_pretrained(src), from_pretrained(out)
    torch.testing.assert_close(b.head.decoder.weight, a.head.decoder.weight / 4)
    assert (out / "tokenizer.json").exists() and (out / "modules.json").exists()
    assert not list(tmp_path.glob("out.tmp*"))
    with pytest.raises(hf_models.MissingInput, match="already exists"):
        hf_models.export_model(src, out)
    # the source's one length (its sentence_bert_config.json) is the export's
    (src / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48}))
    _, length = hf_models.export_model(src, tmp_path / "out48")
    assert length == 48 == json.loads((tmp_path / "out48" / "sentence_bert_config.json").read_text())["max_seq_length"]
    decoder = write_tiny_model(tmp_path / "lm", family="llama")
    with pytest.raises(hf_models.UnsupportedModel, match="causal decoder"):
        hf_models.export_model(decoder, tmp_path / "lm_out", k=4)
    _, length = hf_models.export_model(decoder, tmp_path / "lm_out")
    assert length is None and not (tmp_path / "lm_out" / "modules.json").exists()
    tf = pytest.importorskip("transformers")
    back = tf.AutoModelForMaskedLM.from_pretrained(out).eval()
    ids = torch.randint(5, V, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids).logits, b(ids), atol=1e-4, rtol=1e-4)


def test_export_takes_a_length_of_its_own(tmp_path, capsys):
    """Issue 33: a 256-token export of a 512-token model needed `model.max_seq_length = 256` by hand."""
    src = write_tiny_model(tmp_path / "src", family="bert", type_vocab_size=2)
    longest = hf_models.sparse_encoder_max_seq_length(from_pretrained(src).config)
    hf_models.export_main(["--export", str(src), str(tmp_path / "short"), "--max-len", "16"])
    assert json.loads((tmp_path / "short" / "sentence_bert_config.json").read_text())["max_seq_length"] == 16
    assert "SparseEncoder reading 16 tokens per text" in capsys.readouterr().out
    with pytest.raises(hf_models.MissingInput, match=rf"--max-len {longest + 1}: give 1 to {longest}"):
        hf_models.export_model(src, tmp_path / "long", max_len=longest + 1)
    decoder = write_tiny_model(tmp_path / "lm", family="llama")
    with pytest.raises(hf_models.UnsupportedModel, match="export it without --max-len"):
        hf_models.export_model(decoder, tmp_path / "lm_out", max_len=16)
    assert not (tmp_path / "long").exists() and not (tmp_path / "lm_out").exists()
    assert not list(tmp_path.glob("*.tmp*")), "nothing written"


def test_export_of_splade_tiny_is_a_sparse_encoder_with_our_vectors(shared_data, tmp_path):
    src = shared_data / "models" / "splade-tiny"
    if not src.is_dir():
        pytest.skip(f"{src} is absent")
    run = subprocess.run([sys.executable, "-m", "hf.models", "--export", str(src), str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "SparseEncoder" in run.stdout
    out = tmp_path / "out"
    assert json.loads((out / "config.json").read_text())["hidden_dropout_prob"] == \
        json.loads((src / "config.json").read_text())["hidden_dropout_prob"]
    texts = ["what is the boiling point of water", "water boils at one hundred degrees at sea level"]
    with torch.no_grad():
        mine = M.splade_pool(from_pretrained(out), *encode_texts(load_tokenizer(out), texts, 512))
        source = M.splade_pool(from_pretrained(src), *encode_texts(load_tokenizer(src), texts, 512))
    torch.testing.assert_close(mine, source)
    st = pytest.importorskip("sentence_transformers")
    theirs = st.SparseEncoder(str(out), device="cpu").encode(texts, convert_to_tensor=True).to_dense().float()
    assert (mine > 0).sum() > 0
    torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-4)


def test_a_resumed_train_lm_run_keeps_shipping_the_tokenizer_after_its_checkpoint_is_pruned(tmp_path):
    """The tokenizer files of the folder a model was loaded from are kept in memory: the checkpoint
    a run resumed from is pruned later (keep_checkpoints), and later checkpoints still carry them."""
    rng = np.random.default_rng(0)
    write_shard(tmp_path / "c_val_000000.bin", rng.integers(1, V, 400), delimiter=1, vocab_size=V)
    write_shard(tmp_path / "c_train_000001.bin", rng.integers(1, V, 2000), delimiter=1, vocab_size=V)
    init = write_tiny_model(tmp_path / "init", family="llama", eos_id=1)
    argv = lm_args(tmp_path, tmp_path / "run", init_from=init, ckpt_interval=1, keep_checkpoints=1)
    L.main(argv + ["--max_steps=2"])
    L.main(argv + ["--max_steps=5"])  # resumes from step 2, which is pruned after step 3 is saved
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    assert [c.name for c in ckpts] == ["step_00000005"]
    assert (ckpts[0] / "model" / "tokenizer.json").read_text() == (init / "tokenizer.json").read_text()
    assert (ckpts[0] / "model" / "tokenizer_config.json").exists()


def test_a_resumed_or_continued_train_lm_run_trains_with_its_own_dropout(tmp_path):
    """--dropout=0.1 is a setting of the run (fixed on resume): a model loaded to resume the run, or to
    continue pretraining (init_from), trains with it - never with the checkpoint's, and never with 0."""
    write_tiny_model(tmp_path / "ckpt" / "model", family="llama", eos_id=1)
    cfg = {**L.DEFAULTS, "dropout": 0.1, "init_from": str(tmp_path / "ckpt" / "model")}
    for built in (L.build_model(cfg, tmp_path / "ckpt"), L.build_model(cfg, None)):
        assert built.config.dropout == 0.1
        assert {m.p for m in built.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
        assert {m.dropout for m in built.modules() if isinstance(m, M.Attention)} == {0.1}
    assert from_pretrained(tmp_path / "ckpt" / "model").config.dropout == 0.0  # loading alone: none
