"""Token shards on disk and the data loader that streams them into training.

A shard is one flat stream of token ids (documents concatenated, each starting with the delimiter
token, see data/fineweb_edu.py), stored modded-nanogpt style:

    header: 256 little-endian int32 = [MAGIC, VERSION, token count, bytes per token,
                                        largest token id, delimiter id, vocabulary size, 0, ...]
    body:   the tokens as little-endian uint16 (vocabularies up to 65 536 ids) or uint32

The fixed 1 KiB header lets a reader check a shard from its size alone (a shard cut short by a kill
or a full disk is found before a token of it is trained on), and training check its vocab_size and
delimiter before step 1 (`shard_facts`; -1: unknown to the writer).
To find a damaged byte inside the data, and shards of two preparations mixed in one folder:

    python -m data.shards --verify 'data/tiny/corpus_*.bin' --vocab-size 2048
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python data/x.py): the repo root, not data/, first on sys.path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import glob
import os
import re
from dataclasses import dataclass

import numpy as np
import torch

from data import manifest
from data.atomic import atomic_write
from cli import ConfigError, MissingInput, UserError, where

MAGIC = 20250601  # arbitrary; distinct from llm.c/modded-nanogpt's 20240520 whose header has no dtype field
VERSION = 2  # 1 recorded no largest id, delimiter or vocabulary size: re-prepare such shards
UNKNOWN = -1                # header value of a fact the writer did not know
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


class ShardError(UserError, ValueError):
    """A token shard file that is missing, truncated or not a shard at all."""


def smallest_token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (halves disk and page-cache use), else uint32."""
    return DTYPES[2] if vocab_size <= 2**16 else DTYPES[4]


def write_shard(path, tokens, dtype=None, *, delimiter: int | None = None, vocab_size: int | None = None) -> Path:
    """Write `tokens` (1-D ints) as a shard, atomically; dtype: default keeps a uint16/uint32 input as is, else
    the smallest that holds max(tokens). delimiter, vocab_size: the tokenizer's, recorded in the header."""
    path = Path(path)
    tokens = np.asarray(tokens)
    if dtype is None:
        big = tokens.dtype in (np.uint16, np.uint32)
        dtype = tokens.dtype if big else smallest_token_dtype(int(tokens.max()) + 1 if tokens.size else 1)
    dtype = np.dtype(dtype).newbyteorder("<")
    if dtype.itemsize not in DTYPES or dtype.kind != "u":
        raise ValueError(f"{path}: shard dtype must be uint16 or uint32, got {dtype}")
    if tokens.size and tokens.dtype != dtype and (tokens.min() < 0 or tokens.max() >= 2 ** (8 * dtype.itemsize)):
        raise ValueError(f"{path}: token ids span [{tokens.min()}, {tokens.max()}], which does not fit in {dtype}")
    max_id = int(tokens.max()) if tokens.size else UNKNOWN
    if vocab_size is not None and max_id >= vocab_size:
        raise ValueError(f"{path}: token id {max_id} is outside the vocabulary of {vocab_size} ids")
    if delimiter is not None and not 0 <= delimiter < (vocab_size or 2 ** 31):
        raise ValueError(f"{path}: delimiter id {delimiter} is outside the vocabulary of {vocab_size} ids")
    facts = [max_id, UNKNOWN if delimiter is None else delimiter, UNKNOWN if vocab_size is None else vocab_size]
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:7] = [MAGIC, VERSION, tokens.size, dtype.itemsize, *facts]
    with atomic_write(path) as f:
        f.write(header.tobytes())
        f.write(tokens.astype(dtype, copy=False).tobytes())
    return path


@dataclass(frozen=True)
class ShardInfo:
    """What one shard's header says; a fact the header does not record is None."""
    path: Path
    version: int
    tokens: int
    dtype: np.dtype
    max_token_id: int | None    # largest id in the shard (None also for an empty shard)
    delimiter_id: int | None
    vocab_size: int | None


