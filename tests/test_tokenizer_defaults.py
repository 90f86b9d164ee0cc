"""A tokenizer.json's own truncation and padding must never reach our data (issue: data preparation
cut documents at the file's max_length and wrote [PAD] ids into the shards).

The fixture is a BERT-style tokenizer.json, built here, that carries both, as most BERT-family
files do (bert-base-uncased: `"truncation": {"max_length": 512}`, `"padding": BatchLongest`), with
a max_length of 6 so that every text below is longer. Every place that encodes with a
tokenizer.json is checked with it: data preparation writes every document whole and unpadded; model
inputs are cut at the caller's max length, not the file's. Expected ids are written out by hand
from the word-level vocabulary (WORD_ID), never by the tokenizer under test.
"""
import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from data.tokenizer import encode_texts
from data.fineweb_edu import prepare
from data.shards import read_shard
from hf.models import load_tokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(40)]
WORD_ID = {w: i for i, w in enumerate(SPECIALS + WORDS)}
PAD, CLS, SEP = WORD_ID["[PAD]"], WORD_ID["[CLS]"], WORD_ID["[SEP]"]
FILE_MAX_LENGTH = 6
LONG = " ".join(WORDS[:30])   # 30 words: far over the file's max_length
SHORT = "w1 w2"


def bert_style_tokenizer(path, padding="batch_longest"):
    """A word-level tokenizer.json with [CLS] $A [SEP] and, like BERT's, truncation and padding on.

    padding: "batch_longest" (pads a batch to its longest text, as bert-base-uncased's file) or
    "fixed" (pads every text, even a single one, to 12 tokens).
    """
    tok = Tokenizer(models.WordLevel(WORD_ID, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)])
    tok.add_special_tokens(SPECIALS)
    tok.enable_truncation(FILE_MAX_LENGTH)
    tok.enable_padding(pad_id=PAD, pad_token="[PAD]", length=12 if padding == "fixed" else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def words_of(text):
    return [WORD_ID[w] for w in text.split()]


@pytest.fixture(params=["batch_longest", "fixed"])
def tokenizer_folder(tmp_path, request):
    """A model folder holding only the padded, truncating tokenizer.json."""
    bert_style_tokenizer(tmp_path / "tok" / "tokenizer.json", request.param)
    return tmp_path / "tok"


def test_fixture_truncates_and_pads_when_used_as_configured(tokenizer_folder):
    """The fixture must reproduce the trap, or every test below proves nothing."""
    saved = json.loads((tokenizer_folder / "tokenizer.json").read_text())
    assert saved["truncation"]["max_length"] == FILE_MAX_LENGTH and saved["padding"] is not None
    raw = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json"))
    long, short = raw.encode_batch([LONG, SHORT], add_special_tokens=False)
    assert [i for i in long.ids if i != PAD] == words_of(LONG)[:FILE_MAX_LENGTH] and PAD in short.ids


# ----------------------------------------------------------------------------- data preparation

@pytest.mark.parametrize("workers", [0, 1, 2])
def test_data_preparation_writes_whole_unpadded_documents(tokenizer_folder, tmp_path, workers):
    docs = [LONG, SHORT, " ".join(WORDS[5:25]), "w7"]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    summary = prepare(tmp_path / "out", inputs=[str(tmp_path / "d.jsonl")], tokenizer=str(tokenizer_folder),
                      delimiter="[SEP]", shard_tokens=20, workers=workers)
    stream = np.concatenate([read_shard(tmp_path / "out" / name) for name in summary["shards"]])
    expected = [t for d in docs for t in [SEP, *words_of(d)]]
    assert PAD not in stream, f"{int((stream == PAD).sum())} [PAD] ids written as training text"
    assert len(stream) == len(expected), f"{len(stream)} tokens written, the documents have {len(expected)}"
    np.testing.assert_array_equal(stream, expected)


# ----------------------------------------------------------------------------- model inputs

def test_load_tokenizer_switches_off_the_files_truncation_and_padding(tokenizer_folder):
    for spec in (tokenizer_folder, tokenizer_folder / "tokenizer.json"):
        tok = load_tokenizer(spec)
        assert tok.special.pad == PAD and tok.special.sep == SEP
        assert tok.truncation is None and tok.padding is None, spec
        assert tok.encode(LONG).ids == [CLS, *words_of(LONG), SEP]
        assert [e.ids for e in tok.encode_batch([LONG, SHORT])] == [[CLS, *words_of(LONG), SEP],
                                                                    [CLS, *words_of(SHORT), SEP]]


@pytest.mark.parametrize("max_len", [10, 40])
def test_encode_texts_cuts_at_the_callers_max_len(tokenizer_folder, max_len):
    tok = load_tokenizer(tokenizer_folder)
    ids, mask = encode_texts(tok, [LONG, SHORT], max_len, pad_to_multiple=None)
    long = [CLS, *words_of(LONG)[:max_len - 2], SEP]
    short = [CLS, *words_of(SHORT), SEP] + [PAD] * (len(long) - 4)
    assert ids.tolist() == [long, short]
    assert mask.tolist() == [[1] * len(long), [1] * 4 + [0] * (len(long) - 4)]
    assert tok.truncation is None, "encode_texts must leave the tokenizer as load_tokenizer gave it"
    assert len(tok.encode(LONG).ids) == 32


def test_splade_batches_cut_at_query_and_doc_max_len(tokenizer_folder):
    import train_splade as TS

    class Triples:
        has_teacher = False

        def example(self, i, n_negatives, seed, epoch=0):
            return SHORT, [LONG, " ".join(WORDS[:3])], None

    C = {"n_negatives": 1, "seed": 0, "query_max_len": 3, "doc_max_len": 20}
    (q_ids, q_mask, d_ids, d_mask, _), n = TS.make_batch(Triples(), lambda p: (0, p), range(2), C,
                                                         load_tokenizer(tokenizer_folder), "cpu")
    assert q_ids[0, :3].tolist() == [CLS, WORD_ID["w1"], SEP] and q_mask.sum(1).tolist() == [3, 3]
    assert d_ids[0, :20].tolist() == [CLS, *words_of(LONG)[:18], SEP], "document cut at the file's max_length"
    assert d_mask.sum(1).tolist() == [20, 5, 20, 5] and n == 6 + 50


def test_finetune_encoders_cut_at_the_callers_max_len(tokenizer_folder):
    from eval import finetune as FT
    tok = load_tokenizer(tokenizer_folder)
    sc = FT.encode_sc(tok, [{"text": LONG, "label": 0}, {"text": SHORT, "label": 1}], 12, {0: 0, 1: 1})
    assert [f["ids"] for f in sc] == [[CLS, *words_of(LONG)[:10], SEP], [CLS, *words_of(SHORT), SEP]]
    (tc,) = FT.encode_tc(tok, [{"tokens": LONG.split(), "tags": ["O"] * 30}], 12, {"O": 0})
    assert tc["ids"] == [CLS, *words_of(LONG)[:10], SEP] and tc["first"][:11] == list(range(1, 11)) + [-1]
    assert FT.token_ids(tok, [LONG, SHORT], 12) == [[CLS, *words_of(LONG)[:10], SEP], [CLS, *words_of(SHORT), SEP]]
    assert tok.truncation is None and tok.padding is None, "the encoders must leave the tokenizer untouched"


def test_squad_questions_are_cut_at_max_question_tokens_not_the_files_max_length(tokenizer_folder):
    from eval import finetune as qa
    tok = load_tokenizer(tokenizer_folder)
    question = " ".join(WORDS[:10])
    ex = {"id": "q", "question": question, "context": " ".join(WORDS[10:40]), "answers": []}
    feats = qa.qa_features(tok, [ex], max_len=24, stride=4, max_question_tokens=8)
    assert feats[0].input_ids[:10] == [CLS, *words_of(question)[:8], SEP], \
        "the question must be cut at max_question_tokens=8 (the file's max_length is 6)"
    assert all(len(f.input_ids) == 24 for f in feats[:-1]) and PAD not in feats[-1].input_ids


def test_zeroshot_encodes_whole_texts(tokenizer_folder):
    from eval import zeroshot as Z
    for spec in (tokenizer_folder, tokenizer_folder / "tokenizer.json"):
        tok = Z.make_tokenizer(str(spec), model_spec=None)
        assert tok.encode(LONG) == words_of(LONG), "a context cut at the file's max_length scores the wrong text"
        assert tok.encode(SHORT) == words_of(SHORT), "no padding"


def test_retrieval_token_ids_cut_at_the_callers_max_len(tokenizer_folder):
    from data.tokenizer import token_ids
    ids = token_ids(load_tokenizer(tokenizer_folder), [LONG, SHORT], 12)
    assert ids == [[CLS, *words_of(LONG)[:10], SEP], [CLS, *words_of(SHORT), SEP]]


def test_encode_texts_on_a_batch_shorter_than_the_files_max_length_has_our_padding_only(tokenizer_folder):
    tok = load_tokenizer(tokenizer_folder)
    ids, mask = encode_texts(tok, [SHORT, "w3"], 64, pad_to_multiple=8)
    assert ids.tolist() == [[CLS, 6, 7, SEP] + [PAD] * 4, [CLS, 8, SEP] + [PAD] * 5]
    assert mask.sum(1).tolist() == [4, 3]
