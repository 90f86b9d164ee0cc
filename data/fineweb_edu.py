"""Tokenise FineWeb-Edu (or any local text corpus) into token shards for train_lm.py.

    python -m data.fineweb_edu --out data/fineweb10B                    # GPT-2 tokens of sample/10BT
    python -m data.fineweb_edu --out data/fineweb10B_llama3 --tokenizer hf:EuroBERT/EuroBERT-210m
    python -m data.fineweb_edu --out data/mine --input corpus/ notes.jsonl --shard-tokens 10_000_000

Input files (the Hub's parquet files, one at a time, or local .parquet / .jsonl / .txt, whose documents are
its blank-line-separated paragraphs) -> tokenised in worker processes -> one stream with the delimiter token
*before* every document (GPT-2's <|endoftext|>, a tokenizer.json's BOS) -> shards of exactly --shard-tokens
tokens (data/shards.py): the first is the validation shard, only the last may be shorter.

Resume: after each shard, the input position of the next token is recorded in PREFIX_progress.json with the
settings and content hashes; the same command again drops a damaged shard and all after it and continues,
byte-identical to an uninterrupted run for any --workers. MANIFEST.json (data/manifest.py) is written last.
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python data/x.py): the repo root, not data/, first on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import glob
import json
import multiprocessing as mp
import os
import re
import signal
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tiktoken
from tqdm import tqdm

from hf import hub
from data import manifest
from data.atomic import ExclusiveLock, write_json, write_text
from data.tokenizer import open_tokenizer
from data.shards import VERSION as SHARD_VERSION
from data.shards import ShardError, read_shard_header, shard_facts, smallest_token_dtype, write_shard
from cli import UserError, where

DEFAULT_DATASET = "HuggingFaceFW/fineweb-edu"
INPUT_SUFFIXES = (".parquet", ".jsonl", ".txt")
# Tried in this order when a tokenizer.json is given without --delimiter: a BOS first (it is
# prepended), then the end-of-text tokens that GPT-2-style vocabularies use for the same purpose.
DELIMITER_CANDIDATES = ("<|begin_of_text|>", "<s>", "<|endoftext|>", "<|end_of_text|>", "</s>")
DOCS_PER_TASK = 256      # documents per tokenisation task,
TASK_CHARS = 1 << 20     # or fewer when they hold this many characters (pieces of long .txt paragraphs)
TXT_PIECE_CHARS = 1 << 16      # a .txt paragraph longer than this is read and tokenised in pieces of at most this
TXT_MAX_PIECE_CHARS = 1 << 18  # ... or, where no safe cut comes sooner (see _safe_cut), of at most this
MAX_WARNINGS = 10
LOCK_FILE = "PREPARE.lock"
COUNTS = ("tokens", "documents", "skipped_empty", "skipped_invalid_json", "replaced_invalid_utf8")


class PreparationError(UserError, RuntimeError):
    """Bad input or settings; the message names the file/line/option and the fix."""


def utf8_text(path, raw: bytes) -> str:
    """`raw` (text file `path`, or its start) as text; refused when not UTF-8: a UTF-16/32 byte-order
    mark, or over 1 % NULs and invalid bytes (UTF-16 without a mark, Latin-1, a binary file)."""
    marked = ("UTF-32" if raw[:4] in (b"\xff\xfe\0\0", b"\0\0\xfe\xff")
              else "UTF-16" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else None)
    text = raw.decode("utf-8-sig", errors="replace")
    nul, bad = text.count("\x00"), text.count("\ufffd")
    if marked or nul + bad > max(8, len(text) // 100):
        what = f"{marked} (its byte-order mark says so)" if marked else (
            f"not UTF-8: {nul + bad:,} of its first {len(text):,} characters are NULs or invalid bytes")
        encoding = marked or ("UTF-16LE" if nul > bad else "LATIN1")
        raise PreparationError(f"{path} is {what}; convert it to UTF-8 first, e.g. iconv -f {encoding} -t UTF-8 "
                               f"{path} > {Path(path).with_suffix('.utf8' + Path(path).suffix)}")
    return text


def note(message: str):
    tqdm.write(message, file=sys.stderr)  # does not break the progress bar


@dataclass(frozen=True)
class TokenizerInfo:
    """What a worker process needs to rebuild the tokenizer, and the shard format it implies."""
    spec: str        # the user's --tokenizer (recorded for resume checks)
    source: str      # tiktoken encoding name, or path of a tokenizer.json
    vocab_size: int
    delimiter: int   # token id written before every document
    dtype: str       # "uint16" or "uint32"


def resolve_tokenizer(spec: str, delimiter: str | int | None = None) -> TokenizerInfo:
    """--tokenizer: a tiktoken encoding name (gpt2, cl100k_base, ...), a tokenizer.json (or its folder), or hf:."""
    source = spec
    if spec.startswith("hf:"):
        repo_id, revision = hub.parse_spec(spec)
        source = str(hub.hf_hub_download(repo_id, "tokenizer.json", revision=revision))
    elif Path(spec).is_dir():
        source = str(Path(spec) / "tokenizer.json")
    if source.endswith(".json") or Path(source).exists():
        path = Path(source).resolve()
        try:
            tok = open_tokenizer(path)
        except Exception as e:  # the library raises bare Exceptions for missing or malformed files
            raise PreparationError(f"--tokenizer {spec!r}: cannot load {path}: {e}") from None
        vocab_size = max(tok.get_vocab(with_added_tokens=True).values()) + 1
        lookup, source = tok.token_to_id, str(path)
        specials = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
        default = next((lookup(t) for t in DELIMITER_CANDIDATES if lookup(t) is not None), None)
        if delimiter is None and default is None:
            raise PreparationError(f"{path} has none of the usual document delimiters {DELIMITER_CANDIDATES}; "
                                   f"name its BOS/EOS token with --delimiter TOKEN")
    else:
        enc = load_tiktoken(spec)
        vocab_size, default, specials = enc.n_vocab, enc.eot_token, sorted(enc.special_tokens_set)
        lookup = {token: enc.encode_single_token(token) for token in specials}.get
    delim_id = default if delimiter is None else int(delimiter) if str(delimiter).isdigit() else lookup(delimiter)
    if delim_id is None or not 0 <= delim_id < vocab_size:
        raise PreparationError(f"--delimiter {delimiter!r} is not a special token of {source} ({vocab_size} ids); "
                               f"its special tokens: {', '.join(specials) or 'none'}")
    return TokenizerInfo(spec, source, vocab_size, delim_id, smallest_token_dtype(vocab_size).name)


def load_tiktoken(name: str):
    try:
        return tiktoken.get_encoding(name)
    except ValueError as e:
        raise PreparationError(f"--tokenizer {name!r}: neither a tokenizer.json, a folder holding one, hf:REPO, "
                               f"nor a tiktoken encoding ({e})") from None
    except Exception as e:  # tiktoken downloads its BPE file once, then reads it from its cache
        fix = "give a tokenizer.json, or train a BPE with `python data/text_corpus.py FILE.txt --out DIR`"
        raise PreparationError(f"--tokenizer {name!r}: tiktoken could not fetch its BPE file ({type(e).__name__}: "
                               f"{e}); run once online, set TIKTOKEN_CACHE_DIR to a folder that has it, or {fix}"
                               ) from None


def make_encoder(info: TokenizerInfo, parallel: bool):
    """texts -> token-id lists, no special tokens added. A special-token string inside a text (a web
    page quoting "<|endoftext|>") is encoded as plain text: the delimiter id starts documents only."""
    if info.source.endswith(".json"):
        tok = open_tokenizer(info.source)
        tok.encode_special_tokens = True
        if parallel:
            return lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        return lambda texts: [tok.encode(t, add_special_tokens=False).ids for t in texts]
    enc = load_tiktoken(info.source)
    return enc.encode_ordinary_batch if parallel else lambda texts: [enc.encode_ordinary(t) for t in texts]


def encode_documents(encode, texts: list[str], delimiter: int, dtype: str,
                     starts: list[bool] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All texts as one flat token array (delimiter first in each) and the per-text lengths.
    starts[i] False: text i continues the previous document (a piece of a long .txt paragraph), no delimiter."""
    flat, lengths = [], []
    for ids, first in zip(encode(texts), [True] * len(texts) if starts is None else starts):
        if first:
            flat.append(delimiter)
        flat.extend(ids)
        lengths.append(len(ids) + first)
    return np.array(flat, dtype=dtype), np.array(lengths, dtype=np.int64)


