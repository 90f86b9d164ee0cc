"""A fake Hugging Face Hub on 127.0.0.1, so every download path is tested without the network.

It answers the way huggingface.co does, for the requests hf/hub.py makes:

    HEAD/GET /{repo}/resolve/{revision}/{path}        (/datasets/{repo}/resolve/... for datasets)
        small files: 200, ETag = git blob sha1, X-Repo-Commit, Content-Length, Range -> 206
        LFS files:   302 to {cdn_url}/cdn/{sha256} with X-Linked-Etag = sha256, X-Linked-Size, X-Repo-Commit
        404 + X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound;
        gated repos: 401 (no token) or 403 (wrong token) + X-Error-Code GatedRepo
    GET  /cdn/{sha256}                                the LFS bytes, Range -> 206
    GET  /api/{models|datasets}/{repo}/tree/{revision}?recursive=true   paged, Link: <...>; rel="next"
    GET  /api/{models|datasets}/{repo}/revision/{revision}              {"id", "sha", "siblings"}

Use it through the `fake_hub` fixture (`from fakehub import fake_hub  # noqa`), which points
HF_ENDPOINT at it and clears HF_HUB_OFFLINE and HF_TOKEN for the test:

    commit = fake_hub.add_file("org/tiny", "config.json", b"{}")     # each call makes a new commit
    fake_hub.add_file("org/data", "train.jsonl", rows, repo_type="dataset", revision="v2")
    fake_hub.gate("org/tiny", token="hf_secret")                     # 401/403 without that token
    fake_hub.cut_next_get("org/tiny", "model.safetensors", after_bytes=1000)
    fake_hub.serve_wrong_bytes("org/tiny", "model.safetensors", times=1)   # times=None: always
    fake_hub.requests          # [LoggedRequest(method, path, headers)], clear() between phases
    fake_hub.gets("model.safetensors")   # the GETs whose path contains that text
    fake_hub.page_size = 2     # tree API page size (default 1000)

A new branch starts from the files of "main", like `git branch new main`. Files of 1 KiB or more
are LFS files unless `lfs=` says otherwise.
"""
import hashlib
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

LFS_THRESHOLD = 1024


