"""hf/hub.py against a fake Hub on 127.0.0.1: downloads, the shared cache layout, revisions,
offline mode, resume, checksums, error messages, tokens, listings and a full disk."""
import errno
import hashlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hf.hub as hub
from fakehub import fake_hub, git_blob_sha1  # noqa: F401

REPO = "org/tiny-model"
ROOT = Path(__file__).resolve().parents[1]


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def cache() -> Path:
    return Path(os.environ["HF_HUB_CACHE"])


def storage(repo=REPO, kind="models") -> Path:
    return cache() / f"{kind}--{repo.replace('/', '--')}"


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setattr(hub, "RETRY_BACKOFF_S", 0.01)


def test_download_gives_the_exact_bytes_of_small_and_lfs_files(fake_hub):
    small, big = b'{"hidden_size": 8}', payload(200_000)
    fake_hub.add_file(REPO, "config.json", small)
    fake_hub.add_file(REPO, "model.safetensors", big)
    assert hub.hf_hub_download(REPO, "config.json").read_bytes() == small
    assert hub.hf_hub_download(REPO, "model.safetensors").read_bytes() == big
    assert fake_hub.gets("/cdn/"), "the LFS file should have been fetched through the CDN redirect"


def test_cache_layout_matches_huggingface_hub(fake_hub):
    small, big = b"tokenizer", payload(5000)
    fake_hub.add_file(REPO, "config.json", small)
    commit = fake_hub.add_file(REPO, "1_Pooling/weights.bin", big)
    path = hub.hf_hub_download(REPO, "1_Pooling/weights.bin")
    hub.hf_hub_download(REPO, "config.json")
    root = storage()
    assert path == root / "snapshots" / commit / "1_Pooling" / "weights.bin"
    assert path.is_symlink() and not os.path.isabs(os.readlink(path)), "snapshot entries are relative symlinks"
    assert path.resolve() == (root / "blobs" / hashlib.sha256(big).hexdigest()).resolve(), "LFS blob named by sha256"
    assert (root / "snapshots" / commit / "config.json").resolve() == (root / "blobs" / git_blob_sha1(small)).resolve()
    assert (root / "refs" / "main").read_text() == commit
    assert not list(root.glob("blobs/*.incomplete"))


def test_cached_file_costs_one_head_and_no_get(fake_hub):
    fake_hub.add_file(REPO, "model.safetensors", payload(3000))
    first = hub.hf_hub_download(REPO, "model.safetensors")
    fake_hub.requests.clear()
    assert hub.hf_hub_download(REPO, "model.safetensors") == first
    assert [r.method for r in fake_hub.requests] == ["HEAD"], fake_hub.requests


def test_cached_file_at_a_commit_needs_no_request(fake_hub):
    commit = fake_hub.add_file(REPO, "config.json", b"{}")
    hub.hf_hub_download(REPO, "config.json", revision=commit)
    fake_hub.requests.clear()
    assert hub.hf_hub_download(REPO, "config.json", revision=commit).read_bytes() == b"{}"
    assert fake_hub.requests == []


def test_revision_by_branch_and_by_commit(fake_hub):
    old = fake_hub.add_file(REPO, "config.json", b"v1")
    fake_hub.add_file(REPO, "config.json", b"dev", revision="dev")
    new = fake_hub.add_file(REPO, "config.json", b"v2")
    assert hub.hf_hub_download(REPO, "config.json").read_bytes() == b"v2"
    assert hub.hf_hub_download(REPO, "config.json", revision="dev").read_bytes() == b"dev"
    assert hub.hf_hub_download(REPO, "config.json", revision=old).read_bytes() == b"v1"
    assert (storage() / "refs" / "main").read_text() == new
    assert not (storage() / "refs" / old).exists(), "a commit hash is not a ref"


def test_offline_mode_uses_the_cache_without_network(fake_hub, monkeypatch):
    fake_hub.add_file(REPO, "config.json", b"{}")
    online = hub.hf_hub_download(REPO, "config.json")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.requests.clear()
    assert hub.hf_hub_download(REPO, "config.json") == online
    assert hub.snapshot_download(REPO, allow_patterns=["*.json"]) == online.parent
    assert fake_hub.requests == []


def test_offline_mode_miss_says_what_is_missing_and_what_to_do(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.OfflineCacheMissError) as err:
        hub.hf_hub_download(REPO, "config.json", revision="v3")
    for needed in (REPO, "config.json", "v3", "HF_HUB_OFFLINE"):
        assert needed in str(err.value)
    assert fake_hub.requests == []


