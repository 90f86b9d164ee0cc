"""Download files from the Hugging Face Hub with urllib (which honours HTTPS_PROXY) into the cache that
`huggingface_hub` uses too, so files either tool downloaded serve the other:

    {HF_HUB_CACHE}/models--org--name/      (datasets--org--name)
        blobs/<etag>                       the bytes, named by git sha1 (small files) or sha256 (LFS)
        snapshots/<commit>/<filename>      relative symlink to its blob (a copy where symlinks fail)
        refs/<revision>                    the commit a branch or tag pointed to when last resolved

A cached file costs one HEAD request online, none offline (HF_HUB_OFFLINE=1) or at a full commit hash; a blob
is fetched into `<etag>.incomplete`, resumed after a cut connection, checked, then renamed into place.
Environment: HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, HF_HUB_CACHE, HF_HOME, HF_HUB_DISABLE_PROGRESS_BARS.

    python -m hf.hub download bert-base-uncased config.json
    python -m hf.hub ls mteb/nfcorpus --repo-type dataset
"""
import argparse
import collections
import contextlib
import errno
import fnmatch
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

if __package__ in (None, ""):  # run as a file, Python put hf/ on sys.path: the repo root must be there too
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tqdm import tqdm

from data.atomic import write_text
from cli import UserError

