"""Retrieval benchmarks as plain Python data: corpus {docid: text} (BEIR's `(title + " " + text).strip()`,
None when streamed), queries {qid: text} (by default only the judged ones, as BEIR) and qrels
{qid: {docid: grade}}. `load_benchmark(name_or_path)` returns a list of datasets:

    nanobeir, nanobeir/NFCorpus   13 (or 1) of the zeta-alpha-ai/Nano* Hub datasets
    beir13, beir/<name>           BeIR/<name> + BeIR/<name>-qrels on the Hub
    msmarco-dev, dl19, dl20       MS MARCO dev-small, TREC DL 2019/2020 (Hub, or msmarco_dir= the official TSVs);
                                  DL20's queries and qrels come from whybe-choi/trec-dl-2020, its passages from BeIR
    <folder>                      a BEIR-format folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)

A corpus larger than IN_MEMORY_MAX_BYTES is streamed (`IRDataset.iter_corpus`) unless corpus_in_memory=True.
Bad input: skipped with one IRDataWarning per file (empty texts, judgments of unknown ids, exact repeats, up
to MAX_MALFORMED malformed lines), or an IRDataError naming the file, the line and the fix (strict=True: every
skip). An entry skipped for its empty text keeps its judgments, so it counts in trec_eval's denominators.
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
BEIR_EVAL_SPLIT = {"msmarco": "dev"}  # BEIR evaluates msmarco on dev (its "test" is TREC DL 2019)
# judged queries of each MS MARCO benchmark (dev-small, the TREC DL 2019/2020 overviews): a copy that
# disagrees is not the benchmark the papers report on
EXPECTED_JUDGED_QUERIES = {"msmarco-dev": 6980, "dl19": 43, "dl20": 54}
# msmarco_dir= files (each may be gzipped: name + ".gz"): collection, queries, qrels, and where to get them
MSMARCO_FILES = {
    "msmarco-dev": ("queries.dev.small.tsv", "qrels.dev.small.tsv",
                    "collectionandqueries.tar.gz from https://microsoft.github.io/msmarco/"),
    "dl19": ("msmarco-test2019-queries.tsv", "2019qrels-pass.txt",
             "https://microsoft.github.io/msmarco/TREC-Deep-Learning-2019 (qrels: trec.nist.gov/data/deep/)"),
    "dl20": ("msmarco-test2020-queries.tsv", "2020qrels-pass.txt",
             "https://microsoft.github.io/msmarco/TREC-Deep-Learning-2020 (qrels: trec.nist.gov/data/deep/)"),
}

MAX_MALFORMED = 10                  # malformed lines skipped per file before giving up on it
EXAMPLES_PER_KIND = 3               # positions quoted per kind of problem in a warning
IN_MEMORY_MAX_BYTES = 512 * 2**20   # corpus files above this are streamed by default
PROGRESS_MIN_BYTES = 32 * 2**20     # files above this get a tqdm bar
PARQUET_BATCH_ROWS = 65_536
BEIR_QRELS_HEADER = ["query-id", "corpus-id", "score"]


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
    strict: bool = False            # the policy the corpus was (or, streamed, will be) read with
    keep_empty: bool = False
    query_files: list[Path] = field(default_factory=list)  # for messages; empty for a dataset built in code
    qrels_files: list[Path] = field(default_factory=list)
    empty_queries: set = field(default_factory=set)  # judged, skipped for an empty text: they score 0

    def iter_corpus(self, batch_size: int = 10_000) -> Iterator[list[tuple[str, str]]]:
        """The corpus in batches of (docid, text), from memory or streamed from its files."""
        if self.corpus is not None:
            return _batched(self.corpus.items(), batch_size)
        return iter_corpus(self.corpus_files, batch_size, strict=self.strict, keep_empty=self.keep_empty)

    @property
    def num_judgments(self) -> int:
        return sum(len(docs) for docs in self.qrels.values())

    def check_evaluable(self):
        """IRDataError, naming the file and the fix, unless there are queries, judgments of them, a text for
        every judged query and a corpus (in memory: holding a judged document)."""
        queries, qrels, corpus = (", ".join(map(str, files)) or f"{self.name} ({what})" for files, what in
                                  ((self.query_files, "queries"), (self.qrels_files, "qrels"),
                                   (self.corpus_files, "corpus")))
        skipped = "the file is empty, or every entry was skipped (see the warning above)"
        if not self.queries:
            raise IRDataError(f"{queries}: no queries: {skipped}. Fix: give it the collection's queries.")
        if not (self.corpus if self.corpus is not None else next(self.iter_corpus(batch_size=1), None)):
            raise IRDataError(f"{corpus}: no documents: {skipped}. Fix: point to the collection's corpus.")
        if not any(self.qrels.values()):
            raise IRDataError(f"{qrels}: no judgment of any of the {len(self.queries)} queries of {queries} (query "
                              f"ids such as {_some(self.queries)}). Fix: use the qrels of their collection and split.")
        unrun = [q for q, judged in self.qrels.items() if judged and q not in self.queries
                 and q not in self.empty_queries]
        if unrun:
            raise IRDataError(f"{qrels}: {len(unrun)} judged queries have no text in {queries} ({_some(unrun)}), "
                              f"so no system can run them. Fix: add their texts, or drop their judgments.")
        judged = {d for docs in self.qrels.values() for d in docs}
        if self.corpus is not None and judged.isdisjoint(self.corpus):
            raise IRDataError(f"{qrels}: none of the {len(judged)} judged documents ({_some(judged)}) is in {corpus} "
                              f"(documents such as {_some(self.corpus)}). Fix: use the qrels of this corpus.")

    def __repr__(self):
        docs = f"{len(self.corpus)} docs" if self.corpus is not None else "streamed corpus"
        return f"IRDataset({self.name!r}: {docs}, {len(self.queries)} queries, {self.num_judgments} judgments)"


def _some(ids, n=3) -> str:
    some = sorted(ids)[:n] if len(ids) <= 10_000 else list(islice(ids, n))
    return ", ".join(repr(i) for i in some) + (", ..." if len(ids) > n else "")


def join_title_text(title, text) -> str:
    """BEIR's document string: "title text", or just the text when there is no title."""
    return (f"{title} {text}" if title else text).strip()


