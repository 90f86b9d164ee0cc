"""Read and write the safetensors format ourselves (no `safetensors` package at run time):

    [8 bytes]  little-endian u64 N = length of the JSON header
    [N bytes]  JSON: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
                      "__metadata__": {"key": "str value"}}   (padded with spaces)
    [rest]     raw little-endian tensor bytes; offsets are relative to the start of this block

Reading memory-maps the file copy-on-write: tensors are views of the page cache until written. Also read: a
sharded checkpoint's `model.safetensors.index.json`, and `pytorch_model.bin` (torch.load(weights_only=True)).
"""
import json
import math
import mmap
import os
import pickle
import struct
import sys
import zipfile
from pathlib import Path

import torch

from data.atomic import atomic_write
from cli import UserError

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100_000_000  # the reference implementation's limit; a larger value means a corrupt file
CORRUPT = "the file is truncated or corrupt (download it again or re-save it)"

assert sys.byteorder == "little", "safetensors stores little-endian data; big-endian hosts are not supported"


class SafetensorsError(UserError, ValueError):
    """A file that is not a valid safetensors file (truncated, corrupt header, bad offsets)."""


class WeightsFileError(UserError, ValueError):
    """A weights file (pytorch_model.bin, a shard index) that cannot be read."""


def _is_count(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def read_header(path):
    """(header dict, byte offset where the data starts), every tensor entry checked before any byte is
    read as a tensor: a known dtype, a shape of non-negative ints, offsets [begin, end) inside the data
    block with end - begin = dtype size x the shape's product, and no two tensors sharing a byte (trusted
    blindly, two tensors at one offset load as the same weights, and a negative begin reads the header's
    bytes as numbers: no error, and a model that retrieves nothing)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else size
        if n > MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{path}: header length {n} does not fit in a {size}-byte file; {CORRUPT}, or it "
                                   f"is not a safetensors file")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:  # not UTF-8, or not JSON
            raise SafetensorsError(f"{path}: header is not valid JSON ({e}); {CORRUPT}") from None
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__", {}), dict):
        raise SafetensorsError(f"{path}: the header is a JSON {type(header).__name__}, not an object of tensor "
                               f"entries (with an object __metadata__); {CORRUPT}")
    data_size, spans = size - 8 - n, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        bad = f"{path}: tensor {name!r}"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise SafetensorsError(f"{bad}: the entry {str(info)[:120]} lacks dtype, shape or data_offsets; {CORRUPT}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise SafetensorsError(f"{bad} has unsupported dtype {dtype!r} (this reader knows {', '.join(DTYPES)}); "
                                   "convert the file to one of them")
        if not isinstance(shape, list) or not all(_is_count(s) for s in shape):
            raise SafetensorsError(f"{bad}: shape {shape!r} is not a list of non-negative integers; {CORRUPT}")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
            raise SafetensorsError(f"{bad}: data_offsets {offsets!r} are not two non-negative integers; {CORRUPT}")
        (begin, end), expected = offsets, math.prod(shape) * DTYPES[dtype].itemsize
        if end < begin or end - begin != expected or end > data_size:
            raise SafetensorsError(f"{bad} needs bytes [{begin}, {end}) of a {data_size}-byte data block (expected "
                                   f"{expected} bytes for {dtype} {shape}); {CORRUPT}")
        if end > begin:
            spans.append((begin, end, name))
    spans.sort()
    for (_, end_a, a), (begin_b, _, b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise SafetensorsError(f"{path}: tensors {a!r} and {b!r} share bytes [{begin_b}, {end_a}) of the data "
                                   f"block; the header is corrupt (download the file again or re-save it)")
    return header, 8 + n


def load_safetensors(path, device=None):
    """All tensors of one .safetensors file, as views of a copy-on-write memory map."""
    header, data_start = read_header(path)
    tensors = {}
    with open(path, "rb") as f:
        # ACCESS_COPY gives writable, private pages: zero-copy reads, and writes never reach the file.
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if os.path.getsize(path) > 0 else b""
    for name, info in header.items():
        if name == "__metadata__":
            continue
        (begin, end), dtype = info["data_offsets"], DTYPES[info["dtype"]]
        if end > begin:
            t = torch.frombuffer(mm, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=data_start + begin)
        else:
            t = torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"]).to(device=device)
    return tensors


def save_safetensors(tensors, path):
    """Write `tensors` (name -> Tensor) to `path` atomically (temp file, fsync, rename)."""
    header, offset, ordered = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name].detach()
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"tensor {name!r}: dtype {t.dtype} cannot be stored in safetensors")
        t = t.to("cpu").contiguous()
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        ordered.append(t)
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep the data block 8-byte aligned, as the reference writer does
    with atomic_write(Path(path)) as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for t in ordered:
            if t.numel():  # reinterpret as bytes without a copy (numpy has no bfloat16, uint8 is universal)
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def weight_files(folder) -> list[Path]:
    """The files load_checkpoint_dir reads, in its order of preference: a sharded checkpoint's index and
    its shards, else model.safetensors, else pytorch_model.bin."""
    folder = Path(folder)
    for index in (folder / "model.safetensors.index.json", folder / "pytorch_model.bin.index.json"):
        if index.exists():
            return [index] + [folder / shard for shard in sorted(set(read_weight_map(index).values()))]
    for path in (folder / "model.safetensors", folder / "pytorch_model.bin"):
        if path.exists():
            return [path]
    raise FileNotFoundError(f"{folder}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin "
                            "found (is this a Hugging Face model folder?)")


def load_checkpoint_dir(folder, device=None):
    """All weights of a Hugging Face model folder: single or sharded safetensors, else pytorch_model.bin."""
    files = weight_files(folder)
    loader = load_safetensors if files[0].name.startswith("model.safetensors") else _load_bin
    return {k: v for path in files if not path.name.endswith(".index.json") for k, v in loader(path, device).items()}


def read_weight_map(path):
    """{tensor name: shard file} of a sharded checkpoint's *.index.json, each file inside its folder."""
    path = Path(path)
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise WeightsFileError(f"{path}: not a readable index of checkpoint shards ({type(e).__name__}: {e}); "
                               "the file is truncated or corrupt: download it again") from None
    if not isinstance(weight_map, dict) or not all(
            isinstance(f, str) and f and not Path(f).is_absolute() and ".." not in Path(f).parts
            for f in weight_map.values()):
        raise WeightsFileError(f"{path}: weight_map must map tensor names to shard files inside {path.parent}; "
                               "the file is corrupt: download it again")
    return weight_map


def _load_bin(path, device=None):
    """A pytorch_model.bin, unpickled weights-only (a file that would run code is refused, never run);
    memory-mapped unless it is of the pre-zip format, which cannot be."""
    try:  # torch's zip format is memory-mapped; the pre-zip one cannot be
        return torch.load(path, map_location=device or "cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        refused = [line.strip() for line in str(e).splitlines() if "GLOBAL" in line]
        if refused:
            raise WeightsFileError(f"{path}: refused to load: unpickling it would run code ({refused[0]}); nothing "
                                   "in it was run. Use a model.safetensors of the same model, or convert the file "
                                   "with a tool you trust") from None
        raise WeightsFileError(f"{path}: not a readable PyTorch weights file ({type(e).__name__}); it is truncated, "
                               "corrupt or holds more than tensors: download it again, or use a model.safetensors "
                               "of the same model") from None