def git_blob_sha1(data: bytes) -> str:
    """What git (and the Hub's ETag for a non-LFS file) calls this content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str          # path and query, as sent
    headers: dict      # header names as sent (e.g. "Range", "Authorization")


@dataclass(frozen=True)
class _File:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class _Repo:
    commits: dict = field(default_factory=dict)    # commit sha -> {path: _File}
    branches: dict = field(default_factory=dict)   # branch name -> commit sha
    token: str | None = None                       # set for gated repos
    renamed_to: str | None = None

    def commit_of(self, revision: str) -> str | None:
        return self.branches.get(revision) or (revision if revision in self.commits else None)


class FakeHub:
    def __init__(self):
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._lfs: dict[str, bytes] = {}           # sha256 -> bytes served under /cdn/
        self._cuts: dict[str, int] = {}            # sha256 -> bytes to send before dropping the connection
        self._wrong: dict[str, float] = {}         # sha256 -> how many more GETs get corrupted bytes
        self._lock = threading.Lock()
        self._commit_counter = 0
        self.requests: list[LoggedRequest] = []
        self.page_size = 1000
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.hub = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # The real CDN is another host: clients must not follow the HEAD redirect there nor send it
        # the token. "localhost" is a different origin served by this same server.
        self.cdn_url = f"http://localhost:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- content

    def add_file(self, repo_id: str, path: str, data: bytes, repo_type: str = "model",
                 revision: str = "main", lfs: bool | None = None) -> str:
        """Commit `data` as `path` on branch `revision`; returns the new commit's sha."""
        repo = self._repos.setdefault((repo_type, repo_id), _Repo())
        base = repo.branches.get(revision) or repo.branches.get("main")
        files = dict(repo.commits[base]) if base else {}
        files[path] = _File(bytes(data), len(data) >= LFS_THRESHOLD if lfs is None else lfs)
        with self._lock:
            self._commit_counter += 1
            commit = hashlib.sha1(f"{repo_type}/{repo_id}/{self._commit_counter}".encode()).hexdigest()
        repo.commits[commit] = files
        repo.branches[revision] = commit
        if files[path].lfs:
            self._lfs[files[path].sha256] = files[path].data
        return commit

    def gate(self, repo_id: str, token: str, repo_type: str = "model") -> None:
        """Only requests with `Authorization: Bearer {token}` may read this repo."""
        self._repos.setdefault((repo_type, repo_id), _Repo()).token = token

    def rename(self, old_id: str, new_id: str, repo_type: str = "model") -> None:
        """Requests for old_id get a relative 307 redirect to new_id, as after a repo rename."""
        self._repos[(repo_type, old_id)] = _Repo(renamed_to=new_id)

    # -- faults

    def _file(self, repo_id, path, repo_type, revision) -> _File:
        repo = self._repos[(repo_type, repo_id)]
        return repo.commits[repo.commit_of(revision)][path]

    def cut_next_get(self, repo_id: str, path: str, after_bytes: int, repo_type: str = "model",
                     revision: str = "main") -> None:
        """The next GET that sends this file's bytes drops the connection after `after_bytes`."""
        self._cuts[self._file(repo_id, path, repo_type, revision).sha256] = after_bytes

    def serve_wrong_bytes(self, repo_id: str, path: str, times: int | None = 1, repo_type: str = "model",
                          revision: str = "main") -> None:
        """The next `times` GETs of this file (every one when None) send same-length wrong bytes."""
        self._wrong[self._file(repo_id, path, repo_type, revision).sha256] = float("inf") if times is None else times

    # -- request log

    def gets(self, path_part: str = "") -> list[LoggedRequest]:
        return [r for r in self.requests if r.method == "GET" and path_part in r.path]

    def _log(self, handler) -> None:
        with self._lock:
            self.requests.append(LoggedRequest(handler.command, handler.path, dict(handler.headers.items())))


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeHub/1.0"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_HEAD(self):
        self._dispatch(head=True)

    def do_GET(self):
        self._dispatch(head=False)

    # -- routing

    @property
    def hub(self) -> FakeHub:
        return self.server.hub

    def _dispatch(self, head: bool) -> None:
        self.hub._log(self)
        url = urllib.parse.urlsplit(self.path)
        if url.path.startswith("/cdn/"):
            data = self.hub._lfs.get(url.path[len("/cdn/"):])
            if data is None:
                return self._send_status(404)
            return self._send_bytes(data, head, {"ETag": f'"{hashlib.md5(data).hexdigest()}"'})
        if url.path.startswith("/api/"):
            return self._api(url, head)
        return self._resolve(url, head)

    def _find_commit(self, repo_type: str, repo_id: str, revision: str):
        """(repo, commit), or None after answering the request (404, 401/403, or a rename redirect)."""
        repo = self.hub._repos.get((repo_type, repo_id))
        if repo is None:
            self._send_status(404, "RepoNotFound", "Repository not found")
            return None
        if repo.renamed_to:  # relative Location, as the Hub sends for renamed repos
            location = self.path.replace(f"/{repo_id}/", f"/{repo.renamed_to}/", 1)
            self._send_status(307, headers={"Location": location})
            return None
        if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
            status = 403 if self.headers.get("Authorization") else 401
            self._send_status(status, "GatedRepo", f"Access to model {repo_id} is restricted and you are "
                                                   f"not in the authorized list.")
            return None
        commit = repo.commit_of(revision)
        if commit is None:
            self._send_status(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo, commit

    def _resolve(self, url, head: bool) -> None:
        parts = url.path.strip("/").split("/")
        repo_type = "dataset" if parts[0] == "datasets" else "model"
        parts = parts[1:] if repo_type == "dataset" else parts
        if "resolve" not in parts or len(parts) < parts.index("resolve") + 3:
            return self._send_status(404)
        at = parts.index("resolve")
        repo_id = "/".join(parts[:at])
        revision = urllib.parse.unquote(parts[at + 1])
        path = urllib.parse.unquote("/".join(parts[at + 2:]))
        found = self._find_commit(repo_type, repo_id, revision)
        if found is None:
            return
        repo, commit = found
        file = repo.commits[commit].get(path)
        if file is None:
            return self._send_status(404, "EntryNotFound", f"{path} does not exist on \"{revision}\"",
                                     {"X-Repo-Commit": commit})
        if file.lfs:  # the Hub redirects LFS files to its CDN and puts their metadata on the redirect
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{file.sha256}\nsize {len(file.data)}\n"
            return self._send_status(302, headers={
                "Location": f"{self.hub.cdn_url}/cdn/{file.sha256}", "X-Repo-Commit": commit,
                "X-Linked-Etag": f'"{file.sha256}"', "X-Linked-Size": str(len(file.data)),
                "ETag": f'"{git_blob_sha1(pointer.encode())}"'})
        self._send_bytes(file.data, head, {"ETag": f'"{git_blob_sha1(file.data)}"', "X-Repo-Commit": commit})

    def _api(self, url, head: bool) -> None:
        parts = url.path.strip("/").split("/")  # api, models|datasets, *repo_id, route, revision
        route_at = next((i for i, p in enumerate(parts) if p in ("tree", "revision") and i >= 3), None)
        if len(parts) < 4 or parts[1] not in ("models", "datasets") or route_at is None \
                or route_at + 1 >= len(parts):
            return self._send_status(404)
        repo_type = "model" if parts[1] == "models" else "dataset"
        repo_id = "/".join(parts[2:route_at])
        route, revision = parts[route_at], urllib.parse.unquote(parts[route_at + 1])
        found = self._find_commit(repo_type, repo_id, revision)
        if found is None:
            return
        repo, commit = found
        files = repo.commits[commit]
        if route == "revision":
            return self._send_json({"id": repo_id, "sha": commit,
                                    "siblings": [{"rfilename": p} for p in sorted(files)]}, head)
        query = urllib.parse.parse_qs(url.query)
        entries = _tree_entries(files, recursive=query.get("recursive", ["false"])[0].lower() == "true")
        start = int(query.get("cursor", ["0"])[0])
        page = entries[start:start + self.hub.page_size]
        headers = {}
        if start + self.hub.page_size < len(entries):
            nxt = f"{self.hub.url}{url.path}?recursive=true&cursor={start + self.hub.page_size}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._send_json(page, head, headers)

    # -- responses

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _send_status(self, status: int, error_code: str | None = None, message: str | None = None,
                     headers: dict | None = None) -> None:
        errors = {"X-Error-Code": error_code, "X-Error-Message": message}
        self._send(status, headers={**{k: v for k, v in errors.items() if v}, **(headers or {})})

    def _send_json(self, obj, head: bool, headers: dict | None = None) -> None:
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})}, head)

    def _send_bytes(self, data: bytes, head: bool, headers: dict) -> None:
        start, end, status = 0, len(data) - 1, 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match:
            start = int(match.group(1))
            end = min(int(match.group(2) or end), end)
            if start >= len(data):
                return self._send_status(416, headers={"Content-Range": f"bytes */{len(data)}"})
            status = 206
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if head:
            return
        body, sha = data[start:end + 1], hashlib.sha256(data).hexdigest()
        with self.hub._lock:
            corrupt = self.hub._wrong.get(sha, 0) > 0
            if corrupt:
                self.hub._wrong[sha] -= 1
            cut = self.hub._cuts.pop(sha, None)
        if corrupt:
            body = body.translate(bytes(range(255, -1, -1)))  # same length, every byte different
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


def _tree_entries(files: dict, recursive: bool) -> list[dict]:
    """Entries of the Hub's tree API: directories and files, sorted by path."""
    dirs = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
    entries = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
               for d in dirs]
    for path, f in files.items():
        entry = {"type": "file", "oid": git_blob_sha1(f.data), "size": len(f.data), "path": path}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
        entries.append(entry)
    if not recursive:
        entries = [e for e in entries if "/" not in e["path"]]
    return sorted(entries, key=lambda e: e["path"])


@pytest.fixture
def fake_hub(monkeypatch):
    """A running FakeHub; HF_ENDPOINT points at it, HF_HUB_OFFLINE and HF_TOKEN are cleared."""
    hub = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    hub.close()
