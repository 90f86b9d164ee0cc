"""Fine-tuning evaluation (eval/finetune.py, eval/finetune_data.py): metrics on hand-checked examples, word-to-subword
alignment, SQuAD windows and post-processing, data loading (local files and a fake Hub), tiny
end-to-end fine-tuning on generated data, and the resumable grid driver."""
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

import model as M
from cli import run_cli
from eval import finetune as FT
from hf.models import from_pretrained, load_tokenizer, save_pretrained
from eval.finetune_data import (TASKS, FinetuneDataError, TaskSpec, carve_validation, load_hub_task,
                                load_local_task, read_conll, read_squad_json, read_tsv, with_paper_splits)
from fakehub import fake_hub  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# ----------------------------------------------------------------------------- a tiny encoder

FILLER = [f"w{i}" for i in range(30)]
PERSONS, CITIES, CITY_TAILS = [f"p{i}" for i in range(6)], [f"c{i}" for i in range(6)], [f"t{i}" for i in range(3)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + FILLER + PERSONS + CITIES + CITY_TAILS + ["good", "ans", "where", "is", "it"]


def word_tokenizer():
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer EuroBERT-style encoder with a word-level tokenizer, saved in HF format."""
    folder = tmp_path_factory.mktemp("tiny") / "eurobert-tiny"
    cfg = M.ModelConfig(**{**M.FAMILY_TRAITS["eurobert"], "family": "eurobert", "vocab_size": len(VOCAB),
                           "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128, "pad_id": 0, "max_seq_len": 256})
    torch.manual_seed(0)
    save_pretrained(M.Transformer(cfg), folder, tokenizer=word_tokenizer())
    return str(folder)


def sc_data(n, rng):
    """Label 1 exactly when the keyword `good` is in the sentence."""
    out = []
    for _ in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(4, 12))]
        label = rng.random() < 0.5
        if label:
            words.insert(rng.randrange(len(words) + 1), "good")
        out.append({"text": " ".join(words), "label": int(label)})
    return out


def tc_data(n, rng):
    """Tags follow token identity: p* is a person, c* t* a two-word location, the rest O."""
    out = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(rng.randint(3, 8)):
            r = rng.random()
            if r < 0.2:
                tokens.append(rng.choice(PERSONS)), tags.append("B-PER")
            elif r < 0.35:
                tokens += [rng.choice(CITIES), rng.choice(CITY_TAILS)]
                tags += ["B-LOC", "I-LOC"]
            else:
                tokens.append(rng.choice(FILLER)), tags.append("O")
        out.append({"tokens": tokens, "tags": tags})
    return out


def qa_data(n, rng, prefix="q"):
    """The answer is the word right after the marker `ans`."""
    out = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(6, 14))]
        at = rng.randrange(len(words))
        answer = rng.choice(PERSONS + CITIES)
        words[at:at] = ["ans", answer]
        context = " ".join(words)
        start = len(" ".join(words[:at + 1])) + 1
        assert context[start:start + len(answer)] == answer
        out.append({"id": f"{prefix}{i}", "question": "where is it", "context": context,
                    "answers": [{"text": answer, "start": start}]})
    return out


def splits(make, n_train, n_eval, seed=0):
    rng = random.Random(seed)
    return {"train": make(n_train, rng), "validation": make(n_eval, rng), "test": make(n_eval, rng)}


# ----------------------------------------------------------------------------- metrics: NER


def test_entity_spans_follow_conlleval_for_b_i_edge_cases():
    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "I-ORG", "B-ORG", "I-ORG"]
    # I-LOC after O starts an entity; B-LOC after I-LOC starts a new one; I-ORG after a LOC is a
    # new ORG; the last entity runs to the sentence end
    assert FT.entity_spans(tags) == [("PER", 0, 1), ("LOC", 3, 4), ("LOC", 5, 5), ("ORG", 6, 6), ("ORG", 7, 8)]
    assert FT.entity_spans(["I-MISC"]) == [("MISC", 0, 0)], "an I- at the sentence start opens an entity"
    assert FT.entity_spans(["O", "O"]) == []


def test_ner_scores_need_exact_span_and_type():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "O", "O", "B-ORG"], ["B-ORG", "O"]]
    # PER span too short and LOC typed ORG are both wrong; only sentence 2's ORG is right
    s = FT.ner_scores(gold, pred)
    assert (s["gold_entities"], s["predicted_entities"]) == (3, 3)
    assert s["precision"] == pytest.approx(1 / 3) and s["recall"] == pytest.approx(1 / 3)
    assert s["f1"] == pytest.approx(1 / 3)
    perfect = FT.ner_scores(gold, gold)
    assert perfect["f1"] == 1.0


def test_ner_scores_reject_non_bio_tags_by_name():
    with pytest.raises(ValueError, match="'S-PER'"):
        FT.ner_scores([["S-PER"]], [["O"]])


# ----------------------------------------------------------------------------- metrics: SQuAD


@pytest.mark.parametrize("raw, normalised", [
    ("The  Cat!", "cat"), ("an apple, a pear", "apple pear"), ("A.B.C.", "abc"),
    ("theater", "theater"), ("  Hello\tWorld ", "hello world")])
def test_squad_normalisation(raw, normalised):
    assert FT.normalize_answer(raw) == normalised


def test_squad_em_f1_take_the_max_over_golds():
    em, f1 = FT.question_scores("the big cat", [{"text": "cat"}, {"text": "a big cat sat"}])
    # vs "cat": P 1/2, R 1 -> 2/3;  vs "big cat sat": P 1, R 2/3 -> 0.8
    assert em == 0.0 and f1 == pytest.approx(0.8)
    assert FT.question_scores("Big Cat.", ["cat", "the big cat"]) == (1.0, 1.0)


def test_squad_no_answer_matches_only_the_empty_prediction():
    assert FT.question_scores("", []) == (1.0, 1.0)
    assert FT.question_scores("cat", []) == (0.0, 0.0)
    assert FT.question_scores("", ["cat"]) == (0.0, 0.0)
    s = FT.squad_scores({"a": "cat", "b": ""}, {"a": ["cat"], "b": []})
    assert s["exact"] == 1.0 and s["HasAns_total"] == 1 and s["NoAns_total"] == 1


def test_null_threshold_is_tuned_like_the_official_v2_sweep():
    golds = {"q1": ["paris"], "q2": [], "q3": []}
    spans = {"q1": "paris", "q2": "foo", "q3": "bar"}
    margins = {"q1": -2.0, "q2": 1.0, "q3": -1.0}   # null score minus best span score
    t, best = FT.best_null_threshold(spans, margins, golds)
    assert best == 1.0 and -2.0 <= t < -1.0
    answers = FT.apply_null_threshold(spans, margins, t)
    assert answers == {"q1": "paris", "q2": "", "q3": ""}
    assert FT.apply_null_threshold(spans, margins, 0.0)["q3"] == "bar", "threshold 0 keeps q3 answered"


def test_classification_metrics():
    assert FT.accuracy([1, 0, 1, 1], [1, 0, 0, 1]) == 0.75
    assert FT.binary_f1([1, 0, 1, 1], [1, 0, 0, 1]) == pytest.approx(0.8)  # TP 2, FP 1, FN 0


# ----------------------------------------------------------------------------- word -> sub-word


def wordpiece_tokenizer():
    vocab = {w: i for i, w in enumerate(SPECIALS + ["new", "york", "un", "##believ", "##able", "is", "big"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok


def test_tc_labels_sit_on_the_first_subword_only():
    tok = wordpiece_tokenizer()
    ex = {"tokens": ["new", "york", "is", "unbelievable"], "tags": ["B-LOC", "I-LOC", "O", "O"]}
    tag_ids = {"O": 0, "B-LOC": 1, "I-LOC": 2}
    (f,) = FT.encode_tc(tok, [ex], 64, tag_ids)
    assert tok.decode(f["ids"], skip_special_tokens=False).split()[:3] == ["[CLS]", "new", "york"]
    # [CLS] new york is un ##believ ##able [SEP]
    assert f["labels"] == [-100, 1, 2, 0, 0, -100, -100, -100]
    assert f["first"] == [1, 2, 3, 4]


def test_tc_words_cut_by_max_len_are_marked_and_predicted_o():
    tok = wordpiece_tokenizer()
    ex = {"tokens": ["new", "york", "is", "unbelievable"], "tags": ["B-LOC", "I-LOC", "O", "O"]}
    (f,) = FT.encode_tc(tok, [ex], 5, {"O": 0, "B-LOC": 1, "I-LOC": 2})
    assert len(f["ids"]) == 5 and f["first"] == [1, 2, 3, -1]


def test_leading_space_gives_byte_level_bpe_its_running_text_tokens():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the new york times is big", "new york is a big city"] * 50, trainer)
    words = ["new", "york", "times"]
    (f,) = FT.encode_tc(tok, [{"tokens": words, "tags": ["O"] * 3}], 64, {"O": 0})
    assert f["ids"] == tok.encode("new york times").ids


# ----------------------------------------------------------------------------- SQuAD windows


def test_answer_tokens_from_offsets():
    offsets = [None, (0, 3), (4, 9), (10, 12), None]
    assert FT.answer_tokens(offsets, 4, 12) == (2, 3)
    assert FT.answer_tokens(offsets, 0, 3) == (1, 1)
    assert FT.answer_tokens(offsets, 4, 20) is None, "an answer running past the window is absent"


def long_context_example():
    words = [f"w{i % 30}" for i in range(40)]
    words[25:25] = ["ans", "p3"]
    context = " ".join(words)
    start = context.index(" p3") + 1
    return {"id": "x", "question": "where is it", "context": context, "answers": [{"text": "p3", "start": start}]}


def test_doc_stride_windows_label_the_window_holding_the_answer():
    tok = word_tokenizer()
    ex = long_context_example()
    feats = FT.qa_features(tok, [ex], max_len=20, stride=6, max_question_tokens=4)
    assert len(feats) > 2 and all(len(f.input_ids) <= 20 for f in feats)
    labelled = [f for f in feats if f.start != FT.NULL_INDEX]
    assert labelled, "some window holds the answer"
    for f in labelled:
        assert f.start == f.end and tok.id_to_token(f.input_ids[f.start]) == "p3"
    for f in feats:
        if f.start == FT.NULL_INDEX:
            ctx = [o for o in f.offsets if o is not None]
            s = ex["answers"][0]["start"]
            assert not (ctx[0][0] <= s and s + 2 <= ctx[-1][1]), "an unlabelled window must not hold the answer"
    # consecutive windows overlap by `stride` context tokens
    ctx0 = [o for o in feats[0].offsets if o is not None]
    ctx1 = [o for o in feats[1].offsets if o is not None]
    assert ctx0[-6:] == ctx1[:6]


def test_postprocessing_recovers_the_answer_text_from_offsets():
    tok = word_tokenizer()
    ex = long_context_example()
    feats = FT.qa_features(tok, [ex], max_len=20, stride=6, max_question_tokens=4)
    starts = [np.zeros(len(f.input_ids)) for f in feats]
    ends = [np.zeros(len(f.input_ids)) for f in feats]
    k = next(i for i, f in enumerate(feats) if f.start != FT.NULL_INDEX)
    starts[k][feats[k].start], ends[k][feats[k].end] = 5.0, 5.0
    texts, margins = FT.best_spans([ex], feats, starts, ends)
    assert texts == {"x": "p3"} and margins["x"] < 0
    # a span longer than max_answer_tokens is never chosen
    starts[k][feats[k].start - 2] = 9.0
    texts, _ = FT.best_spans([ex], feats, starts, ends, max_answer_tokens=2)
    assert texts == {"x": "p3"}
    # a confident null position makes the v2 answer empty
    for s in starts:
        s[0] = 50.0
    texts, margins = FT.best_spans([ex], feats, starts, ends)
    assert FT.apply_null_threshold(texts, margins, 0.0) == {"x": ""}


def test_stride_must_leave_room_in_the_window():
    with pytest.raises(ValueError, match="stride"):
        FT.qa_features(word_tokenizer(), [long_context_example()], max_len=16, stride=10, max_question_tokens=4)


# ----------------------------------------------------------------------------- heads


def test_pooling_ignores_padding_and_late_averages_token_logits():
    torch.manual_seed(0)
    h = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    for pooling in ("mean", "bos", "late"):
        head = FT.PooledClassifier(8, 3, pooling)
        h2 = h.clone()
        h2[0, 3:] = 100.0  # padding content must not matter
        torch.testing.assert_close(head(h, mask), head(h2, mask), msg=pooling)
    late = FT.PooledClassifier(8, 3, "late")
    per_token = late.out(torch.nn.functional.gelu(late.dense(h[0, :3])))
    torch.testing.assert_close(late(h, mask)[0], per_token.mean(0))


def test_causal_option_keeps_the_causal_mask(tiny_model):
    enc = from_pretrained(tiny_model)
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    ids2 = ids.clone()
    ids2[0, 3] = 20
    mask = torch.ones_like(ids)
    outs = {}
    for causal in (False, True):
        m = FT.FinetuneModel(from_pretrained(tiny_model), FT.TokenClassifier(64, 3), causal=causal).eval()
        with torch.no_grad():
            outs[causal] = (m(ids, mask)[0, 1], m(ids2, mask)[0, 1])
    assert not torch.allclose(*outs[False]), "bidirectional: token 1 sees token 3"
    torch.testing.assert_close(*outs[True], msg="causal: token 1 must not see token 3")
    assert enc.config.causal is False


def test_segment_ids_reach_only_models_with_segment_embeddings(tiny_model):
    ids, mask = torch.tensor([[2, 10, 3, 11, 12, 3]]), torch.ones(1, 6, dtype=torch.long)
    types = torch.tensor([[0, 0, 0, 1, 1, 1]])
    torch.manual_seed(0)
    bert = M.Transformer(M.ModelConfig(**{**M.FAMILY_TRAITS["bert"], "family": "bert", "vocab_size": len(VOCAB),
                                          "d_model": 32, "n_layers": 1, "n_heads": 4, "d_ff": 64,
                                          "type_vocab_size": 2, "max_seq_len": 64, "pad_id": 0}))
    for encoder, uses_types in ((bert, True), (from_pretrained(tiny_model), False)):
        m = FT.FinetuneModel(encoder, FT.SpanHead(encoder.config.d_model)).eval()
        with torch.no_grad():
            same = torch.equal(m(ids, mask, token_type_ids=types)[0], m(ids, mask)[0])
        assert same != uses_types, encoder.config.family


# ----------------------------------------------------------------------------- tiny end-to-end


def quick_cfg(**kw):
    return FT.FinetuneConfig(**{"lr": 2e-3, "steps": 120, "batch_size": 16, "max_len": 64,
                                "doc_stride": 16, "progress": False, "device": "cpu", **kw})


def test_sequence_classification_learns_the_keyword(tiny_model):
    data = splits(sc_data, 600, 120)
    r = FT.finetune(from_pretrained(tiny_model), load_tokenizer(tiny_model),
                    TaskSpec("kw", "sc", "accuracy"), data, quick_cfg())
    assert r["test"]["accuracy"] > 0.85, f"chance is 0.5; got {r['test']}"
    assert r["train"]["last_loss"] < r["train"]["first_loss"]


def test_token_classification_learns_tags_in_one_epoch(tiny_model):
    data = splits(tc_data, 1200, 100)
    r = FT.finetune(from_pretrained(tiny_model), load_tokenizer(tiny_model),
                    TaskSpec("ner", "tc", "f1"), data, quick_cfg(lr=3e-3))
    assert r["train"]["steps"] == 1200 // 16 + (1200 % 16 > 0), "TC trains for one epoch"
    assert r["test"]["f1"] > 0.8, f"entity F1 of untrained tags is ~0; got {r['test']}"


def test_span_extraction_learns_the_marker(tiny_model):
    data = splits(qa_data, 800, 100)
    r = FT.finetune(from_pretrained(tiny_model), load_tokenizer(tiny_model),
                    TaskSpec("marker", "qa", "f1"), data, quick_cfg(steps=200, lr=3e-3, max_question_tokens=4))
    # chance: one of ~10-16 context words
    assert r["test"]["exact"] > 0.6, r["test"]


def test_span_extraction_v2_tunes_the_null_threshold(tiny_model):
    rng = random.Random(1)

    def mixed(n, rng):
        out = qa_data(n, rng)
        for ex in out[::2]:  # remove the marker: unanswerable
            ex["context"] = ex["context"].replace("ans ", "w1 ")
            ex["answers"] = []
        return out

    data = {"train": mixed(800, rng), "validation": mixed(100, rng), "test": mixed(100, rng)}
    r = FT.finetune(from_pretrained(tiny_model), load_tokenizer(tiny_model),
                    TaskSpec("marker2", "qa", "f1"), data, quick_cfg(steps=200, lr=3e-3, max_question_tokens=4))
    assert "null_threshold" in r["validation"] and r["test"]["NoAns_total"] == 50
    assert r["test"]["f1"] > 0.6, r["test"]


def test_bf16_autocast_path_trains_and_scores(tiny_model):
    """The CUDA recipe (bf16 autocast, fp32 weights) exercised on the CPU's autocast."""
    data = splits(sc_data, 200, 40)
    r = FT.finetune(from_pretrained(tiny_model), load_tokenizer(tiny_model),
                    TaskSpec("kw", "sc", "accuracy"), data, quick_cfg(steps=60, bf16=True, pooling="late"))
    assert np.isfinite(r["train"]["last_loss"]) and r["test"]["accuracy"] > 0.75, r


# ----------------------------------------------------------------------------- local data files


def test_tsv_reader_with_header_and_clear_errors(tmp_path):
    f = tmp_path / "train.tsv"
    f.write_text("sentence\tlabel\nit is good \t1\nbad\t0\n")
    assert read_tsv(f, TASKS["sst2"]) == [{"text": "it is good", "label": 1}, {"text": "bad", "label": 0}]
    f.write_text("sentence\tlabel\nfine\t1\nno label here\n")
    with pytest.raises(FinetuneDataError, match=r"train.tsv, line 3: 1 fields but the header has 2"):
        read_tsv(f, TASKS["sst2"])


def test_a_label_that_is_not_a_class_id_names_the_file_line_and_value(tmp_path):
    f = tmp_path / "train.tsv"
    f.write_text("sentence\tlabel\ngood film\t1\nbad film\tpositive\n")
    with pytest.raises(FinetuneDataError, match=r"train.tsv, line 3: label 'positive' is not a class id of sst2"):
        read_tsv(f, TASKS["sst2"])
    f.write_text("good film\tpos\nbad film\t0\n")  # a task of one's own takes names, but not mixed with ids
    with pytest.raises(FinetuneDataError, match=r"train.tsv, line 2: label '0', but .*train.tsv, line 1 has the label 'pos'"):
        read_tsv(f, TaskSpec("mine", "sc", "accuracy"))


def test_cli_says_error_for_bad_labels_and_missing_model_folders(tiny_model, tmp_path, monkeypatch, capsys):
    """`error: ...` and exit status 2, no traceback: a bad label in a local TSV names its file, line
    and value; a mistyped model folder is said not to exist (not to lack a tokenizer.json)."""
    monkeypatch.delenv("REPRLAB_TRACEBACK", raising=False)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "sst2"
    folder.mkdir()
    (folder / "train.tsv").write_text("sentence\tlabel\ngood film\t1\nbad film\tpositive\n")
    (folder / "dev.tsv").write_text("sentence\tlabel\nfine film\t1\n")
    for models, tasks, said in ((tiny_model, f"sst2={folder}", f"{folder / 'train.tsv'}, line 3: label 'positive'"),
                                ("out/nosuch", "sst2", f"model folder 'out/nosuch' (relative to the current "
                                                       f"directory {Path.cwd()}) does not exist")):
        with pytest.raises(SystemExit) as stop:
            run_cli(FT.main, ["--models", models, "--tasks", tasks, "--out", str(tmp_path / "o"), "--steps", "1",
                              "--lrs", "1e-3", "--seeds", "0", "--device", "cpu"])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(f"error: {said}"), err


def test_conll_reader(tmp_path):
    f = tmp_path / "train.conll"
    f.write_text("-DOCSTART- -X- O O\n\nEU NNP B-ORG\nrejects VBZ O\n\nPeter NNP B-PER\nBlackburn NNP I-PER\n")
    assert read_conll(f) == [{"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]},
                             {"tokens": ["Peter", "Blackburn"], "tags": ["B-PER", "I-PER"]}]
    f.write_text("EU NNP B-ORG\nrejects O\n")
    with pytest.raises(FinetuneDataError, match=r"line 2: 2 fields where earlier lines have 3"):
        read_conll(f)


def test_squad_json_reader_checks_answer_offsets(tmp_path):
    f = tmp_path / "dev.json"
    para = {"context": "Paris is in France.", "qas": [
        {"id": "1", "question": "where?", "answers": [{"text": "France", "answer_start": 12}]},
        {"id": "2", "question": "who?", "answers": [], "is_impossible": True}]}
    f.write_text(json.dumps({"data": [{"paragraphs": [para]}]}))
    out = read_squad_json(f)
    assert out[0]["answers"] == [{"text": "France", "start": 12}] and out[1]["answers"] == []
    para["qas"][0]["answers"][0]["answer_start"] = 3
    f.write_text(json.dumps({"data": [{"paragraphs": [para]}]}))
    with pytest.raises(FinetuneDataError, match=r"qas\[0\].*not at character 3"):
        read_squad_json(f)


def test_record_rows_become_spans_of_their_answer_entities():
    from eval.finetune_data import qa_example
    passage = "Obama met Merkel in Berlin. Later Merkel left."
    row = {"passage": passage, "query": "@placeholder met Obama", "answers": ["Merkel"],
           "entity_spans": {"text": ["Obama", "Merkel", "Berlin", "Merkel"], "start": [0, 10, 20, 34],
                            "end": [4, 15, 25, 39]}, "idx": {"passage": 3, "query": 7}}
    ex = qa_example(row, "here")
    assert ex["id"] == "3-7" and ex["question"] == "@placeholder met Obama"
    assert ex["answers"] == [{"text": "Merkel", "start": 10}, {"text": "Merkel", "start": 34}]


def test_jsonl_errors_name_the_line(tmp_path):
    d = tmp_path / "ner"
    d.mkdir()
    (d / "train.jsonl").write_text('{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["b"], "tags": \n')
    with pytest.raises(FinetuneDataError, match=r"train.jsonl, line 2: invalid JSON"):
        load_local_task(d, TaskSpec("ner", "tc", "f1"))


def test_paper_splits_carve_validation_and_use_dev_as_test():
    train = list(range(1000))
    kept, held = carve_validation(train)
    assert len(held) == 50 and len(kept) == 950 and not set(kept) & set(held)
    assert carve_validation(train) == (kept, held), "the split is seeded"
    s = with_paper_splits({"train": train, "validation": ["d1", "d2"]}, "here")
    assert s["test"] == ["d1", "d2"] and len(s["validation"]) == 50


def test_real_sst2_folder_loads_with_the_paper_splits(shared_data):
    data = load_local_task(shared_data / "labeled" / "sst2", TASKS["sst2"])
    assert len(data["test"]) == 872, "GLUE SST-2 validation is the test set"
    assert len(data["train"]) + len(data["validation"]) == 67349
    assert len(data["validation"]) == 67349 - int(0.95 * 67349)
    assert {ex["label"] for ex in data["test"]} == {0, 1}


def test_real_checkpoint_learns_real_sst2(shared_data):
    """A real (tiny SPLADE BERT) checkpoint and its tokenizer on 4 000 real SST-2 phrases, 50 steps."""
    sst2 = load_local_task(shared_data / "labeled" / "sst2", TASKS["sst2"])
    data = {"train": sst2["train"][:4000], "validation": sst2["validation"][:200], "test": sst2["test"]}
    ckpt = str(shared_data / "models" / "splade-tiny")
    r = FT.finetune(from_pretrained(ckpt), load_tokenizer(ckpt), TASKS["sst2"], data,
                    quick_cfg(lr=5e-4, steps=50, batch_size=32, max_len=48))
    # the majority class of SST-2 dev is 51 %; this run reaches ~72 %
    assert r["test"]["accuracy"] > 0.62, r["test"]


# ----------------------------------------------------------------------------- the Hub (fake)


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def test_hub_table_tasks_load_from_parquet(fake_hub):
    rows = {"sentence": [f"s{i}" for i in range(40)], "label": [i % 2 for i in range(40)], "idx": list(range(40))}
    fake_hub.add_file("nyu-mll/glue", "sst2/train-00000-of-00001.parquet", parquet_bytes(pa.table(rows)), repo_type="dataset")
    fake_hub.add_file("nyu-mll/glue", "sst2/validation-00000-of-00001.parquet",
                      parquet_bytes(pa.table({k: v[:6] for k, v in rows.items()})), repo_type="dataset")
    fake_hub.add_file("nyu-mll/glue", "qqp/train-00000-of-00001.parquet", b"not used", repo_type="dataset")
    data = load_hub_task(TASKS["sst2"])
    assert (len(data["train"]), len(data["validation"]), len(data["test"])) == (38, 2, 6)
    assert data["test"][0] == {"text": "s0", "label": 0}


def test_hub_tc_labels_come_from_the_parquet_classlabel_metadata(fake_hub):
    names = ["O", "B-X", "I-X"]
    features = {"tokens": {"feature": {"dtype": "string", "_type": "Value"}, "_type": "Sequence"},
                "ner_tags": {"feature": {"names": names, "_type": "ClassLabel"}, "_type": "Sequence"}}
    table = pa.table({"tokens": [["a", "b"], ["c"]], "ner_tags": [[1, 2], [0]]})
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    for split in ("train", "validation", "test"):
        fake_hub.add_file("org/ner", f"data/{split}-00000-of-00001.parquet", parquet_bytes(table), repo_type="dataset")
    spec = TaskSpec("ner", "tc", "f1", "org/ner", files={s: f"*{s}*.parquet" for s in ("train", "validation", "test")})
    data = load_hub_task(spec)
    assert data["train"][0] == {"tokens": ["a", "b"], "tags": ["B-X", "I-X"]}


def test_hub_missing_files_say_what_the_repo_has(fake_hub):
    fake_hub.add_file("org/other", "weird/name.parquet", parquet_bytes(pa.table({"a": [1]})), repo_type="dataset")
    spec = TaskSpec("x", "sc", "accuracy", "org/other", files={"train": "sst2/train-*.parquet"})
    with pytest.raises(FinetuneDataError, match=r"weird/name.parquet.*--tasks x=DIR"):
        load_hub_task(spec)


# ----------------------------------------------------------------------------- the grid driver


def write_sc_folder(folder: Path, seed=0):
    folder.mkdir(parents=True)
    rng = random.Random(seed)
    for name, n in (("train", 300), ("dev", 60)):
        rows = sc_data(n, rng)
        (folder / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows))
    return folder


def test_grid_driver_resumes_without_redoing_finished_runs(tiny_model, tmp_path):
    task = f"sc:kw={write_sc_folder(tmp_path / 'kw')}"
    out = tmp_path / "out"
    cfg = quick_cfg(steps=4)
    first = FT.run_grid([tiny_model], [task], lrs=(1e-3, 5e-4), seeds=(0, 1), out=out, cfg=cfg)
    assert (first["executed"], first["skipped"]) == (4, 0)
    second = FT.run_grid([tiny_model], [task], lrs=(1e-3, 5e-4), seeds=(0, 1), out=out, cfg=cfg)
    assert (second["executed"], second["skipped"]) == (0, 4)
    FT.run_path(out, tiny_model, "kw", 5e-4, 1).unlink()
    third = FT.run_grid([tiny_model], [task], lrs=(1e-3, 5e-4), seeds=(0, 1), out=out, cfg=cfg)
    assert (third["executed"], third["skipped"]) == (1, 3)
    assert (out / "results.md").exists() and (out / "results.csv").read_text().count("\n") == 2


def test_table_picks_the_lr_by_validation_and_reports_test_mean_std(tmp_path):
    spec = TaskSpec("t", "sc", "accuracy")
    scores = {1e-4: ([0.90, 0.92], [0.50, 0.60]), 1e-3: ([0.80, 0.80], [0.95, 0.95])}  # (validation, test)
    for lr, (vals, tests) in scores.items():
        for seed, (v, t) in enumerate(zip(vals, tests)):
            FT.write_json_atomic(FT.run_path(tmp_path, "m", "t", lr, seed),
                                 {"validation": {"accuracy": v}, "test": {"accuracy": t}, "done": True})
    (row,) = FT.summarize(tmp_path, ["m"], [spec], (1e-4, 1e-3), (0, 1))
    assert row["best_lr"] == 1e-4, "the lr is chosen on validation, never on test"
    assert row["test_mean"] == pytest.approx(55.0) and row["test_std"] == pytest.approx(np.std([50, 60], ddof=1))
    assert "55.0 ± 7.1 (lr 0.0001)" in FT.format_table([row])


def test_cli_runs_as_a_module_and_as_a_script(tiny_model, tmp_path):
    task = f"sc:kw={write_sc_folder(tmp_path / 'kw')}"
    FT.main(["--models", tiny_model, "--tasks", task, "--lrs", "1e-3", "--seeds", "0", "--steps", "3",
             "--max-len", "32", "--out", str(tmp_path / "o"), "--device", "cpu"])
    assert FT.finished(FT.run_path(tmp_path / "o", tiny_model, "kw", 1e-3, 0))
    for cmd in ([sys.executable, "eval/finetune.py", "--help"], [sys.executable, "-m", "eval.finetune", "--help"]):
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "--models" in r.stdout, r.stderr


# ----------------------------------------------------------------------------- retrieval


def test_contrastive_loss_prefers_the_paired_passage():
    q = torch.nn.functional.normalize(torch.eye(4), dim=-1)
    assert FT.contrastive_loss(q, q) < FT.contrastive_loss(q, q.roll(1, dims=0))


def write_beir_folder(folder: Path, n=24):
    """Query i asks for person p(i%6) in city c(i//6); doc i mentions exactly that pair."""
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "text": f"w1 {PERSONS[i % 6]} w2 {CITIES[i // 6]} w3"} for i in range(n)]
    queries = [{"_id": f"q{i}", "text": f"{PERSONS[i % 6]} {CITIES[i // 6]}"} for i in range(n)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(n)))
    return folder