def test_resume_after_a_cut_connection(fake_hub):
    data = payload(300_000)
    fake_hub.add_file(REPO, "model.safetensors", data)
    fake_hub.cut_next_get(REPO, "model.safetensors", after_bytes=70_000)
    assert hub.hf_hub_download(REPO, "model.safetensors").read_bytes() == data
    ranges = [r.headers.get("Range") for r in fake_hub.gets()]
    assert "bytes=70000-" in ranges, f"expected a resumed GET, saw Range headers {ranges}"


@pytest.mark.parametrize("kept", [12_345, 50_000])
def test_partial_file_left_by_a_killed_run_is_resumed(fake_hub, kept):
    data = payload(50_000)
    fake_hub.add_file(REPO, "model.safetensors", data)
    partial = storage() / "blobs" / (hashlib.sha256(data).hexdigest() + ".incomplete")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[:kept])
    assert hub.hf_hub_download(REPO, "model.safetensors").read_bytes() == data
    ranges = [r.headers.get("Range") for r in fake_hub.gets()]
    # a complete partial (killed just before the rename) only needs its checksum
    assert ranges == ([f"bytes={kept}-"] * 2 if kept < len(data) else []), ranges  # resolve, then CDN
    assert not partial.exists()


def test_wrong_bytes_once_are_rejected_and_fetched_again(fake_hub):
    data = payload(20_000)
    fake_hub.add_file(REPO, "model.safetensors", data)
    fake_hub.serve_wrong_bytes(REPO, "model.safetensors", times=1)
    with pytest.warns(UserWarning, match="sha256"):
        path = hub.hf_hub_download(REPO, "model.safetensors")
    assert path.read_bytes() == data
    assert len(fake_hub.gets("/cdn/")) == 2


def test_always_wrong_bytes_raise_and_leave_nothing_trusted(fake_hub, monkeypatch):
    fake_hub.add_file(REPO, "model.safetensors", payload(20_000))
    fake_hub.serve_wrong_bytes(REPO, "model.safetensors", times=None)
    with pytest.warns(UserWarning), pytest.raises(hub.ChecksumError) as err:
        hub.hf_hub_download(REPO, "model.safetensors")
    assert REPO in str(err.value) and "model.safetensors" in str(err.value)
    assert not [p for p in storage().rglob("*") if p.is_file() and "blobs" in p.parts], "no blob may be kept"
    assert not (storage() / "snapshots").exists()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.OfflineCacheMissError):
        hub.hf_hub_download(REPO, "model.safetensors")


def test_not_found_errors_name_repo_file_and_revision(fake_hub):
    fake_hub.add_file(REPO, "config.json", b"{}")
    cases = [("org/nope", "config.json", "main", hub.RepoNotFoundError),
             (REPO, "missing.bin", "main", hub.EntryNotFoundError),
             (REPO, "config.json", "no-such-branch", hub.RevisionNotFoundError)]
    for repo, filename, revision, error in cases:
        with pytest.raises(error) as err:
            hub.hf_hub_download(repo, filename, revision=revision)
        for needed in (repo, filename, revision):
            assert needed in str(err.value), f"{error.__name__} message lacks {needed!r}: {err.value}"


def test_gated_repo_needs_the_right_token(fake_hub, monkeypatch):
    fake_hub.add_file(REPO, "config.json", b"{}")
    fake_hub.gate(REPO, token="hf_good")
    with pytest.raises(hub.GatedRepoError) as err:
        hub.hf_hub_download(REPO, "config.json")
    assert "HF_TOKEN" in str(err.value) and REPO in str(err.value) and "config.json" in str(err.value)
    monkeypatch.setenv("HF_TOKEN", "hf_bad")
    with pytest.raises(hub.GatedRepoError, match="licence"):
        hub.hf_hub_download(REPO, "config.json")
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    assert hub.hf_hub_download(REPO, "config.json").read_bytes() == b"{}"


@pytest.mark.parametrize("source", ["HF_TOKEN", "token file"])
def test_token_is_sent_as_bearer(fake_hub, monkeypatch, source):
    fake_hub.add_file(REPO, "config.json", b"{}")
    if source == "HF_TOKEN":
        monkeypatch.setenv("HF_TOKEN", "hf_abc")
    if source == "token file":
        Path(os.environ["HF_HOME"], "token").write_text("hf_abc\n")
    hub.hf_hub_download(REPO, "config.json")
    assert {r.headers.get("Authorization") for r in fake_hub.requests} == {"Bearer hf_abc"}


def test_list_repo_files_follows_pagination(fake_hub):
    files = ["a.txt", "b/c.txt", "b/d/e.bin", "config.json", "z.json"]
    for i, name in enumerate(files):
        fake_hub.add_file(REPO, name, payload(10 + i, seed=i))
    fake_hub.page_size = 2
    assert sorted(hub.list_repo_files(REPO)) == files
    assert len(fake_hub.gets("/tree/")) == 4, "7 entries (5 files, 2 folders) in pages of 2"


