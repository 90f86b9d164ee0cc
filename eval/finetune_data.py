"""Datasets of the fine-tuning evaluation (eval/finetune.py; paper 3, EncodEval protocol): where each
task comes from on the Hub (`TASKS`), how local files are read, the train / validation / test
splits, and the retrieval evaluation sets. Every loader returns plain Python examples:

    sc  {"text": str, "label": int | str}                       sequence classification
    tc  {"tokens": [str], "tags": [str]}                         token classification (BIO tags)
    qa  {"id": str, "question": str, "context": str,
         "answers": [{"text": str, "start": int}]}               extractive QA ([] = unanswerable)
    ir  {"query": str, "positive": str}                           retrieval training pairs

Splits follow the paper's code (EncodEval, branch MLM_vs_CLM, encodeval/datasets.py): for GLUE and
SQuAD-style sets the public validation split is the *test* set and 5 % of the training split, drawn
with seed 42, is the validation set that picks the learning rate; token-classification sets keep
their own three splits. Sentence pairs are joined with the paper's templates ("Premise: ...").

Local files (a folder holds train.* and dev.*/validation.* and/or test.*):
- sc: TSV `sentence<TAB>label` (header optional; with a header the columns sentence/text,
  optional sentence2/text_pair, and label are found by name), JSONL {"text", "label"[, "text_pair"]},
  parquet with the same columns;
- tc: CoNLL column format (word first, tag last, blank line between sentences, -DOCSTART-
  lines skipped), JSONL {"tokens", "tags"}, parquet;
- qa: SQuAD JSON ({"data": [{"paragraphs": [{"context", "qas"}]}]}), JSONL or parquet with
  question, context, answers;
- ir: TSV `query<TAB>positive`, JSONL or parquet {"query", "positive"}.
Bad input stops with a FinetuneDataError that names the file, the line and the fix.
"""
import fnmatch
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cli import UserError
from data import ir_datasets
from hf import hub

METRICS = {"sc": "accuracy", "tc": "f1", "qa": "f1", "ir": "nDCG@10"}   # per kind: the one that picks the lr
VALIDATION_FRACTION = 0.05  # EncodEval: train_test_split(train_size=0.95, seed=42)
VALIDATION_SEED = 42
IR_EVAL_SETS = ("msmarco", "nq", "mldr")   # retrieval tasks: the evaluation sets below
CONLL2003_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


class FinetuneDataError(UserError, ValueError):
    """A dataset that cannot be used as it is; the message names the file (and line) and the fix."""


@dataclass(frozen=True)
class TaskSpec:
    name: str
    kind: str                          # sc | tc | qa | ir
    metric: str                        # the validation metric that picks the learning rate
    repo: str | None = None
    revision: str = "main"
    files: dict = field(default_factory=dict)   # split -> glob of its parquet files in the repo
    template: str | None = None        # sc: the text, from the row's columns
    label_column: str = "label"
    tokens_column: str = "tokens"
    tags_column: str = "ner_tags"
    label_names: tuple | None = None   # names of integer labels, when the files have none
    label_file: tuple | None = None    # (path, revision) of a JSON label2id (or list) in the repo
    num_labels: int | None = None      # sc


TASKS = {
    "sst2": TaskSpec("sst2", "sc", "accuracy", "nyu-mll/glue",
                     files={"train": "sst2/train-*.parquet", "test": "sst2/validation-*.parquet"},
                     template="{sentence}", num_labels=2),
    "mnli": TaskSpec("mnli", "sc", "accuracy", "nyu-mll/glue",
                     files={"train": "mnli/train-*.parquet", "test": "mnli/validation_matched-*.parquet"},
                     template="Premise: {premise}\nHypothesis: {hypothesis}", num_labels=3),
    "qqp": TaskSpec("qqp", "sc", "accuracy", "nyu-mll/glue",
                    files={"train": "qqp/train-*.parquet", "test": "qqp/validation-*.parquet"},
                    template="Question 1: {question1}\nQuestion 2: {question2}", num_labels=2),
    "conll2003": TaskSpec("conll2003", "tc", "f1", "eriktks/conll2003", "refs/convert/parquet",
                          files={s: f"*/{s}/*.parquet" for s in ("train", "validation", "test")},
                          label_names=CONLL2003_TAGS),
    "ontonotes5": TaskSpec("ontonotes5", "tc", "f1", "tner/ontonotes5", "refs/convert/parquet",
                           files={s: f"*/{s}/*.parquet" for s in ("train", "validation", "test")},
                           tags_column="tags", label_file=("dataset/label.json", "main")),
    "uner_en": TaskSpec("uner_en", "tc", "f1", "hgissbkh/uner_en",
                        files={s: f"*{s}*.parquet" for s in ("train", "validation", "test")}),
    "squad": TaskSpec("squad", "qa", "f1", "rajpurkar/squad",
                      files={"train": "plain_text/train-*.parquet", "test": "plain_text/validation-*.parquet"}),
    "squad_v2": TaskSpec("squad_v2", "qa", "f1", "rajpurkar/squad_v2",
                         files={"train": "squad_v2/train-*.parquet", "test": "squad_v2/validation-*.parquet"}),
    "record": TaskSpec("record", "qa", "f1", "hgissbkh/record",
                       files={"train": "*train*.parquet", "test": "*validation*.parquet"}),
    "msmarco-pairs": TaskSpec("msmarco-pairs", "ir", "nDCG@10", "hgissbkh/msmarco-pairs",
                              files={"train": "*train*.parquet"}),
}

