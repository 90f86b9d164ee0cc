"""One plain-text file as train/validation token shards for train_lm.py, with a byte-level BPE
trained on the training part only: a small corpus for CPU experiments that needs no download.

    python -m data.text_corpus data/repro/text/tinyshakespeare.txt --out out/data/shakespeare
    python -m data.text_corpus data/repro/text/movie_reviews.txt --out out/data/reviews \\
        --documents line --split shuffle --special-tokens "<|begin_of_text|>,<|end_of_text|>,<|mask|>,<|pad|>"

Every choice changes the data, so each is an argument:
1. Documents: blank-line-separated paragraphs with their line breaks (`documents="paragraph"`, as
   data/fineweb_edu.py reads .txt), or one per non-empty line, stripped (`documents="line"`).
2. Split, whole documents only: `split="tail"` holds out the last `val_fraction` of the characters
   from the first blank line after the cut (as nanoGPT's Shakespeare); `split="shuffle"` holds out
   `val_fraction` of the documents shuffled with `seed` (a file sorted by label must not give a
   validation set of one kind).
3. Tokenizer: a byte-level BPE (GPT-2's regex and byte alphabet: no unknown tokens) of `vocab_size`
   ids: `special_tokens` first (the first is the document delimiter), the 256 bytes, then merges
   seen at least `min_frequency` times; `delimiter_template=True` also puts the delimiter before
   every text it encodes. No truncation, no padding (checked, also on a reused tokenizer.json).
4. Shards: data/fineweb_edu.py's `prepare` of documents.jsonl (validation documents first) with
   shard_tokens = the validation token count, so PREFIX_val_000000.bin is exactly the validation set
   (verified: the token counts, one delimiter per document).

The same settings again reuse the folder (an interrupted one is completed); other settings are
refused naming the difference. corpus.json holds the settings, the text by content hash (a copy of
the text is the same corpus). One writer per folder (PREPARE.lock).
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python data/x.py): the repo root, not data/, first on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import io
import json
import math

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from data import manifest
from data.atomic import write_json, write_text
from data.fineweb_edu import (PreparationError, encode_documents, lock_out, make_encoder, prepare,
                               resolve_tokenizer, txt_paragraphs, utf8_text)
from data.shards import read_shard

PREFIX = "corpus"
# The shards of train_lm.py's `shards_from_text` (data/preflight.py) and of this command by default: a
# byte-level BPE of 2 048 ids, the document delimiter first (id 0, eos_id of the tiny configs), then a
# mask token (id 1, their mask_id); the quick start prepares the sample text the same way.
TEXT_VOCAB_SIZE, TEXT_SPECIAL_TOKENS = 2048, ("<|endoftext|>", "<|mask|>")


def paragraphs(text: str) -> list[str]:
    """Blank-line-separated paragraphs with their line breaks, as data/fineweb_edu.py reads a .txt file."""
    return [doc for _, _, doc, _ in txt_paragraphs(io.BytesIO(text.encode()), "text", cuts="")]


def read_documents(text: str, documents: str) -> list[str]:
    if documents == "paragraph":
        return paragraphs(text)
    if documents == "line":
        return [line.strip() for line in text.splitlines() if line.strip()]
    raise PreparationError(f"documents={documents!r}: use 'paragraph' (documents separated by blank lines) or "
                           "'line' (one document per line)")


def split_documents(text, documents, split, val_fraction, seed):
    """(training text for the tokenizer, training documents, validation documents)."""
    if split == "tail":
        cut = text.find("\n\n", int(len(text) * (1 - val_fraction)))
        if cut < 0 or not text[cut:].strip():
            raise PreparationError(f"no blank line after {1 - val_fraction:.0%} of the text, so no whole paragraph "
                                   "is left for validation; separate documents by blank lines, or split='shuffle'")
        train_text = text[:cut + 1]
        return [train_text], read_documents(train_text, documents), read_documents(text[cut + 2:], documents)
    if split == "shuffle":
        docs = read_documents(text, documents)
        if len(docs) < 2:
            raise PreparationError(f"{len(docs)} document(s) (documents={documents!r}); a training and a validation "
                                   "set need at least 2")
        order = np.random.default_rng(seed).permutation(len(docs))
        n_val = min(len(docs) - 1, max(1, math.floor(val_fraction * len(docs))))
        train = [docs[i] for i in order[n_val:]]
        return train, train, [docs[i] for i in order[:n_val]]
    raise PreparationError(f"split={split!r}: use 'tail' (the end of the text) or 'shuffle' (random documents)")


def train_bpe(texts, vocab_size, special_tokens, min_frequency=0, delimiter_template=False) -> Tokenizer:
    """A byte-level BPE of `vocab_size` ids trained on `texts`, special tokens first; no truncation, no padding."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    if delimiter_template:
        d = special_tokens[0]
        tok.post_processor = processors.TemplateProcessing(single=f"{d} $A", pair=f"{d} $A {d}:1 $B:1",
                                                           special_tokens=[(d, tok.token_to_id(d))])
    return tok  # a new Tokenizer neither truncates nor pads


