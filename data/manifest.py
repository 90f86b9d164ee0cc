"""One way to reuse work (docs/reuse.md): every output a later command reuses is a folder written so.

Its files go into a temporary folder beside it; MANIFEST.json, written last, holds the output's key and
each file's SHA-256; then one atomic rename makes it the output. An output of another key is renamed
NAME.<its key's digest> beside it (aside) and taken back when its key is asked for again (take_back). Work
that may stop half-way accumulates in NAME.<digest>.tmp (work_folder), so a rerun of the key continues it.
"""
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from data.atomic import fsync_dir, write_json

MANIFEST = "MANIFEST.json"
KEEP = 2                 # older outputs kept beside each output
READ_BYTES = 8 << 20     # hashed 8 MiB at a time


def note(text: str):
    print(text, file=sys.stderr, flush=True)


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(READ_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def digest(value) -> str:
    """A short name of a JSON value (a key): the first 12 hex digits of its SHA-256."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def read_json(path):
    """The JSON value in `path`, or None when it is absent, empty or not JSON (a file cut by a kill)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def read(folder, name=MANIFEST) -> dict | None:
    """The manifest of `folder`: {"key", "files", ...}, or None when it has none that can be read."""
    m = read_json(Path(folder) / name)
    ok = isinstance(m, dict) and isinstance(m.get("files"), dict) and "key" in m
    return m if ok else None


def hashes(folder, names=None) -> dict:
    """{name: SHA-256} of `names` in `folder` (default: every file under it but its manifest)."""
    folder = Path(folder)
    names = names if names is not None else sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                                                   if p.is_file() and p.name != MANIFEST)
    return {n: sha256(folder / n) for n in names}


def _recorded(path: Path):
    """What the manifest of an output holding `path` (its folder, or the folder above) records of it, or None."""
    for top in (path.parent, path.parent.parent):
        m = read(top)
        if m is None:
            continue
        rel = path.relative_to(top).as_posix()
        if path.is_file():
            return m["files"].get(rel)
        inside = {n[len(rel) + 1:]: h for n, h in m["files"].items() if n.startswith(rel + "/")}
        return inside or None
    return None


def identity(paths):
    """An input by content: a file's SHA-256, a folder's manifest digest or {name: SHA-256}, a list {name: identity}."""
    if isinstance(paths, (list, tuple)):
        names = [Path(p).name for p in paths]
        names = names if len(set(names)) == len(names) else [str(p) for p in paths]
        return {n: identity(p) for n, p in zip(names, paths)}
    path = Path(paths)
    if path.is_dir() and (m := read(path)) is not None:
        return "manifest " + digest({"key": m["key"], "files": m["files"]})
    recorded = _recorded(path)
    if recorded is not None:
        return recorded
    return hashes(path) if path.is_dir() else sha256(path)


def key(settings: dict, inputs: dict | None = None) -> dict:
    """An output's key: `settings` (as JSON reads them back) and the identity of each input."""
    k = json.loads(json.dumps(settings, default=str))
    for name, paths in (inputs or {}).items():
        k[name] = identity(paths)
    return k


def _flat(value, prefix=""):
    if isinstance(value, dict) and value:
        return {name: v for k, sub in value.items() for name, v in _flat(sub, f"{prefix}{k}/").items()}
    return {prefix.rstrip("/"): value}


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 24 else text[:12] + "..." + text[-6:]


