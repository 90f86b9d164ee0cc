"""Token shards on disk and the data loader that streams them into training.

A shard is one flat stream of token ids (documents concatenated, each starting with the
tokenizer's delimiter token, see data/fineweb_edu.py), stored modded-nanogpt style:

    header: 256 little-endian int32 = [MAGIC, VERSION, token count, bytes per token,
                                        largest token id, delimiter id, vocabulary size, 0, ...]
    body:   the tokens as little-endian uint16 (vocabularies up to 65 536 ids, e.g. GPT-2)
            or uint32 (larger ones, e.g. Llama-3's 128 256)

The fixed 1 KiB header lets a reader check a shard from its size alone: a shard cut short by a
killed job or a full disk is detected before a single token of it is trained on. The three facts
after the size (version 2; -1 where the writer did not know them) let training check its
vocab_size and delimiter against the shards before step 1 (`shard_facts`) without reading a token.
Version 1 shards (size fields only) still read; for them those facts are unknown.

`TokenShardLoader` cuts the stream into (x, y) batches where y is x shifted by one token. Every
rank walks the same global sequence of batches and takes its own slice of each, so N ranks with
batch B see exactly what 1 rank with batch N·B sees, and the position saved in a checkpoint is the
same on every rank.
"""
import glob
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from data.atomic import atomic_write
from cli import MissingInput, UserError, where

MAGIC = 20250601  # arbitrary; distinct from llm.c/modded-nanogpt's 20240520 whose header has no dtype field
VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: no largest id / delimiter / vocabulary size in the header
UNKNOWN = -1                # header value of a fact the writer did not know
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


class ShardError(UserError, ValueError):
    """A token shard file that is missing, truncated or not a shard at all."""


def smallest_token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (halves disk and page-cache use), else uint32."""
    if vocab_size <= 2**16:
        return DTYPES[2]
    if vocab_size <= 2**32:
        return DTYPES[4]
    raise ValueError(f"vocabulary of {vocab_size} ids does not fit in uint32")


def write_shard(path, tokens, dtype=None, *, delimiter: int | None = None, vocab_size: int | None = None) -> Path:
    """Write `tokens` (1-D ints) as a shard, atomically: readers see the old file or the whole new one.

    dtype: uint16/uint32 to store; default keeps a uint16/uint32 input as is and otherwise picks
    the smallest that holds max(tokens).
    delimiter, vocab_size: the tokenizer's document delimiter id and vocabulary size, recorded in
    the header with the largest id of `tokens` (unknown when not given).
    """
    path = Path(path)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"{path}: tokens must be 1-D, got shape {tokens.shape}")
    if dtype is None:
        if tokens.dtype in (np.uint16, np.uint32):
            dtype = tokens.dtype
        else:
            dtype = smallest_token_dtype(int(tokens.max()) + 1 if tokens.size else 1)
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
    if max(facts) >= 2 ** 31:  # a vocabulary of over 2 billion ids: the int32 header cannot record it
        raise ValueError(f"{path}: ids up to {max(facts)} do not fit in the shard header's int32 fields")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:7] = [MAGIC, VERSION, tokens.size, dtype.itemsize, *facts]
    with atomic_write(path) as f:
        f.write(header.tobytes())
        f.write(tokens.astype(dtype, copy=False).tobytes())
    return path


@dataclass(frozen=True)
class ShardInfo:
    """What one shard's header says. The last three are None when the header does not record them
    (version 1 shards, or a writer that was not told the tokenizer's facts)."""
    path: Path
    version: int
    tokens: int
    dtype: np.dtype
    max_token_id: int | None    # largest id in the shard (None also for an empty shard)
    delimiter_id: int | None    # id written before every document
    vocab_size: int | None      # the tokenizer's vocabulary size


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
    if version not in READABLE_VERSIONS:
        raise ShardError(f"{path}: unsupported shard version {version} (this code reads versions "
                         f"{', '.join(map(str, READABLE_VERSIONS))})")
    if width not in DTYPES or ntok < 0:
        raise ShardError(f"{path}: corrupt header: {ntok} tokens of {width} bytes each")
    expected = HEADER_BYTES + ntok * width
    if size != expected:
        what = "truncated" if size < expected else "oversized"
        raise ShardError(f"{path}: {what} token shard: header says {ntok} tokens x {width} bytes, so "
                         f"expected {expected} bytes, the file has {size}; re-create it (re-run the preparation)")
    if version == 1:
        return ShardInfo(path, version, ntok, DTYPES[width], None, None, None)
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
    """What a set of shards says about the tokenizer that wrote them (see `shard_facts`)."""
    paths: list
    tokens: int                 # in all shards
    max_token_id: int | None    # largest id in any shard; None if a shard does not record it
    delimiter_id: int | None    # None if a shard does not record it
    vocab_size: int | None      # None if a shard does not record it


def shard_facts(pattern_or_paths) -> ShardFacts:
    """The largest token id, the delimiter id and the tokenizer's vocabulary size of a glob pattern
    or list of shards, from their headers alone (1 KiB read per shard), so that training can check
    its vocab_size and eos_id/bos_id against the data before step 1.

    A fact is None unless every shard records it: version 1 shards (written before the header held
    them) or shards written by write_shard without delimiter/vocab_size leave it unknown. Shards
    that record different delimiters or vocabulary sizes come from different preparations; mixing
    them is refused with a ShardError naming one of each.
    """
    infos = [read_shard_info(p) for p in shard_paths(pattern_or_paths)]

    def common(field):
        values = [getattr(i, field) for i in infos]
        if None in values:
            return None
        first = infos[0]
        other = next((i for i in infos if getattr(i, field) != getattr(first, field)), None)
        if other is not None:
            raise ShardError(f"{first.path} and {other.path} were prepared with different tokenizers "
                             f"({field.replace('_', ' ')} {getattr(first, field)} vs {getattr(other, field)}); "
                             f"train on shards of one preparation")
        return values[0]

    ids = [i.max_token_id for i in infos if i.tokens]
    unknown_max = any(i.max_token_id is None for i in infos if i.tokens)
    return ShardFacts(paths=[i.path for i in infos], tokens=sum(i.tokens for i in infos),
                      max_token_id=None if unknown_max or not ids else max(ids),
                      delimiter_id=common("delimiter_id"), vocab_size=common("vocab_size"))


def read_shard(path, mmap: bool = True) -> np.ndarray:
    """The tokens of a validated shard: a read-only memory map (default) or an in-memory array."""
    ntok, dtype = read_shard_header(path)
    if mmap:
        if ntok == 0:  # np.memmap cannot map zero bytes
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(ntok,))
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        return np.fromfile(f, dtype=dtype, count=ntok)


