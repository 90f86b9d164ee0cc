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
  NAME.stale-N (below) and computed again in its place, so nothing is lost and nothing
  stale is reported; except data preparation, whose folders are shared by every run trained on
  them: there the command refuses and says which option or command allows it.

Identity of a file: its size and the SHA-256 of its whole content. Hashing costs a read of the
file (README: "Checkpoints, resume and faults" gives the time for 1 GB), so the hash is cached per
file (HashCache: keyed by the file's device, inode, size, mtime and ctime; a file that keeps all
five has not been written since, so a 3 GB corpus or a 1 GB model is hashed once, and a later
identity costs one stat). The decision is on size and hash only; the path and the mtime are
recorded under "info", which is never compared: a copy of the data, or a `touch`, is the same
input and forces no work (it is hashed again, and found the same), while an edit is caught even
when it keeps the name, the size and the mtime.

Stale copies: a result moved aside is kept as NAME.stale-N (N one more than the newest), and a
command that is asked again for what a stale copy holds takes it back instead of computing it
(claim, reusable). Copies are kept up to `keep` per result (KEEP_STALE for the large ones: encoded
corpora and their indexes); beyond that the oldest are deleted, with a line saying which.
"""
import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from data.atomic import write_json
from hf.safetensors_io import SafetensorsError, read_header

READ_BYTES = 8 << 20     # hashed 8 MiB at a time: memory stays small whatever the file size
INFO = "info"            # recorded for whoever reads the stamp, never compared
KEEP_STALE = 2           # stale copies kept of an encoded corpus or an index (each as large as the result)
HASH_CACHE_ENV = "REPR_LAB_HASH_CACHE"   # the cache file's path, or "off" (module docstring)


class HashCache:
    """{(device, inode): (size, mtime_ns, ctime_ns, sha256)} of files hashed before, kept in one
    JSON file (default ~/.cache/repr-lab/file_hashes.json, or $REPR_LAB_HASH_CACHE; "off": no
    cache). An entry is used only while the file's stat still shows all five values: any write
    changes the mtime and the ctime (and os.utime, which can set the mtime back, sets the ctime
    to now), and a file replaced by a rename is another inode. A hash is cached only when the
    file's stat is the same after hashing as before (not written meanwhile). Several processes
    may share the file: each merges its new entries into what is there and writes it atomically;
    an entry lost to a race costs one more hash, never a wrong one. At most MAX_ENTRIES are kept
    (the oldest hashes go first)."""

    MAX_ENTRIES = 20_000

    def __init__(self, path):
        self.path, self.entries, self.loaded = path, None, None

    @staticmethod
    def location():
        value = os.environ.get(HASH_CACHE_ENV, "")
        if value.lower() == "off":
            return None
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return Path(value).expanduser() if value else base / "repr-lab" / "file_hashes.json"

    def _load(self):
        self.loaded = self._version()
        value = read_json(self.path)
        return value.get("entries", {}) if isinstance(value, dict) else {}

    def _version(self):
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    @staticmethod
    def _key(st):
        return f"{st.st_dev}:{st.st_ino}", [st.st_size, st.st_mtime_ns, st.st_ctime_ns]

    def get(self, st) -> str | None:
        key, facts = self._key(st)
        # read again when another process has written it since: the other ranks hash their own
        # checkpoint files as they save them, and rank 0 finds them here
        if self.entries is None or (key not in self.entries and self._version() != self.loaded):
            self.entries = self._load()
        entry = self.entries.get(key)
        return entry["sha256"] if isinstance(entry, dict) and entry.get("stat") == facts else None

    def put(self, st, path, sha256):
        key, facts = self._key(st)
        entry = {"stat": facts, "sha256": sha256, "path": str(path), "hashed": time.time()}
        self.entries = {**self._load(), key: entry}        # what other processes added meanwhile
        if len(self.entries) > self.MAX_ENTRIES:
            newest = sorted(self.entries, key=lambda k: self.entries[k].get("hashed", 0))[-self.MAX_ENTRIES:]
            self.entries = {k: self.entries[k] for k in newest}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.path, {"version": 1, "entries": self.entries}, indent=None, unique=True)
        except OSError:  # a read-only home, a full disk: the cache only saves time
            pass


_caches = {}


def _cache() -> HashCache | None:
    path = HashCache.location()
    if path is None:
        return None
    return _caches.setdefault(path, HashCache(path))


def sha256_of_file(path) -> str:
    """The SHA-256 of a file's whole content, read in READ_BYTES blocks (no cache)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(READ_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def file_identity(path) -> dict:
    """{"size", "sha256"} of a file: its size and the hash of its whole content, from the cache
    when the file has not been written since it was hashed (HashCache)."""
    path = Path(path)
    before = path.stat()
    cache = _cache()
    digest = cache.get(before) if cache is not None else None
    if digest is None:
        digest = sha256_of_file(path)
        after = path.stat()
        if cache is not None and HashCache._key(after) == HashCache._key(before):
            cache.put(after, path.resolve(), digest)
    return {"size": before.st_size, "sha256": digest}


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


