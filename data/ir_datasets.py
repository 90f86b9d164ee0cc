"""Retrieval benchmarks as plain Python data: corpus, queries and graded relevance judgments.

Every loader returns an `IRDataset`:

    corpus:  {docid: text}            title and body joined as BEIR does (below); None when streamed
    queries: {qid: text}              by default only the queries that have judgments (as BEIR)
    qrels:   {qid: {docid: grade}}    the pytrec_eval / eval.metrics shape; grades kept as given

`load_benchmark(name_or_path)` returns a list (a benchmark is one dataset or, for `nanobeir` and
`beir13`, the 13 whose nDCG@10 is averaged):

    nanobeir, nanobeir/NFCorpus   13 (or 1) of the zeta-alpha-ai/Nano* Hub datasets
    beir13, beir/<name>           the BeIR/<name> + BeIR/<name>-qrels Hub datasets
    msmarco-dev, dl19, dl20       MS MARCO passage dev-small and TREC DL 2019/2020 (Hub or
                                  msmarco_dir= a folder with the official TSV files)
    <folder>                      a local BEIR-format folder (corpus.jsonl, queries.jsonl,
                                  qrels/<split>.tsv)

Hub files are found with `list_repo_files`, so a repo converted between jsonl.gz and parquet still
loads (parquet preferred). BEIR's "msmarco test" split is exactly TREC DL 2019; DL 2020 has no BEIR
copy: its queries and qrels come from whybe-choi/trec-dl-2020 (MTEB's third-party upload, checked
against the expected 54 judged queries), its passages from BeIR/msmarco. The official files for
msmarco_dir= are linked from https://microsoft.github.io/msmarco/.

Title + text: `(title + " " + text).strip()`, as BEIR's and sentence-transformers' encoders build
it, so a model sees the input its published BEIR numbers were measured on. A corpus whose files
are larger than IN_MEMORY_MAX_BYTES is streamed (`IRDataset.iter_corpus`) unless
corpus_in_memory=True: the 8.8M MS MARCO passages never have to be in memory at once.

Bad input: skipped with one IRDataWarning summary per file (empty texts, judgments of unknown ids,
exact repeats, up to MAX_MALFORMED malformed lines); an IRDataError naming the file, the line and
the fix for a file of the wrong kind, too many malformed lines, or conflicting repeats; strict=True
turns every skip into an error. A dataset that cannot be evaluated fails at load time
(IRDataset.check_evaluable). A document or query skipped for its empty text keeps its judgments:
it counts in trec_eval's denominators as published numbers do (keep_empty=True keeps such
documents with an empty text, as BEIR's loader does).
"""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python data/x.py): the repo root, not data/, on sys.path
    _here = str(Path(__file__).resolve().parent)
    sys.path = [p for p in sys.path if str(Path(p or ".").resolve()) != _here]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import gzip
import json
import re
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass, field
from itertools import islice
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from hf.hub import OfflineCacheMissError, hf_hub_download, list_repo_files, snapshot_download
from cli import UserError

NANOBEIR = ("NanoClimateFEVER", "NanoDBPedia", "NanoFEVER", "NanoFiQA2018", "NanoHotpotQA",
            "NanoMSMARCO", "NanoNFCorpus", "NanoNQ", "NanoQuoraRetrieval", "NanoSCIDOCS",
            "NanoArguAna", "NanoSciFact", "NanoTouche2020")
BEIR13 = ("arguana", "climate-fever", "dbpedia-entity", "fever", "fiqa", "hotpotqa", "nfcorpus",
          "nq", "quora", "scidocs", "scifact", "trec-covid", "webis-touche2020")
MSMARCO_BENCHMARKS = ("msmarco-dev", "dl19", "dl20")

NANOBEIR_ORG = "zeta-alpha-ai"
NANOBEIR_SPLIT = "train"  # every Nano* repo stores its single sample under split "train"
BEIR_ORG = "BeIR"
BEIR_EVAL_SPLIT = {"msmarco": "dev"}  # BEIR evaluates msmarco on dev (its "test" is TREC DL 2019)
DL20_REPO = "whybe-choi/trec-dl-2020"

# The number of judged queries each MS MARCO benchmark must have (MS MARCO passage dev-small, and
# the TREC 2019/2020 Deep Learning track overviews); a Hub copy that disagrees is not the
# benchmark the papers report on.
EXPECTED_JUDGED_QUERIES = {"msmarco-dev": 6980, "dl19": 43, "dl20": 54}