def prepare_text_corpus(text_file, out_dir, vocab_size=2048, special_tokens=("<|endoftext|>",), val_fraction=0.1,
                        documents="paragraph", split="tail", seed=0, min_frequency=0, delimiter_template=False,
                        workers=0, finished_only=False) -> dict | None:
    """Tokenizer and shards of `text_file` in `out_dir` (module docstring); returns corpus.json's record.
    finished_only: write nothing, take no lock; that record if `out_dir` holds a finished corpus, else None."""
    text_file, out = Path(text_file), Path(out_dir)
    if not text_file.is_file():
        raise PreparationError(f"{text_file}: no such file; give the path of a UTF-8 text file")
    special_tokens = list(special_tokens)
    if not special_tokens or len(set(special_tokens)) != len(special_tokens):
        raise PreparationError(f"special_tokens={special_tokens}: give distinct tokens, the document delimiter first")
    if vocab_size < len(special_tokens) + 256 + 1:
        raise PreparationError(f"vocab_size={vocab_size}: a byte-level BPE needs the {len(special_tokens)} special "
                               "token(s) + 256 byte symbols + some merges")
    if not 0 < val_fraction < 1:
        raise PreparationError(f"val_fraction={val_fraction}: must be in (0, 1)")
    # the text by its content hash, not by its path: a copy is the same text
    settings = {"text": manifest.sha256(text_file),
                "vocab_size": vocab_size, "special_tokens": special_tokens, "val_fraction": val_fraction,
                "documents": documents, "split": split, "seed": seed, "min_frequency": min_frequency,
                "delimiter_template": delimiter_template}
    meta_path = out / "corpus.json"
    if finished_only:
        meta = manifest.read_json(meta_path)
        if meta is None or "shards" not in meta:
            return None
        refuse_other_settings(out, meta, settings)
        return meta
    with open(text_file, "rb") as f:
        utf8_text(text_file, f.read(1 << 16))  # a text of another encoding is refused before `out` is made
    out.mkdir(parents=True, exist_ok=True)
    lock = lock_out(out)  # one writer: the tokenizer, documents.jsonl and the shards
    try:
        return _prepare_locked(text_file, out, meta_path, settings, workers)
    finally:
        if lock is not None:
            lock.release()