def test_snapshot_download_fetches_matching_files_only(fake_hub):
    for name in ["config.json", "model.safetensors", "pytorch_model.bin", "1_Pooling/config.json"]:
        commit = fake_hub.add_file(REPO, name, payload(2000, seed=len(name)))
    folder = hub.snapshot_download(REPO, allow_patterns=["*.json", "model.safetensors"])
    assert folder == storage() / "snapshots" / commit
    got = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert got == ["1_Pooling/config.json", "config.json", "model.safetensors"]
    assert (storage() / "refs" / "main").read_text() == commit
    with pytest.raises(hub.EntryNotFoundError, match=r"\*\.onnx"):
        hub.snapshot_download(REPO, allow_patterns=["*.onnx"])


def test_dataset_repos_use_their_own_urls_and_cache_folder(fake_hub):
    fake_hub.add_file("org/corpus", "data/train.jsonl", b'{"id": 1}\n', repo_type="dataset")
    path = hub.hf_hub_download("org/corpus", "data/train.jsonl", repo_type="dataset")
    assert path.read_bytes() == b'{"id": 1}\n'
    assert storage("org/corpus", kind="datasets") in path.parents
    assert all(r.path.startswith("/datasets/org/corpus/") for r in fake_hub.requests)
    assert hub.list_repo_files("org/corpus", repo_type="dataset") == ["data/train.jsonl"]
    with pytest.raises(hub.RepoNotFoundError, match="repo_type"):
        hub.hf_hub_download("org/corpus", "data/train.jsonl")