# Official MS MARCO file names for msmarco_dir= (each may also be gzipped: name + ".gz").
MSMARCO_COLLECTION = "collection.tsv"
MSMARCO_LOCAL_FILES = {
    "msmarco-dev": ("queries.dev.small.tsv", "qrels.dev.small.tsv"),
    "dl19": ("msmarco-test2019-queries.tsv", "2019qrels-pass.txt"),
    "dl20": ("msmarco-test2020-queries.tsv", "2020qrels-pass.txt"),
}
MSMARCO_WHERE = {
    "msmarco-dev": "collectionandqueries.tar.gz from https://microsoft.github.io/msmarco/",
    "dl19": "https://microsoft.github.io/msmarco/TREC-Deep-Learning-2019 "
            "(qrels also at https://trec.nist.gov/data/deep/2019qrels-pass.txt)",
    "dl20": "https://microsoft.github.io/msmarco/TREC-Deep-Learning-2020 "
            "(qrels also at https://trec.nist.gov/data/deep/2020qrels-pass.txt)",
}

MAX_MALFORMED = 10                  # malformed lines skipped per file before giving up on it
EXAMPLES_PER_KIND = 3               # positions quoted per kind of problem in a warning
IN_MEMORY_MAX_BYTES = 512 * 2**20   # corpus files above this are streamed by default
PROGRESS_MIN_BYTES = 32 * 2**20     # files above this get a tqdm bar
PARQUET_BATCH_ROWS = 65_536
BEIR_QRELS_HEADER = ["query-id", "corpus-id", "score"]
QRELS_COLUMNS = {"beir": "query-id corpus-id score", "trec": "qid 0 docid grade"}


class IRDataError(UserError, ValueError):
    """A retrieval data file that cannot be used as it is; the message names file, line and fix."""


class IRDataWarning(UserWarning):
    """Entries skipped while loading (see the module docstring for the policy)."""


@dataclass
class IRDataset:
    name: str
    corpus: dict[str, str] | None   # None: too large to hold, read it with iter_corpus()
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    corpus_files: list[Path] = field(default_factory=list)
    # the policy the corpus was (or will be, when streamed) read with
    strict: bool = False
    keep_empty: bool = False
    # where queries and qrels came from, for error messages (empty for a dataset built in code)
    query_files: list[Path] = field(default_factory=list)
    qrels_files: list[Path] = field(default_factory=list)
    # judged queries skipped for an empty text: in qrels, not in queries; they score 0 (module docstring)
    empty_queries: set = field(default_factory=set)

    def iter_corpus(self, batch_size: int = 10_000) -> Iterator[list[tuple[str, str]]]:
        """The corpus in batches of (docid, text), from memory or streamed from its files."""
        if self.corpus is not None:
            yield from _batched(self.corpus.items(), batch_size)
        else:
            yield from iter_corpus(self.corpus_files, batch_size, strict=self.strict,
                                   keep_empty=self.keep_empty)

    @property
    def num_judgments(self) -> int:
        return sum(len(docs) for docs in self.qrels.values())

    def check_evaluable(self):
        """Raise IRDataError, naming the file and the fix, unless this dataset can be evaluated:
        it has queries, judgments of them, every judged query has a text, and a corpus (for one in
        memory: holding at least one judged document). Reads no more than one document of a
        streamed corpus, so a caller can afford it before encoding anything."""
        queries = _where(self.query_files, f"{self.name} (queries)")
        qrels = _where(self.qrels_files, f"{self.name} (qrels)")
        corpus = _where(self.corpus_files, f"{self.name} (corpus)")
        if not self.queries:
            raise IRDataError(f"{queries}: no queries: the file is empty, or every entry was "
                              f"skipped (see the warning above). Fix: give it the collection's "
                              f"queries, one per line (BEIR jsonl: {{\"_id\": ..., \"text\": ...}}).")
        if (not self.corpus if self.corpus is not None
                else next(self.iter_corpus(batch_size=1), None) is None):
            raise IRDataError(f"{corpus}: no documents: the file is empty, or every entry was "
                              f"skipped (see the warning above). Fix: point to the collection's "
                              f"corpus.")
        if not any(self.qrels.values()):
            raise IRDataError(
                f"{qrels}: no judgment of any of the {len(self.queries)} queries of {queries} "
                f"(query ids such as {_some(self.queries)}): the file is empty, or every judgment "
                f"names a query or document the collection does not have (the warning above lists "
                f"them). Fix: use the qrels of the same collection and split as the queries and "
                f"the corpus.")
        unrun = [q for q, judged in self.qrels.items()
                 if judged and q not in self.queries and q not in self.empty_queries]
        if unrun:
            raise IRDataError(f"{qrels}: {len(unrun)} judged queries have no text in {queries} "
                              f"({_some(unrun)}), so no system can run them. Fix: add their "
                              f"texts, or drop their judgments.")
        if self.corpus is None:
            return                                       # judged ids are checked when in memory
        judged = {d for docs in self.qrels.values() for d in docs}
        if judged.isdisjoint(self.corpus):
            raise IRDataError(f"{qrels}: none of the {len(judged)} judged documents "
                              f"({_some(judged)}) is in {corpus} (documents such as "
                              f"{_some(self.corpus)}), so every measure would be 0. Fix: use the "
                              f"qrels and corpus of the same collection and version.")

    def __repr__(self):
        docs = f"{len(self.corpus)} docs" if self.corpus is not None else "streamed corpus"
        return (f"IRDataset({self.name!r}: {docs}, {len(self.queries)} queries, "
                f"{self.num_judgments} judgments)")