def _prepare_locked(text_file, out, meta_path, settings, workers):
    meta = manifest.read_json(meta_path)  # unreadable (cut short by a kill) counts as absent
    if meta is not None:
        refuse_other_settings(out, meta, settings)
        if "shards" in meta and all((out / name).exists() for name in meta["shards"]):
            return meta

    special_tokens, vocab_size = settings["special_tokens"], settings["vocab_size"]
    tok_texts, train, val = split_documents(utf8_text(text_file, text_file.read_bytes()), settings["documents"],
                                            settings["split"], settings["val_fraction"], settings["seed"])
    tok_path = out / "tokenizer.json"
    if meta is None or not tok_path.exists():  # no record of what made a tokenizer.json there: train it again
        tok = train_bpe(tok_texts, vocab_size, special_tokens, settings["min_frequency"],
                        settings["delimiter_template"])
        write_text(tok_path, tok.to_str())
    write_json(meta_path, {"settings": settings})  # what the files here are made from, before they are
    bad = [k for k in ("truncation", "padding") if json.loads(tok_path.read_text()).get(k) is not None]
    if bad:  # a tokenizer.json that would cut or pad documents must not write shards
        raise PreparationError(f"{tok_path} has {' and '.join(bad)} set, which would cut or pad documents in the "
                               "shards; delete it (it is re-trained) or set both to null")
    delimiter = special_tokens[0]
    info = resolve_tokenizer(str(tok_path), delimiter)
    encode = make_encoder(info, parallel=False)
    val_tokens, train_tokens = (len(encode_documents(encode, d, info.delimiter, info.dtype)[0]) for d in (val, train))

    docs_path = out / "documents.jsonl"  # what prepare reads: validation documents first
    write_text(docs_path, "".join(json.dumps({"text": d}) + "\n" for d in val + train))
    summary = prepare(out, inputs=[str(docs_path)], tokenizer=str(tok_path), delimiter=delimiter,
                      shard_tokens=val_tokens, prefix=PREFIX, workers=workers, strict=True, lock=False)
    shards = summary["shards"]
    sizes = [len(read_shard(out / s)) for s in shards]
    delimiters = sum(int(np.count_nonzero(read_shard(out / s) == info.delimiter)) for s in shards)
    if sizes[0] != val_tokens or sum(sizes[1:]) != train_tokens or delimiters != len(val) + len(train):
        raise PreparationError(f"{out}: the shards do not match the split (validation shard {sizes[0]} tokens, "
                               f"expected {val_tokens}; training shards {sum(sizes[1:])}, expected {train_tokens}; "
                               f"{delimiters} delimiters for {len(val) + len(train)} documents); delete {out} and "
                               "re-run")
    tok = Tokenizer.from_file(str(tok_path))
    meta = {"settings": settings, "text_file": str(Path(text_file).resolve()), "tokenizer": str(tok_path),
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "delimiter_id": info.delimiter, "special_ids": {t: tok.token_to_id(t) for t in special_tokens},
            "train_shards": str(out / f"{PREFIX}_train_*.bin"), "val_shards": str(out / f"{PREFIX}_val_*.bin"),
            "shards": shards, "tokens": {"train": train_tokens, "validation": val_tokens},
            "documents": {"train": len(train), "validation": len(val)}}
    write_json(meta_path, meta)
    return meta


def refuse_other_settings(out, meta, settings):
    changed = sorted(k for k in settings if meta.get("settings", {}).get(k) != settings[k])
    if changed:
        raise PreparationError(f"{out} holds a corpus prepared with other settings (differs in: "
                               f"{', '.join(changed)}); use another output folder, or delete it to start over")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text_file")
    p.add_argument("--out", dest="out_dir", required=True, help="output folder (tokenizer.json, documents.jsonl, shards, corpus.json)")
    p.add_argument("--vocab-size", type=int, default=TEXT_VOCAB_SIZE, help="ids in all, special tokens included")
    p.add_argument("--special-tokens", default=",".join(TEXT_SPECIAL_TOKENS),
                   help="comma-separated; the first is the delimiter (default: the ids of the tiny configs, eos 0, mask 1)")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--documents", choices=("paragraph", "line"), default="paragraph")
    p.add_argument("--split", choices=("tail", "shuffle"), default="tail")
    p.add_argument("--seed", type=int, default=0, help="seed of the document shuffle (split=shuffle)")
    p.add_argument("--min-frequency", type=int, default=0, help="BPE merges of pairs seen at least this often")
    p.add_argument("--delimiter-template", action="store_true", help="the tokenizer puts the delimiter before texts")
    a = p.parse_args(argv)
    meta = prepare_text_corpus(**{**vars(a), "special_tokens": a.special_tokens.split(",")})
    print(json.dumps({k: v for k, v in meta.items() if k != "settings"}, indent=1))


if __name__ == "__main__":
    from cli import run_cli
    run_cli(main)
