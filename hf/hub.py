"""Download files from the Hugging Face Hub over plain HTTPS into the standard Hugging Face cache.

Only the standard library talks to the network (urllib, which also honours HTTPS_PROXY), so the
project needs neither `requests` nor `huggingface_hub`, yet it shares their cache: files either tool
downloaded are reused by the other. The cache of one repo looks like

    {HF_HUB_CACHE}/models--org--name/            (datasets--org--name for datasets)
        blobs/<etag>                    the bytes, named by git sha1 (small files) or sha256 (LFS files)
        snapshots/<commit>/<filename>   relative symlink to its blob (a copy where symlinks fail)
        refs/<revision>                 the commit a branch or tag pointed to when last resolved

One HEAD request on `{HF_ENDPOINT}/{repo}/resolve/{revision}/{filename}` tells the commit
(X-Repo-Commit) and the content hash (X-Linked-Etag for LFS files, ETag otherwise) without sending the
file, so a cached file costs that one request online and none offline (HF_HUB_OFFLINE=1) or when the
revision is a full commit hash. Missing blobs are fetched into `blobs/<etag>.incomplete`, resumed
with `Range` after a cut connection, checked against their size and (LFS) sha256, and only then
renamed into place: a blob under its final name is always complete.

Environment: HF_ENDPOINT, HF_TOKEN (or the token file under HF_HOME), HF_HUB_OFFLINE, HF_HUB_CACHE,
HF_HOME, HF_HUB_DISABLE_PROGRESS_BARS.

    python -m hf.hub download bert-base-uncased config.json
    python -m hf.hub download mteb/nfcorpus corpus.jsonl --repo-type dataset
    python -m hf.hub ls answerdotai/ModernBERT-base
"""
import argparse
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

if __package__ in (None, ""):  # run as a file, Python put hf/ on sys.path: the repo root must be there instead
    _here = str(Path(__file__).resolve().parent)
    sys.path = [p for p in sys.path if str(Path(p or ".").resolve()) != _here]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tqdm import tqdm

from data.atomic import write_text
from cli import UserError

DEFAULT_ENDPOINT = "https://huggingface.co"
REPO_TYPES = {"model": "models", "dataset": "datasets"}  # repo_type -> URL/cache-folder prefix
COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
SAFE_ETAG = re.compile(r"^[0-9A-Za-z._-]+$")  # an etag becomes a file name under blobs/

CHUNK_BYTES = 1 << 20
PROGRESS_MIN_BYTES = 10 << 20      # no progress bar for config/tokenizer files
HEAD_TIMEOUT_S = 10
GET_TIMEOUT_S = 60                 # per socket read: a stalled CDN connection is retried, not waited on
MAX_ATTEMPTS = 3                   # HEAD/API calls on 5xx/429/reset connections
MAX_STALLED_DOWNLOADS = 5          # consecutive GETs that bring no new byte before giving up
RETRY_BACKOFF_S = 1.0              # doubled after each failed attempt
RETRY_STATUS = {429, 500, 502, 503, 504}


class HubError(UserError, RuntimeError):
    """Every Hub failure; the message names the repo, the file, the revision and the fix."""


class RepoNotFoundError(HubError):
    pass


class EntryNotFoundError(HubError):
    pass


class RevisionNotFoundError(HubError):
    pass


class GatedRepoError(HubError):
    pass


class OfflineCacheMissError(HubError):
    needs = "the Hub"  # UserError.needs: experiments/runner.py stops the jobs that need it too


class HubUnreachable(HubError):
    needs = "the Hub"


class ChecksumError(HubError):
    pass


class _NetworkDown(Exception):
    """The Hub could not be reached at all (DNS, refused connection, repeated resets)."""


class _CutShort(Exception):
    """A GET ended before the whole file arrived; the caller resumes it with Range."""


# ----------------------------------------------------------------------------- environment