def test_ir_grid_trains_once_and_evaluates_every_set(tiny_model, tmp_path, monkeypatch):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{PERSONS[i % 6]} {CITIES[i // 6 % 6]}\tw1 {PERSONS[i % 6]} w2 {CITIES[i // 6 % 6]} w3\n"
                             for i in range(200)))
    a, b = write_beir_folder(tmp_path / "a"), write_beir_folder(tmp_path / "b")
    trained = []
    real = FT.train_biencoder
    monkeypatch.setattr(FT, "train_biencoder", lambda *x, **k: trained.append(1) or real(*x, **k))
    result = FT.run_grid([tiny_model], [f"nq={a}", f"mldr={b}"], lrs=(2e-3,), seeds=(0,), out=tmp_path / "o",
                         cfg=quick_cfg(steps=60), ir_train=str(pairs))
    assert result["executed"] == 2 and len(trained) == 1, "one training run serves both sets"
    run = json.loads(FT.run_path(tmp_path / "o", tiny_model, "nq", 2e-3, 0).read_text())
    assert run["test"]["documents"] == 24 and run["validation"]["queries"] == 12
    # random ranking of 24 docs with one relevant each gives nDCG@10 ~ 0.2
    assert run["test"]["nDCG@10"] > 0.5, run["test"]


def test_two_runs_step_folders_never_share_results(tmp_path):
    """out/clm/checkpoints/step_N/model and out/mlm/checkpoints/step_N/model map to two results
    folders: one folder would skip the second model as finished and report it with the first's."""
    a = tmp_path / "clm" / "checkpoints" / "step_00000100" / "model"
    b = tmp_path / "mlm" / "checkpoints" / "step_00000100" / "model"
    assert FT.model_slug(str(a)) != FT.model_slug(str(b))
    assert FT.model_slug(str(a)) == FT.model_slug(str(a)), "stable, so a rerun finds its finished runs"
    assert FT.model_slug("hf:EuroBERT/EuroBERT-210m") == "EuroBERT--EuroBERT-210m"
