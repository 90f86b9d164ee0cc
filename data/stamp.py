"""Stamps: what a reusable result was computed from, so that a command reuses the result only when
all of it is the same (README: "Checkpoints, resume and faults").

A stamp is a small JSON object written atomically next to a result: the settings that shape the
result and the identity of every input file. Before reusing a result, a command builds the stamp
of what it is asked now and compares the two:

- equal: the result is reused (work a killed run left half done is continued);
- absent or unreadable (a 0-byte file left by a kill, a hand edit): as if there were no result,
  so it is computed, never a crash and never a skip;
- different: one line on stderr names the first fields that differ (old -> new) and what the
  command does about it. The rule, the same everywhere: the old result is moved aside to
  NAME.stale-N (the first free N) and computed again in its place, so nothing is lost and nothing
  stale is reported; except data preparation, whose folders are shared by every run trained on
  them: there the command refuses and says which option or command allows it.

Identity of a file: its size and a SHA-256 of its content - of the whole file up to
WHOLE_FILE_BYTES (64 MiB), and above that of its size and its first and last MiB (EDGE_BYTES),
so that identifying a 3 GB corpus costs two reads of 1 MiB. The decision is on size and hash only;
the path and the mtime are recorded under "info", which is never compared: a copy of the data, or a
`touch`, is the same input and forces no work, while an edit is caught even when it keeps the size
and the mtime. The price of the cheap hash: an edit in the middle of a file over 64 MiB that keeps
its size is not seen; after such an edit, move the result away (or use another output folder).
"""
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from data.atomic import write_json

WHOLE_FILE_BYTES = 64 << 20
EDGE_BYTES = 1 << 20
INFO = "info"            # recorded for whoever reads the stamp, never compared