class BadSpec(HubError, ValueError):
    """A Hub spec (hf:org/name[@revision]) that names no possible repository."""


# A Hub repo name part: letters, digits, '_', '-', '.', starting and ending with a letter or digit
# (the Hub's own rule; '..' and '--' are refused too), at most 96 characters
REPO_PART = re.compile(r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?")


def parse_spec(spec: str) -> tuple[str, str]:
    """'hf:org/name@rev' (or 'org/name', 'hf:name') -> ('org/name', 'rev'); revision defaults to main."""
    body = spec[3:] if spec.startswith("hf:") else spec
    repo_id, at, revision = body.partition("@")
    parts = repo_id.split("/")
    problem = None
    if len(parts) > 2 or not all(REPO_PART.fullmatch(p) and ".." not in p and "--" not in p for p in parts):
        problem = f"{repo_id!r} is not a Hub repository name (org/name: letters, digits, '_', '-', '.')"
    elif at and not revision:
        problem = "nothing after '@'"
    elif at and (revision.startswith("/") or "\\" in revision or ".." in revision.split("/")):
        problem = f"revision {revision!r} is not a branch, tag or commit"
    if problem:
        local = f"; for a local folder, give its path without hf: ({body})" if spec.startswith("hf:") and body else ""
        raise BadSpec(f"bad Hub spec {spec!r}: {problem}. Expected hf:org/name or hf:org/name@revision{local}")
    return repo_id, revision or "main"


def _endpoint() -> str:
    endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")
    if not endpoint.startswith(("https://", "http://")):
        raise HubError(f"HF_ENDPOINT={endpoint!r} must be a URL such as https://huggingface.co")
    return endpoint


def _is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _hf_home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(os.environ.get("HF_HOME") or default).expanduser()


def hub_cache_dir() -> Path:
    """The cache root: HF_HUB_CACHE, else HF_HOME/hub (~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return _hf_home() / "hub"


def _find_token() -> str | None:
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"].strip()
    try:
        return (Path(os.environ.get("HF_TOKEN_PATH") or _hf_home() / "token").read_text().strip() or None)
    except OSError:
        return None


def _check_repo_type(repo_type: str) -> None:
    if repo_type not in REPO_TYPES:
        raise ValueError(f"repo_type must be one of {sorted(REPO_TYPES)}, got {repo_type!r}")


def _check_relative(name: str, what: str) -> None:
    # File names come from the server too (snapshot_download); none may escape the snapshot folder.
    parts = PurePosixPath(name).parts
    if not name or name.startswith("/") or ".." in parts:
        raise HubError(f"refusing {what} {name!r}: it must be a relative path inside the repo")


def _repo_page(repo_id: str, repo_type: str) -> str:
    return f"{_endpoint()}/{'datasets/' if repo_type == 'dataset' else ''}{repo_id}"


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
        return _repo_page(self.repo_id, self.repo_type)


def hf_hub_url(repo_id: str, filename: str, *, repo_type: str = "model", revision: str = "main") -> str:
    return f"{_repo_page(repo_id, repo_type)}/resolve/{urllib.parse.quote(revision, safe='')}/" \
           f"{urllib.parse.quote(filename)}"


def _api_url(repo_id: str, repo_type: str, route: str, revision: str) -> str:
    return f"{_endpoint()}/api/{REPO_TYPES[repo_type]}/{repo_id}/{route}/{urllib.parse.quote(revision, safe='')}"


# ----------------------------------------------------------------------------- cache layout

def _storage_folder(cache: Path, repo_id: str, repo_type: str) -> Path:
    return cache / "--".join([REPO_TYPES[repo_type], *repo_id.split("/")])


def _read_ref(storage: Path, revision: str) -> str | None:
    try:
        return (storage / "refs" / revision).read_text().strip() or None
    except OSError:
        return None


def _cached_commit(storage: Path, revision: str) -> str | None:
    return revision if COMMIT_HASH.match(revision) else _read_ref(storage, revision)


def _cached_file(storage: Path, revision: str, filename: str) -> Path | None:
    commit = _cached_commit(storage, revision)
    pointer = storage / "snapshots" / commit / filename if commit else None
    return pointer if pointer is not None and pointer.exists() else None  # exists() is False for a dangling link


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    if revision == commit or _read_ref(storage, revision) == commit:
        return
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    write_text(ref, commit, unique=True)  # unique: ranks and threads race here


def _link_pointer(blob: Path, pointer: Path) -> None:
    """snapshots/<commit>/<file> -> ../../blobs/<etag>, relative so the cache folder can be moved."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(f"{pointer.name}.{uuid.uuid4().hex}.tmp")
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), tmp)
    except (OSError, NotImplementedError):  # e.g. Windows without developer mode, some network mounts
        shutil.copyfile(blob, tmp)
    os.replace(tmp, pointer)