REPO_TYPES = {"model": "models", "dataset": "datasets"}  # repo_type -> URL/cache-folder prefix
COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
SAFE_ETAG = re.compile(r"^[0-9A-Za-z._-]+$")  # an etag becomes a file name under blobs/
# a repo name part: letters, digits, '_', '-', '.', starting and ending with a letter or digit, at most 96
REPO_PART = re.compile(r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?")

CHUNK_BYTES = 1 << 20
PROGRESS_MIN_BYTES = 10 << 20      # no progress bar for config/tokenizer files
GET_TIMEOUT_S = 60                 # per socket read: a stalled CDN connection is retried, not waited on
MAX_ATTEMPTS = 3                   # HEAD/API calls on 5xx/429/reset connections
MAX_STALLED_DOWNLOADS = 5          # consecutive GETs that bring no new byte before giving up
RETRY_BACKOFF_S = 1.0              # doubled after each failed attempt
RETRY_STATUS = {429, 500, 502, 503, 504}


class HubError(UserError, RuntimeError):
    """Every Hub failure; the message names the repo, the file, the revision and the fix."""


class RepoNotFoundError(HubError):
    """No such repo (or a private one, without a token that may see it)."""


class EntryNotFoundError(HubError):
    """No such file (or no file matching the patterns) at the revision."""


class RevisionNotFoundError(HubError):
    """No such branch, tag or commit."""


class GatedRepoError(HubError):
    """A gated or private repo that the token sent (if any) may not read."""


class ChecksumError(HubError):
    """The bytes received twice in a row do not match the file's size or sha256."""


class BadSpec(HubError, ValueError):
    """A Hub spec (hf:org/name[@revision]) that names no possible repository."""


class OfflineCacheMissError(HubError):
    needs = "the Hub"  # UserError.needs: experiments/runner.py stops the jobs that need it too


class HubUnreachable(HubError):
    needs = "the Hub"


class _NetworkDown(Exception):
    """The Hub could not be reached at all (DNS, refused connection, repeated resets)."""


class _CutShort(Exception):
    """A GET ended before the whole file arrived; the caller resumes it with Range."""


def parse_spec(spec: str) -> tuple[str, str]:
    """'hf:org/name@rev' (or 'org/name', 'hf:name') -> ('org/name', 'rev'); revision defaults to main."""
    body = spec.removeprefix("hf:")
    repo_id, at, revision = body.partition("@")
    problem = None
    if not all(REPO_PART.fullmatch(p) and ".." not in p and "--" not in p for p in repo_id.split("/")) \
            or repo_id.count("/") > 1:
        problem = f"{repo_id!r} is not a Hub repository name (org/name: letters, digits, '_', '-', '.')"
    elif at and (not revision or revision.startswith("/") or "\\" in revision or ".." in revision.split("/")):
        problem = f"revision {revision!r} is not a branch, tag or commit"
    if problem:
        local = f"; for a local folder, give its path without hf: ({body})" if spec.startswith("hf:") and body else ""
        raise BadSpec(f"bad Hub spec {spec!r}: {problem}. Expected hf:org/name or hf:org/name@revision{local}")
    return repo_id, revision or "main"


def _endpoint() -> str:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    if not endpoint.startswith(("https://", "http://")):
        raise HubError(f"HF_ENDPOINT={endpoint!r} must be a URL such as https://huggingface.co")
    return endpoint


def _is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _hf_home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(os.environ.get("HF_HOME") or default).expanduser()


def _headers() -> dict[str, str]:
    token = os.environ.get("HF_TOKEN", "").strip()
    with contextlib.suppress(OSError):
        token = token or Path(os.environ.get("HF_TOKEN_PATH") or _hf_home() / "token").read_text().strip()
    return {"User-Agent": "nano-hub/1.0", **({"Authorization": f"Bearer {token}"} if token else {})}


def _check_relative(name: str, what: str) -> None:
    # File names come from the server too (snapshot_download); none may escape the snapshot folder.
    if not name or name.startswith("/") or ".." in PurePosixPath(name).parts:
        raise HubError(f"refusing {what} {name!r}: it must be a relative path inside the repo")


@dataclass(frozen=True)
class _Target:
    """The repo (and file) a request is about; str() is how every message names it."""
    repo_id: str
    repo_type: str
    revision: str
    filename: str | None = None

    def __str__(self) -> str:
        repo = f"{self.repo_type} repo '{self.repo_id}' at revision '{self.revision}'"
        return f"file '{self.filename}' of {repo}" if self.filename else repo

    @property
    def page(self) -> str:
        return f"{_endpoint()}/{'datasets/' if self.repo_type == 'dataset' else ''}{self.repo_id}"

    def url(self, revision: str) -> str:
        return f"{self.page}/resolve/{urllib.parse.quote(revision, safe='')}/{urllib.parse.quote(self.filename)}"

    def api(self, route: str, revision: str) -> str:
        quoted = urllib.parse.quote(revision, safe="")
        return f"{_endpoint()}/api/{REPO_TYPES[self.repo_type]}/{self.repo_id}/{route}/{quoted}"

    @property
    def storage(self) -> Path:
        """Its folder in the cache: HF_HUB_CACHE, else HF_HOME/hub (~/.cache/huggingface/hub)."""
        cache = Path(os.environ.get("HF_HUB_CACHE") or _hf_home() / "hub").expanduser()
        return cache / "--".join([REPO_TYPES[self.repo_type], *self.repo_id.split("/")])


# ----------------------------------------------------------------------------- cache layout
def _cached_commit(storage: Path, revision: str) -> str | None:
    if COMMIT_HASH.match(revision):
        return revision
    with contextlib.suppress(OSError):
        return (storage / "refs" / revision).read_text().strip() or None
    return None


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    if revision != commit and _cached_commit(storage, revision) != commit:
        (storage / "refs" / revision).parent.mkdir(parents=True, exist_ok=True)
        write_text(storage / "refs" / revision, commit, unique=True)  # unique: ranks and threads race here


def _link_pointer(blob: Path, pointer: Path) -> None:
    """snapshots/<commit>/<file> -> ../../blobs/<etag>, relative so the cache folder can be moved."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(f"{pointer.name}.{uuid.uuid4().hex}.tmp")
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), tmp)
    except (OSError, NotImplementedError):  # e.g. Windows without developer mode, some network mounts
        shutil.copyfile(blob, tmp)
    os.replace(tmp, pointer)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


# ----------------------------------------------------------------------------- HTTP
class _RedirectPolicy(urllib.request.HTTPRedirectHandler):
    """Keep the method across redirects, optionally stay on the same origin (scheme, host, port),
    and send the token only to the origin it was given for (a CDN must never see it)."""
    def __init__(self, same_origin_only: bool):
        self.same_origin_only = same_origin_only

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        same_origin = urllib.parse.urlsplit(newurl)[:2] == urllib.parse.urlsplit(req.full_url)[:2]
        if self.same_origin_only and not same_origin:
            return None  # urllib then raises HTTPError(3xx) and the caller reads its headers
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        new.method = req.get_method()  # urllib would turn a redirected HEAD into a GET
        if not same_origin:
            new.remove_header("Authorization")
        return new


def _open(method: str, url: str, headers: dict[str, str], *, same_origin_only=False, timeout=30.0):
    """Open url; retry 5xx/429 and reset connections with backoff; an unreachable Hub raises _NetworkDown."""
    opener = urllib.request.build_opener(_RedirectPolicy(same_origin_only))
    for attempt in range(MAX_ATTEMPTS):
        last = attempt == MAX_ATTEMPTS - 1
        try:
            return opener.open(urllib.request.Request(url, method=method, headers=headers), timeout=timeout)
        except urllib.error.HTTPError as err:
            if err.code not in RETRY_STATUS or last:
                raise
            err.close()
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", err)  # no point retrying a name that does not resolve, or no route
            unreachable = isinstance(reason, (socket.gaierror, ConnectionRefusedError)) or \
                getattr(reason, "errno", None) in (errno.ENETUNREACH, errno.EHOSTUNREACH)
            if last or unreachable:
                raise _NetworkDown(reason) from err
        time.sleep(RETRY_BACKOFF_S * 2 ** attempt)


def _hub_error(err: urllib.error.HTTPError, where: _Target, token_sent: bool) -> HubError:
    """Map the Hub's status and X-Error-Code header to an error that says what to do."""
    code = err.headers.get("X-Error-Code", "") if err.headers else ""
    said = err.headers.get("X-Error-Message") if err.headers else None
    said = f" (Hub says: {said})" if said else ""
    if code == "GatedRepo" or (not code and err.code in (401, 403)):
        fix = "the token sent may not read it: use a token" if token_sent else "set HF_TOKEN to a token"
        return GatedRepoError(f"{where} is gated or private (HTTP {err.code}){said}: {fix} of an account that accepted "
                              f"the licence on {where.page}.")
    if code == "RepoNotFound" or (not code and err.code == 404 and where.filename is None):
        return RepoNotFoundError(f"{where}: no such repo on {_endpoint()} (HTTP {err.code}){said}. Check the repo id "
                                 f"and repo_type ('dataset' for datasets); if the repo is private, set HF_TOKEN.")
    if code == "RevisionNotFound":
        return RevisionNotFoundError(f"{where}: revision '{where.revision}' does not exist (HTTP {err.code}){said}. "
                                     f"Use an existing branch, tag or full commit hash (see {where.page}).")
    if code == "EntryNotFound" or err.code == 404:
        return EntryNotFoundError(f"{where}: no such file at this revision (HTTP {err.code}){said}. Check the file "
                                  f"name (list_repo_files('{where.repo_id}') shows what exists) and the revision.")
    return HubError(f"{where}: HTTP {err.code} {err.reason}{said} from {err.url}; try again later.")


FileMetadata = collections.namedtuple("FileMetadata", "commit etag size")  # size: None where the Hub gives none


def _file_metadata(where: _Target, headers: dict[str, str]) -> FileMetadata:
    """One HEAD request: the commit the revision points to, the file's etag and size. An LFS file
    answers with a redirect to the CDN that carries the metadata, so only redirects on the Hub itself
    (a renamed repo) are followed."""
    try:
        with _open("HEAD", where.url(where.revision), headers, same_origin_only=True, timeout=10) as resp:
            found, redirect = resp.headers, False
    except urllib.error.HTTPError as err:
        with contextlib.closing(err):
            if not 300 <= err.code < 400:
                raise _hub_error(err, where, "Authorization" in headers) from None
            found, redirect = err.headers, True
    commit, etag = found.get("X-Repo-Commit"), found.get("X-Linked-Etag") or found.get("ETag")
    etag = etag.removeprefix("W/").strip('"') if etag else None
    if not (commit and etag and COMMIT_HASH.match(commit) and SAFE_ETAG.match(etag)):  # both become cache names
        raise HubError(f"{where}: {_endpoint()} sent no usable X-Repo-Commit/ETag headers ({commit!r}, {etag!r}); "
                       "is HF_ENDPOINT a Hugging Face Hub (or a mirror that forwards those headers)?")
    # On a redirect, Content-Length is the length of the redirect's own body, not of the file.
    size = found.get("X-Linked-Size") or (None if redirect else found.get("Content-Length"))
    return FileMetadata(commit, etag, int(size) if size else None)


# ----------------------------------------------------------------------------- blob download
def _disk_error(err: OSError, path: Path, need: int | None, where: _Target, removed: bool) -> HubError:
    free = shutil.disk_usage(path.parent).free if path.parent.exists() else 0
    what = "no space left on device" if err.errno == errno.ENOSPC else f"cannot write ({err})"
    need = f"{need:,} more bytes" if need is not None else "the whole file"
    kept = "the partial file was removed" if removed else "nothing was written"
    return HubError(f"{what} for {where} at {path}: the download needs {need}, {free:,} bytes are free "
                    f"there ({kept}). Free some space or point HF_HUB_CACHE at a larger disk, then run again.")


def _append_missing_bytes(url: str, headers: dict[str, str], tmp: Path, bar: tqdm, where: _Target) -> None:
    """One GET for the bytes `tmp` lacks. Raises _CutShort when the connection ends early."""
    have = _size(tmp)
    try:
        resp = _open("GET", url, dict(headers, Range=f"bytes={have}-") if have else headers, timeout=GET_TIMEOUT_S)
    except urllib.error.HTTPError as err:
        with contextlib.closing(err):
            if err.code == 416:  # a partial longer than the file: it cannot be a prefix of it
                tmp.unlink()
                raise _CutShort("the partial file was longer than the file; restarting") from None
            raise _hub_error(err, where, "Authorization" in headers) from None
    except _NetworkDown as err:
        raise _CutShort(str(err)) from err
    with resp:
        if have and resp.status != 206:  # the server ignored Range and sends the whole file
            have = 0
            bar.reset(total=bar.total)
        expected, received = resp.headers.get("Content-Length"), 0
        with open(tmp, "ab" if have else "wb") as f:
            while True:
                try:
                    chunk = resp.read(CHUNK_BYTES)
                except (OSError, http.client.HTTPException) as err:  # resets, timeouts, TLS cut mid-record
                    raise _CutShort(f"{type(err).__name__}: {err}") from err
                if not chunk:
                    break
                f.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
            f.flush()
            os.fsync(f.fileno())  # the rename below must never expose a file whose bytes are not on disk
    if expected is not None and received < int(expected):
        # http.client returns b"" on an early close instead of raising: the length check is ours.
        raise _CutShort(f"connection closed after {received:,} of {int(expected):,} bytes")


def _fetch_into(tmp: Path, meta: FileMetadata, url: str, headers: dict[str, str], where: _Target) -> None:
    """Complete `tmp`, resuming after cut connections; gives up after a few attempts without progress."""
    stalled = 0
    quiet = meta.size is None or meta.size < PROGRESS_MIN_BYTES or \
        os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").lower() in {"1", "true", "yes"}
    tty = sys.stderr.isatty()  # redirected to a log file, a bar would append a line ten times a second for hours
    with tqdm(total=meta.size, initial=_size(tmp), unit="B", unit_scale=True, unit_divisor=1024, desc=where.filename,
              disable=quiet, mininterval=0.5 if tty else 60, dynamic_ncols=tty) as bar:
        while (have := _size(tmp)) != meta.size:  # equal: killed between the last byte and the rename
            try:
                return _append_missing_bytes(url, headers, tmp, bar, where)
            except _CutShort as err:
                stalled = 0 if _size(tmp) > have else stalled + 1
                if stalled >= MAX_STALLED_DOWNLOADS:
                    raise HubError(f"download of {where} keeps failing ({err}); {tmp} keeps the {_size(tmp):,} bytes "
                                   "received, the next run resumes from there: check the network, run again") from err
                if stalled:
                    time.sleep(RETRY_BACKOFF_S * 2 ** (stalled - 1))


def _verification_problem(path: Path, meta: FileMetadata) -> str | None:
    size = path.stat().st_size
    if meta.size is not None and size != meta.size:
        return f"got {size:,} bytes, expected {meta.size:,}"
    if SHA256_HEX.match(meta.etag):  # LFS files are named by the sha256 of their content
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != meta.etag:
            return f"sha256 {digest} does not match the expected {meta.etag}"
    return None


def _download_blob(blob: Path, meta: FileMetadata, url: str, headers: dict[str, str], where: _Target) -> None:
    tmp = blob.with_name(blob.name + ".incomplete")
    try:
        for attempt in (1, 2):
            missing = None if meta.size is None else meta.size - _size(tmp)
            if missing is not None and shutil.disk_usage(tmp.parent).free < missing:  # say so before hours of it
                raise _disk_error(OSError(errno.ENOSPC, "No space left"), tmp, missing, where, removed=False)
            _fetch_into(tmp, meta, url, headers, where)
            problem = _verification_problem(tmp, meta)
            if problem is None:
                os.replace(tmp, blob)
                return
            tmp.unlink()
            if attempt == 1:
                warnings.warn(f"{where}: {problem}; downloading it again")
    except OSError as err:  # writing failed (disk full, quota, permissions): a partial must not linger
        tmp.unlink(missing_ok=True)
        raise _disk_error(err, tmp, meta.size, where, removed=True) from err
    raise ChecksumError(f"{where}: {problem}, twice in a row. The copy on the server or a proxy on the way is "
                        f"corrupt; nothing was kept in the cache. Try again later or report it on {where.page}.")


# ----------------------------------------------------------------------------- public API
def hf_hub_download(repo_id: str, filename: str, *, repo_type: str = "model", revision: str = "main") -> Path:
    """Path of `filename` in the cache snapshot of `repo_id` at `revision`, downloading it if needed."""
    _check_relative(filename, "file name")
    _check_relative(revision, "revision")
    where = _Target(repo_id, repo_type, revision, filename)
    storage = where.storage
    commit = _cached_commit(storage, revision)
    cached = storage / "snapshots" / commit / filename if commit else None
    cached = cached if cached is not None and cached.exists() else None  # exists() is False for a dangling link
    if cached is not None and COMMIT_HASH.match(revision):
        return cached  # the files of a commit never change: no request at all
    headers = _headers()
    meta = _ask(where, cached, str(where), lambda: _file_metadata(where, headers))
    if meta is None:
        return cached
    pointer = storage / "snapshots" / meta.commit / filename
    if not pointer.exists():
        blob = storage / "blobs" / meta.etag
        lock = storage.parent / ".locks" / storage.name / f"{meta.etag}.lock"  # huggingface_hub's lock file
        for folder in (blob.parent, lock.parent):
            folder.mkdir(parents=True, exist_ok=True)
        import fcntl
        with open(lock, "a") as f:  # two DDP ranks, or this code and the official client, never write one blob
            fcntl.flock(f, fcntl.LOCK_EX)
            if not blob.exists():  # another process may have finished it while we waited
                # Fetch by commit, not branch: the bytes must be those the HEAD described.
                _download_blob(blob, meta, where.url(meta.commit), headers, where)
        _link_pointer(blob, pointer)
    _write_ref(storage, revision, meta.commit)
    return pointer


def _ask(where: _Target, cached: Path | None, what: str, request):
    """request()'s answer from the Hub, or None where the cache must serve: offline (HF_HUB_OFFLINE=1), or
    with the Hub unreachable (a warning); without a `cached` answer, an error naming `what` is missing."""
    if _is_offline() and cached is None:
        raise OfflineCacheMissError(f"HF_HUB_OFFLINE=1 and {what} is not in the cache {where.storage}. Unset "
                                    f"HF_HUB_OFFLINE to download it, or point HF_HUB_CACHE/HF_HOME at a cache with it.")
    if _is_offline():
        return None
    try:
        return request()
    except _NetworkDown as err:
        if cached is None:  # HF_HUB_OFFLINE=1 is advised only where this repo has cached files for it to use
            snapshots = where.storage / "snapshots"
            fix = (f", or set HF_HUB_OFFLINE=1 to use only the files already cached in {where.storage}"
                   if snapshots.is_dir() and any(snapshots.iterdir()) else
                   f"; nothing of {where.repo_id} is cached yet ({where.storage}), so it needs the Hub once")
            raise HubUnreachable(f"cannot reach {_endpoint()} for {where}: {err}. Check the network, "
                                 f"HF_ENDPOINT{fix}.") from None
        warnings.warn(f"cannot reach {_endpoint()} ({err}); using the cached {what}")
        return None


def _get_json(url: str, headers: dict[str, str], where: _Target):
    """GET a Hub API url -> (parsed JSON, url of the next page or None); _NetworkDown if unreachable."""
    try:
        with _open("GET", url, headers) as resp:
            # the Hub pages listings with an RFC 8288 header: Link: <https://...&cursor=...>; rel="next"
            found = re.search(r'<([^>]*)>\s*;\s*rel="?next"?', resp.headers.get("Link") or "")
            return json.loads(resp.read()), found and urllib.parse.urljoin(url, found.group(1))
    except urllib.error.HTTPError as err:
        with contextlib.closing(err):
            raise _hub_error(err, where, "Authorization" in headers) from None
    except (OSError, http.client.HTTPException, ValueError) as err:  # cut mid-body, or not JSON
        raise HubError(f"bad answer from {url} for {where}: {err}; try again later") from err


def list_repo_files(repo_id: str, *, repo_type: str = "model", revision: str = "main") -> list[str]:
    """All file paths in the repo at `revision` (Hub tree API, every page)."""
    where = _Target(repo_id, repo_type, revision)
    headers, url, files = _headers(), where.api("tree", revision) + "?recursive=true", []
    while url:
        entries, url = _ask(where, None, f"the file list of {where}", lambda: _get_json(url, headers, where))
        files += [e["path"] for e in entries if e.get("type") == "file"]
    return files


def _matches(path: str, patterns: list[str] | None) -> bool:
    # "folder/" means everything under the folder, as in huggingface_hub.
    return patterns is None or any(fnmatch.fnmatch(path, p + "*" if p.endswith("/") else p) for p in patterns)


def snapshot_download(repo_id: str, *, repo_type: str = "model", revision: str = "main",
                      allow_patterns: list[str] | None = None) -> Path:
    """Download every file matching `allow_patterns` (fnmatch; None: all); returns `.../snapshots/<commit>`."""
    _check_relative(revision, "revision")
    where = _Target(repo_id, repo_type, revision)
    storage = where.storage
    commit = _cached_commit(storage, revision)
    cached = storage / "snapshots" / commit if commit else None
    if cached is None or not any(_matches(p.relative_to(cached).as_posix(), allow_patterns)
                                 for p in cached.rglob("*") if p.is_file()):
        cached = None
    # pin the commit first, so that every file comes from the same one even if the branch moves
    info = _ask(where, cached, f"a snapshot of {where} with files matching {allow_patterns}",
                lambda: _get_json(where.api("revision", revision), _headers(), where)[0])
    if info is None:
        return cached
    commit = info.get("sha", "") if isinstance(info, dict) else ""
    if not COMMIT_HASH.match(commit):
        raise HubError(f"{where}: the Hub API answered without a commit hash ({str(info)[:200]})")
    files = [f for f in list_repo_files(repo_id, repo_type=repo_type, revision=commit) if _matches(f, allow_patterns)]
    if not files:
        raise EntryNotFoundError(f"{where} has no file matching {allow_patterns}: see list_repo_files('{repo_id}')")
    for filename in files:
        hf_hub_download(repo_id, filename, repo_type=repo_type, revision=commit)
    _write_ref(storage, revision, commit)
    return storage / "snapshots" / commit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hf.hub", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["download", "ls", "snapshot"], help="download FILE and print its path, list "
                   "the repo's files, or download the files matching --include and print the snapshot folder")
    p.add_argument("repo")
    p.add_argument("file", nargs="?", help="the file to download")
    p.add_argument("--include", action="append", help="snapshot: an fnmatch pattern (repeatable; default: all)")
    p.add_argument("--repo-type", default="model", choices=sorted(REPO_TYPES))
    p.add_argument("--revision", default="main")
    args = p.parse_args(argv)
    where = dict(repo_type=args.repo_type, revision=args.revision)
    if args.command == "download":
        print(hf_hub_download(args.repo, args.file or p.error("download needs a FILE"), **where))
    elif args.command == "ls":
        print("\n".join(list_repo_files(args.repo, **where)))
    else:
        print(snapshot_download(args.repo, allow_patterns=args.include, **where))
    return 0


if __name__ == "__main__":
    from cli import run_cli
    sys.exit(run_cli(main))