def _where(files, default) -> str:
    return ", ".join(str(f) for f in files) if files else default


def _some(ids, n=3) -> str:
    some = sorted(ids)[:n] if len(ids) <= 10_000 else list(islice(ids, n))
    return ", ".join(repr(i) for i in some) + (", ..." if len(ids) > n else "")


def join_title_text(title, text) -> str:
    """BEIR's document string: "title text", or just the text when there is no title."""
    return (f"{title} {text}" if title else text).strip()


# ----------------------------------------------------------------------------------------------
# Problem bookkeeping: one per file, enforcing the policy of the module docstring


class RowProblems:
    """The problems found in one input file, counted by kind; also used by train_splade.py's readers.
    Skippable problems are summarised in one warning per file; structural ones, or any in strict
    mode, stop with the file and line."""

    KINDS = {  # kind -> (what the warning says was skipped, how to fix it for good)
        "malformed": ("malformed entries skipped", "correct or delete it"),
        "empty": ("entries with an empty text skipped", "give it a text or delete it "
                  "(keep_empty=True keeps such entries)"),
        "repeat": ("exact repeats skipped (first occurrence kept)", "delete the repeat"),
        "unknown_query": ("judgments of unknown queries skipped",
                          "check that qrels and queries come from the same collection and split"),
        "unknown_doc": ("judgments of unknown documents skipped",
                        "check that qrels and corpus come from the same collection and version"),
        "no_header": ("first line read as data (no `query-id corpus-id score` header)",
                      "add the header line `query-id<TAB>corpus-id<TAB>score`"),
    }

    def __init__(self, path, strict: bool, strict_name: str = "strict=True (--strict)"):
        # strict_name: how the caller's user asks for strict loading, quoted in messages
        self.path, self.strict, self.strict_name = path, strict, strict_name
        self.unit = "row" if file_format(path) == "parquet" else "line"
        self.counts = Counter()
        self.examples = {}

    def error(self, pos, detail, fix) -> IRDataError:
        where = f"{self.path}" + (f", {self.unit} {pos}" if pos else "")
        return IRDataError(f"{where}: {detail}. Fix: {fix}.")

    def skip(self, kind, pos, detail):
        if self.strict:
            raise self.error(pos, detail, self.KINDS[kind][1] + f" ({self.strict_name} stops on "
                                                                f"every problem; without it, "
                                                                f"this one is skipped)")
        self.counts[kind] += 1
        examples = self.examples.setdefault(kind, [])
        if len(examples) < EXAMPLES_PER_KIND:
            examples.append(f"{self.unit} {pos}: {detail}")
        if kind == "malformed" and self.counts[kind] > MAX_MALFORMED:
            raise IRDataError(
                f"{self.path}: more than {MAX_MALFORMED} malformed {self.unit}s "
                f"({'; '.join(examples)}; ...), so this is not a file of the expected format. "
                f"Fix: check that the file is what was asked for and repair it.")

    def report(self):
        if not self.counts:
            return
        lines = [f"{self.path}: skipped {sum(self.counts.values())} problem(s) "
                 f"({self.strict_name} stops on them instead):"]
        for kind, n in self.counts.items():
            more = ", ..." if n > len(self.examples[kind]) else ""
            lines.append(f"  {self.KINDS[kind][0]}: {n} ({'; '.join(self.examples[kind])}{more})")
        warnings.warn("\n".join(lines), IRDataWarning, stacklevel=4)


# ----------------------------------------------------------------------------------------------
# Reading records from files: jsonl(.gz), tsv(.gz)/txt and parquet


def file_format(path) -> str | None:
    name = str(path).lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    if name.endswith((".tsv", ".tsv.gz", ".txt", ".txt.gz")):
        return "tsv"
    return None