def read_shard_info(path) -> ShardInfo:
    """The header of a shard, after checking magic, version and the file size (no token is read)."""
    path = Path(path)
    if not path.is_file():
        raise ShardError(f"token shard {where(path)} not found")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ShardError(f"{path}: truncated token shard: expected a {HEADER_BYTES}-byte header, "
                         f"the file has {size} bytes; re-create it (re-run the preparation)")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, ntok, width, max_id, delimiter, vocab_size = (int(v) for v in header[:7])
    if magic != MAGIC:
        raise ShardError(f"{path}: bad magic number {magic} (expected {MAGIC}): not a token shard "
                         f"written by data/shards.py, or its header is corrupt")
    if version != VERSION:
        raise ShardError(f"{path}: unsupported shard version {version} (this code reads version {VERSION}); "
                         "re-prepare the shards")
    if width not in DTYPES or ntok < 0:
        raise ShardError(f"{path}: corrupt header: {ntok} tokens of {width} bytes each")
    expected = HEADER_BYTES + ntok * width
    if size != expected:
        what = "truncated" if size < expected else "oversized"
        raise ShardError(f"{path}: {what} token shard: header says {ntok} tokens x {width} bytes, so "
                         f"expected {expected} bytes, the file has {size}; re-create it (re-run the preparation)")
    known = [None if v == UNKNOWN else v for v in (max_id, delimiter, vocab_size)]
    if any(v is not None and v < 0 for v in known) or (
            known[2] is not None and any(v is not None and v >= known[2] for v in known[:2])):
        raise ShardError(f"{path}: corrupt header: largest id {max_id}, delimiter {delimiter}, vocabulary size "
                         f"{vocab_size}")
    return ShardInfo(path, version, ntok, DTYPES[width], *known)


def read_shard_header(path) -> tuple[int, np.dtype]:
    """(token count, dtype) of a shard, after checking magic, version and the file size."""
    info = read_shard_info(path)
    return info.tokens, info.dtype


@dataclass(frozen=True)
class ShardFacts:
    """What a set of shards says about the tokenizer that wrote them; None where a shard does not say."""
    paths: list
    tokens: int                 # in all shards
    max_token_id: int | None    # largest id in any shard
    delimiter_id: int | None
    vocab_size: int | None


def shard_facts(pattern_or_paths) -> ShardFacts:
    """The largest id, the delimiter id and the vocabulary size of a glob or list of shards, from their
    headers alone; shards of two preparations (different delimiters or vocabulary sizes) are refused."""
    infos = [read_shard_info(p) for p in shard_paths(pattern_or_paths)]

    def common(field):
        values = [getattr(i, field) for i in infos]
        other = next((i for i in infos if getattr(i, field) != values[0]), None)
        if other is not None and None not in values:
            raise ShardError(f"{infos[0].path} and {other.path} were prepared with different tokenizers "
                             f"({field.replace('_', ' ')} {values[0]} vs {getattr(other, field)}); "
                             f"train on shards of one preparation")
        return None if None in values else values[0]

    ids = [i.max_token_id for i in infos if i.tokens]
    return ShardFacts(paths=[i.path for i in infos], tokens=sum(i.tokens for i in infos),
                      max_token_id=None if None in ids or not ids else max(ids),
                      delimiter_id=common("delimiter_id"), vocab_size=common("vocab_size"))


def read_shard(path) -> np.ndarray:
    """The tokens of a validated shard, as a read-only memory map."""
    ntok, dtype = read_shard_header(path)
    if ntok == 0:  # np.memmap cannot map zero bytes
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(ntok,))


def shard_paths(pattern_or_paths) -> list[Path]:
    """A glob pattern (sorted matches) or an explicit list of shard paths."""
    if isinstance(pattern_or_paths, (str, os.PathLike)):
        paths = sorted(glob.glob(str(pattern_or_paths)))
        if not paths:
            folder = Path(pattern_or_paths).parent
            raise MissingInput(f"no token shards match {where(pattern_or_paths)}; prepare them there with `python "
                               f"data/text_corpus.py FILE.txt --out {folder}` (a text and its own BPE, offline) or "
                               f"`python -m data.fineweb_edu --out {folder}` (FineWeb-Edu, from the Hub)",
                               path=pattern_or_paths)
    else:
        paths = list(pattern_or_paths)
        if not paths:
            raise ValueError("empty list of token shards")
    return [Path(p) for p in paths]