@contextlib.contextmanager
def _file_lock(path: Path):
    # Same lock file as huggingface_hub (which flocks it through `filelock`), so two DDP ranks, or
    # this code and the official client, never write one blob at the same time.
    import fcntl
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- HTTP

def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.netloc


class _RedirectPolicy(urllib.request.HTTPRedirectHandler):
    """Keep the method across redirects, optionally stay on the same origin (scheme, host, port),
    and send the token only to the origin it was given for (a CDN must never see it)."""

    def __init__(self, same_origin_only: bool):
        self.same_origin_only = same_origin_only

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        same_origin = _origin(newurl) == _origin(req.full_url)
        if self.same_origin_only and not same_origin:
            return None  # urllib then raises HTTPError(3xx) and the caller reads its headers
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        new.method = req.get_method()  # urllib would turn a redirected HEAD into a GET
        auth = req.unredirected_hdrs.get("Authorization")
        if auth and same_origin:
            new.add_unredirected_header("Authorization", auth)
        return new


def _headers() -> dict[str, str]:
    headers = {"User-Agent": f"nano-hub/1.0; python/{sys.version.split()[0]}",
               "Accept-Encoding": "identity"}  # sizes and hashes refer to the raw bytes
    token = _find_token()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _open(method: str, url: str, headers: dict[str, str], *, same_origin_only: bool, timeout: float):
    opener = urllib.request.build_opener(_RedirectPolicy(same_origin_only))
    req = urllib.request.Request(url, method=method,
                                 headers={k: v for k, v in headers.items() if k != "Authorization"})
    if "Authorization" in headers:
        req.add_unredirected_header("Authorization", headers["Authorization"])
    return opener.open(req, timeout=timeout)


def _is_unreachable(err: BaseException) -> bool:
    """No point retrying: the name does not resolve, nobody listens, or there is no route."""
    reason = getattr(err, "reason", err)
    return isinstance(reason, (socket.gaierror, ConnectionRefusedError)) or \
        getattr(reason, "errno", None) in (errno.ENETUNREACH, errno.EHOSTUNREACH)


def _open_with_retries(method: str, url: str, headers: dict[str, str], *, same_origin_only: bool,
                       timeout: float):
    """Open url; retry 5xx/429 and reset connections with backoff. HTTPError (incl. unfollowed 3xx)
    propagates for the caller to interpret; an unreachable Hub raises _NetworkDown."""
    for attempt in range(MAX_ATTEMPTS):
        last = attempt == MAX_ATTEMPTS - 1
        try:
            return _open(method, url, headers, same_origin_only=same_origin_only, timeout=timeout)
        except urllib.error.HTTPError as err:
            if err.code not in RETRY_STATUS or last:
                raise
            err.close()
        except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as err:
            if last or _is_unreachable(err):
                raise _NetworkDown(getattr(err, "reason", err)) from err
        time.sleep(RETRY_BACKOFF_S * 2 ** attempt)


