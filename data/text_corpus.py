"""One plain-text file as train/validation token shards for train_lm.py, with a byte-level BPE
trained on the training part only: a small, self-contained corpus for CPU experiments that needs
no download (no GPT-2 BPE file, no Hub).

    python -m data.text_corpus --input ../shared/data/text/tinyshakespeare.txt --out out/data/shakespeare
    python train_lm.py configs/tiny_lm.py --train_shards="out/data/shakespeare/corpus_train_*.bin" \\
        --val_shards="out/data/shakespeare/corpus_val_*.bin" --vocab_size=2048 --eos_id=0

Steps, all written into --out (never into the repository):
1. Split. The text is cut into documents at blank lines (as data/fineweb_edu.py reads .txt files:
   in a play, one speech per document). The first (1 - val_fraction) of the characters, extended
   to the end of the paragraph they stop in, is train.txt; the rest is val.txt. Nothing of the
   validation text is seen by the tokenizer or the model.
2. Tokenizer. A byte-level BPE (GPT-2's pre-tokenisation regex and byte alphabet, so any text
   encodes without unknown tokens) is trained on train.txt with `tokenizers`, vocabulary
   --vocab-size including the one special token <|endoftext|> (id 0), the document delimiter.
   The saved tokenizer.json has no truncation and no padding: data preparation must never cut or
   pad a document (checked below, and when an existing tokenizer.json is reused).
3. Shards, with data/fineweb_edu.py's `prepare`, which writes its first shard as the validation
   shard. val.txt is given first and every shard holds exactly as many tokens as the validation
   text, so corpus_val_000000.bin is precisely val.txt and corpus_train_*.bin precisely train.txt
   (verified after writing: shard sizes, and the delimiter count equal to the document count, so
   no padding or other inserted id).

Re-running with the same arguments reuses what exists (prepare resumes its own shards); other
arguments for an existing folder are an error naming the difference.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

from data.fineweb_edu import (PreparationError, is_empty, iter_documents, make_encoder, prepare,
                              resolve_tokenizer, save_json_atomic)
from data.shards import read_shard

DELIMITER = "<|endoftext|>"
PREFIX = "corpus"


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """(train, val): train is the first (1 - val_fraction) of the characters, extended to the next
    blank line so that no document is cut in two; val is everything after that blank line."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = text.find("\n\n", int(len(text) * (1 - val_fraction)))
    if cut < 0 or not text[cut:].strip():
        raise PreparationError(f"no blank line after {1 - val_fraction:.0%} of the text, so there is no whole "
                               f"paragraph left for validation; documents must be separated by blank lines")
    return text[:cut + 1], text[cut + 2:]