# ----------------------------------------------------------------------------- splits


def carve_validation(examples: list, fraction=VALIDATION_FRACTION, seed=VALIDATION_SEED):
    """(train, validation): a seeded random `fraction` of the examples is held out.

    Mirrors datasets' train_test_split(train_size=1 - fraction, seed=seed): n_train =
    floor((1 - fraction) n), a numpy default_rng(seed) permutation, the first n - n_train indices
    held out. (The index arithmetic follows that library's code as read, not a run of it.)"""
    n = len(examples)
    n_train = math.floor((1 - fraction) * n)
    order = np.random.default_rng(seed).permutation(n)
    held_out, kept = order[:n - n_train], order[n - n_train:]
    return [examples[i] for i in kept], [examples[i] for i in held_out]


def with_paper_splits(splits: dict, where: str) -> dict:
    """The missing split the paper's way: validation carved out of train; dev as test when only train and dev."""
    if "train" not in splits:
        raise _err(where, "no training split", "add a train.* file (a Hub task: a `train` glob)")
    splits = dict(splits)
    if "test" not in splits:
        if "validation" not in splits:
            raise _err(where, "only a training split; the protocol needs a test set", "add test.* or dev.*")
        splits["test"] = splits.pop("validation")
    if "validation" not in splits:
        splits["train"], splits["validation"] = carve_validation(splits["train"])
    return {k: splits[k] for k in ("train", "validation", "test")}


# ----------------------------------------------------------------------------- row -> example
def _err(where, what, fix):
    return FinetuneDataError(f"{where}: {what}. Fix: {fix}.")


def sc_example(row: dict, spec: TaskSpec, where: str) -> dict:
    try:
        text, label = spec.template.format(**row) if spec.template else row["text"], row[spec.label_column]
    except KeyError as e:
        raise _err(where, f"no column {e.args[0]!r} (the row has {sorted(row)})",
                   f"add the column, or check that the file belongs to task {spec.name}")
    if row.get("text_pair") is not None and not spec.template:
        text = f"{text}\n{row['text_pair']}"
    return {"text": text, "label": label}


def tc_example(row: dict, spec: TaskSpec, names, where: str) -> dict:
    tokens = _first(row, (spec.tokens_column, "tokens", "words"), where)
    tags = _first(row, (spec.tags_column, "ner_tags", "tags", "ner"), where)
    if len(tokens) != len(tags):
        raise _err(where, f"{len(tokens)} tokens but {len(tags)} tags", "give one tag per token")
    if tags and not isinstance(tags[0], str):
        if names is None:
            raise _err(where, "integer tags and no label names for them", "add label_names to the task spec")
        try:
            tags = [names[t] for t in tags]
        except IndexError:
            raise _err(where, f"tag id {max(tags)} but only {len(names)} label names", "check the label names")
    return {"tokens": [str(t) for t in tokens], "tags": list(tags)}


def _first(row, names, where):
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
    raise _err(where, f"no column {list(dict.fromkeys(names))} (the row has {sorted(row)})", "rename the column")


def _answers(raw, context, where) -> list:
    """[{"text", "start"}] from the SQuAD parquet struct {"text": [...], "answer_start": [...]}
    or a JSON list of {"text", "answer_start"}; every start is checked against the context."""
    if isinstance(raw, dict):
        raw = [{"text": t, "answer_start": s} for t, s in zip(raw.get("text") or [], raw.get("answer_start") or [])]
    out = []
    for a in raw or []:
        text, start = a.get("text"), a.get("answer_start", a.get("start"))
        if not isinstance(text, str) or not isinstance(start, int):
            raise _err(where, f"answer {a!r} lacks a text or an integer answer_start", "give both")
        if context[start:start + len(text)] != text:
            raise _err(where, f"answer {text!r} is not at character {start} of the context", "fix answer_start")
        out.append({"text": text, "start": start})
    return out