def _hub_error(err: urllib.error.HTTPError, where: _Target, token_sent: bool) -> HubError:
    """Map the Hub's status and X-Error-Code header to an error that says what to do."""
    page = where.page
    code = err.headers.get("X-Error-Code", "") if err.headers else ""
    said = err.headers.get("X-Error-Message") if err.headers else None
    said = f" (Hub says: {said})" if said else ""
    if code == "GatedRepo" or (not code and err.code in (401, 403)):
        fix = (f"the token sent has no access: accept the licence on {page} with that account, or use "
               f"another token" if token_sent else
               f"set HF_TOKEN to a token of an account that has accepted the licence on {page}")
        return GatedRepoError(f"{where} is gated or private (HTTP {err.code}){said}: {fix}.")
    if code == "RepoNotFound" or (not code and err.code == 404 and where.filename is None):
        return RepoNotFoundError(
            f"{where}: no such repo on {_endpoint()} (HTTP {err.code}){said}. Check the repo id and "
            f"repo_type ('dataset' for datasets); if the repo is private, set HF_TOKEN.")
    if code == "RevisionNotFound":
        return RevisionNotFoundError(
            f"{where}: revision '{where.revision}' does not exist (HTTP {err.code}){said}. Use an existing "
            f"branch, tag or full commit hash (see {page}).")
    if code == "EntryNotFound" or err.code == 404:
        return EntryNotFoundError(
            f"{where}: no such file at this revision (HTTP {err.code}){said}. Check the file name "
            f"(list_repo_files('{where.repo_id}') shows what exists) and the revision.")
    return HubError(f"{where}: HTTP {err.code} {err.reason}{said} from {err.url}; try again later.")


def _unreachable_error(err: _NetworkDown, where: _Target, storage: Path) -> HubError:
    """HF_HUB_OFFLINE=1 is advised only where this repo has cached files for it to use."""
    cached = (storage / "snapshots").is_dir() and any((storage / "snapshots").iterdir())
    fix = (f", or set HF_HUB_OFFLINE=1 to use only the files already cached in {storage}" if cached else
           f"; nothing of {where.repo_id} is cached yet ({storage}), so it needs the Hub once")
    return HubUnreachable(f"cannot reach {_endpoint()} for {where}: {err}. Check the network (and HF_ENDPOINT, "
                          f"HTTPS_PROXY){fix}.")


@dataclass(frozen=True)
class FileMetadata:
    commit: str
    etag: str
    size: int | None


def _normalize_etag(etag: str | None) -> str | None:
    return etag.removeprefix("W/").strip('"') if etag else None


def _metadata_from_headers(headers, where: _Target, redirect: bool) -> FileMetadata:
    commit = headers.get("X-Repo-Commit")
    etag = _normalize_etag(headers.get("X-Linked-Etag") or headers.get("ETag"))
    if not commit or not etag:
        raise HubError(f"{where}: {_endpoint()} sent no X-Repo-Commit/ETag headers; is HF_ENDPOINT a "
                       f"Hugging Face Hub (or a mirror that forwards those headers)?")
    if not COMMIT_HASH.match(commit) or not SAFE_ETAG.match(etag):  # both become names in the cache
        raise HubError(f"{where}: the server sent an unusable commit {commit!r} or ETag {etag!r}")
    # On a redirect, Content-Length is the length of the redirect's own body, not of the file.
    size = headers.get("X-Linked-Size") or (None if redirect else headers.get("Content-Length"))
    return FileMetadata(commit=commit, etag=etag, size=int(size) if size else None)


