"""The learned-position limit is one property of the model config, ModelConfig.position_limit
(issue 36), and every reader of a length takes it from there: training.check_length (both training
scripts), hf.models.sparse_encoder_max_seq_length (the exported SparseEncoder's length),
eval/finetune.model_max_len (fine-tuning) and eval/retrieval's encoder. RoBERTa's table has
pad_id + 1 rows more than the tokens it holds (fairseq ids count real tokens from padding_idx + 1):
514 rows are 512 tokens. Two callers used to read max_seq_len itself, so 513 and 514 tokens passed
their check and indexed past the table."""
import json

import pytest
import torch

import model as M
import training
from cli import ConfigError
from eval import retrieval as R
from eval.finetune import FinetuneConfig, model_max_len
from hf.models import model_max_seq_length, sparse_encoder_max_seq_length, write_sparse_encoder_files

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's order: pad_id 1
WORDS = [f"w{i}" for i in range(40)]


def roberta_shaped():
    """A tiny RoBERTa as from_pretrained reads roberta-base: 514 position rows, pad_id 1."""
    torch.manual_seed(0)
    cfg = M.ModelConfig(**{**M.FAMILY_TRAITS["roberta"], "family": "roberta", "vocab_size": len(SPECIALS) + len(WORDS),
                           "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "max_seq_len": 514,
                           "type_vocab_size": 1, "pad_id": 1, "bos_id": 0, "eos_id": 2, "mask_id": 4})
    return M.Transformer(cfg).eval()


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return tok


@pytest.fixture(scope="module")
def roberta():
    return roberta_shaped()


def real_tokens(n):
    return torch.tensor([[0] + [5 + i % len(WORDS) for i in range(n - 2)] + [2]])


def test_the_limit_is_what_the_table_holds(roberta):
    assert roberta.config.position_limit == 512
    roberta(real_tokens(512))  # 512 real tokens: positions 2 .. 513, the table's last row
    with pytest.raises(IndexError):
        roberta(real_tokens(513))  # position 514: past the table, what each check below prevents
    bert = M.ModelConfig(**{**M.FAMILY_TRAITS["bert"], "family": "bert", "max_seq_len": 512, "pad_id": 0})
    assert bert.position_limit == 512, "BERT's positions start at 0: every row is a token"
    assert M.ModelConfig(family="llama", max_seq_len=2048).position_limit is None, "RoPE: no table"


def test_training_check_length_takes_512_and_refuses_513(roberta):
    training.check_length(roberta.config, "doc_max_len", 512)
    with pytest.raises(ConfigError, match="doc_max_len=513: the roberta model has learned positions for 512 tokens"):
        training.check_length(roberta.config, "doc_max_len", 513)


def test_sparse_encoder_length_is_512_and_a_513_in_the_folder_is_cut_to_it(roberta, tmp_path):
    assert sparse_encoder_max_seq_length(roberta.config) == 512
    assert model_max_seq_length(None, roberta.config)[0] == 512
    for written, read in ((512, 512), (513, 512)):
        write_sparse_encoder_files(tmp_path, roberta, written)
        assert json.loads((tmp_path / "sentence_bert_config.json").read_text())["max_seq_length"] == written
        assert model_max_seq_length(tmp_path, roberta.config) == (read, "its sentence_bert_config.json")


def test_finetuning_length_is_capped_at_512(roberta):
    assert model_max_len(roberta, FinetuneConfig(max_len=512)) == 512
    assert model_max_len(roberta, FinetuneConfig(max_len=513)) == 512
    assert model_max_len(roberta, FinetuneConfig(max_len=128)) == 128


def test_retrieval_encodes_512_tokens_and_refuses_513(roberta):
    text = " ".join(WORDS * 13)  # 520 words: cut at max_len
    vectors = R.encode_sparse(roberta, tokenizer(), [text], max_len=512)
    assert vectors.shape == (1, roberta.config.vocab_size) and vectors.nnz > 0
    with pytest.raises(ValueError, match="max_len=513: this model has learned positions for 512 tokens"):
        R.encode_sparse(roberta, tokenizer(), [text], max_len=513)