def train_tokenizer(text: str, vocab_size: int):
    """A byte-level BPE with `vocab_size` ids (<|endoftext|> = 0, then the 256 byte symbols, then
    the merges), trained on `text`, with truncation and padding off."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    if vocab_size < 258:
        raise ValueError(f"vocab_size {vocab_size}: a byte-level BPE needs at least 256 bytes + 1 special + 1 merge")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[DELIMITER], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    tok.no_truncation()
    tok.no_padding()
    return tok


def check_no_truncation_or_padding(path: Path):
    """A tokenizer.json that would cut or pad documents must not be used to write shards."""
    cfg = json.loads(Path(path).read_text())
    bad = [k for k in ("truncation", "padding") if cfg.get(k) is not None]
    if bad:
        raise PreparationError(f"{path} has {' and '.join(bad)} set, which would cut or pad documents in the shards; "
                               f"delete it (it is re-trained) or set both to null")


def count_tokens(txt: Path, tokenizer_json: Path) -> tuple[int, int]:
    """(tokens, documents) that `prepare` writes for this .txt file: its documents (the same
    reader), each encoded without special tokens and preceded by the delimiter."""
    info = resolve_tokenizer(str(tokenizer_json), DELIMITER)
    encode = make_encoder(info, parallel=False)
    docs = [d.text for d in iter_documents(txt, 0, 0, "text", strict=True) if not is_empty(d)]
    return sum(len(ids) + 1 for ids in encode(docs)), len(docs)


def prepare_text(input_path, out, vocab_size: int = 2048, val_fraction: float = 0.1, workers: int = 0) -> dict:
    """Split, train the tokenizer and write the shards into `out`; returns the description that
    is also saved as out/corpus.json (paths, glob patterns for train_lm.py, vocab_size, eos_id,
    token and document counts)."""
    input_path, out = Path(input_path), Path(out)
    if not input_path.is_file():
        raise PreparationError(f"--input {input_path}: no such file (give a plain-text file)")
    out.mkdir(parents=True, exist_ok=True)
    settings = {"input": str(input_path.resolve()), "input_bytes": input_path.stat().st_size,
                "vocab_size": vocab_size, "val_fraction": val_fraction}
    meta_path = out / "corpus.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        changed = sorted(k for k in settings if meta["settings"].get(k) != settings[k])
        if changed:
            raise PreparationError(f"{out} holds a corpus prepared with other settings (differs in: {', '.join(changed)}); "
                                   f"use another --out, or delete {out} to start over")
        if all((out / name).exists() for name in meta["shards"]):
            return meta

    train_text, val_text = split_text(input_path.read_text(encoding="utf-8"), val_fraction)
    train_txt, val_txt, tok_json = out / "train.txt", out / "val.txt", out / "tokenizer.json"
    train_txt.write_text(train_text, encoding="utf-8")
    val_txt.write_text(val_text, encoding="utf-8")
    if not tok_json.exists():
        train_tokenizer(train_text, vocab_size).save(str(tok_json))
    check_no_truncation_or_padding(tok_json)

    val_tokens, val_docs = count_tokens(val_txt, tok_json)
    train_tokens, train_docs = count_tokens(train_txt, tok_json)
    summary = prepare(out, inputs=[str(val_txt), str(train_txt)], tokenizer=str(tok_json), delimiter=DELIMITER,
                      shard_tokens=val_tokens, prefix=PREFIX, workers=workers, strict=True)
    shards = summary["shards"]
    eos_id = summary["delimiter"]
    sizes = [len(read_shard(out / s)) for s in shards]
    delimiters = sum(int(np.count_nonzero(read_shard(out / s) == eos_id)) for s in shards)
    if sizes[0] != val_tokens or sum(sizes[1:]) != train_tokens or delimiters != val_docs + train_docs:
        raise PreparationError(f"{out}: the shards do not match the split (validation shard {sizes[0]} tokens, "
                               f"expected {val_tokens}; training shards {sum(sizes[1:])}, expected {train_tokens}; "
                               f"{delimiters} delimiters for {val_docs + train_docs} documents); delete {out} and re-run")
    meta = {"settings": settings, "tokenizer": str(tok_json), "vocab_size": vocab_size, "eos_id": eos_id,
            "train_shards": str(out / f"{PREFIX}_train_*.bin"), "val_shards": str(out / f"{PREFIX}_val_*.bin"),
            "shards": shards, "train_tokens": train_tokens, "val_tokens": val_tokens,
            "train_documents": train_docs, "val_documents": val_docs,
            "train_chars": len(train_text), "val_chars": len(val_text)}
    save_json_atomic(meta_path, meta)
    return meta


def main(argv=None):
    p = argparse.ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:2]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="a plain-text file (UTF-8; documents separated by blank lines)")
    p.add_argument("--out", required=True, help="output folder (tokenizer.json, train.txt, val.txt, shards, corpus.json)")
    p.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary incl. <|endoftext|> (a multiple of 64)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of the characters held out, at the end")
    p.add_argument("--workers", type=int, default=0, help="tokeniser processes for prepare (0 = in this process)")
    args = p.parse_args(argv)
    try:
        meta = prepare_text(args.input, args.out, args.vocab_size, args.val_fraction, args.workers)
    except PreparationError as e:
        raise SystemExit(f"error: {e}") from None
    print(json.dumps({k: meta[k] for k in ("train_shards", "val_shards", "vocab_size", "eos_id", "train_tokens",
                                           "val_tokens", "tokenizer")}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