def file_identity(path) -> dict:
    """{"size", "sha256"} of a file up to WHOLE_FILE_BYTES, {"size", "sha256_size_first_last_mib"}
    of a larger one (the name says what was hashed)."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= WHOLE_FILE_BYTES:
            for block in iter(lambda: f.read(EDGE_BYTES), b""):
                h.update(block)
            return {"size": size, "sha256": h.hexdigest()}
        h.update(str(size).encode() + b"\0" + f.read(EDGE_BYTES))
        f.seek(size - EDGE_BYTES)
        h.update(f.read(EDGE_BYTES))
    return {"size": size, "sha256_size_first_last_mib": h.hexdigest()}


def _file_list(paths) -> list[Path]:
    """Files, and every file under folders (sorted; temporary and hidden files left out)."""
    found = []
    for p in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        p = Path(p)
        if p.is_dir():
            found += sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith(".")
                            and not q.name.endswith(".tmp"))
        else:
            found.append(p)
    return found


def _names(files: list[Path], root) -> list[str]:
    """Names relative to `root` (default: the files' common folder), so that a copy of the whole
    folder elsewhere has the same names."""
    if not files:
        return []
    resolved = [f.resolve() for f in files]
    base = Path(root).resolve() if root is not None else Path(os.path.commonpath([f.parent for f in resolved]))
    return [f.relative_to(base).as_posix() if f.is_relative_to(base) else str(f) for f in resolved]


def files_identity(paths, root=None) -> dict:
    """{name: file_identity} of files and folders (every file under them), named relative to
    `root` (default: their common folder). A missing file raises FileNotFoundError."""
    files = _file_list(paths)
    return {name: file_identity(f) for name, f in zip(_names(files, root), files)}


def text_identity(pairs) -> dict:
    """{"items", "sha256"} of (id, text) pairs in their order: the identity of data held in memory."""
    h, n = hashlib.sha256(), 0
    for key, text in pairs:
        for part in (str(key), str(text)):
            data = part.encode("utf-8", "surrogatepass")
            h.update(len(data).to_bytes(8, "little") + data)  # lengths first: ("ab", "c") != ("a", "bc")
        n += 1
    return {"items": n, "sha256": h.hexdigest()}


def make(settings: dict, inputs: dict | None = None, root=None) -> dict:
    """A stamp: `settings` (JSON values: what shapes the result), and for each key of `inputs` (its
    files and folders) their files_identity; under "info", their paths and mtimes and the time
    written, for whoever reads it."""
    stamp = json.loads(json.dumps(settings, default=str))   # as it will read back: tuples are lists
    info = {"written": time.strftime("%Y-%m-%d %H:%M:%S")}
    for key, paths in (inputs or {}).items():
        files = _file_list(paths)
        names = _names(files, root)
        stamp[key] = {name: file_identity(f) for name, f in zip(names, files)}
        info[key] = {name: {"path": str(f.resolve()), "mtime": time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(f.stat().st_mtime))} for name, f in zip(names, files)}
    stamp[INFO] = info
    return stamp


def _compared(stamp) -> str:
    body = {k: v for k, v in stamp.items() if k != INFO} if isinstance(stamp, dict) else stamp
    return json.dumps(body, sort_keys=True, default=str)


def same(old, new) -> bool:
    """Whether two stamps agree on everything but "info"."""
    return old is not None and new is not None and _compared(old) == _compared(new)


def _flat(value, prefix=""):
    """{"a/b/0": leaf} of nested dicts and lists, "info" left out."""
    if isinstance(value, (dict, list)) and value:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        out = {}
        for k, v in items:
            if not prefix and k == INFO:
                continue
            out.update(_flat(v, f"{prefix}{k}/"))
        return out
    return {prefix.rstrip("/"): value}


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:12] + "..." + text[-6:]


def differences(old: dict | None, new: dict, limit=3) -> str:
    """The first `limit` fields in which two stamps differ, as "field old -> new, ..." (a field one
    of them lacks shows as "absent")."""
    a, b = _flat(old or {}), _flat(new)
    keys = [k for k in dict.fromkeys([*b, *a]) if a.get(k, KeyError) != b.get(k, KeyError)]
    shown = [f"{k} {_short(a[k]) if k in a else 'absent'} -> {_short(b[k]) if k in b else 'absent'}"
             for k in keys[:limit]]
    return ", ".join(shown) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def read_json(path):
    """The JSON value in `path`, or None when the file is absent, empty or not JSON: a marker that
    cannot be read counts as no marker."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def read(path) -> dict | None:
    """The stamp (or result record) in `path`: a JSON object, else None (read_json)."""
    value = read_json(path)
    return value if isinstance(value, dict) else None


def write(path, stamp: dict):
    """Write a stamp or result record atomically (a kill leaves the old file or the whole new one)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json(path, stamp, unique=True, default=str)


def note(text: str):
    print(text, file=sys.stderr, flush=True)


def move_aside(path) -> Path:
    """Rename a result (a file or a folder) to NAME.stale-N, the first N not taken; returns it."""
    path = Path(path)
    n = 1
    while (aside := path.with_name(f"{path.name}.stale-{n}")).exists():
        n += 1
    os.replace(path, aside)
    return aside


def claim(folder, stamp: dict, what: str, name="stamp.json") -> bool:
    """For work stamped before it starts, so that a killed run's partial work can be continued (the
    encoded chunks of a corpus): True when folder/`name` holds `stamp` (reuse or continue what is
    there). Otherwise the folder is made ready for the work: when it holds anything, that is moved
    aside to FOLDER.stale-N with one line on stderr (what changed, or that its stamp is missing or
    unreadable); then `stamp` is written. Returns False: compute."""
    folder = Path(folder)
    old = read(folder / name)
    if same(old, stamp):
        return True
    if folder.is_dir() and any(folder.iterdir()):
        why = (f"was computed from other inputs ({differences(old, stamp)})" if old is not None
               else f"has no readable {name}")
        aside = move_aside(folder)
        note(f"note: {what} in {folder} {why}; moved it to {aside.name} and computing it again")
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / name, stamp)
    return False


def reusable(path, stamp: dict, what: str, key=None, output=None, quiet=False) -> bool:
    """For results stamped when they are finished (a fine-tuning run, a driver's row): True when
    the record in `path` (its `key` entry, when the result carries its own stamp) equals `stamp`.
    An absent or unreadable record: False (compute). A readable record of other inputs: `output`
    (default: `path` itself) is moved aside to NAME.stale-N, with one line on stderr unless `quiet`
    (a caller that reports many at once), and False."""
    record = read(path)
    old = record.get(key) if key is not None and record is not None else record
    if same(old, stamp):
        return True
    if record is not None:
        output = Path(output) if output is not None else Path(path)
        aside = move_aside(output) if output.exists() else None
        if not quiet:
            note(f"note: {what} ({output}) was computed from other inputs ({differences(old, stamp)}); "
                 f"{f'moved it to {aside.name} and ' if aside else ''}computing it again")
    return False