def _numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, raw bytes without the newline) with a progress bar for big files."""
    size = path.stat().st_size
    with open(path, "rb") as raw, tqdm(total=size, unit="B", unit_scale=True, desc=path.name,
                                       disable=size < PROGRESS_MIN_BYTES, leave=False) as bar:
        stream = gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw
        done = 0
        try:
            for lineno, line in enumerate(stream, 1):
                yield lineno, line.rstrip(b"\r\n")
                if lineno % 65_536 == 0:
                    bar.update(raw.tell() - done)
                    done = raw.tell()
        except (OSError, EOFError, zlib.error) as e:
            raise IRDataError(f"{path}: cannot be decompressed ({e}); the file is truncated or "
                              f"corrupt. Fix: delete it and download it again.") from e


def text_lines(path: Path, problems: RowProblems) -> Iterator[tuple[int, str]]:
    """Decoded, non-blank lines; a line that is not UTF-8 is a malformed line."""
    for lineno, raw in _numbered_lines(path):
        try:
            line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a UTF-8 mark before the first line is no text
        except UnicodeDecodeError as e:
            problems.skip("malformed", lineno, f"not UTF-8 (byte {e.start} of the line: "
                          f"{raw[e.start:e.start + 4]!r}); re-encode the file as UTF-8, "
                          f"e.g. iconv -f latin1 -t utf-8")
            continue
        if line.strip():
            yield lineno, line


def jsonl_objects(path: Path, problems: RowProblems) -> Iterator[tuple[int, dict]]:
    for lineno, line in text_lines(path, problems):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.skip("malformed", lineno, f"invalid JSON ({e.msg}, column {e.colno})")
            continue
        if not isinstance(obj, dict):
            problems.skip("malformed", lineno, f"a JSON {type(obj).__name__}, not an object")
            continue
        yield lineno, obj


def parquet_rows(path: Path, problems: RowProblems, required, optional=()) -> Iterator[tuple[int, dict]]:
    """Rows as dicts of the wanted columns; missing required columns stop with an error."""
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise IRDataError(f"{path}: not a readable parquet file ({e}). "
                          f"Fix: delete it and download it again.") from e
    names = pf.schema_arrow.names
    missing = [c for c in required if c not in names]
    if missing:
        raise IRDataError(
            f"{path}: no column(s) {missing}; the file has columns {names}. Fix: BEIR-format "
            f"parquet needs the columns {list(required)} (optional: {list(optional)}); rename "
            f"them, or check that this is the right file.")
    columns = list(required) + [c for c in optional if c in names]
    total = pf.metadata.num_rows
    row = 0
    with tqdm(total=total, unit="rows", desc=path.name, disable=total < 200_000, leave=False) as bar:
        try:
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
                values = [batch.column(c).to_pylist() for c in columns]
                for record in zip(*values):
                    row += 1
                    yield row, dict(zip(columns, record))
                bar.update(batch.num_rows)
        except (pa.ArrowException, OSError) as e:
            raise IRDataError(f"{path}: unreadable after row {row} ({e}); the file is truncated "
                              f"or corrupt. Fix: delete it and download it again.") from e


def _clean_id(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    value = str(value).strip()
    return value or None


def _text_records(path: Path, problems: RowProblems, kind: str) -> Iterator[tuple[int, str, str]]:
    """(position, id, text) of a corpus (kind="document") or queries (kind="query") file.

    jsonl/parquet: BEIR fields `_id`, `text` (+ `title` for documents); tsv: `id<TAB>text`
    (MS MARCO collection.tsv and queries.*.tsv).
    """
    fmt = file_format(path)
    if fmt == "tsv":
        for lineno, line in text_lines(path, problems):
            fields = line.split("\t", 1)
            docid = _clean_id(fields[0])
            if len(fields) != 2 or docid is None:
                problems.skip("malformed", lineno, f"expected `id<TAB>text`, got {line[:60]!r}")
                continue
            yield lineno, docid, fields[1].strip()
        return
    title_field = ("title",) if kind == "document" else ()
    if fmt == "parquet":
        records = parquet_rows(path, problems, ("_id", "text"), title_field)
    elif fmt == "jsonl":
        records = jsonl_objects(path, problems)
    else:
        raise IRDataError(f"{path}: unknown file type. Fix: use .jsonl(.gz), .parquet or .tsv.")
    for pos, record in records:
        missing = [f for f in ("_id", "text") if f not in record]
        if missing:
            problems.skip("malformed", pos, f"no field {missing} (fields: {sorted(record)}); "
                          f"BEIR {kind} entries need `_id` and `text`")
            continue
        docid, text, title = _clean_id(record["_id"]), record["text"], record.get("title")
        if text is None:
            text = ""
        if docid is None or not isinstance(text, str) or not isinstance(title, (str, type(None))):
            problems.skip("malformed", pos, f"`_id` must be a non-empty string or integer and "
                          f"`text`/`title` strings, got _id={record['_id']!r}, "
                          f"text of type {type(text).__name__}")
            continue
        yield pos, docid, join_title_text(title if kind == "document" else None, text)


def _parse_grade(value) -> int | None:
    """An integer grade from an int, an integral float or their string forms; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


def _qrels_text_rows(path: Path, problems: RowProblems) -> Iterator[tuple[int, str, str, str]]:
    """Rows of a BEIR qrels TSV (header `query-id corpus-id score`) or of a TREC qrels file
    (`qid 0 docid grade`, as MS MARCO and NIST distribute them); the first line tells which."""
    layout = None
    for lineno, line in text_lines(path, problems):
        fields = line.split("\t") if line.count("\t") == 2 else line.split()
        if layout is None:
            layout = _qrels_layout(fields, lineno, problems)
            if fields == BEIR_QRELS_HEADER:
                continue
        width = 4 if layout == "trec" else 3
        if len(fields) != width:
            problems.skip("malformed", lineno, f"expected {width} columns "
                          f"({QRELS_COLUMNS[layout]}), got {line[:60]!r}")
            continue
        qid, docid, grade = (fields[0], fields[2], fields[3]) if layout == "trec" else fields
        yield lineno, qid, docid, grade


