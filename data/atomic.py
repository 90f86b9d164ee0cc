"""Writing files so that a crash never leaves a half-written one.

Write a temporary file next to the target, flush it to the disk, rename it over the target (atomic
on POSIX: a reader sees the old file or the whole new one), then sync the folder so that the rename
itself survives a power cut. Checkpoint files, token shards, progress records, results and Hub refs
are all written through here.
"""
import contextlib
import json
import os
import uuid
from pathlib import Path


def fsync_dir(directory):
    """Make a rename inside `directory` durable (a crash right after os.replace could lose it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # platforms without directory file descriptors (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path, mode="wb", unique=False):
    """A file object to write `path` through; `path` changes only if the block completes.
    unique: a temporary name of its own, for writers that may race (threads, ranks)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex if unique else 'tmp'}.tmp")
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text(path, text, unique=False):
    with atomic_write(path, "w", unique=unique) as f:
        f.write(text)


def write_json(path, obj, indent=1, unique=False, **dumps):
    write_text(path, json.dumps(obj, indent=indent, **dumps) + "\n", unique=unique)