def qa_example(row: dict, where: str) -> dict:
    if "passage" in row and "entity_spans" in row:
        return record_example(row, where)
    question, context = _first(row, ("question",), where), _first(row, ("context",), where)
    return {"id": str(row.get("id", where)), "question": question, "context": context,
            "answers": _answers(row.get("answers"), context, where)}


def record_example(row: dict, where: str) -> dict:
    """A SuperGLUE ReCoRD row as extractive QA: the cloze query is the question and every entity
    mention whose text is a gold answer is a gold span (ReCoRD scores the max over answers)."""
    passage, spans = row["passage"], row["entity_spans"] or {}
    golds = list(dict.fromkeys(row.get("answers") or []))
    answers = [{"text": t, "start": s} for t, s in zip(spans.get("text", []), spans.get("start", []))
               if t in golds and passage[s:s + len(t)] == t]
    if not answers:  # entity offsets that do not match the text: fall back to the first occurrence
        answers = [{"text": t, "start": passage.find(t)} for t in golds if passage.find(t) >= 0]
    qid = row.get("idx", where)
    qid = f"{qid['passage']}-{qid['query']}" if isinstance(qid, dict) else str(qid)
    return {"id": qid, "question": row["query"], "context": passage, "answers": answers}


def ir_example(row: dict, where: str) -> dict:
    return {"query": _first(row, ("query", "anchor"), where),
            "positive": _first(row, ("positive", "pos", "document"), where)}


def to_examples(rows, spec: TaskSpec, where: str, names=None):
    """Rows (dicts) of one file (`where`) -> examples of the spec's kind; names: tc's tag names."""
    make = {"sc": lambda row, at: sc_example(row, spec, at), "tc": lambda row, at: tc_example(row, spec, names, at),
            "qa": qa_example, "ir": ir_example}[spec.kind]
    return [make(row, f"{where}, row {i}") for i, row in enumerate(rows, 1)]


# ----------------------------------------------------------------------------- parquet
def read_parquet(path) -> tuple[list[dict], dict]:
    """(rows, {column: ClassLabel names}) of a parquet file (the `datasets` metadata in its schema)."""
    rows, meta = [], None
    for batch in ir_datasets.read_parquet(path, error=FinetuneDataError):
        rows += batch.to_pylist()
        meta = (batch.schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(meta or "{}").get("info", {}).get("features", {})
    except ValueError:
        features = {}
    return rows, {column: tuple(found) for column, feature in features.items() if (found := _class_names(feature))}


def _class_names(feature):
    """The `names` of a ClassLabel, also inside Sequence/List features."""
    if isinstance(feature, list) and len(feature) == 1:
        return _class_names(feature[0])
    if not isinstance(feature, dict):
        return None
    names = feature.get("names")
    return names if isinstance(names, list) else _class_names(feature.get("feature", feature.get("features")))


# ----------------------------------------------------------------------------- the Hub
def hub_split_files(spec: TaskSpec, split: str) -> list[Path]:
    """Download (or find in the cache) the parquet files of one split of a table task."""
    pattern = spec.files[split]
    try:
        folder = hub.snapshot_download(spec.repo, repo_type="dataset", revision=spec.revision, allow_patterns=[pattern])
    except hub.EntryNotFoundError as e:  # snapshot_download has just listed the repo: it can be listed
        listing = hub.list_repo_files(spec.repo, repo_type="dataset", revision=spec.revision)
        raise _err(f"hf:{spec.repo}@{spec.revision}", f"no file matches {pattern!r} (split {split}); it has "
                   f"{listing[:30]}", f"update TASKS' glob, or give local files: --tasks {spec.name}=DIR") from e
    return sorted(p for p in folder.rglob("*.parquet") if fnmatch.fnmatch(p.relative_to(folder).as_posix(), pattern))


def hub_tag_names(spec: TaskSpec, file_names: dict):
    if spec.label_names:
        return tuple(spec.label_names)
    if spec.label_file:
        path, revision = spec.label_file
        mapping = json.loads(hub.hf_hub_download(spec.repo, path, repo_type="dataset", revision=revision).read_text())
        return tuple(sorted(mapping, key=mapping.get) if isinstance(mapping, dict) else mapping)  # label2id or a list
    return file_names.get(spec.tags_column)


def load_hub_task(spec: TaskSpec) -> dict:
    """{split: examples} of a task of the table, with the paper's splits."""
    if spec.repo is None:
        raise _err(f"task {spec.name}", "no Hub source", f"give local files: --tasks {spec.name}=DIR")
    splits = {}
    for split in spec.files:
        files = [read_parquet(path) for path in hub_split_files(spec, split)]
        rows, names = [row for r, _ in files for row in r], {k: v for _, n in files for k, v in n.items()}
        labels = hub_tag_names(spec, names) if spec.kind == "tc" else None
        splits[split] = to_examples(rows, spec, f"hf:{spec.repo} {spec.files[split]}", labels)
    return splits if spec.kind == "ir" else with_paper_splits(splits, f"hf:{spec.repo}")


# ----------------------------------------------------------------------------- local files
SPLIT_NAMES = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}
SUFFIXES = (".tsv", ".jsonl", ".json", ".parquet", ".conll", ".txt", ".iob", ".bio", ".csv")