class RowProblems:
    """The problems of one input file, counted by kind (train_splade.py's readers use it too): skipped
    ones are summarised in one warning per file; structural ones, or any in strict mode, stop."""
    KINDS = {  # kind -> (what the warning says was skipped, how to fix it for good)
        "malformed": ("malformed entries skipped", "correct or delete it"),
        "empty": ("entries with an empty text skipped", "give it a text or delete it (keep_empty=True keeps it)"),
        "repeat": ("exact repeats skipped (first occurrence kept)", "delete the repeat"),
        "unknown_query": ("judgments of unknown queries skipped",
                          "check that qrels and queries come from the same collection and split"),
        "unknown_doc": ("judgments of unknown documents skipped",
                        "check that qrels and corpus come from the same collection and version"),
        "no_header": ("first line read as data (no `query-id corpus-id score` header)",
                      "add the header line `query-id<TAB>corpus-id<TAB>score`"),
    }

    def __init__(self, path, strict: bool):
        self.path, self.strict = path, strict
        self.unit = "row" if file_format(path) == "parquet" else "line"
        self.counts, self.examples = Counter(), {}

    def error(self, pos, detail, fix) -> IRDataError:
        return IRDataError(f"{self.path}{f', {self.unit} {pos}' if pos else ''}: {detail}. Fix: {fix}.")

    def skip(self, kind, pos, detail):
        if self.strict:
            raise self.error(pos, detail, f"{self.KINDS[kind][1]} (strict=True, --strict, stops on every problem)")
        self.counts[kind] += 1
        examples = self.examples.setdefault(kind, [])
        if len(examples) < EXAMPLES_PER_KIND:
            examples.append(f"{self.unit} {pos}: {detail}")
        if kind == "malformed" and self.counts[kind] > MAX_MALFORMED:
            raise IRDataError(f"{self.path}: more than {MAX_MALFORMED} malformed {self.unit}s ({'; '.join(examples)}; "
                              f"...), so this is not a file of the expected format. Fix: check the file.")

    def report(self):
        if self.counts:
            lines = [f"  {self.KINDS[kind][0]}: {n} ({'; '.join(self.examples[kind])}"
                     f"{', ...' if n > len(self.examples[kind]) else ''})" for kind, n in self.counts.items()]
            warnings.warn(f"{self.path}: skipped {self.counts.total()} problem(s) (strict=True, --strict, stops on "
                          f"them instead):\n" + "\n".join(lines), IRDataWarning, stacklevel=4)