def get_file_metadata(repo_id: str, filename: str, *, repo_type: str = "model", revision: str = "main") -> FileMetadata:
    """One HEAD request: the commit the revision points to, the file's etag and size.

    An LFS file answers with a redirect to the CDN; the Hub puts the metadata on that redirect, so
    only redirects on the Hub itself (a renamed repo) are followed, never the one to another host."""
    headers = _headers()
    url = hf_hub_url(repo_id, filename, repo_type=repo_type, revision=revision)
    where = _Target(repo_id, repo_type, revision, filename)
    try:
        with _open_with_retries("HEAD", url, headers, same_origin_only=True, timeout=HEAD_TIMEOUT_S) as r:
            return _metadata_from_headers(r.headers, where, redirect=False)
    except urllib.error.HTTPError as err:
        with contextlib.closing(err):
            if 300 <= err.code < 400:
                return _metadata_from_headers(err.headers, where, redirect=True)
            raise _hub_error(err, where, "Authorization" in headers) from None


# ----------------------------------------------------------------------------- blob download

def _disk_error(err: OSError, path: Path, need: int | None, where: _Target, removed: bool) -> HubError:
    free = shutil.disk_usage(path.parent).free if path.parent.exists() else 0
    what = "no space left on device" if err.errno == errno.ENOSPC else f"cannot write ({err})"
    need = f"{need:,} more bytes" if need is not None else "the whole file"
    kept = "the partial file was removed" if removed else "nothing was written"
    return HubError(f"{what} for {where} at {path}: the download needs {need}, {free:,} bytes are free "
                    f"there ({kept}). Free some space or point HF_HUB_CACHE at a larger disk, then run again.")


def _check_free_space(path: Path, missing: int | None, where: _Target) -> None:
    # Better to say so now than after hours of a download that cannot fit.
    if missing is not None and shutil.disk_usage(path.parent).free < missing:
        raise _disk_error(OSError(errno.ENOSPC, "No space left on device"), path, missing, where, removed=False)


def _progress(size: int | None, have: int, filename: str) -> tqdm:
    small = size is None or size < PROGRESS_MIN_BYTES
    disabled = small or os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").lower() in {"1", "true", "yes"}
    interactive = sys.stderr.isatty()
    # Redirected to a log file, a bar would append a line ten times a second for hours.
    return tqdm(total=size, initial=have, unit="B", unit_scale=True, unit_divisor=1024, desc=filename,
                disable=disabled, mininterval=0.5 if interactive else 60, dynamic_ncols=interactive)


def _append_missing_bytes(url: str, headers: dict[str, str], tmp: Path, bar: tqdm, where: _Target) -> None:
    """One GET for the bytes `tmp` lacks. Raises _CutShort when the connection ends early."""
    have = tmp.stat().st_size if tmp.exists() else 0
    request_headers = dict(headers, Range=f"bytes={have}-") if have else headers
    try:
        resp = _open_with_retries("GET", url, request_headers, same_origin_only=False,
                                  timeout=GET_TIMEOUT_S)
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
        expected = resp.headers.get("Content-Length")
        received = 0
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
    have = tmp.stat().st_size if tmp.exists() else 0
    with _progress(meta.size, have, where.filename) as bar:
        while True:
            have = tmp.stat().st_size if tmp.exists() else 0
            if have == meta.size:  # killed between the last byte and the rename: only verification is left
                return
            try:
                _append_missing_bytes(url, headers, tmp, bar, where)
                return
            except _CutShort as err:
                progressed = tmp.exists() and tmp.stat().st_size > have
                stalled = 0 if progressed else stalled + 1
                if stalled >= MAX_STALLED_DOWNLOADS:
                    raise HubError(f"download of {where} keeps failing ({err}); {tmp} keeps the "
                                   f"{tmp.stat().st_size if tmp.exists() else 0:,} bytes received and the "
                                   f"next run resumes from there. Check the network and run again.") from err
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
            have = tmp.stat().st_size if tmp.exists() else 0
            _check_free_space(tmp, None if meta.size is None else meta.size - have, where)
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
    raise ChecksumError(f"{where}: {problem}, twice in a row. The copy on the server or a proxy on the "
                        f"way is corrupt; nothing was kept in the cache. Try again later or report it "
                        f"on {where.page}.")