_worker = {}


def _init_worker(info: TokenizerInfo):
    # Pool.terminate() stops workers with SIGTERM: a handler inherited through fork (a training run's
    # pre-emption flag) would leave them alive and the pool's join hanging.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # One process per core already; the tokenizers library's own thread pool would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker["encode"] = make_encoder(info, parallel=False)
    _worker["info"] = info


def _encode_in_worker(texts, starts):
    info = _worker["info"]
    return encode_documents(_worker["encode"], texts, info.delimiter, info.dtype, starts)


@dataclass
class Document:
    file_index: int
    row: int                 # parquet row, jsonl line (0-based), or txt paragraph index
    text: str | None
    flaw: tuple[str, str] | None = None   # (counter name, warning naming file and line)
    part: int | None = None  # a piece of a long .txt paragraph: 0, 1, ... (the delimiter goes before part 0 only)


def is_empty(doc: Document) -> bool:
    return doc.text is None or (doc.part is None and not doc.text.strip())


def _parquet_documents(path, file_index, start_row, text_column):
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if text_column not in names:
        raise PreparationError(f"{path}: no {text_column!r} column; columns found: {names}. "
                               f"Pass --text-column with the one holding the documents")
    field_type = pf.schema_arrow.field(text_column).type
    if not (pa.types.is_string(field_type) or pa.types.is_large_string(field_type)):
        raise PreparationError(f"{path}: column {text_column!r} has type {field_type}, expected strings")
    # Whole row groups before start_row are skipped by the footer's row counts, not decoded.
    ends = np.cumsum([pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)], dtype=np.int64)
    first_group = int(np.searchsorted(ends, start_row, side="right"))
    row = int(ends[first_group - 1]) if first_group else 0
    texts = (text for batch in pf.iter_batches(batch_size=1024, columns=[text_column],
                                               row_groups=list(range(first_group, pf.num_row_groups)))
             for text in batch.column(0).to_pylist())
    for r, text in islice(enumerate(texts, row), start_row - row, None):
        yield Document(file_index, r, text)


