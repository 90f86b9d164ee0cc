"""A plain-text file -> its own byte-level BPE tokenizer + token shards for train_lm.py, in one call:

    python -m data.text_corpus ../shared/data/text/movie_reviews.txt --out out/movie_reviews --vocab-size 4096

    from data.text_corpus import prepare_text_corpus
    facts = prepare_text_corpus("reviews.txt", "out/reviews", vocab_size=4096)

What it does, in order (every choice below changes the data, so each is stated):
1. Documents: one per non-empty line (`documents="line"`, e.g. one review per line) or one per
   blank-line-separated paragraph (`documents="paragraph"`). Surrounding whitespace is stripped.
2. Split: the documents are shuffled with `seed` (so that a file sorted by label or date does not
   give a validation set of one kind), and the first `val_fraction` of them (at least one) become
   the validation set; the rest are the training set. Whole documents, so no text is in both.
3. Tokenizer: a byte-level BPE (GPT-2 / Llama-3 style: any byte sequence is encodable, no unknown
   token) trained with the `tokenizers` library on the *training* documents only, to `vocab_size`
   ids in all, the special tokens first (ids 0, 1, ...), then the 256 byte symbols, then merges of
   pairs seen at least twice. `special_tokens[0]` is the document delimiter: the shards hold it
   before every document, and the tokenizer's post-processor puts it before every encoded text
   (so fine-tuning inputs start as pretraining documents did). The saved tokenizer.json has NO
   truncation and NO padding: a tokenizer.json that truncates or pads changes every text encoded
   with it, so each caller sets what it needs. The default special tokens carry Llama-3/EuroBERT
   names, which model.load_tokenizer and data.fineweb_edu recognise by name:
   <|begin_of_text|> (delimiter / BOS), <|end_of_text|> (EOS), <|mask|> (MLM), <|pad|>.
4. Shards: data.fineweb_edu.prepare writes the validation documents first and the training
   documents after, with shard_tokens = the validation set's token count, so shard 0
   (PREFIX_val_000000.bin) is exactly the validation set and PREFIX_train_*.bin the training set.

Output folder: tokenizer.json, documents.jsonl (the ordered documents prepare reads), the shards,
prepare's progress record, and corpus.json (the settings and facts). A finished folder is reused
when called again with the same settings (a different setting is an error naming the fix); an
interrupted one is completed (the tokenizer training is deterministic and prepare resumes).
"""
import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from data.fineweb_edu import PreparationError, TokenizerInfo, encode_documents, make_encoder, prepare
from data.shards import smallest_token_dtype

SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>")
PREFIX = "corpus"


def read_documents(text_file, documents="line") -> list[str]:
    """The non-empty documents of a UTF-8 text file: lines, or blank-line-separated paragraphs."""
    text = Path(text_file).read_text(encoding="utf-8")
    if documents == "line":
        parts = text.splitlines()
    elif documents == "paragraph":
        parts = [p.replace("\n", " ") for p in text.replace("\r\n", "\n").split("\n\n")]
    else:
        raise PreparationError(f"documents={documents!r}: use 'line' (one document per line) or 'paragraph' "
                               "(documents separated by blank lines)")
    return [d.strip() for d in parts if d.strip()]