# ---------------- Reading records from files: jsonl(.gz), tsv(.gz)/txt and parquet
FORMATS = {"parquet": (".parquet",), "jsonl": (".jsonl", ".jsonl.gz"), "tsv": (".tsv", ".tsv.gz", ".txt", ".txt.gz")}


def file_format(path) -> str | None:
    return next((fmt for fmt, suffixes in FORMATS.items() if str(path).lower().endswith(suffixes)), None)


def text_lines(path: Path, problems: RowProblems) -> Iterator[tuple[int, str]]:
    """(line number, line) of the non-blank lines; a line that is not UTF-8 is a malformed line."""
    size = path.stat().st_size
    with open(path, "rb") as raw, tqdm(total=size, unit="B", unit_scale=True, desc=path.name,
                                       disable=size < PROGRESS_MIN_BYTES, leave=False) as bar:
        try:
            for lineno, line in enumerate(gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw, 1):
                if lineno % 65_536 == 0:
                    bar.update(raw.tell() - bar.n)
                try:
                    line = line.rstrip(b"\r\n").decode("utf-8-sig" if lineno == 1 else "utf-8")  # a BOM is no text
                except UnicodeDecodeError as e:
                    problems.skip("malformed", lineno, f"not UTF-8 (byte {e.start} of the line: "
                                  f"{e.object[e.start:e.start + 4]!r}); re-encode it, e.g. iconv -f latin1 -t utf-8")
                    continue
                if line.strip():
                    yield lineno, line
        except (OSError, EOFError, zlib.error) as e:
            raise IRDataError(f"{path}: cannot be decompressed ({e}): truncated or corrupt. Fix: fetch it again") from e


def jsonl_objects(path: Path, problems: RowProblems) -> Iterator[tuple[int, dict]]:
    for lineno, line in text_lines(path, problems):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.skip("malformed", lineno, f"invalid JSON ({e.msg}, column {e.colno})")
            continue
        if isinstance(obj, dict):
            yield lineno, obj
        else:
            problems.skip("malformed", lineno, f"a JSON {type(obj).__name__}, not an object")


def read_parquet(path, required=(), optional=(), *, error=IRDataError, fix=None) -> Iterator[pa.RecordBatch]:
    """The record batches of a parquet file (the project's one parquet reader): the `required` and present
    `optional` columns (none named: all); `error`, naming the file and `fix`, for an unreadable file."""
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        missing = [c for c in required if c not in names]
        if missing:
            raise error(f"{path}: no column(s) {missing}; the file has columns {names}. Fix: {fix or 'rename them'}.")
        columns = [*required, *(c for c in optional if c in names)] or None
        rows = pf.metadata.num_rows
        with tqdm(total=rows, unit="rows", desc=Path(path).name, disable=rows < 200_000, leave=False) as bar:
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns):
                yield batch
                bar.update(batch.num_rows)
    except (pa.ArrowException, OSError) as e:
        raise error(f"{path}: not a readable parquet file ({e}). Fix: delete it and download it again.") from e


def parquet_rows(path: Path, problems: RowProblems, required, optional=()) -> Iterator[tuple[int, dict]]:
    """(row number, row as a dict) of the wanted columns, like the other readers (`problems` unused)."""
    return enumerate((row for batch in read_parquet(path, required, optional) for row in batch.to_pylist()), 1)


def _records(path: Path, problems: RowProblems, required, optional, what) -> Iterator[tuple[int, dict]]:
    """(position, record) of a parquet or jsonl file, records without a `required` field skipped."""
    parquet = file_format(path) == "parquet"
    records = parquet_rows(path, problems, required, optional) if parquet else jsonl_objects(path, problems)
    for pos, record in records:
        missing = [f for f in required if f not in record]
        if missing:
            problems.skip("malformed", pos, f"no field {missing} (fields: {sorted(record)}); {what}")
        else:
            yield pos, record