def changed_files(folder, record: dict) -> list[str]:
    """The names of `record` ({name: file_identity}, as files_identity made it) whose file in
    `folder` is missing or holds other content: a result checked before it is used again."""
    folder = Path(folder)
    return [name for name, want in record.items()
            if not (folder / name).is_file() or file_identity(folder / name) != want]


def folder_identity(folder) -> dict:
    """{"files", "bytes", "sha256"} of a folder by content: every file under it (files_identity),
    hashed by name and content into one digest; a renamed, added, removed or edited file changes
    it, a copy of the folder elsewhere or a `touch` does not."""
    files = files_identity(folder, root=folder)
    listing = json.dumps(sorted((name, f["sha256"]) for name, f in files.items()))
    return {"files": len(files), "bytes": sum(f["size"] for f in files.values()),
            "sha256": hashlib.sha256(listing.encode()).hexdigest()}


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


def _is_info(key, value) -> bool:
    return key == INFO and isinstance(value, dict) and "written" in value


def _without_info(value):
    """A stamp (or a record holding stamps) without its "info" sections, at any depth."""
    if isinstance(value, dict):
        return {k: _without_info(v) for k, v in value.items() if not _is_info(k, v)}
    if isinstance(value, list):
        return [_without_info(v) for v in value]
    return value


def _compared(stamp) -> str:
    return json.dumps(_without_info(stamp), sort_keys=True, default=str)


def same(old, new) -> bool:
    """Whether two stamps agree on everything but "info"."""
    return old is not None and new is not None and _compared(old) == _compared(new)


def _flat(value, prefix=""):
    """{"a/b/0": leaf} of nested dicts and lists, "info" left out."""
    if isinstance(value, (dict, list)) and value:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        out = {}
        for k, v in items:
            if _is_info(k, v):
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


def stale_copies(path) -> list[Path]:
    """The stale copies of a result, NAME.stale-N, oldest (lowest N) first."""
    path = Path(path)
    pattern = re.compile(re.escape(path.name) + r"\.stale-(\d+)")
    found = [(int(m[1]), p) for p in path.parent.glob(f"{glob_escape(path.name)}.stale-*")
             if (m := pattern.fullmatch(p.name))] if path.parent.is_dir() else []
    return [p for _, p in sorted(found)]


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def move_aside(path, keep: int | None = None) -> Path:
    """Rename a result (a file or a folder) to NAME.stale-N, N one more than the newest copy's;
    returns it. keep: then delete the oldest copies beyond `keep`, with a line naming them."""
    path = Path(path)
    copies = stale_copies(path)
    n = int(copies[-1].name.rsplit("-", 1)[1]) + 1 if copies else 1
    aside = path.with_name(f"{path.name}.stale-{n}")
    os.replace(path, aside)
    if keep is not None:
        prune_stale(path, keep)
    return aside


def prune_stale(path, keep: int):
    """Delete the oldest stale copies of a result beyond the newest `keep`, saying which."""
    gone = stale_copies(path)[:-keep] if keep > 0 else stale_copies(path)
    for old in gone:
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    if gone:
        note(f"note: removed {', '.join(p.name for p in gone)} (at most {keep} stale copies of {Path(path).name} "
             "are kept, the newest)")


def matching_stale(path, stamp: dict, name=None, key=None) -> Path | None:
    """The newest stale copy of `path` whose stamp equals `stamp`: read from its `name` file (for a
    folder) or the copy itself, its `key` entry when the record carries its own stamp."""
    for copy in reversed(stale_copies(path)):
        record = read(copy / name if name else copy)
        if same(record.get(key) if key is not None and record is not None else record, stamp):
            return copy
    return None


