"""Writing files so that a crash never leaves a half-written one.

Write a temporary file next to the target, flush it to the disk, rename it over the target (atomic
on POSIX: a reader sees the old file or the whole new one), then sync the folder so that the rename
itself survives a power cut. Checkpoint files, token shards, progress records, results and Hub refs
are all written through here. Beside them, the lock that keeps a folder to one writer (ExclusiveLock).
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
    unique: a temporary name of its own, for writers that may race (threads, ranks). Text is UTF-8."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex if unique else 'tmp'}.tmp")
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
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


class ExclusiveLock:
    """An exclusive lock on a file, for "one writer per folder" (training's RUN.lock, data
    preparation's PREPARE.lock).

    fcntl.flock locks belong to an open file: the OS drops them when the process ends, however it
    ends, so a SIGKILLed writer never leaves a stale lock behind. The holder writes its pid into
    the file, so that whoever is refused can name it. A second acquire in the same process, through
    another ExclusiveLock of the same file, is refused too (flock counts open files, not processes)."""

    def __init__(self, path):
        self.path, self.fd, self.holder = Path(path), None, None

    def acquire(self) -> bool:
        """True when this object holds the lock now; False when another holds it (self.holder: the
        pid it wrote, or "unknown"). OSError when the file cannot be created (a read-only folder)."""
        import fcntl
        if self.fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return True

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # closing the file releases the lock
            self.fd = None