# ----------------------------------------------------------------------------- public API

def hf_hub_download(repo_id: str, filename: str, *, repo_type: str = "model", revision: str = "main") -> Path:
    """Path of `filename` in the cache snapshot of `repo_id` at `revision`, downloading it if needed."""
    _check_repo_type(repo_type)
    _check_relative(filename, "file name")
    _check_relative(revision, "revision")
    storage = _storage_folder(hub_cache_dir(), repo_id, repo_type)
    where = _Target(repo_id, repo_type, revision, filename)
    cached = _cached_file(storage, revision, filename)
    if cached is not None and COMMIT_HASH.match(revision):
        return cached  # the files of a commit never change: no request at all
    if _is_offline():
        if cached is not None:
            return cached
        raise OfflineCacheMissError(
            f"HF_HUB_OFFLINE=1 and {where} is not in the cache {storage}. Unset HF_HUB_OFFLINE to "
            f"download it, or point HF_HUB_CACHE/HF_HOME at a cache that has it.")
    try:
        meta = get_file_metadata(repo_id, filename, repo_type=repo_type, revision=revision)
    except _NetworkDown as err:
        if cached is not None:
            warnings.warn(f"cannot reach {_endpoint()} ({err}); using the cached {where}")
            return cached
        raise _unreachable_error(err, where, storage) from None
    pointer = storage / "snapshots" / meta.commit / filename
    if not pointer.exists():
        blob = storage / "blobs" / meta.etag
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            lock = storage.parent / ".locks" / storage.name / f"{meta.etag}.lock"
            with _file_lock(lock):
                if not blob.exists():  # another process may have finished it while we waited
                    # Fetch by commit, not branch: the bytes must be those the HEAD described.
                    url = hf_hub_url(repo_id, filename, repo_type=repo_type, revision=meta.commit)
                    _download_blob(blob, meta, url, _headers(), where)
        _link_pointer(blob, pointer)
    _write_ref(storage, revision, meta.commit)
    return pointer


def _get_json(url: str, headers: dict[str, str], where: _Target):
    """GET a Hub API url -> (parsed JSON, url of the next page or None); _NetworkDown if unreachable."""
    try:
        with _open_with_retries("GET", url, headers, same_origin_only=False, timeout=30) as resp:
            data = json.loads(resp.read())
            return data, _next_page(resp.headers.get("Link"), url)
    except urllib.error.HTTPError as err:
        with contextlib.closing(err):
            raise _hub_error(err, where, "Authorization" in headers) from None
    except (OSError, http.client.HTTPException, ValueError) as err:  # cut mid-body, or not JSON
        raise HubError(f"bad answer from {url} for {where}: {err}; try again later") from err


def _next_page(link_header: str | None, url: str) -> str | None:
    # The Hub paginates listings with an RFC 8288 header: Link: <https://...&cursor=...>; rel="next"
    for part in (link_header or "").split(","):
        match = re.match(r'\s*<([^>]*)>\s*;\s*rel="?next"?', part)
        if match:
            return urllib.parse.urljoin(url, match.group(1))
    return None


def list_repo_files(repo_id: str, *, repo_type: str = "model", revision: str = "main") -> list[str]:
    """All file paths in the repo at `revision` (Hub tree API, every page)."""
    _check_repo_type(repo_type)
    storage = _storage_folder(hub_cache_dir(), repo_id, repo_type)
    where = _Target(repo_id, repo_type, revision)
    if _is_offline():
        raise OfflineCacheMissError(
            f"HF_HUB_OFFLINE=1: listing the files of {where} needs the "
            f"Hub. Unset HF_HUB_OFFLINE, or ask for cached files by name with hf_hub_download.")
    headers = _headers()
    url = _api_url(repo_id, repo_type, "tree", revision) + "?recursive=true"
    files = []
    while url:
        try:
            entries, url = _get_json(url, headers, where)
        except _NetworkDown as err:
            raise _unreachable_error(err, where, storage) from None
        files += [e["path"] for e in entries if e.get("type") == "file"]
    return files