def _qrels_layout(first: list[str], lineno: int, problems: RowProblems) -> str:
    if first == BEIR_QRELS_HEADER:
        return "beir"
    if len(first) == 4:
        return "trec"
    if len(first) == 3 and _parse_grade(first[2]) is not None:
        problems.skip("no_header", lineno, f"{' '.join(first)[:60]!r}")
        return "beir"
    raise problems.error(lineno, f"first line {first} is neither the BEIR qrels header nor a "
                         f"qrels row", f"BEIR qrels start with the header "
                         f"`query-id<TAB>corpus-id<TAB>score`; TREC qrels have the 4 columns "
                         f"`{QRELS_COLUMNS['trec']}`")


def _qrels_table_rows(path: Path, problems: RowProblems) -> Iterator[tuple[int, object, object, object]]:
    """Rows of a parquet or jsonl qrels file with BEIR's column names."""
    required = ("query-id", "corpus-id")
    records = (parquet_rows(path, problems, required, ("score",)) if file_format(path) == "parquet"
               else jsonl_objects(path, problems))
    for pos, record in records:
        missing = [f for f in required if f not in record]
        if missing:
            problems.skip("malformed", pos, f"no field {missing} (fields: {sorted(record)}); "
                          f"judgments need `query-id`, `corpus-id` and optionally `score`")
            continue
        yield pos, record["query-id"], record["corpus-id"], record.get("score", 1)


def _qrels_records(path: Path, problems: RowProblems) -> Iterator[tuple[int, str, str, int]]:
    """(position, qid, docid, grade) of a qrels file in any supported format.

    A parquet or jsonl qrels file without `score` is binary (NanoBEIR): every row is grade 1.
    """
    fmt = file_format(path)
    if fmt == "tsv":
        rows = _qrels_text_rows(path, problems)
    elif fmt in ("parquet", "jsonl"):
        rows = _qrels_table_rows(path, problems)
    else:
        raise IRDataError(f"{path}: unknown file type. Fix: use .tsv, .txt, .jsonl or .parquet.")
    for pos, qid, docid, grade in rows:
        qid, docid, score = _clean_id(qid), _clean_id(docid), _parse_grade(grade)
        if qid is None or docid is None or score is None:
            problems.skip("malformed", pos, f"need a query id, a document id and an integer "
                          f"grade, got {qid!r}, {docid!r}, {grade!r}")
            continue
        yield pos, qid, docid, score


# ----------------------------------------------------------------------------------------------
# Building the in-memory dataset


def _load_texts(files, kind, strict, keep_empty) -> tuple[dict[str, str], set[str]]:
    """{id: text} of all files, and the ids skipped for an empty text."""
    texts, empty = {}, set()
    for path in files:
        problems = RowProblems(path, strict)
        for pos, docid, text in _text_records(path, problems, kind):
            if not text and not keep_empty:
                problems.skip("empty", pos, f"{kind} {docid!r}")
                empty.add(docid)
                continue
            if docid in texts:
                if texts[docid] != text:
                    raise problems.error(pos, f"{kind} id {docid!r} appears a second time with a "
                                         f"different text (first: {_first_position(files, docid, kind)})",
                                         "ids must be unique; delete or rename one of the two")
                problems.skip("repeat", pos, f"{kind} {docid!r}")
                continue
            texts[docid] = text
        problems.report()
    return texts, empty


def _first_position(files, wanted_id, kind) -> str:
    """Where an id first occurs; looked up again only on the error path, to keep loading lean."""
    for path in files:
        problems = RowProblems(path, strict=False)  # never reported: this file was read once already
        for pos, docid, _ in _text_records(path, problems, kind):
            if docid == wanted_id:
                return f"{path}, {problems.unit} {pos}"
    return "unknown"


def _load_qrels(files, strict, queries, skipped_queries, docs, empty_docs) -> dict:
    """{qid: {docid: grade}}, checked against the queries and (when in memory) the corpus."""
    qrels, first_at = {}, {}
    for path in files:
        problems = RowProblems(path, strict)
        for pos, qid, docid, grade in _qrels_records(path, problems):
            if qid not in queries and qid not in skipped_queries:  # an empty query keeps its judgments
                problems.skip("unknown_query", pos, f"query {qid!r} (not in the queries)")
                continue
            if docs is not None and docid not in docs and docid not in empty_docs:
                problems.skip("unknown_doc", pos, f"document {docid!r} is not in the corpus")
                continue
            judged = qrels.setdefault(qid, {})
            if docid in judged:
                if judged[docid] != grade:
                    raise problems.error(pos, f"query {qid!r} judges document {docid!r} again "
                                         f"with grade {grade} (grade {judged[docid]} at "
                                         f"{first_at[qid, docid]})", "keep one of the two judgments")
                problems.skip("repeat", pos, f"judgment {qid!r} {docid!r}")
                continue
            judged[docid] = grade
            first_at[qid, docid] = f"{problems.unit} {pos}"
        problems.report()
    return qrels


