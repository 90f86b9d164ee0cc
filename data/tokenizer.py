"""Tokenizers: reading a tokenizer.json, and turning texts into padded batches of ids.

A tokenizer.json's own truncation and padding never apply: most BERT-family files carry
`"truncation": {"max_length": 512}` and a padding section, which would cut every document at 512
tokens in data preparation and write [PAD] ids into the shards.
"""
import contextlib
import sys
from pathlib import Path

from tokenizers import Tokenizer

from cli import MissingInput, UserError, where


class TokenizerFileError(UserError, ValueError):
    """A tokenizer.json the tokenizers library cannot read (truncated, corrupt, of a newer format)."""


def open_tokenizer(path) -> Tokenizer:
    """A tokenizer.json with its own truncation and padding switched off."""
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises bare Exceptions ("EOF while parsing a value at line 1...")
        if not Path(path).is_file():
            raise MissingInput(f"tokenizer file {where(path)} does not exist") from None
        raise TokenizerFileError(f"{path}: not a readable tokenizer.json ({e}); the file is truncated or corrupt, "
                                 "or of a newer tokenizers format: download it (or save it) again") from None
    tok.no_truncation()
    tok.no_padding()
    return tok


def shards_tokenizer(shards, source=None):
    """The tokenizer.json their preparation kept beside a set of token shards, of the vocabulary size their
    headers record. None when unknown (tiktoken shards, shards in several folders), and when the model folder
    `source` holds the same file (its tokenizer files are then the ones to ship)."""
    folders = {Path(p).parent for p in shards.paths}
    path = folders.pop() / "tokenizer.json" if len(folders) == 1 else None
    if path is None or not path.is_file():
        return None
    if source and (Path(source) / "tokenizer.json").is_file() and \
            (Path(source) / "tokenizer.json").read_bytes() == path.read_bytes():
        return None
    n = max(open_tokenizer(path).get_vocab(with_added_tokens=True).values()) + 1
    if shards.vocab_size is not None and n != shards.vocab_size:
        print(f"note: {path} has {n} ids, but the shards beside it were written by a tokenizer of "
              f"{shards.vocab_size}: checkpoints will not carry it (set --tokenizer to the right one)", file=sys.stderr)
        return None
    return path


@contextlib.contextmanager
def truncated(tokenizer, max_len, **options):
    """Inside the block the tokenizer cuts at `max_len` (its template's special tokens counted); never pads."""
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_len, **options)
    try:
        yield tokenizer
    finally:
        tokenizer.no_truncation()


def token_ids(tokenizer, texts, max_len, batch=4096):
    """The ids of every text with the tokenizer's own template ([CLS] ... [SEP], a BOS...), cut at max_len."""
    texts = list(texts)
    with truncated(tokenizer, max_len):
        return [e.ids for s in range(0, len(texts), batch) for e in tokenizer.encode_batch(texts[s:s + batch])]


def pad_id(tokenizer, default=0):
    pad = getattr(getattr(tokenizer, "special", None), "pad", None)
    return default if pad is None else pad


def pad_batch(seqs, pad, pad_to=None, device="cpu", fill=None, multiple=None):
    """(ids, attention mask) int64 tensors: `seqs` right-padded with `pad` (or `fill`, for labels) to
    the longest, rounded up to a `multiple`, or to `pad_to` (longer sequences cut there)."""
    import torch
    T = pad_to or max((len(s) for s in seqs), default=0)
    if multiple and not pad_to:
        T = -(-T // multiple) * multiple
    ids = torch.full((len(seqs), T), pad if fill is None else fill, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        n = min(len(s), T)
        ids[i, :n] = torch.as_tensor(s[:n], dtype=torch.long)
        mask[i, :n] = 1
    return ids.to(device), mask.to(device)


def encode_texts(tokenizer, texts, max_len, pad_to_multiple=8, device="cpu"):
    """(input_ids, attention_mask) of a batch of texts: the tokenizer's template, cut at max_len, right-padded
    to a multiple of `pad_to_multiple` (at most max_len)."""
    ids = token_ids(tokenizer, texts, max_len)
    longest = max((len(x) for x in ids), default=0)
    T = min(max_len, -(-longest // pad_to_multiple) * pad_to_multiple) if pad_to_multiple else longest
    return pad_batch(ids, pad_id(tokenizer), pad_to=T, device=device)