def _matches(path: str, patterns: list[str] | None) -> bool:
    if patterns is None:
        return True
    # "folder/" means everything under the folder, as in huggingface_hub.
    return any(fnmatch.fnmatch(path, p + "*" if p.endswith("/") else p) for p in patterns)


def snapshot_download(repo_id: str, *, repo_type: str = "model", revision: str = "main",
                      allow_patterns: list[str] | None = None) -> Path:
    """Download every file matching `allow_patterns` (fnmatch; all files when None) and return the
    snapshot folder `.../snapshots/<commit>`."""
    _check_repo_type(repo_type)
    _check_relative(revision, "revision")
    if isinstance(allow_patterns, str):
        allow_patterns = [allow_patterns]
    storage = _storage_folder(hub_cache_dir(), repo_id, repo_type)
    where = _Target(repo_id, repo_type, revision)
    commit = _cached_commit(storage, revision)
    cached = storage / "snapshots" / commit if commit else None
    if _is_offline():
        has_match = cached is not None and cached.is_dir() and any(
            _matches(p.relative_to(cached).as_posix(), allow_patterns) for p in cached.rglob("*") if p.is_file())
        if has_match:
            return cached
        raise OfflineCacheMissError(
            f"HF_HUB_OFFLINE=1 and no cached snapshot of {where} has files matching {allow_patterns} "
            f"in {storage}. Unset HF_HUB_OFFLINE to download them.")
    headers = _headers()
    try:
        # Pin the commit first so every file comes from the same one even if the branch moves.
        info, _ = _get_json(_api_url(repo_id, repo_type, "revision", revision), headers, where)
    except _NetworkDown as err:
        if cached is not None and cached.is_dir():
            warnings.warn(f"cannot reach {_endpoint()} ({err}); using the cached snapshot of {where}")
            return cached
        raise _unreachable_error(err, where, storage) from None
    commit = info.get("sha", "") if isinstance(info, dict) else ""
    if not COMMIT_HASH.match(commit):
        raise HubError(f"{where}: the Hub API answered without a commit hash ({str(info)[:200]})")
    files = [f for f in list_repo_files(repo_id, repo_type=repo_type, revision=commit) if _matches(f, allow_patterns)]
    if not files:
        raise EntryNotFoundError(f"{where} has no file matching {allow_patterns}; list_repo_files('{repo_id}') "
                                 f"shows what exists.")
    for filename in files:
        hf_hub_download(repo_id, filename, repo_type=repo_type, revision=commit)
    _write_ref(storage, revision, commit)
    return storage / "snapshots" / commit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf.hub", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in [("download", "download one file, print its path"),
                        ("ls", "list the files of a repo"),
                        ("snapshot", "download matching files, print the snapshot folder")]:
        p = sub.add_parser(name, help=help_)
        p.add_argument("repo")
        if name == "download":
            p.add_argument("file")
        if name == "snapshot":
            p.add_argument("--include", action="append", help="fnmatch pattern (repeatable)")
        p.add_argument("--repo-type", default="model", choices=sorted(REPO_TYPES))
        p.add_argument("--revision", default="main")
    args = parser.parse_args(argv)
    if args.command == "download":
        print(hf_hub_download(args.repo, args.file, repo_type=args.repo_type, revision=args.revision))
    elif args.command == "ls":
        print("\n".join(list_repo_files(args.repo, repo_type=args.repo_type, revision=args.revision)))
    else:
        print(snapshot_download(args.repo, repo_type=args.repo_type, revision=args.revision,
                                allow_patterns=args.include))
    return 0


if __name__ == "__main__":
    from cli import run_cli
    sys.exit(run_cli(main))