def _decode_line(raw: bytes, path, lineno: int, strict: bool, at: int = 0) -> tuple[str, tuple[str, str] | None]:
    """A line (or the part of a long one from byte `at` on) as text, with its warning, if any."""
    try:
        return raw.decode("utf-8-sig" if lineno == 1 and not at else "utf-8"), None  # a file's UTF-8 mark is no text
    except UnicodeDecodeError as e:
        place = f"{path}:{lineno}: invalid UTF-8 byte {raw[e.start]:#04x} at byte {at + e.start} of the line"
        if strict:
            raise PreparationError(f"{place}; re-encode the file as UTF-8 (e.g. iconv), or drop --strict to "
                                   f"replace such bytes with U+FFFD") from None
        return raw.decode("utf-8", errors="replace"), ("replaced_invalid_utf8", place + ", replaced with U+FFFD")


def _jsonl_documents(path, file_index, start_row, text_column, strict):
    with open(path, "rb") as f:
        for row, raw in islice(enumerate(f), start_row, None):
            line, flaw = _decode_line(raw, path, row + 1, strict)
            if not line.strip():
                yield Document(file_index, row, None, flaw)
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                place = f"{path}:{row + 1}: invalid JSON ({e.msg} at column {e.colno})"
                if strict:
                    raise PreparationError(f"{place}; fix or delete the line, or drop --strict to skip it") from None
                yield Document(file_index, row, None, ("skipped_invalid_json", place + ", line skipped"))
                continue
            if not isinstance(obj, dict) or text_column not in obj:
                found = list(obj) if isinstance(obj, dict) else type(obj).__name__
                raise PreparationError(f"{path}:{row + 1}: no {text_column!r} key; found {found}. "
                                       f"Pass --text-column with the key holding the documents")
            text = obj[text_column]
            if text is not None and not isinstance(text, str):
                raise PreparationError(f"{path}:{row + 1}: {text_column!r} is a {type(text).__name__}, expected a string")
            yield Document(file_index, row, text, flaw)


def txt_paragraphs(f, path, strict: bool = False, cuts: str = " \n", piece_chars: int = TXT_PIECE_CHARS,
                   max_piece_chars: int = TXT_MAX_PIECE_CHARS):
    """(paragraph index, part, text, flaw) of a text file opened in binary mode: its blank-line-separated
    paragraphs with their line breaks; flaw: on a paragraph's first piece, its first invalid UTF-8 line.
    A paragraph over piece_chars comes in pieces (part 0, 1, ...) cut at the last safe point (_safe_cut)
    before piece_chars, else before max_piece_chars (cut anyway there, with a warning): memory stays about
    2 x max_piece_chars + piece_chars characters, and the pieces' ids join to the whole paragraph's."""
    row, part, lineno, at, carry = 0, 0, 1, 0, b""
    text, size, flaw, flawed = [], 0, None, False  # the paragraph not yet yielded, its flaw, one yielded
    blank, blank_size, text_line = [], 0, False    # the current line: its parts while all whitespace
    warned = False

    def piece(cut=None):
        """The paragraph so far (or up to `cut`) as the next item; the rest stays."""
        nonlocal text, size, part, flaw, flawed
        joined = "".join(text)
        out, text = (joined, []) if cut is None else (joined[:cut], [joined[cut:]])
        size = len(joined) - len(out)
        item = (row, None if cut is None and part == 0 else part, out, flaw)
        part, flawed, flaw = part + 1, flawed or flaw is not None, None
        return item

    while True:
        want = piece_chars - len(carry) if cuts else -1   # bytes of a line read at a time (-1: the whole line)
        chunk = f.readline(want)
        raw, carry = carry + chunk, b""
        ends = not cuts or raw.endswith(b"\n") or len(chunk) < want
        if not ends:  # a long line, in parts that decode to what the whole line decodes to
            k = _utf8_start(raw)
            raw, carry = raw[:k], raw[k:]
        if not raw:
            break
        line, line_flaw = _decode_line(raw, path, lineno, strict, at)
        current, lineno, at = lineno, lineno + ends, 0 if ends else at + len(raw)
        if not text_line and not line.strip() and blank_size + len(line) <= max_piece_chars:
            if not ends:
                blank.append(line)
                blank_size += len(line)
                continue
            if text:  # a blank line ends the paragraph
                yield piece()
                row, part, flawed = row + 1, 0, False
            blank, blank_size = [], 0
            continue
        if blank:  # the line began with whitespace parts
            text += blank
            size += blank_size
            blank, blank_size = [], 0
        text.append(line)
        size += len(line)
        text_line = not ends
        if line_flaw and not flawed and flaw is None:
            flaw = line_flaw
        while cuts and size >= piece_chars:
            joined = "".join(text)
            text = [joined]
            cut = _safe_cut(joined, piece_chars, cuts)
            if cut < 0:
                cut = _safe_cut(joined, max_piece_chars, cuts)
            if cut < 0 and size <= max_piece_chars:
                break  # read on: the next line may bring a safe point
            if cut < 0:
                cut = max_piece_chars
                if not warned:
                    warned = True
                    note(f"warning: {path}:{current}: {max_piece_chars} characters without a space or line break "
                         f"between words; cut there (and wherever this recurs in the file) to bound memory, so the "
                         f"tokens at such a cut may differ from those of the whole text")
            yield piece(cut)
    if text:
        yield piece()