def _clean_id(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return str(value).strip() or None


def _text_records(path: Path, problems: RowProblems, kind: str) -> Iterator[tuple[int, str, str]]:
    """(position, id, text) of a corpus (kind="document") or queries (kind="query") file: jsonl/parquet
    with BEIR fields `_id`, `text` (+ `title` for documents), or tsv `id<TAB>text` (MS MARCO)."""
    if file_format(path) == "tsv":
        for lineno, line in text_lines(path, problems):
            fields = line.split("\t", 1)
            if len(fields) != 2 or _clean_id(fields[0]) is None:
                problems.skip("malformed", lineno, f"expected `id<TAB>text`, got {line[:60]!r}")
            else:
                yield lineno, _clean_id(fields[0]), fields[1].strip()
        return
    title = ("title",) if kind == "document" else ()
    for pos, record in _records(path, problems, ("_id", "text"), title, f"BEIR {kind} entries need `_id` and `text`"):
        docid, text, title = _clean_id(record["_id"]), record["text"], record.get("title")
        text = "" if text is None else text
        if docid is None or not isinstance(text, str) or not isinstance(title, (str, type(None))):
            problems.skip("malformed", pos, f"`_id` {record['_id']!r} or `text`/`title` of type {type(text).__name__}: "
                          "give a string or integer `_id` and string texts")
        else:
            yield pos, docid, join_title_text(title if kind == "document" else None, text)


def _parse_grade(value) -> int | None:
    """An integer grade from an int, an integral float or their string forms; else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def _qrels_records(path: Path, problems: RowProblems) -> Iterator[tuple[int, str, str, int]]:
    """(position, qid, docid, grade) of a qrels file: a BEIR TSV (header `query-id corpus-id score`), a TREC
    file (`qid 0 docid grade`, as MS MARCO and NIST give them; the first line tells which), or parquet/jsonl
    with BEIR's field names (without `score`, binary as NanoBEIR's: every row grade 1)."""
    if file_format(path) != "tsv":
        records = _records(path, problems, ("query-id", "corpus-id"), ("score",), "judgments need them (and `score`)")
        rows = ((pos, r["query-id"], r["corpus-id"], r.get("score", 1)) for pos, r in records)
    else:
        rows = _qrels_text_rows(path, problems)
    for pos, qid, docid, grade in rows:
        qid, docid, score = _clean_id(qid), _clean_id(docid), _parse_grade(grade)
        if qid is None or docid is None or score is None:
            problems.skip("malformed", pos, f"need a query id, a document id and an integer grade, got {qid!r}, "
                          f"{docid!r}, {grade!r}")
        else:
            yield pos, qid, docid, score


def _qrels_text_rows(path: Path, problems: RowProblems) -> Iterator[tuple[int, str, str, str]]:
    width = None
    for lineno, line in text_lines(path, problems):
        fields = line.split("\t") if line.count("\t") == 2 else line.split()
        if width is None:  # the first line tells the layout
            width = 4 if len(fields) == 4 and fields != BEIR_QRELS_HEADER else 3
            if fields == BEIR_QRELS_HEADER:
                continue
            if len(fields) != 4 and (len(fields) != 3 or _parse_grade(fields[2]) is None):
                raise problems.error(lineno, f"first line {fields} is neither the BEIR qrels header nor a qrels row",
                                     "start with `query-id<TAB>corpus-id<TAB>score`, or give TREC `qid 0 docid grade`")
            if width == 3:
                problems.skip("no_header", lineno, f"{' '.join(fields)[:60]!r}")
        if len(fields) != width:
            layout = "qid 0 docid grade" if width == 4 else "query-id corpus-id score"
            problems.skip("malformed", lineno, f"expected {width} columns ({layout}), got {line[:60]!r}")
        else:
            yield lineno, fields[0], fields[width - 2], fields[width - 1]


# ---------------- Building the in-memory dataset
def _entries(files, kind, strict, keep_empty, empty: set):
    """(problems, position, id, text) of the files' entries with a text (or keep_empty); others' ids to `empty`."""
    for path in files:
        problems = RowProblems(path, strict)
        for pos, docid, text in _text_records(path, problems, kind):
            if text or keep_empty:
                yield problems, pos, docid, text
            else:
                problems.skip("empty", pos, f"{kind} {docid!r}")
                empty.add(docid)
        problems.report()


def _load_texts(files, kind, strict, keep_empty) -> tuple[dict[str, str], set[str]]:
    """{id: text} of all files, and the ids skipped for an empty text."""
    texts, empty = {}, set()
    for problems, pos, docid, text in _entries(files, kind, strict, keep_empty, empty):
        if docid not in texts:
            texts[docid] = text
        elif texts[docid] == text:
            problems.skip("repeat", pos, f"{kind} {docid!r}")
        else:  # where the first one was: read again, on this error path only
            first = next(f"{p.path}, {p.unit} {at}" for p, at, i, _ in _entries(files, kind, False, True, set())
                         if i == docid)
            raise problems.error(pos, f"{kind} id {docid!r} appears a second time with a different text (first: "
                                 f"{first})", "ids must be unique; delete or rename one of the two")
    return texts, empty


def _load_qrels(files, strict, queries, empty_queries, docs, empty_docs) -> dict:
    """{qid: {docid: grade}} of known queries and (in memory) documents; an entry skipped as empty keeps its own."""
    qrels, first_at = {}, {}
    for path in files:
        problems = RowProblems(path, strict)
        for pos, qid, docid, grade in _qrels_records(path, problems):
            judged = qrels.setdefault(qid, {})
            if qid not in queries and qid not in empty_queries:
                problems.skip("unknown_query", pos, f"query {qid!r} (not in the queries)")
            elif docs is not None and docid not in docs and docid not in empty_docs:
                problems.skip("unknown_doc", pos, f"document {docid!r} is not in the corpus")
            elif docid not in judged:
                judged[docid], first_at[qid, docid] = grade, f"{problems.unit} {pos}"
            elif judged[docid] == grade:
                problems.skip("repeat", pos, f"judgment {qid!r} {docid!r}")
            else:
                raise problems.error(pos, f"query {qid!r} judges document {docid!r} again with grade {grade} "
                                     f"(grade {judged[docid]} at {first_at[qid, docid]})", "keep one of the two")
        problems.report()
    return {qid: judged for qid, judged in qrels.items() if judged}


def _paths(files) -> list[Path]:
    return [Path(files)] if isinstance(files, (str, Path)) else [Path(f) for f in files]


def load_files(corpus, queries, qrels, *, name: str, strict: bool = False, keep_empty: bool = False,
               judged_only: bool = True, corpus_in_memory: bool | None = None) -> IRDataset:
    """The dataset in the given files (each argument one path or a list of shards), formats told by
    extension: .jsonl(.gz) and .parquet with BEIR fields, .tsv(.gz) with `id<TAB>text`, BEIR or TREC
    qrels (.tsv, .txt). judged_only: keep only judged queries (as BEIR). corpus_in_memory: None = when
    the corpus files hold at most IN_MEMORY_MAX_BYTES. A dataset that cannot be evaluated is an error."""
    corpus_files, query_files, qrels_files = _paths(corpus), _paths(queries), _paths(qrels)
    for path in corpus_files + query_files + qrels_files:
        if not path.is_file():
            raise IRDataError(f"{path}: no such file. Fix: check the path.")
        if file_format(path) is None:
            raise IRDataError(f"{path}: unknown file type. Fix: use .jsonl(.gz), .parquet, .tsv(.gz) or .txt.")
    if corpus_in_memory is None:
        corpus_in_memory = sum(p.stat().st_size for p in corpus_files) <= IN_MEMORY_MAX_BYTES
    docs, empty_docs = (_load_texts(corpus_files, "document", strict, keep_empty) if corpus_in_memory
                        else (None, set()))
    query_texts, empty_queries = _load_texts(query_files, "query", strict, keep_empty)
    judgments = _load_qrels(qrels_files, strict, query_texts, empty_queries, docs, empty_docs)
    empty_judged = empty_queries & judgments.keys()
    if empty_judged:
        warnings.warn(f"{name}: {len(empty_judged)} judged queries have an empty text ({_some(empty_judged)}); each "
                      f"scores 0 in every measure and counts in the mean. Fix: give them their text in "
                      f"{', '.join(map(str, query_files))}", IRDataWarning, stacklevel=2)
    dataset = IRDataset(name, docs, query_texts, judgments, corpus_files, strict, keep_empty, query_files,
                        qrels_files, empty_judged)
    dataset.check_evaluable()  # before judged_only, to tell an empty queries file from unjudged queries
    if judged_only:
        dataset.queries = {qid: text for qid, text in query_texts.items() if qid in judgments}
    return dataset


def _batched(items: Iterable, size: int) -> Iterator[list]:
    items = iter(items)
    while batch := list(islice(items, size)):
        yield batch


def iter_corpus(files, batch_size: int = 10_000, *, strict: bool = False,
                keep_empty: bool = False) -> Iterator[list[tuple[str, str]]]:
    """Stream a corpus (one file or shards) as batches of (docid, text), checked as in memory but for repeats."""
    entries = _entries(_paths(files), "document", strict, keep_empty, set())
    return _batched(((docid, text) for _, _, docid, text in entries), batch_size)


# ---------------- Local folders and the Hub
def _find_local(folder: Path, name) -> Path | None:
    return next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None)


def load_beir_folder(folder, split: str = "test", *, name: str | None = None, **options) -> IRDataset:
    """A BEIR-format folder: corpus.jsonl, queries.jsonl (or .jsonl.gz), qrels/<split>.tsv; options: see load_files."""
    folder = Path(folder)
    corpus, queries = _find_local(folder, "corpus.jsonl"), _find_local(folder, "queries.jsonl")
    qrels = _find_local(folder / "qrels", f"{split}.tsv")
    if corpus is None or queries is None:
        raise IRDataError(f"{folder}: not a BEIR-format folder (needs corpus.jsonl and queries.jsonl, found "
                          f"{sorted(p.name for p in folder.iterdir())}). Fix: point to the unzipped BEIR dataset.")
    if qrels is None:
        raise IRDataError(f"{folder}: no qrels/{split}.tsv (qrels files present: "
                          f"{sorted(p.name for p in (folder / 'qrels').glob('*.tsv*'))}). Fix: choose one with split=.")
    return load_files(corpus, queries, qrels, name=name or folder.name, **options)


def _hub_part(files: list[str], part: str, split: str | None = None) -> list[str]:
    """The files of one part of a dataset repo, in the best format present (parquet first). Corpus and
    queries: files named or foldered after the part (corpus.jsonl.gz, corpus/train-0000-of-0001.parquet).
    qrels: files of the split in a qrels folder or named qrels (qrels/test.jsonl), else named or foldered
    after the split (test.tsv of BeIR/<name>-qrels, data/test-00000-of-00001.parquet)."""
    def names(path):  # folder names, the file's stem and the stem's first dash-separated word
        *folders, base = path.split("/")
        stem = base.split(".")[0]
        return set(folders) | {stem, re.split(r"[-_]", stem)[0]}

    usable = [f for f in files if file_format(f) is not None]
    if part == "qrels":
        chosen = [f for f in usable if {"qrels", split} <= names(f)]
        chosen = chosen or [f for f in usable if split in names(f) and not {"corpus", "queries"} & names(f)]
    else:
        chosen = [f for f in usable if part in names(f)]
    rank = list(FORMATS)  # parquet first
    best = min((rank.index(file_format(f)) for f in chosen), default=None)
    return sorted(f for f in chosen if rank.index(file_format(f)) == best)


def hub_dataset_files(repo_id: str, revision: str, folder: str = "") -> list[str]:
    """The files of a Hub dataset repo; offline, those of its cached snapshot (`folder`'s: what an earlier run took)."""
    try:
        return list_repo_files(repo_id, repo_type="dataset", revision=revision)
    except OfflineCacheMissError:
        snapshot = snapshot_download(repo_id, repo_type="dataset", revision=revision,
                                     allow_patterns=[f"{folder}/"] if folder else None)
        return [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]


def _hub_download_part(repo_id: str, part: str, split=None, revision: str = "main") -> list[Path]:
    files = hub_dataset_files(repo_id, revision)
    chosen = _hub_part(files, part, split)
    if not chosen:
        raise IRDataError(f"hf:{repo_id}@{revision}: no {part} file named or foldered '{split or part}' in "
                          f"{files[:20]}. Fix: download the files and use load_files() with them.")
    return [hf_hub_download(repo_id, f, repo_type="dataset", revision=revision) for f in chosen]


def load_hub(repo_id: str, *, qrels_repo: str | None = None, split: str = "test", corpus_repo: str | None = None,
             name: str | None = None, revision: str = "main", **options) -> IRDataset:
    """A BEIR-style dataset repo: corpus (corpus_repo's if given), queries, and `split`'s qrels from qrels_repo."""
    corpus = _hub_download_part(corpus_repo or repo_id, "corpus", revision=revision)
    queries = _hub_download_part(repo_id, "queries", revision=revision)
    qrels = _hub_download_part(qrels_repo or repo_id, "qrels", split, revision=revision)
    return load_files(corpus, queries, qrels, name=name or repo_id, **options)


def load_nanobeir(name: str, **options) -> IRDataset:
    """One NanoBEIR dataset, e.g. "NFCorpus" or "NanoNFCorpus" (case does not matter)."""
    known = {n.lower().removeprefix("nano"): n for n in NANOBEIR}.get(name.lower().removeprefix("nano"))
    if known is None:
        raise IRDataError(f"no NanoBEIR dataset {name!r}. Fix: use one of {list(NANOBEIR)}.")
    # every Nano* repo stores its single sample under split "train"
    return load_hub(f"zeta-alpha-ai/{known}", split="train", name=f"nanobeir/{known}", **options)


def load_beir(name: str, split: str | None = None, **options) -> IRDataset:
    """BeIR/<name> with the judgments of BeIR/<name>-qrels (default split: the one BEIR reports)."""
    return load_hub(f"BeIR/{name}", qrels_repo=f"BeIR/{name}-qrels", split=split or BEIR_EVAL_SPLIT.get(name, "test"),
                    name=f"beir/{name}", **options)


def load_msmarco(which: str, msmarco_dir=None, **options) -> IRDataset:
    """MS MARCO dev-small, TREC DL 2019 or 2020, from the official files in msmarco_dir, else from the Hub."""
    if which not in MSMARCO_BENCHMARKS:
        raise IRDataError(f"no MS MARCO benchmark {which!r}. Fix: use one of {MSMARCO_BENCHMARKS}.")
    if msmarco_dir is not None:
        *names, source = ("collection.tsv", *MSMARCO_FILES[which])
        files = [_find_local(Path(msmarco_dir), n) for n in names]
        missing = [n for n, f in zip(names, files) if f is None]
        if missing:
            raise IRDataError(f"{msmarco_dir}: no {missing} for {which}. Fix: download them from {source} (gzipped "
                              f"files are fine), or drop msmarco_dir to load the Hub copy.")
        dataset = load_files(*files, name=which, **options)
    elif which == "dl20":
        dataset = load_hub("whybe-choi/trec-dl-2020", corpus_repo="BeIR/msmarco", split="test", name=which, **options)
    else:
        dataset = load_hub("BeIR/msmarco", qrels_repo="BeIR/msmarco-qrels", name=which,
                           split="dev" if which == "msmarco-dev" else "test", **options)
    if len(dataset.qrels) != (expected := EXPECTED_JUDGED_QUERIES[which]):
        warnings.warn(f"{which}: {len(dataset.qrels)} judged queries where the benchmark has {expected}: not the "
                      "standard set, so numbers are not comparable with published ones", IRDataWarning, stacklevel=2)
    return dataset


def load_benchmark(name_or_path, *, split: str | None = None, msmarco_dir=None, **options) -> list[IRDataset]:
    """The datasets of a named benchmark or a local BEIR folder (module docstring), or of several,
    comma-separated. options: strict, keep_empty, judged_only, corpus_in_memory (see load_files)."""
    name = str(name_or_path)
    key = name.lower()
    if "," in name and not Path(name).exists():  # several, one result each: "cacm_folder,cisi_folder"
        return [d for part in name.split(",") if part.strip()
                for d in load_benchmark(part.strip(), split=split, msmarco_dir=msmarco_dir, **options)]
    if key == "nanobeir":
        return [load_nanobeir(n, **options) for n in NANOBEIR]
    if key == "beir13":
        return [load_beir(n, split, **options) for n in BEIR13]
    if key.startswith("nanobeir/"):
        return [load_nanobeir(name.split("/", 1)[1], **options)]
    if key.startswith("beir/"):
        return [load_beir(key.split("/", 1)[1], split, **options)]
    if key in MSMARCO_BENCHMARKS:
        return [load_msmarco(key, msmarco_dir, **options)]
    if Path(name).is_dir():
        return [load_beir_folder(name, split or "test", **options)]
    raise IRDataError(f"{name!r} is neither a benchmark name nor a folder. Fix: use nanobeir, nanobeir/<name>, "
                      f"beir13, beir/<name>, msmarco-dev, dl19, dl20 or the path of a BEIR-format folder.")


def main(argv=None):
    """python -m data.ir_datasets [BENCHMARK ...]: load each (downloading what is missing) and print its sizes."""
    p = argparse.ArgumentParser(description="Load retrieval benchmarks (downloading what is missing): their sizes")
    p.add_argument("benchmarks", nargs="*", default=["nanobeir"], metavar="BENCHMARK",
                   help="nanobeir, nanobeir/<name>, beir13, beir/<name>, msmarco-dev, dl19, dl20 or a BEIR folder")
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