def _paths(files) -> list[Path]:
    return [Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files]


def load_files(corpus, queries, qrels, *, name: str, strict: bool = False,
               keep_empty: bool = False, judged_only: bool = True,
               corpus_in_memory: bool | None = None) -> IRDataset:
    """The dataset in the given files (each argument: one path or a list of shards).

    Formats are told by extension: .jsonl(.gz) and .parquet with BEIR fields, .tsv(.gz) with
    `id<TAB>text` (corpus, queries) and BEIR or TREC qrels (.tsv, .txt).
    judged_only: keep only queries with judgments (BEIR's loader does the same; the others
    cannot be scored). corpus_in_memory: None = only when the corpus files are at most
    IN_MEMORY_MAX_BYTES. A dataset that cannot be evaluated is an IRDataError (check_evaluable).
    """
    corpus_files, query_files, qrels_files = _paths(corpus), _paths(queries), _paths(qrels)
    for path in corpus_files + query_files + qrels_files:
        if not path.is_file():
            raise IRDataError(f"{path}: no such file. Fix: check the path.")
    if corpus_in_memory is None:
        corpus_in_memory = sum(p.stat().st_size for p in corpus_files) <= IN_MEMORY_MAX_BYTES
    docs, empty_docs = (_load_texts(corpus_files, "document", strict, keep_empty)
                        if corpus_in_memory else (None, set()))
    query_texts, empty_queries = _load_texts(query_files, "query", strict, keep_empty)
    judgments = _load_qrels(qrels_files, strict, query_texts, empty_queries, docs, empty_docs)
    empty_judged = {q for q in empty_queries if judgments.get(q)}
    if empty_judged:
        warnings.warn(f"{name}: {len(empty_judged)} judged queries have an empty text ({_some(empty_judged)}); "
                      f"they cannot be run, so each scores 0 in every measure and counts in the mean (every "
                      f"judged query counts). Fix: give them their text in {_where(query_files, 'the queries')}",
                      IRDataWarning, stacklevel=2)
    dataset = IRDataset(name, docs, query_texts, judgments, corpus_files, strict, keep_empty,
                        query_files, qrels_files, empty_judged)
    # before judged_only drops the unjudged queries, so the error can tell an empty queries file
    # from queries that the qrels do not judge
    dataset.check_evaluable()
    if judged_only:
        dataset.queries = {qid: text for qid, text in query_texts.items() if qid in judgments}
    return dataset


def _batched(items: Iterable, size: int) -> Iterator[list]:
    items = iter(items)
    while batch := list(islice(items, size)):
        yield batch


def iter_corpus(files, batch_size: int = 10_000, *, strict: bool = False,
                keep_empty: bool = False) -> Iterator[list[tuple[str, str]]]:
    """Stream a corpus (one file or shards, any supported format) as batches of (docid, text).

    Memory stays at one batch plus one parquet row group; every entry is checked as by the
    in-memory loader except for duplicate ids (that check would need every id in memory).
    """
    def records():
        for path in _paths(files):
            problems = RowProblems(path, strict)
            for pos, docid, text in _text_records(path, problems, "document"):
                if not text and not keep_empty:
                    problems.skip("empty", pos, f"document {docid!r}")
                    continue
                yield docid, text
            problems.report()
    yield from _batched(records(), batch_size)


# ----------------------------------------------------------------------------------------------
# Local folders


def _find_local(folder: Path, names) -> Path | None:
    for name in names:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def load_beir_folder(folder, split: str = "test", *, name: str | None = None, **options) -> IRDataset:
    """A BEIR-format folder: corpus.jsonl, queries.jsonl (or .jsonl.gz), qrels/<split>.tsv.

    options: strict, keep_empty, judged_only, corpus_in_memory (see load_files).
    """
    folder = Path(folder)
    corpus = _find_local(folder, ["corpus.jsonl"])
    queries = _find_local(folder, ["queries.jsonl"])
    qrels = _find_local(folder / "qrels", [f"{split}.tsv"])
    if corpus is None or queries is None:
        raise IRDataError(f"{folder}: not a BEIR-format folder (needs corpus.jsonl and "
                          f"queries.jsonl, found {sorted(p.name for p in folder.iterdir())}). "
                          f"Fix: point to the folder holding the unzipped BEIR dataset.")
    if qrels is None:
        splits = sorted(p.name for p in (folder / "qrels").glob("*.tsv*"))
        raise IRDataError(f"{folder}: no qrels/{split}.tsv (qrels files present: {splits}). "
                          f"Fix: choose one of those splits with split=.")
    return load_files(corpus, queries, qrels, name=name or folder.name, **options)