def _utf8_start(raw: bytes) -> int:
    """Where to cut a long line's bytes so that both parts decode as the whole: before a UTF-8 lead
    byte among the last three (its character may be incomplete), else at the end."""
    for j in range(len(raw) - 1, max(len(raw) - 4, 0), -1):
        if raw[j] >= 0xC0:
            return j
    return len(raw)


def _safe_cut(text: str, end: int, cuts: str = " \n") -> int:
    """The last point c <= end where text[:c] + text[c:] tokenise as text does, or -1. Kinds (`cuts`):
      " "   a space between two printable ASCII characters: GPT-2/cl100k-style regexes (tiktoken,
            byte-level BPE) start a token at the space before a word; WordPiece, Metaspace split there;
      "\n"  after a line break between two such characters: the regexes keep the break a token of its
            own, WordPiece splits there; but Metaspace adds "▁" before a text's first word.
    A tokenizer that adds something to every text's start (Metaspace, Llama-2's prepending
    normalizer) breaks some kind; `safe_cuts` tests each kind on the tokenizer in use."""
    best = -1
    for sep in cuts:
        after = sep == "\n"  # cut after a line break, before a space
        i = text.rfind(sep, 1, end + 1 - after)
        while i > 0 and i + after > best:
            if i + 1 < len(text) and "!" <= text[i - 1] <= "~" and "!" <= text[i + 1] <= "~":  # printable ASCII
                best = i + after
                break
            i = text.rfind(sep, 1, i)
    return best


CUT_PROBE = ("It's 3.14159 o'clock; naïve café-owners (Zoë & José) said: \"Don't!\" 東京 and 北京, x2+y3=z4 "
             "#tag a.b@c.de 1,234,567 CAPS and MiXeD\n  an indented\tline… ½ of ünïcödé\n<|endoftext|> in "
             "text\nabc\n123\n(x)\nlast. Ende.\n")


def safe_cuts(encode) -> str:
    """The kinds of _safe_cut points (" ", "\n") where this tokenizer's ids join, at every such point of CUT_PROBE."""
    whole = list(encode([CUT_PROBE])[0])

    def exact(c):
        return list(encode([CUT_PROBE[:c]])[0]) + list(encode([CUT_PROBE[c:]])[0]) == whole
    return "".join(sep for sep in " \n" if all(exact(c) for c in range(len(CUT_PROBE))
                                                if _safe_cut(CUT_PROBE, c, sep) == c))


def dataset_folder(name: str) -> str:
    """--name as the dataset card's config names it -> folder of parquet files in the repo."""
    if m := re.fullmatch(r"sample-(\d+BT)", name):
        return f"sample/{m.group(1)}"          # sample-10BT -> sample/10BT/000_00000.parquet ...
    if re.fullmatch(r"CC-MAIN-\d{4}-\d{2}", name):
        return f"data/{name}"                  # one Common Crawl dump
    if name == "default":
        return "data"                          # every dump
    if "/" in name:
        return name.strip("/")
    raise PreparationError(f"--name {name!r}: expected sample-10BT / sample-100BT / sample-350BT, a dump such as "
                           f"CC-MAIN-2024-10, default, or a folder of the repo such as sample/10BT")


def hub_sources(dataset: str, name: str, revision: str, max_files: int | None) -> list[str]:
    """The dataset's parquet files in that folder, as hf://datasets/REPO@REV/PATH, sorted."""
    folder = dataset_folder(name)
    files = hub.list_repo_files(dataset, repo_type="dataset", revision=revision)
    picked = sorted(f for f in files if f.startswith(folder + "/") and f.endswith(".parquet"))
    if not picked:
        tops = sorted({f.split("/")[0] for f in files if "/" in f})
        raise PreparationError(f"no parquet files under {folder}/ in dataset {dataset}@{revision}; folders there: "
                               f"{tops}. Pick another --name")
    return [f"hf://datasets/{dataset}@{quote(revision, safe='')}/{f}" for f in picked[:max_files]]