def find_split_files(folder: Path) -> dict:
    found = {}
    for split, stems in SPLIT_NAMES.items():
        for p in sorted(folder.iterdir()):
            if p.is_file() and p.suffix in SUFFIXES and p.stem.lower() in stems:
                found.setdefault(split, p)
    if not found:
        raise _err(folder, f"no train.*, dev.* or test.* file of a suffix {SUFFIXES}", "name files after their split")
    return found


def load_local_task(path, spec: TaskSpec) -> dict:
    """{split: examples} from a folder of split files (paper splits filled in) or one file (train)."""
    path = Path(path)
    if path.is_dir():
        splits = {s: load_local(p, spec) for s, p in find_split_files(path).items()}
        return splits if spec.kind == "ir" else with_paper_splits(splits, str(path))
    if path.is_file():
        return {"train": load_local(path, spec)}
    raise _err(path, "no such file or folder", "give a folder with train.* and dev.*/test.* files, or one file")


def load_local(path: Path, spec: TaskSpec) -> list:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows, names = read_parquet(path)
        labels = (spec.label_names or names.get(spec.tags_column)) if spec.kind == "tc" else None
        return to_examples(rows, spec, str(path), labels)
    if suffix == ".jsonl":
        return to_examples(_jsonl_rows(path), spec, str(path), spec.label_names)
    if spec.kind == "qa" and suffix == ".json":
        return read_squad_json(path)
    if spec.kind == "tc" and suffix in (".conll", ".txt", ".iob", ".bio", ".tsv"):
        return read_conll(path)
    if spec.kind in ("sc", "ir") and suffix in (".tsv", ".txt"):
        return read_tsv(path, spec)
    raise _err(path, f"a {suffix or 'suffix-less'} file is no {spec.kind} format", f"use {_FORMATS[spec.kind]}")


_FORMATS = {"sc": "TSV (sentence<TAB>label), JSONL or parquet",
            "tc": "CoNLL column files, JSONL {tokens, tags} or parquet",
            "qa": "SQuAD JSON, JSONL or parquet", "ir": "TSV (query<TAB>positive), JSONL or parquet"}


def _lines(path: Path):
    with open(path, encoding="utf-8", newline="") as f:
        try:
            for lineno, line in enumerate(f, 1):
                yield lineno, line.rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise FinetuneDataError(f"{path}: not UTF-8 ({e}). Fix: re-encode it as UTF-8.") from e


def _jsonl_rows(path: Path):
    rows = []
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise _err(f"{path}, line {lineno}", f"invalid JSON ({e})", "one JSON object per line") from e
        if not isinstance(row, dict):
            raise _err(f"{path}, line {lineno}", f"a JSON {type(row).__name__}", "one JSON object per line")
        rows.append(row)
    return rows


def _label_value(value: str, spec: TaskSpec, where: str, first=None):
    """A label field as a class id (an integer) or a label name. A table task without label names
    (GLUE: its files hold class ids) takes only its own ids, and a file holds ids or names, not both
    (`first`: where the file's first label stands, and that label)."""
    value = value.strip()
    label = int(value) if re.fullmatch(r"-?\d+", value) else value
    if spec.num_labels and not spec.label_names and label not in range(spec.num_labels):
        raise _err(where, f"label {value!r} is not a class id of {spec.name} (0 to {spec.num_labels - 1})",
                   "write the class id, or read the file as a task of your own (sc:NAME=PATH) to use label names")
    if first and isinstance(label, int) != isinstance(first[1], int):
        raise _err(where, f"label {value!r}, but {first[0]} has the label {first[1]!r}", "use ids or names, not both")
    return label