def load_msmarco_local(which: str, msmarco_dir, **options) -> IRDataset:
    """MS MARCO dev-small or TREC DL 2019/2020 from the official TSV files in msmarco_dir."""
    folder = Path(msmarco_dir)
    query_name, qrels_name = MSMARCO_LOCAL_FILES[which]
    files = [_find_local(folder, [n]) for n in (MSMARCO_COLLECTION, query_name, qrels_name)]
    missing = [n for n, f in zip((MSMARCO_COLLECTION, query_name, qrels_name), files) if f is None]
    if missing:
        raise IRDataError(f"{folder}: no {missing} for {which}. Fix: download them from "
                          f"{MSMARCO_WHERE[which]} (gzipped files are fine), or drop msmarco_dir "
                          f"to load the Hub copy.")
    return _checked_msmarco(which, load_files(*files, name=which, **options))


def _checked_msmarco(which: str, dataset: IRDataset) -> IRDataset:
    expected = EXPECTED_JUDGED_QUERIES[which]
    judged = len(dataset.qrels)
    if judged != expected:
        warnings.warn(f"{which}: {judged} judged queries where the benchmark has {expected}; "
                      f"these files are not the standard {which} set, so numbers will not be "
                      f"comparable with published ones.", IRDataWarning, stacklevel=3)
    return dataset


# ----------------------------------------------------------------------------------------------
# The Hub


def _hub_part(files: list[str], part: str, split: str | None = None) -> list[str]:
    """The files of one part of a dataset repo, in the best format present (parquet first).

    part "corpus"/"queries": files named or foldered after the part (corpus.jsonl.gz,
    corpus/corpus-00000-of-00001.parquet, corpus/train-00000-of-00001.parquet). part "qrels":
    files of the split inside a qrels folder or named qrels (qrels/test.jsonl,
    qrels/train-00000-of-00001.parquet), else named or foldered after the split (test.tsv of a
    BeIR/<name>-qrels repo, data/test-00000-of-00001.parquet).
    """
    def names(path):  # folder names, the file's stem and the stem's first dash-separated word
        *folders, base = path.split("/")
        stem = base.split(".")[0]
        return set(folders) | {stem, re.split(r"[-_]", stem)[0]}

    usable = [f for f in files if file_format(f) is not None]
    if part == "qrels":
        chosen = [f for f in usable if {"qrels", split} <= names(f)]
        chosen = chosen or [f for f in usable if split in names(f)
                            and not {"corpus", "queries"} & names(f)]
    else:
        chosen = [f for f in usable if part in names(f)]
    rank = {"parquet": 0, "jsonl": 1, "tsv": 2}
    best = min((rank[file_format(f)] for f in chosen), default=None)
    return sorted(f for f in chosen if rank[file_format(f)] == best)


def _repo_files(repo_id: str, revision: str) -> list[str]:
    """The repo's files; offline (HF_HUB_OFFLINE=1), the files of its cached snapshot, which are
    the ones an earlier online load chose, so a dataset loaded once loads again without network."""
    try:
        return list_repo_files(repo_id, repo_type="dataset", revision=revision)
    except OfflineCacheMissError:
        snapshot = snapshot_download(repo_id, repo_type="dataset", revision=revision)
        return [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]


def _hub_download_part(repo_id: str, part: str, split=None, revision: str = "main") -> list[Path]:
    files = _repo_files(repo_id, revision)
    chosen = _hub_part(files, part, split)
    if not chosen:
        what = f"{part} file for split {split!r}" if split else f"{part} file"
        raise IRDataError(f"hf:{repo_id}@{revision}: no {what} this loader recognises (parquet, "
                          f"jsonl(.gz) or tsv named or foldered '{part if split is None else split}'); "
                          f"the repo has {files[:20]}. Fix: download it and use load_files() or "
                          f"load_beir_folder() with its files.")
    return [hf_hub_download(repo_id, f, repo_type="dataset", revision=revision) for f in chosen]


def load_hub(repo_id: str, *, qrels_repo: str | None = None, split: str = "test",
             corpus_repo: str | None = None, name: str | None = None,
             revision: str = "main", **options) -> IRDataset:
    """A BEIR-style dataset repo: corpus and queries from repo_id (corpus from corpus_repo when
    given), qrels of `split` from qrels_repo (default: repo_id itself). options: see load_files."""
    corpus = _hub_download_part(corpus_repo or repo_id, "corpus", revision=revision)
    queries = _hub_download_part(repo_id, "queries", revision=revision)
    qrels = _hub_download_part(qrels_repo or repo_id, "qrels", split, revision=revision)
    return load_files(corpus, queries, qrels, name=name or repo_id, **options)