def local_sources(inputs: list[str]) -> list[str]:
    """--input: files, folders (searched recursively) and glob patterns, in the order given."""
    sources = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.suffix.lower() in INPUT_SUFFIXES and q.is_file())
        elif any(c in item for c in "*?["):
            found = sorted(Path(q) for q in glob.glob(item))
        else:
            found = [p]
        if not found:
            raise PreparationError(f"--input {where(item)}: no {'/'.join(INPUT_SUFFIXES)} files there")
        for q in found:
            if not q.is_file():
                raise PreparationError(f"--input {where(q)}: no such file")
            if q.suffix.lower() not in INPUT_SUFFIXES:
                raise PreparationError(f"--input {str(q)!r}: unsupported type; use {', '.join(INPUT_SUFFIXES)}")
            if q.suffix.lower() != ".parquet":
                with open(q, "rb") as f:
                    utf8_text(q, f.read(1 << 16))
            sources.append(str(q.resolve()))
    return sources


def fetch(source: str) -> Path:
    """Local path of an input file, downloading a hf:// one into the Hub cache first."""
    if not source.startswith("hf://datasets/"):
        return Path(source)
    org, name_at_revision, filename = source[len("hf://datasets/"):].split("/", 2)
    name, revision = name_at_revision.rsplit("@", 1)
    return hub.hf_hub_download(f"{org}/{name}", filename, repo_type="dataset", revision=unquote(revision))


def _fetch_in_background(source: str) -> Future:
    """`source` downloading in a daemon thread: an early stop (--max-tokens) does not wait for it."""
    future = Future()

    def run():
        try:
            future.set_result(fetch(source))
        except BaseException as e:  # re-raised by future.result() in the caller's thread
            future.set_exception(e)
    threading.Thread(target=run, daemon=True).start()
    return future


def documents_from(sources: list[str], file_index: int, row: int, text_column: str, strict: bool, cuts: str):
    """Documents of all sources from (file_index, row) on; the next file downloads meanwhile."""
    if file_index >= len(sources):
        return
    pending = _fetch_in_background(sources[file_index])
    for i in range(file_index, len(sources)):
        path, start = Path(pending.result()), row if i == file_index else 0
        if i + 1 < len(sources):
            pending = _fetch_in_background(sources[i + 1])
        if path.suffix.lower() == ".parquet":
            yield from _parquet_documents(path, i, start, text_column)
        elif path.suffix.lower() == ".jsonl":
            yield from _jsonl_documents(path, i, start, text_column, strict)
        else:  # .txt: local_sources took no other type
            with open(path, "rb") as f:
                yield from (Document(i, r, text, flaw, part) for r, part, text, flaw in
                            txt_paragraphs(f, path, strict, cuts) if r >= start)


def _tasks(documents):
    """The documents in tasks of DOCS_PER_TASK, or fewer when they reach TASK_CHARS characters."""
    batch, chars = [], 0
    for doc in documents:
        batch.append(doc)
        chars += len(doc.text or "")
        if len(batch) == DOCS_PER_TASK or chars >= TASK_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _pair(docs: list[Document], encoded):
    """(doc, its tokens) for each doc of a task; None for the empty ones (they were not sent)."""
    flat, lengths = encoded
    pieces = iter(np.split(flat, np.cumsum(lengths)[:-1]))
    for doc in docs:
        yield doc, None if is_empty(doc) else next(pieces)


def tokenized(documents, info: TokenizerInfo, pool, workers: int):
    """(Document, tokens or None) in input order, tokenised by the pool's workers (no pool: here)."""
    encode = make_encoder(info, parallel=True) if pool is None else None
    # Not Pool.imap: its feeder thread reads the input as fast as the workers take it, and results
    # queue up for a slower consumer without limit (100k documents ahead within a second). A window
    # of 2 tasks per worker keeps every worker busy, memory bounded, order kept.
    in_flight = deque()
    for docs in _tasks(documents):   # the texts to tokenise, and whether each starts a document (the delimiter)
        sent = [d for d in docs if not is_empty(d)]
        texts, starts = [d.text for d in sent], [d.part in (None, 0) for d in sent]
        if pool is None:
            yield from _pair(docs, encode_documents(encode, texts, info.delimiter, info.dtype, starts))
            continue
        in_flight.append((docs, pool.apply_async(_encode_in_worker, (texts, starts))))
        if len(in_flight) >= 2 * workers:
            first, result = in_flight.popleft()
            yield from _pair(first, result.get())
    for docs, result in in_flight:
        yield from _pair(docs, result.get())