def read_tsv(path: Path, spec: TaskSpec) -> list:
    """sc: `sentence<TAB>label` or `sentence<TAB>sentence2<TAB>label`; ir: `query<TAB>positive`.
    A first line whose label field is the word `label` (or, for ir, `query`) is a header."""
    out, header, first = [], None, None
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        fields, at = line.split("\t"), f"{path}, line {lineno}"
        if lineno == 1 and (fields[-1].strip().lower() == "label" or fields[0].strip().lower() == "query"):
            header = [f.strip().lower() for f in fields]
            continue
        if spec.kind == "ir":
            if len(fields) != 2:
                raise _err(at, f"{len(fields)} tab-separated fields", "write query<TAB>positive")
            out.append({"query": fields[0], "positive": fields[1]})
            continue
        names = header or {2: ("sentence", "label"), 3: ("sentence", "sentence2", "label")}.get(len(fields))
        if names is None:
            raise _err(at, f"{len(fields)} tab-separated fields", "write sentence<TAB>label")
        if len(fields) != len(names):
            raise _err(at, f"{len(fields)} fields but the header has {len(names)}", "one field per column")
        row = dict(zip(names, fields))
        text = next((row[k] for k in ("sentence", "text", "sentence1") if k in row), None)
        pair = next((row[k] for k in ("sentence2", "text_pair") if k in row), None)
        if text is None or "label" not in row:
            raise _err(f"{path}, line 1", f"header {header} has no sentence/text or no label", "rename the columns")
        if not row["label"].strip():
            raise _err(at, "empty label", "give every line a label")
        label = _label_value(row["label"], spec, at, first)
        first = first or (at, label)
        out.append({"text": text.strip() if pair is None else f"{text.strip()}\n{pair.strip()}", "label": label})
    return out


def read_conll(path: Path) -> list:
    """CoNLL column format: one `word ... tag` line per word (the tag last), blank lines between sentences."""
    sentences, tokens, tags, width = [], [], [], None
    for lineno, line in itertools.chain(_lines(path), [(None, "")]):  # a blank line ends the last sentence
        fields = line.split()
        if not fields:
            if tokens:
                sentences.append({"tokens": tokens, "tags": tags})
            tokens, tags = [], []
            continue
        if fields[0] == "-DOCSTART-":
            continue
        if len(fields) < 2:
            raise _err(f"{path}, line {lineno}", f"one field ({line!r})", "write `word tag` (POS columns between)")
        width = width or len(fields)
        if len(fields) != width:
            raise _err(f"{path}, line {lineno}", f"{len(fields)} fields where earlier lines have {width}", "fix it")
        tokens.append(fields[0])
        tags.append(fields[-1])
    return sentences


def read_squad_json(path: Path) -> list:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
    except (ValueError, KeyError, TypeError) as e:
        raise _err(path, f"not SQuAD JSON ({e!r})", 'use the layout {"data": [{"paragraphs": [...]}]}') from e
    return [qa_example({**qa, "context": para["context"],
                        "answers": [] if qa.get("is_impossible") else qa.get("answers")},
                       f"{path}, data[{a}].paragraphs[{p}].qas[{q}]")
            for a, article in enumerate(data) for p, para in enumerate(article.get("paragraphs", []))
            for q, qa in enumerate(para.get("qas", []))]


# ----------------------------------------------------------------------------- retrieval evaluation sets
# As the paper's code builds them (validation picks the lr, test is reported): msmarco is MS MARCO
# dev / TREC DL 2019 (data/ir_datasets.py), nq a seeded half of BEIR NQ's test queries / the other
# half, mldr MLDR-en dev / test (Shitao/MLDR). The corpus searched is only the documents judged in
# the two splits, not the full collection: numbers are much higher than full-corpus retrieval and
# comparable only with the paper's protocol. A local BEIR folder (`nq=PATH`) uses its qrels/dev.tsv
# (or validation.tsv) and qrels/test.tsv, or halves test.tsv when it has no dev file.
MLDR_REPO = "Shitao/MLDR"
MLDR_FILES = {"validation": "mldr-v1.0-en/dev.jsonl.gz", "test": "mldr-v1.0-en/test.jsonl.gz"}
SPLIT_SEED = 0