class _FullDiskFile:
    """A file object that accepts `room` bytes, then fails like a full disk."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, b):
        if len(b) > self.room:
            self.f.write(b[:self.room])
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(b)
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_disk_full_while_writing_leaves_no_file_that_could_be_trusted(fake_hub, monkeypatch):
    fake_hub.add_file(REPO, "model.safetensors", payload(100_000))
    monkeypatch.setattr(hub, "open", lambda path, mode="r": _FullDiskFile(open(path, mode), 4096), raising=False)
    with pytest.raises(hub.HubError, match="no space left") as err:
        hub.hf_hub_download(REPO, "model.safetensors")
    assert "blobs" in str(err.value) and "100,000" in str(err.value), "message names the path and the size needed"
    assert not [p for p in storage().rglob("*") if p.is_file() and "blobs" in p.parts]
    assert not (storage() / "snapshots").exists()


def test_too_little_free_space_fails_before_downloading(fake_hub, monkeypatch):
    fake_hub.add_file(REPO, "model.safetensors", payload(100_000))
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 10, 10))
    with pytest.raises(hub.HubError, match="no space left.*100,000 more bytes, 10 bytes are free"):
        hub.hf_hub_download(REPO, "model.safetensors")
    assert fake_hub.gets() == []


def test_unreachable_hub_is_named_and_falls_back_to_the_cache(fake_hub, monkeypatch):
    fake_hub.add_file(REPO, "config.json", b"{}")
    cached = hub.hf_hub_download(REPO, "config.json")
    fake_hub.close()  # nobody listens on that port any more
    with pytest.warns(UserWarning, match="cannot reach"):
        assert hub.hf_hub_download(REPO, "config.json") == cached
    with pytest.raises(hub.HubError, match="cannot reach.*HF_HUB_OFFLINE") as err:
        hub.hf_hub_download(REPO, "tokenizer.json")
    assert "tokenizer.json" in str(err.value) and REPO in str(err.value)


def test_unreachable_hub_with_nothing_cached_does_not_advise_offline_mode(fake_hub):
    """HF_HUB_OFFLINE=1 uses cached files only: with none of the repo cached it is no fix."""
    fake_hub.close()
    with pytest.raises(hub.HubError, match="cannot reach") as err:
        hub.hf_hub_download(REPO, "config.json")
    assert "HF_HUB_OFFLINE" not in str(err.value) and f"nothing of {REPO} is cached yet" in str(err.value)


def test_renamed_repo_redirect_is_followed_with_the_token(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    fake_hub.add_file("org/new-name", "config.json", b"{}")
    fake_hub.gate("org/new-name", token="hf_abc")  # the redirected requests must still carry the token
    fake_hub.rename(REPO, "org/new-name")
    assert hub.hf_hub_download(REPO, "config.json").read_bytes() == b"{}"
    assert [r.method for r in fake_hub.requests[:2]] == ["HEAD", "HEAD"], "a redirected HEAD stays a HEAD"


def test_snapshot_entries_fall_back_to_copies_without_symlinks(fake_hub, monkeypatch):
    fake_hub.add_file(REPO, "config.json", b"{}")

    def no_symlinks(*args):
        raise OSError(errno.EPERM, "symlinks not permitted")

    monkeypatch.setattr(hub.os, "symlink", no_symlinks)
    path = hub.hf_hub_download(REPO, "config.json")
    assert not path.is_symlink() and path.read_bytes() == b"{}"


def test_parse_spec():
    assert hub.parse_spec("hf:org/name") == ("org/name", "main")
    assert hub.parse_spec("hf:org/name@v1.0") == ("org/name", "v1.0")
    assert hub.parse_spec("bert-base-uncased") == ("bert-base-uncased", "main")
    for bad in ["hf:org/name@", "hf:a/b/c", "hf:"]:
        with pytest.raises(ValueError, match="Hub spec"):
            hub.parse_spec(bad)


def test_cli_download_prints_the_path(fake_hub, capsys):
    fake_hub.add_file(REPO, "config.json", b"{}")
    assert hub.main(["download", REPO, "config.json"]) == 0
    assert Path(capsys.readouterr().out.strip()).read_bytes() == b"{}"
    from cli import run_cli
    with pytest.raises(SystemExit) as e:  # what `python -m hf.hub` runs: the message, status 2, no traceback
        run_cli(lambda: hub.main(["download", REPO, "nope.json"]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and "nope.json" in err


def test_cache_is_shared_with_huggingface_hub(fake_hub, monkeypatch):
    """Files our code cached are found by the official client offline, and the other way round."""
    hf = pytest.importorskip("huggingface_hub")  # test-only: comes with transformers
    ours = payload(4000, seed=1)
    fake_hub.add_file(REPO, "ours.bin", ours)
    fake_hub.add_file(REPO, "theirs.bin", payload(4000, seed=2))
    hub.hf_hub_download(REPO, "ours.bin")
    # huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE once, when it is first imported (often by
    # transformers in an earlier test, under conftest's HF_HUB_OFFLINE=1), not at every call
    monkeypatch.setattr(pytest.importorskip("huggingface_hub.constants"), "HF_HUB_OFFLINE", False)
    hf.hf_hub_download(REPO, "theirs.bin", cache_dir=cache(), endpoint=fake_hub.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.requests.clear()
    assert Path(hf.hf_hub_download(REPO, "ours.bin", cache_dir=cache(), local_files_only=True)).read_bytes() == ours
    assert hub.hf_hub_download(REPO, "theirs.bin").read_bytes() == payload(4000, seed=2)
    assert fake_hub.requests == []


def test_token_never_leaves_the_hub_for_the_cdn(fake_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    fake_hub.add_file(REPO, "model.safetensors", payload(5000))
    hub.hf_hub_download(REPO, "model.safetensors")
    cdn = [r for r in fake_hub.requests if r.path.startswith("/cdn/")]
    assert cdn and all("Authorization" not in r.headers for r in cdn), cdn
    assert all(r.headers.get("Authorization") == "Bearer hf_abc" for r in fake_hub.requests if r not in cdn)


def test_progress_bar_only_for_large_files_and_quiet_in_logs(fake_hub, monkeypatch, capfd):
    fake_hub.add_file(REPO, "config.json", b"{}")
    fake_hub.add_file(REPO, "model.safetensors", payload(300_000))
    monkeypatch.setattr(hub, "PROGRESS_MIN_BYTES", 100_000)
    monkeypatch.setattr(hub, "CHUNK_BYTES", 1000)  # 300 updates
    hub.hf_hub_download(REPO, "config.json")
    assert capfd.readouterr().err == "", "no bar for a small file"
    hub.hf_hub_download(REPO, "model.safetensors")
    err = capfd.readouterr().err  # captured, so not a TTY, like a job log
    assert "model.safetensors" in err and "100%" in err
    assert err.count("\r") <= 3, f"a log should get a few bar lines, not one per chunk: {err!r}"


def test_concurrent_downloads_of_one_file_fetch_it_once(fake_hub):
    """DDP ranks all ask for the checkpoint at once; the blob lock makes one of them fetch it."""
    from concurrent.futures import ThreadPoolExecutor
    data = payload(400_000)
    fake_hub.add_file(REPO, "model.safetensors", data)
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: hub.hf_hub_download(REPO, "model.safetensors"), range(4)))
    assert len(set(paths)) == 1 and paths[0].read_bytes() == data
    assert len(fake_hub.gets("/cdn/")) == 1, "the blob was downloaded more than once"


def test_runs_as_a_file_like_as_a_module():
    """`python hf/hub.py` puts hf/ on sys.path, not the repo root that holds data/ and cli.py."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "hf/hub.py", "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "download" in r.stdout, r.stderr