class TokenShardLoader:
    """Endless (x, y) int64 batches of shape (batch_size, seq_len) from token shards, y = x shifted by one.

    Each step consumes one global batch of world_size·batch_size·seq_len (+1) consecutive tokens of
    the current shard; rank r takes rows [r·B, (r+1)·B), so N ranks with batch B see what 1 rank with
    batch N·B sees, and the saved position is the same on every rank. A shard's tail too short for a
    global batch is skipped; after the last shard the next epoch starts (shard order reshuffled from
    (seed, epoch) when shuffle=True).

    vocab_size: every id must be below it; each global batch is checked as it is read (one max over the host
    array), so a bad id is named with its shard and offset instead of an `IndexError` inside the model. A
    shard that vanished, shrank or was replaced since is named when a batch would be read from it (one fstat
    per batch; a memory map of a truncated file would SIGBUS). state_dict() records the shards' names, token
    counts and content hashes, so a resume on other shards is refused.
    """
    def __init__(self, pattern_or_paths, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle: bool = False, device=None, vocab_size: int | None = None,
                 hash_shards: bool = True):
        self.pattern = str(pattern_or_paths) if isinstance(pattern_or_paths, (str, os.PathLike)) else None
        self.paths = shard_paths(pattern_or_paths)
        infos = [read_shard_info(p) for p in self.paths]  # fails fast on a truncated shard
        self.sizes = [i.tokens for i in infos]
        self.B, self.T, self.rank, self.world_size = batch_size, seq_len, rank, world_size
        self.seed, self.shuffle, self.vocab_size = seed, shuffle, vocab_size
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.global_tokens = world_size * batch_size * seq_len
        if max(self.sizes) < self.global_tokens + 1:
            raise ValueError(f"no shard holds one global batch: the largest has {max(self.sizes)} tokens, a batch needs "
                             f"world_size*batch_size*seq_len+1 = {self.global_tokens + 1}")
        for info in infos:
            if vocab_size is not None and info.max_token_id is not None and info.max_token_id >= vocab_size:
                raise ShardError(f"{info.path}: its header records token ids up to {info.max_token_id}, but "
                                 f"vocab_size={vocab_size}: {self._fixes()}")
        self.epoch, self.shard_index, self.position = 0, 0, 0
        self._order, self._open = None, None  # _open: (index in paths, open file, its tokens mapped, links then)
        # hashed now: a shard may vanish before the next save
        self._hashes = [manifest.identity(p) for p in self.paths] if hash_shards else None

    def _fixes(self) -> str:
        return (f"the shards were written with another tokenizer, or are corrupt. Fix: check them with `python -m "
                f"data.shards --verify '{self.pattern or 'GLOB'}' --vocab-size {self.vocab_size}`, re-prepare them "
                f"with the model's tokenizer, or set vocab_size to that tokenizer's size")

    def batches_per_epoch(self) -> int:
        return sum((n - 1) // self.global_tokens for n in self.sizes if n > 0)

    def content_hashes(self) -> list[str]:
        """Every shard's identity when the loader was made (hash_shards=False: when first asked)."""
        if self._hashes is None:
            self._hashes = [manifest.identity(p) for p in self.paths]
        return self._hashes

    def state_dict(self) -> dict:
        """Where the next batch starts, and in which shards; the same on every rank."""
        return {"epoch": self.epoch, "shard_index": self.shard_index, "position": self.position,
                "seed": self.seed, "shuffle": self.shuffle,
                "shard_files": [p.name for p in self.paths], "shard_tokens": list(self.sizes),
                "shard_sha256": self.content_hashes()}

    def load_state_dict(self, state: dict, accept_changed: bool = False):
        """Continue where `state` left off, on its shards; another content is refused (accept_changed: warned)."""
        if state["shuffle"] != self.shuffle or state["seed"] != self.seed:
            raise ConfigError(f"loader state was saved with shuffle={state['shuffle']}, seed={state['seed']}; this "
                              f"loader has shuffle={self.shuffle}, seed={self.seed}: resume with the same settings")
        where_ = self.pattern or "the list"
        names = [p.name for p in self.paths]
        if list(zip(state["shard_files"], state["shard_tokens"])) != list(zip(names, self.sizes)):
            saved, now = dict(zip(state["shard_files"], state["shard_tokens"])), dict(zip(names, self.sizes))
            changes = [f"{what}: {_some(names)}" for what, names in (
                ("missing", [n for n in saved if n not in now]), ("new", [n for n in now if n not in saved]),
                ("different size", [f"{n} ({saved[n]} tokens then, {now[n]} now)" for n in saved
                                    if n in now and saved[n] != now[n]])) if names]
            raise ShardError(f"the shards of {where_} are not those the loader state was saved with "
                             f"({'; '.join(changes) or 'the same files in another order'}). Resuming on other data "
                             "would change what the run trains on from here and the data order. Fix: restore the "
                             "shards the run was started with, or start a new run (a new out_dir) on these shards")
        if state["shard_sha256"] != self.content_hashes():
            edited = [p.name for p, a, b in zip(self.paths, state["shard_sha256"], self.content_hashes()) if a != b]
            what = f"{_some(edited)}: the same names and token counts, another content than when the run was saved"
            if not accept_changed:
                raise ShardError(f"the shards of {where_} are not those the run was saved on ({what}): resuming "
                                 "would train on other data from the saved position. Fix: restore them, start a new "
                                 "run (a new out_dir), or pass --accept_changed_data=True to continue on them")
            print(f"warning: {what}; continuing on them (accept_changed_data=True)", file=sys.stderr)
        self.epoch, self.shard_index, self.position = state["epoch"], state["shard_index"], state["position"]
        self._order = None
        self.close()

    def close(self):
        if getattr(self, "_open", None) is not None:
            self._open[1].close()  # the memory map keeps its own reference to the file
        self._open = None

    __del__ = close   # a loader dropped without close() (an error, a test) closes its file all the same

    def _open_shard(self, i: int):
        """Map shard i, after checking that it is still the file the loader was made with."""
        path = self.paths[i]
        try:
            info = read_shard_info(path)
            file = open(path, "rb")
        except (ShardError, OSError) as e:
            raise self._vanished(i, str(e)) from None
        if info.tokens != self.sizes[i]:
            file.close()
            raise self._vanished(i, f"{path} now holds {info.tokens} tokens")
        tokens = np.memmap(file, dtype=info.dtype, mode="r", offset=HEADER_BYTES, shape=(info.tokens,))
        self._open = (i, file, tokens, os.fstat(file.fileno()).st_nlink)

    def _vanished(self, i: int, what: str) -> ShardError:
        return ShardError(f"token shard {self.paths[i]} changed since the loader opened it with {self.sizes[i]} "
                          f"tokens: {what}. Fix: restore the shards the run was started with (the last checkpoint "
                          "resumes on them), or start a new run (a new out_dir) on the new shards")

    def _check_unchanged(self, end: int):
        """The open shard still has its first `end` tokens and still has its name."""
        i, file, tokens, links = self._open
        st = os.fstat(file.fileno())
        if links and not st.st_nlink:  # its last name is gone (`links` guards file systems that count none)
            raise self._vanished(i, "it was deleted or replaced")
        if st.st_size < HEADER_BYTES + end * tokens.dtype.itemsize:
            raise self._vanished(i, f"it shrank to {st.st_size} bytes")

    def _check_ids(self, i: int, window: np.ndarray):
        """Ids the model has no embedding for: one max over the batch; the search only when it fails."""
        if window.size and int(window.max()) >= self.vocab_size:
            first = int(np.argmax(window >= self.vocab_size))
            raise ShardError(f"{self.paths[i]}: token id {int(window[first])} at offset {self.position + first} (in "
                             f"tokens from the start of the shard's data) is not below vocab_size={self.vocab_size}: "
                             f"{self._fixes()}")

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        while True:
            if self._order is None:
                n = len(self.paths)
                self._order = (np.random.default_rng([self.seed, self.epoch]).permutation(n).tolist() if self.shuffle
                               else list(range(n)))
            i = self._order[self.shard_index]
            if self.position + self.global_tokens + 1 <= self.sizes[i]:
                break
            self.shard_index, self.position = self.shard_index + 1, 0
            self.close()
            if self.shard_index == len(self.paths):
                self.epoch, self.shard_index, self._order = self.epoch + 1, 0, None
        if self._open is None or self._open[0] != i:
            self.close()
            self._open_shard(i)
        end = self.position + self.global_tokens + 1
        self._check_unchanged(end)
        window = self._open[2][self.position:end]
        if self.vocab_size is not None:
            self._check_ids(i, window)
        start = self.rank * self.B * self.T
        buf = torch.from_numpy(window[start:start + self.B * self.T + 1].astype(np.int64))
        self.position += self.global_tokens
        if self.device.type == "cuda":  # page-locked host memory lets the copy overlap with compute
            buf = buf.pin_memory().to(self.device, non_blocking=True)
        x = buf[:-1].view(self.B, self.T)
        y = buf[1:].view(self.B, self.T).clone()  # x and y must not share memory: MLM masks x in place
        return x, y


def _some(names) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def validation_batches(pattern_or_paths, batch_size: int, seq_len: int, num_batches: int, rank: int = 0,
                       world_size: int = 1, device=None, vocab_size: int | None = None):
    """The same `num_batches` (x, y) batches on every call: the start of the validation shard(s)."""
    loader = TokenShardLoader(pattern_or_paths, batch_size, seq_len, rank, world_size, device=device,
                              vocab_size=vocab_size, hash_shards=False)
    available = loader.batches_per_epoch()
    if num_batches > available:
        raise ValueError(f"validation shards {[str(p) for p in loader.paths]} hold {available} batches of "
                         f"{world_size}x{batch_size}x{seq_len} tokens, {num_batches} were asked for")
    return _first_batches(loader, num_batches)


def _first_batches(loader, num_batches):
    try:
        for _ in range(num_batches):
            yield next(loader)
    finally:
        loader.close()


# ----------------------------------------------------------------------------- python -m data.shards --verify
VERIFY_BLOCK_TOKENS = 1 << 24  # read 32 MiB (uint16) at a time: memory stays small whatever the shard size
MAX_BAD_OFFSETS = 5
SHARD_NAME = re.compile(r"^(?P<prefix>.+)_(?:val|train)_\d{6}\.bin$")  # data/fineweb_edu.py shard_name


def verify_shard(path, vocab_size: int | None = None):
    """Read every token of a shard: (ShardInfo, the largest id found, problems): the largest id must be the
    header's and below both vocabulary sizes; ids beyond are counted, the first MAX_BAD_OFFSETS offsets named."""
    info = read_shard_info(path)
    tokens = read_shard(path)
    recorded = None if info.max_token_id is None else info.max_token_id + 1
    limit = min((v for v in (vocab_size, info.vocab_size, recorded) if v is not None), default=None)
    largest, bad, offsets = None, 0, []
    for start in range(0, len(tokens), VERIFY_BLOCK_TOKENS):
        block = tokens[start:start + VERIFY_BLOCK_TOKENS]
        top = int(block.max())
        largest = top if largest is None else max(largest, top)
        if limit is not None and top >= limit:
            found = np.flatnonzero(block >= limit)
            bad += len(found)
            offsets += (start + found[:MAX_BAD_OFFSETS - len(offsets)]).tolist()
    limits = ((vocab_size, f"--vocab-size {vocab_size}"),
              (info.vocab_size, f"the vocabulary size {info.vocab_size} its header records"))
    problems = [f"token ids up to {largest}, not below {what}" for size, what in limits
                if largest is not None and size is not None and largest >= size]
    if info.max_token_id is not None and largest != info.max_token_id:
        problems.append(f"largest id {largest}, but its header records {info.max_token_id} (the data changed after "
                        "the shard was written)")
    if bad:
        problems.append(f"{bad} ids >= {limit}, the first at token offsets {', '.join(map(str, offsets))}")
    return info, largest, problems


def record_problems(info: ShardInfo, records: dict) -> tuple[str | None, list[str]]:
    """(name of the progress record of data/fineweb_edu.py beside the shard or None, where the shard
    disagrees with it): not listed (another preparation's, or a stopped run's), another count or
    content, a size other than --shard-tokens (all but the last), another vocabulary, delimiter or dtype."""
    match = SHARD_NAME.match(info.path.name)
    record_path = info.path.with_name(f"{match['prefix']}_progress.json") if match else None
    if record_path is None or not record_path.exists():
        return None, []
    if record_path not in records:  # read once per record
        record = manifest.read_json(record_path)
        records[record_path] = record if isinstance(record, dict) and {"settings", "shards"} <= record.keys() else None
    record, name = records[record_path], record_path.name
    if record is None:
        return name, [f"its progress record {name} cannot be read"]
    shards, settings = record["shards"], record["settings"]
    entry = next((r for r in shards if r.get("file") == info.path.name), None)
    if entry is None:
        return name, [f"not in {name} (which lists {len(shards)} shards): written by another preparation, or by a "
                      "run that stopped before recording it"]
    problems = []
    if info.tokens != entry["tokens"]:
        problems.append(f"{info.tokens} tokens, {name} records {entry['tokens']}")
    elif "identity" in entry and manifest.sha256(info.path) != entry["identity"]:
        problems.append(f"its content is not what {name} records (another preparation's shard?)")
    if entry is not shards[-1] and info.tokens != settings.get("shard_tokens"):
        problems.append(f"{info.tokens} tokens where the preparation's --shard-tokens is {settings['shard_tokens']}")
    for field, key in (("vocab_size", "vocab_size"), ("delimiter_id", "delimiter")):
        if getattr(info, field) is not None and key in settings and getattr(info, field) != settings[key]:
            problems.append(f"{field.replace('_', ' ')} {getattr(info, field)}, the preparation's is {settings[key]}")
    if "dtype" in settings and info.dtype.name != settings["dtype"]:
        problems.append(f"{info.dtype.name} tokens, the preparation writes {settings['dtype']}")
    return name, problems


def main(argv=None):
    p = argparse.ArgumentParser(description="Check token shards whole: header, size, and every token id, and "
                                            "each against the progress record of its preparation, if any.",
                                epilog="Exit status 0 when every shard is good, 2 (with error: lines) otherwise.")
    p.add_argument("--verify", nargs="+", required=True, metavar="GLOB", help="shard files or glob patterns")
    p.add_argument("--vocab-size", type=int, help="the model's vocabulary size: every id must be below it")
    args = p.parse_args(argv)
    paths = [path for pattern in args.verify for path in shard_paths(pattern)]
    bad, records = 0, {}
    for path in paths:
        try:
            info, largest, problems = verify_shard(path, args.vocab_size)
            record, mixed = record_problems(info, records)
        except ShardError as e:  # header or size: the data cannot be read as tokens
            info, problems, mixed = None, [str(e)], []
        if problems or mixed:
            bad += 1
            damaged = info is None or (info.max_token_id is not None and largest != info.max_token_id)
            fix = (f"if its preparation was stopped, run it again (it rewrites what {record} does not record); if "
                   "two preparations wrote this folder, delete its shards and the record and prepare it once (one "
                   "preparation per --out)" if mixed else
                   "delete it and re-run the preparation command (data/fineweb_edu.py re-creates a missing shard and "
                   "the ones after it)" if damaged else
                   "re-prepare the shards with the model's tokenizer, or set vocab_size to the tokenizer's size")
            named = "" if info is None else f"{path}: "  # a ShardError names the file itself
            print(f"error: {named}{'; '.join(problems + mixed)}. Fix: {fix}", file=sys.stderr, flush=True)
            continue
        limits = [f"--vocab-size {args.vocab_size}"] if args.vocab_size is not None else []
        limits += [f"header vocabulary {info.vocab_size}"] if info.vocab_size is not None else []
        recorded = "not recorded" if info.max_token_id is None else info.max_token_id
        print(f"ok: {path}: header ok (version {info.version}, {info.dtype.name}), {info.tokens} tokens match the "
              f"file size{f', as {record} records' if record else ''}, largest id {largest} (header: {recorded})"
              + (f", below {' and '.join(limits)}" if limits else ""), flush=True)
    print(f"{len(paths)} shards checked, {bad} bad")
    if bad:
        raise SystemExit(2)


if __name__ == "__main__":
    from cli import run_cli
    run_cli(main)