@dataclass
class IREvalSet:
    name: str
    queries: dict            # qid -> text
    corpus: dict             # docid -> text (the judged documents)
    qrels: dict              # split -> {qid: {docid: grade}}


def halve_queries(qrels: dict, seed=SPLIT_SEED) -> dict:
    """{"validation": half of the judged queries, "test": the other half}, a seeded draw."""
    qids = sorted(qrels)
    order = np.random.default_rng(seed).permutation(len(qids))
    half = len(qids) // 2
    pick = lambda idx: {qids[i]: qrels[qids[i]] for i in sorted(idx)}
    return {"validation": pick(order[:half]), "test": pick(order[half:])}


def judged_set(name, test, validation=None) -> IREvalSet:
    """`test`'s judged queries and `validation`'s (None: a seeded half of test's, halve_queries)
    against the documents of test's corpus judged in either, its corpus streamed when it is large."""
    qrels = halve_queries(test.qrels) if validation is None else {"validation": validation.qrels, "test": test.qrels}
    queries = test.queries if validation is None else {**validation.queries, **test.queries}
    judged = {d for split in qrels.values() for docs in split.values() for d in docs}
    return IREvalSet(name, queries, {d: t for batch in test.iter_corpus() for d, t in batch if d in judged}, qrels)


def load_mldr_eval() -> IREvalSet:
    """MLDR-en: every dev/test line carries its query and positive passages with their texts."""
    queries, corpus, qrels = {}, {}, {}
    for split, name in MLDR_FILES.items():
        path = hub.hf_hub_download(MLDR_REPO, name, repo_type="dataset")
        qrels[split] = {}
        for lineno, row in ir_datasets.jsonl_objects(path, ir_datasets.RowProblems(path, strict=True)):
            try:
                qid = str(row["query_id"])
                queries[qid] = row["query"]
                qrels[split][qid] = {str(p["docid"]): 1 for p in row["positive_passages"]}
                corpus.update((str(p["docid"]), p["text"]) for p in row["positive_passages"])
            except (KeyError, TypeError) as e:
                raise _err(f"{path}, line {lineno}", f"no {e} field of an MLDR line",
                           "download it again, or give a BEIR folder (mldr=PATH)") from e
    return IREvalSet("mldr", queries, corpus, qrels)


def load_ir_eval(name, path=None) -> IREvalSet:
    if path:
        folder = Path(path)
        dev = next((s for s in ("dev", "validation") if (folder / "qrels" / f"{s}.tsv").exists()), None)
        return judged_set(name, ir_datasets.load_beir_folder(folder, "test", name=name),
                          dev and ir_datasets.load_beir_folder(folder, dev, name=name))
    if name == "msmarco":  # one corpus: MS MARCO's passages
        return judged_set(name, ir_datasets.load_benchmark("dl19")[0], ir_datasets.load_benchmark("msmarco-dev")[0])
    if name == "nq":
        return judged_set(name, ir_datasets.load_beir("nq", "test"))
    if name != "mldr":
        raise ValueError(f"no retrieval evaluation set {name!r}; use one of {IR_EVAL_SETS} or NAME=BEIR_FOLDER")
    return load_mldr_eval()


# ----------------------------------------------------------------------------- entry point
def parse_task(arg: str) -> tuple[TaskSpec, str | None]:
    """`name`, `name=PATH` (a table task read from local files) or `kind:name=PATH` (a new task)."""
    name, _, path = arg.partition("=")
    if ":" in name:
        kind, name = name.split(":", 1)
        if kind not in METRICS:
            raise _err(f"task {arg!r}", f"kind {kind!r} is not one of {tuple(METRICS)}", "use one of them")
        return TaskSpec(name, kind, METRICS[kind]), path or None
    if name in TASKS and TASKS[name].kind == "ir":
        raise _err(f"task {name!r}", "the retrieval training set", "name msmarco, nq or mldr (--ir-train PATH: pairs)")
    if name in IR_EVAL_SETS:
        return TaskSpec(name, "ir", METRICS["ir"]), path or None
    if name not in TASKS:
        raise _err(f"task {name!r}", "unknown", f"use one of {sorted(TASKS) + sorted(IR_EVAL_SETS)} or KIND:NAME=DIR")
    return TASKS[name], path or None


def load_task(spec: TaskSpec, path=None) -> dict:
    """{split: examples} for a task: local files when `path` is given, else the Hub."""
    return load_local_task(path, spec) if path else load_hub_task(spec)