def differences(old, new, limit=3) -> str:
    """The first `limit` fields in which two keys differ: "field old -> new, ..." (or "absent")."""
    a, b = _flat(old if isinstance(old, dict) else {}), _flat(new)
    keys = [k for k in dict.fromkeys([*b, *a]) if a.get(k, KeyError) != b.get(k, KeyError)]
    shown = [f"{k} {_short(a[k]) if k in a else 'absent'} -> {_short(b[k]) if k in b else 'absent'}"
             for k in keys[:limit]]
    return ", ".join(shown) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def problem(folder, key=None, check=lambda name: True, name=MANIFEST) -> str | None:
    """None when `folder` is a complete output (of `key`) whose files `check` picks are recorded; else why not."""
    m = read(folder, name)
    if m is None:
        return f"no {name} that can be read (the write did not finish)"
    if key is not None and m["key"] != key:
        return f"made from other inputs ({differences(m['key'], key)})"
    for file, want in m["files"].items():
        if not check(file):
            continue
        if not (Path(folder) / file).is_file():
            return f"{file} is missing"
        if sha256(Path(folder) / file) != want:
            return (f"{file} is not the file that was saved (truncated, damaged or replaced since: its SHA-256 "
                    f"differs from {name}'s)")
    return None


def _fsync_tree(folder):
    for root, _, files in os.walk(folder):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(root)


def finish(tmp, folder, key, files=None, **info) -> Path:
    """Make `tmp` the output `folder` of `key`: its manifest written last (`info`: recorded, never compared),
    synced, then one rename; an output of another key at `folder` is set aside first, one of the same replaced."""
    tmp, folder = Path(tmp), Path(folder)
    files = hashes(tmp) if files is None else files
    write_json(tmp / MANIFEST, {"key": key, "files": files, **info})
    _fsync_tree(tmp)
    if folder.exists():
        if (read(folder) or {}).get("key") == key:
            shutil.rmtree(folder)
        else:
            aside(folder)
    os.replace(tmp, folder)
    fsync_dir(folder.parent)
    return folder


def older(folder, key, suffix="") -> Path:
    """Where an output of `key` is kept once another takes its place."""
    return Path(folder).with_name(f"{Path(folder).name}.{digest(key)}{suffix}")


def work_folder(folder, key) -> Path:
    """The temporary folder of an output of `key` while it is written (pieces there are this key's)."""
    return older(folder, key, ".tmp")


def _kept(folder: Path, suffix="") -> list[Path]:
    """The older outputs (suffix ".tmp": the unfinished work folders) beside `folder`, oldest first."""
    found = [p for p in folder.parent.glob(f"{folder.name}.*{suffix}") if p.is_dir()
             and len(p.name[len(folder.name) + 1:]) == 12 + len(suffix)] if folder.parent.is_dir() else []
    return sorted(found, key=lambda p: p.stat().st_mtime)


def aside(folder, name=MANIFEST, keep=KEEP):
    """Rename the output `folder` aside under its key (no readable manifest: deleted), keeping `keep` older ones."""
    folder = Path(folder)
    m = read(folder, name)
    if m is None:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    target = older(folder, m["key"])
    shutil.rmtree(target, ignore_errors=True)
    os.replace(folder, target)
    os.utime(target)
    for kept in (_kept(folder), _kept(folder, ".tmp")):
        for old in kept[:-keep] if len(kept) > keep else []:
            shutil.rmtree(old, ignore_errors=True)
            note(f"note: removed {old.name} (at most {KEEP} older outputs of {folder.name} are kept, the newest)")
    return target


def take_back(folder, key, what, name=MANIFEST) -> bool:
    """Put an older output of `key` kept beside `folder` back in its place (with a line saying so), and True."""
    folder, copy = Path(folder), older(folder, key)
    if not copy.is_dir() or problem(copy, key, name=name) is not None:
        return False
    m = read(folder, name)
    why = f"was made from other inputs ({differences(m['key'], key)})" if m else "is not finished"
    if folder.exists():
        aside(folder, name, keep=KEEP + 1)   # the copy taken back is one of them
    os.replace(copy, folder)
    note(f"note: {what} in {folder} {why}; {copy.name} was made from these inputs: took it back instead of "
         "computing it again")
    return True


def reuse(folder, key, what, check=lambda name: True) -> bool:
    """True when `folder` is a complete output of `key`, or an older one was taken back; else False (and why)."""
    folder = Path(folder)
    why = problem(folder, key, check)
    if why is None or take_back(folder, key, what):
        return True
    if folder.exists():
        note(f"note: {what} in {folder}: {why}; computing it again")
    return False
