"""Writing files so that a crash never leaves a half-written one: a temporary file beside the target,
flushed to the disk, renamed over the target (a reader sees the old file or the whole new one), the
folder synced so that the rename survives a power cut. Beside it, the lock that keeps a folder to
one writer (ExclusiveLock).
"""
import contextlib
import errno
import json
import os
import shutil
import uuid
from pathlib import Path


def disk_full(error) -> bool:
    """Whether `error` or one it was raised from (torch.save's, numpy's) is 'no space left' / 'quota exceeded'."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False


def size_text(n) -> str:
    """A size in the unit that shows it: 272.0 KB, 3.8 MB, 1.2 GB (a free space under 1 MB is not "0 MB")."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n)} bytes"


def free_space(path) -> str:
    """The free space of the device that holds `path` (or its nearest existing folder)."""
    p = Path(path).absolute()
    existing = next((q for q in [p, *p.parents] if q.exists()), Path.cwd())
    return size_text(shutil.disk_usage(existing).free)


class DiskFull(OSError):
    """A write ran out of space (errno ENOSPC); the message names the folder, the space free there and the fix."""
    def __init__(self, message):
        super().__init__(message)
        self.errno = errno.ENOSPC

    def __str__(self):
        return self.args[0]


def disk_full_error(folder, needed_bytes, what, fix="Free some space and run the same command again") -> DiskFull:
    """The one line of a full disk: the folder, what was being written and its size, and the space free now."""
    size = f" (about {size_text(needed_bytes)} in all)" if needed_bytes else ""
    return DiskFull(f"no space left on the device of {folder} while writing {what}{size}: {free_space(folder)} "
                    f"are free. {fix}")


def fsync_dir(directory):
    """Make a rename inside `directory` durable (a crash right after os.replace could lose it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # platforms without directory file descriptors (Windows)
        return
    with contextlib.suppress(OSError):
        os.fsync(fd)
    os.close(fd)


@contextlib.contextmanager
def atomic_write(path, mode="wb", unique=False):
    """A file object to write `path` through, which changes only if the block completes (unique: racing writers)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex if unique else 'tmp'}.tmp")
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if disk_full(e) and not isinstance(e, DiskFull):  # every writer through here says so in one line
            raise disk_full_error(path.parent, None, path.name) from e
        raise
    fsync_dir(path.parent)


def write_text(path, text, unique=False):
    with atomic_write(path, "w", unique=unique) as f:
        f.write(text)


def write_json(path, obj, indent=1, unique=False, **dumps):
    write_text(path, json.dumps(obj, indent=indent, **dumps) + "\n", unique=unique)


class ExclusiveLock:
    """An exclusive fcntl.flock lock on a file, for "one writer per folder" (RUN.lock, PREPARE.lock,
    OUT.lock). The OS drops it when the process ends, however it ends: a SIGKILLed writer leaves no
    stale lock. The holder writes its pid and `label` into the file, so whoever is refused can name
    it; a second acquire in the same process is refused too (flock counts open files). remove: the
    file is deleted on release; who locked a file just deleted that way tries again on the new one."""
    def __init__(self, path, label: str = "", remove: bool = False):
        self.path, self.fd, self.holder, self.holder_label = Path(path), None, None, ""
        self.label, self.remove = label, remove

    def acquire(self) -> bool:
        """True when this object holds the lock now; False when another holds it (self.holder: its pid
        or "unknown", self.holder_label: what it is). OSError when the file cannot be created."""
        import fcntl
        if self.fd is not None:
            return True
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pid, _, label = os.read(fd, 512).decode(errors="replace").strip().partition(" ")
                self.holder, self.holder_label = pid or "unknown", label
                os.close(fd)
                return False
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.stat(self.path), os.fstat(fd)):
                    break
            os.close(fd)  # locked a file its holder deleted on release: lock the one there now
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {self.label}".strip().encode())
        except OSError as e:
            os.close(fd)
            raise disk_full_error(self.path.parent, None, self.path.name) if disk_full(e) else e
        self.fd = fd
        return True

    def release(self):
        if self.fd is not None:
            if self.remove:
                Path(self.path).unlink(missing_ok=True)  # while still held: see the class docstring
            os.close(self.fd)  # closing the file releases the lock
            self.fd = None