def take_back(path, copy: Path, keep: int | None, what: str, why: str):
    """Put the stale copy `copy` back in place of `path` (whose own content is moved aside first),
    with one line saying so."""
    path = Path(path)
    aside = move_aside(path) if path.exists() else None
    os.replace(copy, path)
    moved = f"moved it to {aside.name}; " if aside is not None else ""
    note(f"note: {what} in {path} {why}; {moved}{copy.name} was computed from these inputs: took it back "
         "instead of computing it again")
    if keep is not None:
        prune_stale(path, keep)


def claim(folder, stamp: dict, what: str, name="stamp.json", keep: int | None = None) -> bool:
    """For work stamped before it starts, so that a killed run's partial work can be continued (the
    encoded chunks of a corpus): True when folder/`name` holds `stamp` (reuse or continue what is
    there), or when a stale copy FOLDER.stale-N does, which is then taken back (take_back).
    Otherwise the folder is made ready for the work: when it holds anything, that is moved aside
    to FOLDER.stale-N with one line on stderr (what changed, or that its stamp is missing or
    unreadable); then `stamp` is written. Returns False: compute. keep: stale copies kept."""
    folder = Path(folder)
    old = read(folder / name)
    if same(old, stamp):
        return True
    why = (f"was computed from other inputs ({differences(old, stamp)})" if old is not None
           else f"has no readable {name}")
    if (copy := matching_stale(folder, stamp, name)) is not None:
        take_back(folder, copy, keep, what, why)
        return True
    if folder.is_dir() and any(folder.iterdir()):
        aside = move_aside(folder)
        note(f"note: {what} in {folder} {why}; moved it to {aside.name} and computing it again")
        if keep is not None:
            prune_stale(folder, keep)
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / name, stamp)
    return False


def reusable(path, stamp: dict, what: str, key=None, output=None, quiet=False, keep: int | None = None) -> bool:
    """For results stamped when they are finished (a fine-tuning run, a driver's row): True when
    the record in `path` (its `key` entry, when the result carries its own stamp) equals `stamp`,
    or when a stale copy of `output` (default: `path` itself) holds such a record: it is taken back
    (take_back). An absent or unreadable record: False (compute). A readable record of other
    inputs: `output` is moved aside to NAME.stale-N, with one line on stderr unless `quiet` (a
    caller that reports many at once), and False. keep: stale copies kept."""
    record = read(path)
    old = record.get(key) if key is not None and record is not None else record
    if same(old, stamp):
        return True
    output = Path(output) if output is not None else Path(path)
    inside = Path(path).relative_to(output).as_posix() if Path(path).is_relative_to(output) else None
    if inside is not None and (copy := matching_stale(output, stamp, inside if inside != "." else None, key)):
        why = (f"was computed from other inputs ({differences(old, stamp)})" if old is not None
               else "has no readable record")
        take_back(output, copy, keep, what, why)
        return True
    if record is not None:
        aside = move_aside(output, keep) if output.exists() else None
        if not quiet:
            note(f"note: {what} ({output}) was computed from other inputs ({differences(old, stamp)}); "
                 f"{f'moved it to {aside.name} and ' if aside else ''}computing it again")
    return False


def manifest_problem(folder, by_content=lambda name: True, only=None):
    """None if the files of checkpoint `folder` are those its MANIFEST.json records, else what is
    wrong. Each file by size, and those `by_content` picks by the SHA-256 the manifest holds
    (cached per file (HashCache): a stat once hashed; a manifest written before it held hashes
    is checked by size alone). only: the prefix of the files to check (None: all)."""
    manifest = Path(folder) / "MANIFEST.json"
    if not manifest.exists():
        return "no MANIFEST.json (the save did not finish)"
    try:
        record = json.loads(manifest.read_text())
        files, hashes = record["files"], record.get("sha256", {})
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable MANIFEST.json ({e})"
    for name, size in files.items():
        p = Path(folder) / name
        if only is not None and not name.startswith(only):
            continue
        if not p.exists():
            return f"{name} is missing"
        if p.stat().st_size != size:
            return f"{name} has {p.stat().st_size} bytes, the manifest says {size} (truncated or overwritten)"
        if name in hashes and by_content(name) and file_identity(p)["sha256"] != hashes[name]:
            return (f"{name} is not the file that was saved (its content changed since, its size kept: the "
                    "SHA-256 differs from MANIFEST.json's)")
        if name.endswith(".safetensors"):
            try:
                read_header(p)
            except SafetensorsError as e:
                return str(e)
    return None