def load_nanobeir(name: str, **options) -> IRDataset:
    """One NanoBEIR dataset, e.g. "NFCorpus" or "NanoNFCorpus" (case does not matter)."""
    return load_hub(f"{NANOBEIR_ORG}/{_nanobeir_name(name)}", split=NANOBEIR_SPLIT,
                    name=f"nanobeir/{_nanobeir_name(name)}", **options)


def _nanobeir_name(name: str) -> str:
    wanted = name.lower().removeprefix("nano")
    for known in NANOBEIR:
        if known.lower().removeprefix("nano") == wanted:
            return known
    raise IRDataError(f"no NanoBEIR dataset {name!r}. Fix: use one of {list(NANOBEIR)}.")


def load_beir(name: str, split: str | None = None, **options) -> IRDataset:
    """BeIR/<name> with the judgments of BeIR/<name>-qrels (default split: the one BEIR reports)."""
    split = split or BEIR_EVAL_SPLIT.get(name, "test")
    return load_hub(f"{BEIR_ORG}/{name}", qrels_repo=f"{BEIR_ORG}/{name}-qrels", split=split,
                    name=f"beir/{name}", **options)


def load_msmarco(which: str, msmarco_dir=None, **options) -> IRDataset:
    """MS MARCO passage dev-small ("msmarco-dev"), TREC DL 2019 ("dl19") or 2020 ("dl20"),
    from the official files in msmarco_dir, else from the Hub (module docstring)."""
    if which not in MSMARCO_BENCHMARKS:
        raise IRDataError(f"no MS MARCO benchmark {which!r}. Fix: use one of {MSMARCO_BENCHMARKS}.")
    if msmarco_dir is not None:
        return load_msmarco_local(which, msmarco_dir, **options)
    msmarco = f"{BEIR_ORG}/msmarco"
    if which == "dl20":
        dataset = load_hub(DL20_REPO, corpus_repo=msmarco, split="test", name=which, **options)
    else:
        dataset = load_hub(msmarco, qrels_repo=f"{msmarco}-qrels", name=which,
                           split="dev" if which == "msmarco-dev" else "test", **options)
    return _checked_msmarco(which, dataset)


def load_benchmark(name_or_path, *, split: str | None = None, msmarco_dir=None,
                   **options) -> list[IRDataset]:
    """The datasets of a named benchmark or a local BEIR folder (see the module docstring), or of
    several, comma-separated.

    options: strict, keep_empty, judged_only, corpus_in_memory (see load_files).
    """
    name = str(name_or_path)
    key = name.lower()
    if "," in name and not Path(name).exists():  # several, one result each: "cacm_folder,cisi_folder"
        return [d for part in name.split(",") if part.strip()
                for d in load_benchmark(part.strip(), split=split, msmarco_dir=msmarco_dir, **options)]
    if key == "nanobeir":
        return [load_nanobeir(n, **options) for n in NANOBEIR]
    if key.startswith("nanobeir/"):
        return [load_nanobeir(name.split("/", 1)[1], **options)]
    if key == "beir13":
        return [load_beir(n, split, **options) for n in BEIR13]
    if key.startswith("beir/"):
        return [load_beir(key.split("/", 1)[1], split, **options)]
    if key in MSMARCO_BENCHMARKS:
        return [load_msmarco(key, msmarco_dir, **options)]
    if Path(name).is_dir():
        return [load_beir_folder(name, split or "test", **options)]
    raise IRDataError(f"{name!r} is neither a benchmark name nor a folder. Fix: use nanobeir, "
                      f"nanobeir/<name>, beir13, beir/<name>, msmarco-dev, dl19, dl20 or the path "
                      f"of a BEIR-format folder.")


def main(argv=None):
    """python -m data.ir_datasets [BENCHMARK ...]: load each (downloading what is missing) and print its sizes."""
    p = argparse.ArgumentParser(description="Load retrieval benchmarks (downloading what is missing from the Hub) "
                                            "and print their sizes; see data/ir_datasets.py for the sources.")
    p.add_argument("benchmarks", nargs="*", default=["nanobeir"], metavar="BENCHMARK",
                   help="nanobeir, nanobeir/<name>, beir13, beir/<name>, msmarco-dev, dl19, dl20, or a BEIR-format "
                        "folder (default: nanobeir)")
    p.add_argument("--split", help="the qrels split (default: the one each benchmark reports on)")
    p.add_argument("--msmarco-dir", help="a folder with the official MS MARCO files (instead of the Hub)")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed entry instead of skipping it")
    p.add_argument("--keep-empty", action="store_true", help="keep documents with an empty text (as BEIR's loader)")
    args = p.parse_args(argv)
    for name in args.benchmarks:
        for dataset in load_benchmark(name, split=args.split, msmarco_dir=args.msmarco_dir, strict=args.strict,
                                      keep_empty=args.keep_empty):
            print(dataset)


if __name__ == "__main__":
    from cli import run_cli
    run_cli(main)