def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}_{'val' if index == 0 else 'train'}_{index:06d}.bin"


def read_progress(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PreparationError(f"{path}: unreadable progress record ({e}); delete it and the shards next to it "
                               f"to start over") from None


def resume_point(out: Path, progress: dict | None, settings: dict) -> dict:
    """The progress of an earlier run with the same settings, trimmed to its intact shards. A record
    of other settings is refused, also before its first shard: it may be another preparation's."""
    if progress is None:
        return {"settings": settings, "shards": [], "done": False}
    old = progress["settings"]
    changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
    if changed:
        what = "shards" if progress["shards"] else "the progress record (no shard yet)"
        raise PreparationError(f"{out} holds {what} of a preparation with other settings (differs in: "
                               f"{', '.join(changed)}); use another --out, or delete the shards and the progress "
                               f"record there to start over")
    for i, rec in enumerate(progress["shards"]):
        problem = shard_problem(out / rec["file"], rec)
        if problem:
            note(f"warning: {problem}; re-creating shard {rec['file']} and the ones after it")
            progress["shards"], progress["done"] = progress["shards"][:i], False
            break
    return progress


def shard_problem(path: Path, rec: dict) -> str | None:
    """What is wrong with a shard against its progress record entry (header, size, count, hash), or None."""
    try:
        ntok, _ = read_shard_header(path)
    except ShardError as e:
        return str(e)
    if ntok != rec["tokens"]:
        return f"{path} holds {ntok} tokens, {rec['tokens']} were written"
    if "identity" in rec and manifest.sha256(path) != rec["identity"]:
        return f"{path} is not the shard that was written there (its content hash differs)"
    return None


def lock_out(out: Path) -> ExclusiveLock | None:
    """The lock on out/PREPARE.lock, or a PreparationError naming its holder; None for an unwritable folder."""
    lock = ExclusiveLock(out / LOCK_FILE, label="data preparation")
    try:
        acquired = lock.acquire()
    except OSError:  # a read-only folder (shared data): nobody can write it, so a reader needs no lock
        return None
    if not acquired:
        raise PreparationError(f"--out {out} is being written by another preparation (pid {lock.holder}, lock file "
                               f"{lock.path}); wait for it to finish or stop it, or use another --out")
    return lock


def prepare(out, *, inputs: list[str] | None = None, dataset: str = DEFAULT_DATASET, name: str = "sample-10BT",
            revision: str = "main", max_files: int | None = None, tokenizer: str = "gpt2",
            delimiter: str | int | None = None, shard_tokens: int = 100_000_000, max_tokens: int | None = None,
            prefix: str | None = None, text_column: str = "text", workers: int | None = None,
            strict: bool = False, on_shard=None, lock: bool = True) -> dict:
    """Write the shards into `out` (continuing an interrupted run there) and return the summary. on_shard(index,
    path): called after each shard is written, before its progress record. lock=False: the caller holds it."""
    t0 = time.time()
    out = Path(out)
    # Everything is checked before `out` is created: an empty folder would be taken for data.
    if shard_tokens < 1:
        raise PreparationError(f"--shard-tokens must be positive, got {shard_tokens}")
    if max_tokens is not None and max_tokens < 1:
        raise PreparationError(f"--max-tokens must be positive, got {max_tokens}")
    if out.exists() and not out.is_dir():
        raise PreparationError(f"--out {where(out)} is a file; give a folder for the shards")
    workers = max(1, (os.cpu_count() or 2) - 1) if workers is None else workers
    prefix = prefix or ("corpus" if inputs else "fineweb_edu")
    progress_path = out / f"{prefix}_progress.json"
    earlier = read_progress(progress_path)  # read again under the lock; here only to skip the Hub listing
    info = resolve_tokenizer(tokenizer, delimiter)
    keep_tokenizer(out, info, write=False)
    if inputs:
        hub_folder, sources = None, local_sources(inputs)
        sizes = [Path(s).stat().st_size for s in sources]
    else:
        hub_folder, sizes = [dataset, dataset_folder(name), revision, max_files], None
        # a resume needs no network listing, and the repo may have moved on
        sources = (earlier["settings"]["sources"] if earlier and earlier["settings"]["hub_folder"] == hub_folder
                   else hub_sources(dataset, name, revision, max_files))
    settings = {"sources": sources, "source_bytes": sizes, "hub_folder": hub_folder, "tokenizer": tokenizer,
                "vocab_size": info.vocab_size, "delimiter": info.delimiter, "dtype": info.dtype,
                "shard_tokens": shard_tokens, "max_tokens": max_tokens, "text_column": text_column,
                "shard_format": SHARD_VERSION,
                # local inputs by content too: an edited file of the same size is another input
                "source_identity": [manifest.sha256(s) for s in sources] if inputs else None,
                # and a tokenizer.json by content: an edited one at the same path writes other ids
                "tokenizer_identity": manifest.sha256(info.source) if info.source.endswith(".json") else None}
    created = [d for d in [out, *out.parents] if not d.exists()]  # deepest first
    out.mkdir(parents=True, exist_ok=True)
    held, progress, new_lock = None, None, not (out / LOCK_FILE).exists()
    try:
        held = lock_out(out) if lock else None
        progress = resume_point(out, read_progress(progress_path), settings)
        if not progress["done"]:
            write_shards(out, prefix, info, progress, progress_path, workers, strict, on_shard)
            if len(progress["shards"]) < 2:  # a validation shard alone trains nothing: none is kept
                tokens = sum(s["tokens"] for s in progress["shards"])
                for shard in progress["shards"]:
                    (out / shard["file"]).unlink()
                progress["shards"] = []
                raise PreparationError(
                    f"the {len(sources)} input file(s) hold {tokens:,} tokens, all in the validation shard "
                    f"(--shard-tokens {shard_tokens:,}), so no training shard would be written; run again with "
                    f"--shard-tokens {max(1, tokens // 10)} (a tenth for validation)" if tokens else
                    f"no tokens to write: the {len(sources)} input file(s) hold no non-empty document; check "
                    "--input and --text-column")
            # last: the manifest (data/manifest.py) by which readers identify the shards
            write_json(out / manifest.MANIFEST, {"key": progress["settings"], "files": {
                shard["file"]: shard["identity"] for shard in progress["shards"]}})
        keep_tokenizer(out, info, write=True)
        return summarize(out, info, progress, time.time() - t0)
    except BaseException:
        if progress is None or not progress["shards"]:  # nothing to resume: leave the folder as it was
            if held is not None and new_lock:
                held.path.unlink(missing_ok=True)
            if progress is not None:  # past the refusals: the record is this run's
                for path in (progress_path, progress_path.with_name(progress_path.name + ".tmp"),
                             out / (shard_name(prefix, 0) + ".tmp")):
                    path.unlink(missing_ok=True)
            for folder in created:
                try:
                    folder.rmdir()
                except OSError:  # not empty: someone else's files, leave them
                    break
        raise
    finally:
        if held is not None:
            held.release()


def keep_tokenizer(out: Path, info: TokenizerInfo, write: bool):
    """The shards' tokenizer.json, kept beside them; an --out holding another one is refused before any work."""
    if not info.source.endswith(".json"):
        return
    copy, text = out / "tokenizer.json", Path(info.source).read_text(encoding="utf-8")
    if copy.exists() and copy.resolve() != Path(info.source).resolve() and copy.read_text(encoding="utf-8") != text:
        raise PreparationError(f"{copy} is another tokenizer than --tokenizer {info.spec!r}; shards beside it "
                               "would be taken for its own: use another --out")
    if write and not copy.exists():
        write_text(copy, text)


def count_document(counts: Counter, doc: Document, tokens) -> str | None:
    """Adds the document (or piece of one) to the counters; returns its warning, if any."""
    if tokens is not None:
        counts["documents"] += doc.part in (None, 0)
    elif not (doc.flaw and doc.flaw[0] == "skipped_invalid_json"):
        counts["skipped_empty"] += 1
    if doc.flaw:
        counts[doc.flaw[0]] += 1
        return doc.flaw[1]
    return None


def txt_cuts(info: TokenizerInfo, sources: list[str]) -> str:
    """Where long paragraphs of .txt inputs may be cut for this tokenizer (txt_paragraphs, safe_cuts)."""
    if not any(s.lower().endswith(".txt") for s in sources):
        return ""
    cuts = safe_cuts(make_encoder(info, parallel=False))
    if not cuts:
        note(f"warning: {info.spec} tokenises a text cut between two words differently from the whole text, so "
             "each .txt paragraph is read and tokenised whole: memory grows with the longest one")
    return cuts


def write_shards(out, prefix, info, progress, progress_path, workers, strict, on_shard):
    """Fill shards from the recorded position on, recording the position after each shard."""
    settings, shards = progress["settings"], progress["shards"]
    shard_tokens = settings["shard_tokens"]
    limit = settings["max_tokens"] or float("inf")
    counts = Counter(shards[-1]["counts"]) if shards else Counter()
    file_index, row, skip = shards[-1]["next"] if shards else (0, 0, 0)
    if shards:
        note(f"resuming after {len(shards)} shards ({counts['tokens']:,} tokens): input file {file_index}, "
             f"row {row}, token {skip} of that document")
    buf, fill, warned = np.empty(shard_tokens, dtype=info.dtype), 0, 0

    def finish_shard(next_position):
        nonlocal fill
        path = write_shard(out / shard_name(prefix, len(shards)), buf[:fill], info.dtype,
                           delimiter=info.delimiter, vocab_size=info.vocab_size)
        if on_shard is not None:
            on_shard(len(shards), path)
        shards.append({"file": path.name, "tokens": fill, "next": next_position, "counts": dict(counts),
                       "identity": manifest.sha256(path)})  # python -m data.shards --verify checks it
        write_json(progress_path, progress)
        fill = 0

    write_json(progress_path, progress)
    (out / manifest.MANIFEST).unlink(missing_ok=True)   # written again once the shards are
    # The pool exists before the progress bar's and the downloads' threads: forking a process that
    # runs other threads can deadlock the children.
    with (mp.Pool(workers, _init_worker, (info,)) if workers > 0 else nullcontext()) as pool:
        bar = tqdm(total=settings["max_tokens"], initial=counts["tokens"], unit="tok", unit_scale=True,
                   desc=f"tokenising into {out}")
        documents = documents_from(settings["sources"], file_index, row, settings["text_column"], strict,
                                   txt_cuts(info, settings["sources"]))
        resumed = (file_index, row) if skip else None
        for doc, tokens in tokenized(documents, info, pool, workers):
            if doc.part in (None, 0):
                before = 0  # tokens of this document in its earlier pieces (a long .txt paragraph)
            # Of the document a resumed run starts in, `skip` tokens were written before the stop, and
            # the pieces they began in were counted then.
            done = skip if (doc.file_index, doc.row) == resumed else 0
            offset = 0 if tokens is None else min(max(done - before, 0), len(tokens))
            if before >= done and (warning := count_document(counts, doc, tokens)) and warned < MAX_WARNINGS:
                warned += 1
                note(f"warning: {warning}" + (" (further warnings only counted)" if warned == MAX_WARNINGS else ""))
            while tokens is not None and offset < len(tokens) and counts["tokens"] < limit:
                n = int(min(len(tokens) - offset, shard_tokens - fill, limit - counts["tokens"]))
                buf[fill:fill + n] = tokens[offset:offset + n]
                fill, offset, counts["tokens"] = fill + n, offset + n, counts["tokens"] + n
                bar.update(n)
                if fill == shard_tokens:
                    finish_shard([doc.file_index, doc.row, before + offset])
            before += 0 if tokens is None else len(tokens)
            if counts["tokens"] >= limit:
                break
        bar.close()
    if fill:
        finish_shard(None)
    progress["done"] = True
    write_json(progress_path, progress)


def summarize(out, info, progress, seconds) -> dict:
    shards = progress["shards"]  # a finished preparation has at least 2
    counts = Counter(shards[-1]["counts"])
    max_id = shard_facts([out / s["file"] for s in shards]).max_token_id
    summary = {"out": str(out), "shards": [s["file"] for s in shards], "dtype": info.dtype,
               "vocab_size": info.vocab_size, "delimiter": info.delimiter, "max_token_id": max_id,
               "files": len(progress["settings"]["sources"]), **{k: counts[k] for k in COUNTS},
               "seconds": round(seconds, 2)}
    print(f"{out}: {len(shards)} shards (1 val + {len(shards) - 1} train, {info.dtype}, delimiter id "
          f"{info.delimiter}, largest id {max_id} of a vocabulary of {info.vocab_size}) holding {counts['tokens']:,} "
          f"tokens of {counts['documents']:,} documents from {summary['files']} files; skipped "
          f"{counts['skipped_empty']:,} empty documents and {counts['skipped_invalid_json']:,} invalid JSON lines; "
          f"{counts['replaced_invalid_utf8']:,} documents had invalid UTF-8 replaced; {seconds:.1f} s")
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:2]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder for the shards and the progress record")
    p.add_argument("--input", nargs="+", dest="inputs", help="local .parquet/.jsonl/.txt files, folders or globs (instead of the Hub)")
    p.add_argument("--dataset", default=DEFAULT_DATASET, help="Hub dataset repo")
    p.add_argument("--name", default="sample-10BT", help="sample-10BT | sample-100BT | sample-350BT | CC-MAIN-YYYY-WW | default | FOLDER")
    p.add_argument("--revision", default="main")
    p.add_argument("--max-files", type=int, help="only the first N parquet files of the Hub folder")
    p.add_argument("--tokenizer", default="gpt2", help="tiktoken encoding, tokenizer.json (or its folder), or hf:REPO[@REV]")
    p.add_argument("--delimiter", help="token (or id) written before every document; default: EOT / BOS of the tokenizer")
    p.add_argument("--shard-tokens", type=int, default=100_000_000)
    p.add_argument("--max-tokens", type=int, help="stop after this many tokens in all")
    p.add_argument("--prefix", help="shard file prefix (default fineweb_edu, or corpus with --input)")
    p.add_argument("--text-column", default="text")
    p.add_argument("--workers", type=int, help="tokeniser processes (default: CPUs - 1; 0 = in this process)")
    p.add_argument("--strict", action="store_true", help="stop at invalid UTF-8 or JSON instead of replacing/skipping")
    prepare(**vars(p.parse_args(argv)))


if __name__ == "__main__":
    from cli import run_cli
    run_cli(main)
