"""Read and write the safetensors format ourselves (no `safetensors` package at run time).

The format is small enough to hold in one's head:

    [8 bytes]  little-endian u64 N = length of the JSON header
    [N bytes]  JSON: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
                      "__metadata__": {"key": "str value"}}   (padded with spaces)
    [rest]     raw little-endian tensor bytes; offsets are relative to the start of this block

Reading memory-maps the file copy-on-write, so tensors are views of the page cache until written
(zero-copy). Checkpoints split over several files come with `model.safetensors.index.json`
(`{"weight_map": {name: file}}`); `pytorch_model.bin` is read with `torch.load(weights_only=True)`.
"""
import json
import mmap
import os
import struct
import sys
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

assert sys.byteorder == "little", "safetensors stores little-endian data; big-endian hosts are not supported"


class SafetensorsError(UserError, ValueError):
    """A file that is not a valid safetensors file (truncated, corrupt header, bad offsets)."""


def read_header(path):
    """Parse and validate the header; returns (header dict, byte offset where the data starts)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path}: file is {size} bytes, too short for a safetensors header "
                                   "(truncated download? delete it and download again)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{path}: header length {n} does not fit in a {size}-byte file "
                                   "(truncated or not a safetensors file)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not valid JSON ({e}); the file is corrupt") from None
    data_start = 8 + n
    data_size = size - data_start
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] not in DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        numel = 1
        for s in info["shape"]:
            numel *= s
        expected = numel * DTYPES[info["dtype"]].itemsize
        if end - begin != expected or end > data_size:
            raise SafetensorsError(
                f"{path}: tensor {name!r} needs bytes [{begin}, {end}) of a {data_size}-byte data block "
                f"(expected {expected} bytes); the file is truncated or corrupt")
    return header, data_start


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
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        if end == begin:
            t = torch.empty(info["shape"], dtype=dtype)
        else:
            t = torch.frombuffer(mm, dtype=dtype, count=(end - begin) // dtype.itemsize,
                                 offset=data_start + begin).reshape(info["shape"])
        tensors[name] = t.to(device) if device is not None else t
    return tensors


def save_safetensors(tensors, path, metadata=None):
    """Write `tensors` (name -> Tensor) to `path` atomically (temp file, fsync, rename)."""
    path = Path(path)
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
    header["__metadata__"] = {"format": "pt", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep the data block 8-byte aligned, as the reference writer does
    with atomic_write(path) as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in ordered:
            if t.numel():
                # reinterpret as bytes without a copy (numpy has no bfloat16, uint8 is universal)
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def load_checkpoint_dir(folder, device=None):
    """All weights of a Hugging Face model folder: single or sharded safetensors, else pytorch_model.bin."""
    folder = Path(folder)
    for index_name, loader in (("model.safetensors.index.json", load_safetensors),
                               ("pytorch_model.bin.index.json", _load_bin)):
        if (folder / index_name).exists():
            weight_map = json.loads((folder / index_name).read_text())["weight_map"]
            out = {}
            for shard in sorted(set(weight_map.values())):
                out.update(loader(folder / shard, device))
            return out
    if (folder / "model.safetensors").exists():
        return load_safetensors(folder / "model.safetensors", device)
    if (folder / "pytorch_model.bin").exists():
        return _load_bin(folder / "pytorch_model.bin", device)
    raise FileNotFoundError(f"{folder}: no model.safetensors, model.safetensors.index.json or "
                            "pytorch_model.bin found (is this a Hugging Face model folder?)")


def _load_bin(path, device=None):
    return torch.load(path, map_location=device or "cpu", weights_only=True, mmap=True)