def train_bpe(texts, vocab_size, special_tokens=SPECIAL_TOKENS) -> Tokenizer:
    """A byte-level BPE of `vocab_size` ids trained on `texts`; no truncation, no padding."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    bos = special_tokens[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    tok.no_truncation()
    tok.no_padding()
    return tok


def prepare_text_corpus(text_file, out_dir, vocab_size=4096, special_tokens=SPECIAL_TOKENS, val_fraction=0.1,
                        documents="line", seed=0) -> dict:
    """Tokenizer + shards for `text_file` in `out_dir` (module docstring); returns corpus.json's
    content: settings, paths (train_shards / val_shards globs, tokenizer), ids of the special
    tokens, and token / document counts."""
    text_file, out = Path(text_file), Path(out_dir)
    if not text_file.is_file():
        raise PreparationError(f"{text_file}: no such file; give the path of a UTF-8 text file")
    special_tokens = list(special_tokens)
    if len(special_tokens) < 1 or len(set(special_tokens)) != len(special_tokens):
        raise PreparationError(f"special_tokens={special_tokens}: give distinct tokens, the document delimiter first")
    if vocab_size < len(special_tokens) + 256 + 1:
        raise PreparationError(f"vocab_size={vocab_size}: a byte-level BPE needs the {len(special_tokens)} special "
                               "tokens + 256 byte symbols + some merges; use at least 512")
    if not 0 < val_fraction < 1:
        raise PreparationError(f"val_fraction={val_fraction}: must be in (0, 1)")
    settings = {"text_file": str(text_file.resolve()), "vocab_size": vocab_size, "special_tokens": special_tokens,
                "val_fraction": val_fraction, "documents": documents, "seed": seed}
    meta = out / "corpus.json"
    if meta.exists():
        done = json.loads(meta.read_text())
        if done["settings"] != settings:
            changed = sorted(k for k in settings if done["settings"].get(k) != settings[k])
            raise PreparationError(f"{out} holds a corpus prepared with other settings ({', '.join(changed)}): use "
                                   "another output folder, or delete this one to prepare it again")
        return done

    docs = read_documents(text_file, documents)
    if len(docs) < 2:
        raise PreparationError(f"{text_file}: {len(docs)} document(s) (documents={documents!r}); a training and a "
                               "validation set need at least 2")
    order = np.random.default_rng(seed).permutation(len(docs))
    n_val = min(len(docs) - 1, max(1, math.floor(val_fraction * len(docs))))
    val, train = [docs[i] for i in order[:n_val]], [docs[i] for i in order[n_val:]]

    out.mkdir(parents=True, exist_ok=True)
    tok = train_bpe(train, vocab_size, special_tokens)
    tok_path = out / "tokenizer.json"
    tmp = out / "tokenizer.json.tmp"
    tok.save(str(tmp))
    os.replace(tmp, tok_path)
    ids = {t: tok.token_to_id(t) for t in special_tokens}
    n_ids = tok.get_vocab_size(with_added_tokens=True)

    # The validation set's size in tokens, encoded exactly as prepare will (delimiter + ids per document).
    info = TokenizerInfo(str(tok_path), str(tok_path.resolve()), n_ids, ids[special_tokens[0]],
                         str(smallest_token_dtype(n_ids)))
    flat, _ = encode_documents(make_encoder(info, parallel=True), val, info.delimiter, info.dtype)
    val_tokens = len(flat)

    doc_path = out / "documents.jsonl"
    tmp = out / "documents.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for d in val + train:
            f.write(json.dumps({"text": d}) + "\n")
    os.replace(tmp, doc_path)
    summary = prepare(out, inputs=[str(doc_path)], tokenizer=str(tok_path), delimiter=special_tokens[0],
                      shard_tokens=val_tokens, prefix=PREFIX, workers=0)
    if summary["documents"] != len(docs):
        raise PreparationError(f"{doc_path}: prepare wrote {summary['documents']} documents, expected {len(docs)}")
    result = {"settings": settings, "tokenizer": str(tok_path),
              "train_shards": str(out / f"{PREFIX}_train_*.bin"), "val_shards": str(out / f"{PREFIX}_val_*.bin"),
              "vocab_size": n_ids, "special_ids": ids,
              "documents": {"train": len(train), "validation": len(val)},
              "tokens": {"train": summary["tokens"] - val_tokens, "validation": val_tokens}}
    tmp = out / "corpus.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, meta)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text_file")
    p.add_argument("--out", required=True, help="output folder (tokenizer.json, shards, corpus.json)")
    p.add_argument("--vocab-size", type=int, default=4096, help="ids in all, special tokens included")
    p.add_argument("--special-tokens", default=",".join(SPECIAL_TOKENS),
                   help="comma-separated; the first is the document delimiter")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--documents", choices=("line", "paragraph"), default="line")
    p.add_argument("--seed", type=int, default=0, help="seed of the document shuffle before the split")
    a = p.parse_args(argv)
    try:
        r = prepare_text_corpus(a.text_file, a.out, a.vocab_size, a.special_tokens.split(","), a.val_fraction,
                                a.documents, a.seed)
    except PreparationError as e:
        raise SystemExit(f"error: {e}") from None
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