def shard_paths(pattern_or_paths) -> list[Path]:
    """A glob pattern (sorted matches) or an explicit list of shard paths."""
    if isinstance(pattern_or_paths, (str, os.PathLike)):
        paths = sorted(glob.glob(str(pattern_or_paths)))
        if not paths:
            raise MissingInput(f"no token shards match {where(pattern_or_paths)}; "
                               f"prepare them with `python -m data.fineweb_edu --out DIR`")
    else:
        paths = list(pattern_or_paths)
        if not paths:
            raise ValueError("empty list of token shards")
    return [Path(p) for p in paths]


class TokenShardLoader:
    """Endless (x, y) int64 batches of shape (batch_size, seq_len) from token shards.

    Each step consumes one global batch of world_size·batch_size·seq_len (+1) consecutive tokens of
    the current shard; rank r takes rows [r·B, (r+1)·B). A shard's tail too short for a whole
    global batch is skipped. After the last shard the next epoch starts, with the shard order
    reshuffled from (seed, epoch) when shuffle=True.
    """

    def __init__(self, pattern_or_paths, batch_size: int, seq_len: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle: bool = False, device=None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.paths = shard_paths(pattern_or_paths)
        self.sizes = [read_shard_header(p)[0] for p in self.paths]  # fails fast on a truncated shard
        self.B, self.T, self.rank, self.world_size = batch_size, seq_len, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.global_tokens = world_size * batch_size * seq_len
        if max(self.sizes) < self.global_tokens + 1:
            raise ValueError(f"no shard holds one global batch: the largest has {max(self.sizes)} tokens, a batch needs "
                             f"world_size*batch_size*seq_len+1 = {self.global_tokens + 1}")
        self.epoch, self.shard_index, self.position = 0, 0, 0
        self._order, self._tokens = None, None

    def shard_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.paths)))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.paths)).tolist()

    def batches_per_epoch(self) -> int:
        return sum((n - 1) // self.global_tokens for n in self.sizes if n > 0)

    def state_dict(self) -> dict:
        """Where the next batch starts; identical on every rank, so saving rank 0's is enough."""
        return {"epoch": self.epoch, "shard_index": self.shard_index, "position": self.position,
                "num_shards": len(self.paths), "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict):
        if state["num_shards"] != len(self.paths) or state["shuffle"] != self.shuffle or state["seed"] != self.seed:
            raise ValueError(f"loader state was saved for {state['num_shards']} shards (shuffle={state['shuffle']}, "
                             f"seed={state['seed']}), this loader has {len(self.paths)} (shuffle={self.shuffle}, "
                             f"seed={self.seed}): resume with the same shards and settings")
        self.epoch, self.shard_index, self.position = state["epoch"], state["shard_index"], state["position"]
        self._order, self._tokens = None, None

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        while True:
            if self._order is None:
                self._order = self.shard_order(self.epoch)
            if self._tokens is None:
                self._tokens = read_shard(self.paths[self._order[self.shard_index]])
            if self.position + self.global_tokens + 1 <= len(self._tokens):
                break
            self.shard_index, self.position, self._tokens = self.shard_index + 1, 0, None
            if self.shard_index == len(self.paths):
                self.epoch, self.shard_index, self._order = self.epoch + 1, 0, None
        start = self.position + self.rank * self.B * self.T
        buf = torch.from_numpy(self._tokens[start:start + self.B * self.T + 1].astype(np.int64))
        self.position += self.global_tokens
        if self.device.type == "cuda":  # page-locked host memory lets the copy overlap with compute
            buf = buf.pin_memory().to(self.device, non_blocking=True)
        x = buf[:-1].view(self.B, self.T)
        y = buf[1:].view(self.B, self.T).clone()  # x and y must not share memory: MLM masks x in place
        return x, y


def validation_batches(pattern_or_paths, batch_size: int, seq_len: int, num_batches: int, rank: int = 0,
                       world_size: int = 1, device=None):
    """The same `num_batches` (x, y) batches on every call: the start of the validation shard(s)."""
    loader = TokenShardLoader(pattern_or_paths, batch_size, seq_len, rank, world_size, device=device)
    available = loader.batches_per_epoch()
    if num_batches > available:
        raise ValueError(f"validation shards {[str(p) for p in loader.paths]} hold {available} batches of "
                         f"{world_size}x{batch_size}x{seq_len} tokens, {num_batches} were asked for")
    return (next(loader) for _ in range(num_batches))
