"""Loaders of data/ir_datasets.py: every format on files written here, the Hub layouts through
the fake Hub, the real Cranfield/CISI/CACM folders, and the bad-input policy."""
import gzip
import io
import json
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.ir_datasets import (BEIR13, NANOBEIR, IRDataError, IRDataWarning, iter_corpus,
                              join_title_text, load_beir, load_beir_folder, load_benchmark,
                              load_files, load_msmarco, load_nanobeir)
from fakehub import fake_hub  # noqa: F401


# ---------------------------------------------------------------------------------------------
# helpers writing the formats


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def parquet(columns: dict) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    return buffer.getvalue()


def qrels_tsv(rows, header=True) -> bytes:
    lines = (["query-id\tcorpus-id\tscore"] if header else []) + ["\t".join(map(str, r)) for r in rows]
    return ("\n".join(lines) + "\n").encode()


DOCS = [{"_id": "d1", "title": "Heat", "text": "transfer in flow"},
        {"_id": "d2", "title": "", "text": " wing lift "},
        {"_id": "d3", "title": "Mach", "text": "numbers"}]
QUERIES = [{"_id": "q1", "text": "heat flow"}, {"_id": "q2", "text": "lift"},
           {"_id": "q3", "text": "never judged"}]
QRELS = [("q1", "d1", 2), ("q1", "d3", 0), ("q2", "d2", 1)]
EXPECTED_CORPUS = {"d1": "Heat transfer in flow", "d2": "wing lift", "d3": "Mach numbers"}
EXPECTED_QRELS = {"q1": {"d1": 2, "d3": 0}, "q2": {"d2": 1}}


def beir_folder(root: Path, docs=DOCS, queries=QUERIES, qrels=QRELS, split="test") -> Path:
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_bytes(jsonl(docs))
    (root / "queries.jsonl").write_bytes(jsonl(queries))
    (root / "qrels" / f"{split}.tsv").write_bytes(qrels_tsv(qrels))
    return root


def load_quietly(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IRDataWarning)
        return load_files(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# formats


def test_join_title_text_is_beirs_title_space_text_stripped():
    assert join_title_text("Heat", "transfer ") == "Heat transfer", "title and text joined by one space"
    assert join_title_text("", " body ") == "body", "no title: the stripped text alone"
    assert join_title_text(None, "body") == "body", "a null title counts as no title"


def test_beir_folder_gives_joined_texts_judged_queries_and_graded_qrels(tmp_path):
    ds = load_beir_folder(beir_folder(tmp_path / "tiny"))
    assert ds.name == "tiny"
    assert ds.corpus == EXPECTED_CORPUS, "documents: BEIR's title + text string"
    assert ds.qrels == EXPECTED_QRELS, "graded judgments, grade 0 kept"
    assert ds.queries == {"q1": "heat flow", "q2": "lift"}, "unjudged q3 dropped by default"
    every_query = load_beir_folder(tmp_path / "tiny", judged_only=False)
    assert set(every_query.queries) == {"q1", "q2", "q3"}, "judged_only=False keeps q3"


def test_beir_folder_split_selects_the_qrels_file_and_names_the_ones_present(tmp_path):
    folder = beir_folder(tmp_path / "tiny", qrels=[("q2", "d2", 1)], split="dev")
    assert load_beir_folder(folder, split="dev").qrels == {"q2": {"d2": 1}}
    with pytest.raises(IRDataError, match=r"no qrels/test\.tsv.*dev\.tsv"):
        load_beir_folder(folder)


def test_beir_folder_reads_gzipped_jsonl(tmp_path):
    folder = beir_folder(tmp_path / "gz")
    (folder / "corpus.jsonl.gz").write_bytes(gzip.compress((folder / "corpus.jsonl").read_bytes()))
    (folder / "corpus.jsonl").unlink()
    assert load_beir_folder(folder).corpus == EXPECTED_CORPUS


def test_parquet_text_tsv_and_jsonl_give_the_same_dataset(tmp_path):
    (tmp_path / "c.parquet").write_bytes(parquet({"_id": [d["_id"] for d in DOCS],
                                                  "title": [d["title"] for d in DOCS],
                                                  "text": [d["text"] for d in DOCS]}))
    (tmp_path / "q.parquet").write_bytes(parquet({"_id": ["q1", "q2"], "text": ["heat flow", "lift"]}))
    (tmp_path / "r.parquet").write_bytes(parquet({"query-id": ["q1", "q1", "q2"],
                                                  "corpus-id": ["d1", "d3", "d2"], "score": [2, 0, 1]}))
    from_parquet = load_files(tmp_path / "c.parquet", tmp_path / "q.parquet", tmp_path / "r.parquet", name="p")
    (tmp_path / "c.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in EXPECTED_CORPUS.items()))
    (tmp_path / "q.tsv").write_text("q1\theat flow\nq2\tlift\n")
    (tmp_path / "r.txt").write_text("q1 0 d1 2\nq1 0 d3 0\nq2 0 d2 1\n")  # TREC qrels
    from_tsv = load_files(tmp_path / "c.tsv", tmp_path / "q.tsv", tmp_path / "r.txt", name="t")
    for ds in (from_parquet, from_tsv):
        assert (ds.corpus, ds.queries, ds.qrels) == (EXPECTED_CORPUS, {"q1": "heat flow", "q2": "lift"},
                                                     EXPECTED_QRELS), f"{ds.name}: differs from the jsonl reading"


def test_iter_corpus_streams_batches_and_matches_the_in_memory_dict(tmp_path):
    docs = [{"_id": f"d{i}", "title": "", "text": f"text {i}"} for i in range(7)]
    (tmp_path / "c.jsonl").write_bytes(jsonl(docs))
    batches = list(iter_corpus(tmp_path / "c.jsonl", batch_size=3))
    assert [len(b) for b in batches] == [3, 3, 1], "batches of batch_size, the last one shorter"
    assert dict(pair for b in batches for pair in b) == {f"d{i}": f"text {i}" for i in range(7)}

    (tmp_path / "q.jsonl").write_bytes(jsonl([{"_id": "q", "text": "t"}]))
    (tmp_path / "r.tsv").write_bytes(qrels_tsv([("q", "d1", 1)]))
    streamed = load_files(tmp_path / "c.jsonl", tmp_path / "q.jsonl", tmp_path / "r.tsv", name="s",
                          corpus_in_memory=False)
    in_memory = load_files(tmp_path / "c.jsonl", tmp_path / "q.jsonl", tmp_path / "r.tsv", name="m")
    assert streamed.corpus is None, "corpus_in_memory=False must not build the dict"
    assert [b for b in streamed.iter_corpus(4)] == [b for b in in_memory.iter_corpus(4)]


def test_iter_corpus_is_lazy_it_yields_before_reading_the_whole_file(tmp_path):
    good = [json.dumps({"_id": f"d{i}", "text": "x"}) for i in range(4)]
    (tmp_path / "c.jsonl").write_text("\n".join(good + ["{broken"] * 20) + "\n")
    stream = iter_corpus(tmp_path / "c.jsonl", batch_size=2)
    assert len(next(stream)) == 2, "the first batch comes before the broken tail is read"
    with pytest.raises(IRDataError, match="more than 10 malformed lines"):
        list(stream)


# ---------------------------------------------------------------------------------------------
# the Hub, through the fake Hub


def add_nano(hub, name, docs=DOCS, queries=QUERIES, qrels=QRELS):
    repo = f"zeta-alpha-ai/{name}"
    hub.add_file(repo, "README.md", b"# Nano", repo_type="dataset")
    hub.add_file(repo, "corpus/train-00000-of-00001.parquet", parquet(
        {"_id": [d["_id"] for d in docs], "text": [join_title_text(d["title"], d["text"]) for d in docs]}),
        repo_type="dataset")
    hub.add_file(repo, "queries/train-00000-of-00001.parquet", parquet(
        {"_id": [q["_id"] for q in queries], "text": [q["text"] for q in queries]}), repo_type="dataset")
    hub.add_file(repo, "qrels/train-00000-of-00001.parquet", parquet(
        {"query-id": [r[0] for r in qrels], "corpus-id": [r[1] for r in qrels]}), repo_type="dataset")


def test_nanobeir_from_the_hub_parquet_layout_with_binary_qrels(fake_hub):
    add_nano(fake_hub, "NanoNFCorpus")
    [ds] = load_benchmark("nanobeir/nfcorpus")
    assert ds.name == "nanobeir/NanoNFCorpus"
    assert ds.corpus == EXPECTED_CORPUS
    assert ds.qrels == {"q1": {"d1": 1, "d3": 1}, "q2": {"d2": 1}}, "no score column: every judgment is 1"
    assert fake_hub.gets("README") == [], "only the three parquet files are downloaded"


def test_nanobeir_loads_all_thirteen_in_order(fake_hub):
    for name in NANOBEIR:
        add_nano(fake_hub, name)
    datasets = load_benchmark("nanobeir")
    assert [d.name for d in datasets] == [f"nanobeir/{n}" for n in NANOBEIR]
    assert all(d.corpus == EXPECTED_CORPUS for d in datasets)


def test_loaded_hub_dataset_loads_again_offline_from_the_cache(fake_hub, monkeypatch):
    add_nano(fake_hub, "NanoSciFact")
    online = load_nanobeir("SciFact")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.requests.clear()
    offline = load_nanobeir("scifact")
    assert (offline.corpus, offline.queries, offline.qrels) == (online.corpus, online.queries, online.qrels)
    assert fake_hub.requests == [], "offline load must not touch the Hub"


def test_beir_hub_original_jsonl_gz_and_qrels_tsv_layout(fake_hub):
    fake_hub.add_file("BeIR/scifact", "corpus.jsonl.gz", gzip.compress(jsonl(DOCS)), repo_type="dataset")
    fake_hub.add_file("BeIR/scifact", "queries.jsonl.gz", gzip.compress(jsonl(QUERIES)), repo_type="dataset")
    fake_hub.add_file("BeIR/scifact", "scifact.py", b"# loading script", repo_type="dataset")
    fake_hub.add_file("BeIR/scifact-qrels", "train.tsv", qrels_tsv([("q3", "d1", 1)]), repo_type="dataset")
    fake_hub.add_file("BeIR/scifact-qrels", "test.tsv", qrels_tsv(QRELS), repo_type="dataset")
    [ds] = load_benchmark("beir/scifact")
    assert ds.name == "beir/scifact"
    assert (ds.corpus, ds.qrels) == (EXPECTED_CORPUS, EXPECTED_QRELS), "test split, not train"
    assert set(ds.queries) == {"q1", "q2"}


def test_beir_hub_prefers_the_parquet_conversion_when_both_exist(fake_hub):
    repo = "BeIR/nfcorpus"
    fake_hub.add_file(repo, "corpus.jsonl.gz", gzip.compress(jsonl([{"_id": "old", "text": "x"}])),
                      repo_type="dataset")
    fake_hub.add_file(repo, "corpus/corpus-00000-of-00001.parquet", parquet(
        {"_id": ["d1", "d2", "d3"], "title": ["Heat", "", "Mach"],
         "text": ["transfer in flow", "wing lift", "numbers"]}), repo_type="dataset")
    fake_hub.add_file(repo, "queries/queries-00000-of-00001.parquet", parquet(
        {"_id": ["q1", "q2"], "title": ["", ""], "text": ["heat flow", "lift"]}), repo_type="dataset")
    fake_hub.add_file("BeIR/nfcorpus-qrels", "test.tsv", qrels_tsv(QRELS), repo_type="dataset")
    ds = load_beir("nfcorpus")
    assert ds.corpus == EXPECTED_CORPUS, "documents from the parquet conversion"
    assert fake_hub.gets("corpus.jsonl.gz") == [], "the jsonl.gz copy is not downloaded"


def test_beir_msmarco_is_evaluated_on_dev(fake_hub):
    fake_hub.add_file("BeIR/msmarco", "corpus.jsonl.gz", gzip.compress(jsonl(DOCS)), repo_type="dataset")
    fake_hub.add_file("BeIR/msmarco", "queries.jsonl.gz", gzip.compress(jsonl(QUERIES)), repo_type="dataset")
    fake_hub.add_file("BeIR/msmarco-qrels", "dev.tsv", qrels_tsv([("q2", "d2", 1)]), repo_type="dataset")
    fake_hub.add_file("BeIR/msmarco-qrels", "test.tsv", qrels_tsv(QRELS), repo_type="dataset")
    assert load_beir("msmarco").qrels == {"q2": {"d2": 1}}


def add_msmarco_hub(hub):
    """BeIR/msmarco(+qrels) and the MTEB DL20 copy, with tiny stand-in content."""
    hub.add_file("BeIR/msmarco", "corpus.jsonl.gz", gzip.compress(jsonl(DOCS)), repo_type="dataset")
    hub.add_file("BeIR/msmarco", "queries.jsonl.gz", gzip.compress(jsonl(QUERIES)), repo_type="dataset")
    hub.add_file("BeIR/msmarco-qrels", "dev.tsv", qrels_tsv([("q2", "d2", 1)]), repo_type="dataset")
    hub.add_file("BeIR/msmarco-qrels", "test.tsv", qrels_tsv(QRELS), repo_type="dataset")
    dl20 = "whybe-choi/trec-dl-2020"
    hub.add_file(dl20, "corpus.jsonl", jsonl([{"_id": "never", "title": "", "text": "used"}] * 200),
                 repo_type="dataset")
    hub.add_file(dl20, "queries.jsonl", jsonl([{"_id": "q9", "text": "dl20 query"}]), repo_type="dataset")
    hub.add_file(dl20, "qrels/test.jsonl", jsonl([{"query-id": "q9", "corpus-id": "d3", "score": 3.0}]),
                 repo_type="dataset")


def test_msmarco_dev_dl19_dl20_from_the_hub(fake_hub):
    add_msmarco_hub(fake_hub)
    with pytest.warns(IRDataWarning, match=r"dl19: 2 judged queries where the benchmark has 43"):
        [dl19] = load_benchmark("dl19")
    assert dl19.qrels == EXPECTED_QRELS, "DL19 = BeIR/msmarco-qrels test.tsv"
    with pytest.warns(IRDataWarning, match="6980"):
        [dev] = load_benchmark("msmarco-dev")
    assert dev.qrels == {"q2": {"d2": 1}}, "dev-small = BeIR/msmarco-qrels dev.tsv"
    with pytest.warns(IRDataWarning, match="54"):
        [dl20] = load_benchmark("dl20")
    assert dl20.qrels == {"q9": {"d3": 3}}, "float grade 3.0 read as 3"
    assert dl20.queries == {"q9": "dl20 query"}
    assert dl20.corpus == EXPECTED_CORPUS, "DL20 passages come from BeIR/msmarco"
    assert fake_hub.gets("trec-dl-2020/resolve/main/corpus") == [], "the duplicate DL20 corpus is not fetched"


def test_hub_repo_without_a_recognised_file_names_the_repo_and_its_files(fake_hub):
    fake_hub.add_file("BeIR/odd", "data.csv", b"a,b\n", repo_type="dataset")
    with pytest.raises(IRDataError, match=r"hf:BeIR/odd@main: no corpus file.*data\.csv"):
        load_beir("odd")


# ---------------------------------------------------------------------------------------------
# MS MARCO official files


def msmarco_dir(root: Path, gz_queries=False) -> Path:
    root.mkdir()
    (root / "collection.tsv").write_text("0\tthe first passage\n1\tthe second passage\n2\tthird\n")
    (root / "queries.dev.small.tsv").write_text("100\twhat is first\n101\twhat is second\n")
    (root / "qrels.dev.small.tsv").write_text("100\t0\t0\t1\n101\t0\t1\t1\n")
    queries = "200\tdl query\n201\tunjudged dl query\n".encode()
    name = "msmarco-test2019-queries.tsv"
    (root / (name + ".gz" if gz_queries else name)).write_bytes(gzip.compress(queries) if gz_queries else queries)
    (root / "2019qrels-pass.txt").write_text("200 0 0 3\n200 0 1 0\n200 0 2 2\n")
    return root


def test_msmarco_official_tsv_files_give_dev_small_and_graded_dl19(tmp_path):
    folder = msmarco_dir(tmp_path / "msmarco", gz_queries=True)
    with pytest.warns(IRDataWarning, match="judged queries"):
        [dev] = load_benchmark("msmarco-dev", msmarco_dir=folder)
        [dl19] = load_benchmark("dl19", msmarco_dir=folder, corpus_in_memory=False)
    assert dev.queries == {"100": "what is first", "101": "what is second"}
    assert dev.qrels == {"100": {"0": 1}, "101": {"1": 1}}
    assert dev.corpus == {"0": "the first passage", "1": "the second passage", "2": "third"}
    assert dl19.qrels == {"200": {"0": 3, "1": 0, "2": 2}}, "graded TREC qrels, grade 0 kept"
    assert dl19.queries == {"200": "dl query"}, "only the judged test query"
    assert dl19.corpus is None and sum(len(b) for b in dl19.iter_corpus(2)) == 3, "streamed collection"


def test_msmarco_local_missing_files_say_where_to_get_them(tmp_path):
    folder = msmarco_dir(tmp_path / "msmarco")
    with pytest.raises(IRDataError, match=r"no \['msmarco-test2020-queries.tsv', '2020qrels-pass.txt'\]"
                                          r".*TREC-Deep-Learning-2020"):
        load_msmarco("dl20", msmarco_dir=folder)


# ---------------------------------------------------------------------------------------------
# dispatcher


def test_load_benchmark_takes_a_folder_and_rejects_unknown_names(tmp_path):
    folder = beir_folder(tmp_path / "mine")
    [ds] = load_benchmark(str(folder))
    assert ds.corpus == EXPECTED_CORPUS
    with pytest.raises(IRDataError, match="neither a benchmark name nor a folder"):
        load_benchmark("beir14")
    with pytest.raises(IRDataError, match="no NanoBEIR dataset 'Bogus'"):
        load_benchmark("nanobeir/Bogus")


def test_benchmark_lists_are_the_papers_thirteen():
    assert len(BEIR13) == len(set(BEIR13)) == 13 and "msmarco" not in BEIR13
    assert len(NANOBEIR) == len(set(NANOBEIR)) == 13


# ---------------------------------------------------------------------------------------------
# the real small collections


@pytest.mark.parametrize("name, docs, queries, all_queries, judgments", [
    # Cranfield documents 471 and 995 are empty (title and text): skipped by default, 1 398 left;
    # 995's judgment (query 125, grade 2) is kept, so the count stays at the README's 1 837.
    ("cranfield", 1398, 225, 225, 1837),
    ("cisi", 1460, 76, 112, 3114),   # 36 queries have no judgments: dropped unless judged_only=False
    ("cacm", 3204, 52, 64, 796),
])
def test_shared_collections_have_their_published_sizes(shared_data, name, docs, queries, all_queries, judgments):
    folder = shared_data / "ir" / name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = load_beir_folder(folder)
        every_query = load_beir_folder(folder, judged_only=False)
    assert (len(ds.corpus), len(ds.queries), ds.num_judgments) == (docs, queries, judgments)
    assert len(every_query.queries) == all_queries
    assert set(ds.queries) == set(ds.qrels), "every kept query is judged, every judged query kept"
    if name == "cranfield":
        assert len(caught) == 2, "one summary per load"
        w = str(caught[0].message)
        assert "entries with an empty text skipped: 2 (line 471: document '471'; line 995: document '995')" in w
        assert ds.qrels["125"]["995"] == 2, "the empty document keeps its judgment"
        with_empty = load_beir_folder(folder, keep_empty=True, strict=True)
        assert len(with_empty.corpus) == 1400 and with_empty.corpus["995"] == "", "BEIR's own count"
    else:
        assert caught == [], f"{name} has no problems to report"


# ---------------------------------------------------------------------------------------------
# bad input: every message names the file and the line (or row)


def write(tmp_path, corpus=None, queries=None, qrels=None):
    """Files c.jsonl, q.jsonl, r.tsv (defaults: the good tiny dataset); returns their paths."""
    paths = tmp_path / "c.jsonl", tmp_path / "q.jsonl", tmp_path / "r.tsv"
    for path, data in zip(paths, (corpus or jsonl(DOCS), queries or jsonl(QUERIES), qrels or qrels_tsv(QRELS))):
        path.write_bytes(data)
    return paths


def test_malformed_jsonl_line_is_skipped_with_file_and_line(tmp_path):
    corpus = jsonl(DOCS[:2]) + b'{"_id": "d9", "text": "cut off\n' + jsonl(DOCS[2:])
    paths = write(tmp_path, corpus=corpus)
    with pytest.warns(IRDataWarning, match=r"c\.jsonl: skipped 1 problem.*\n  malformed entries skipped: 1 "
                                           r"\(line 3: invalid JSON"):
        ds = load_files(*paths, name="t")
    assert ds.corpus == EXPECTED_CORPUS, "the other lines are all kept"
    with pytest.raises(IRDataError, match=r"c\.jsonl, line 3: invalid JSON.*strict=True"):
        load_files(*paths, name="t", strict=True)


def test_more_malformed_lines_than_the_limit_stop_the_load(tmp_path):
    paths = write(tmp_path, corpus=jsonl(DOCS) + b"not json\n" * 11)
    with pytest.raises(IRDataError, match=r"c\.jsonl: more than 10 malformed lines \(line 4: invalid JSON"):
        load_files(*paths, name="t")


def test_missing_id_or_text_field_names_the_line_and_the_fields_present(tmp_path):
    paths = write(tmp_path, corpus=jsonl(DOCS + [{"id": "d4", "text": "x"}, {"_id": "d5", "contents": "y"}]))
    with pytest.warns(IRDataWarning) as record:
        load_files(*paths, name="t")
    message = str(record[0].message)
    assert "line 4: no field ['_id'] (fields: ['id', 'text'])" in message
    assert "line 5: no field ['text'] (fields: ['_id', 'contents'])" in message


def test_wrong_parquet_columns_stop_with_the_columns_found(tmp_path):
    (tmp_path / "c.parquet").write_bytes(parquet({"doc_id": ["d1"], "passage": ["x"]}))
    _, q, r = write(tmp_path)
    with pytest.raises(IRDataError, match=r"c\.parquet: no column\(s\) \['_id', 'text'\]; the file has "
                                          r"columns \['doc_id', 'passage'\]"):
        load_files(tmp_path / "c.parquet", q, r, name="t")
    (tmp_path / "r.parquet").write_bytes(parquet({"qid": ["q1"], "docid": ["d1"]}))
    with pytest.raises(IRDataError, match=r"r\.parquet: no column\(s\) \['query-id', 'corpus-id'\]"):
        load_files(tmp_path / "c.jsonl", q, tmp_path / "r.parquet", name="t")


def test_wrong_qrels_header_stops_at_line_1(tmp_path):
    paths = write(tmp_path, qrels=b"qid\tdocid\trelevance\nq1\td1\t1\n")
    with pytest.raises(IRDataError, match=r"r\.tsv, line 1: first line \['qid', 'docid', 'relevance'\] "
                                          r"is neither the BEIR qrels header"):
        load_files(*paths, name="t")


def test_qrels_without_header_reads_line_1_as_data_and_says_so(tmp_path):
    paths = write(tmp_path, qrels=qrels_tsv(QRELS, header=False))
    with pytest.warns(IRDataWarning, match=r"r\.tsv.*\n  first line read as data.*line 1"):
        ds = load_files(*paths, name="t")
    assert ds.qrels == EXPECTED_QRELS, "no judgment lost"


def test_malformed_qrels_rows_name_the_line(tmp_path):
    paths = write(tmp_path, qrels=qrels_tsv(QRELS) + b"q2\td3\n" + b"q2\td1\thigh\n")
    with pytest.warns(IRDataWarning) as record:
        ds = load_files(*paths, name="t")
    message = str(record[0].message)
    assert "malformed entries skipped: 2 (line 5: expected 3 columns" in message
    assert "line 6: need a query id, a document id and an integer grade, got 'q2', 'd1', 'high'" in message
    assert ds.qrels == EXPECTED_QRELS


def test_empty_texts_are_skipped_with_a_counted_summary(tmp_path):
    docs = DOCS + [{"_id": f"e{i}", "title": "", "text": "  "} for i in range(5)]
    queries = QUERIES + [{"_id": "q4", "text": ""}]
    qrels = QRELS + [("q1", "e0", 1), ("q4", "d1", 1)]
    paths = write(tmp_path, corpus=jsonl(docs), queries=jsonl(queries), qrels=qrels_tsv(qrels))
    with pytest.warns(IRDataWarning) as record:
        ds = load_files(*paths, name="t")
    messages = "\n".join(str(w.message) for w in record)
    assert ("entries with an empty text skipped: 5 (line 4: document 'e0'; line 5: document 'e1'; "
            "line 6: document 'e2', ...)") in messages, "count, first three lines, then ..."
    assert "q.jsonl" in messages and "line 4: query 'q4'" in messages
    assert "1 judged queries have an empty text ('q4')" in messages and "counts in the mean" in messages
    assert "e0" not in ds.corpus and ds.qrels["q1"]["e0"] == 1, "an empty document keeps its judgment"
    assert ds.qrels["q4"] == {"d1": 1} and ds.empty_queries == {"q4"}, \
        "an empty query keeps its judgments (issue 35: every judged query counts)"
    with pytest.raises(IRDataError, match=r"c\.jsonl, line 4: document 'e0'"):
        load_files(*paths, name="t", strict=True)
    kept = load_quietly(*paths, name="t", keep_empty=True)
    assert kept.corpus["e0"] == "" and kept.queries["q4"] == "", "keep_empty=True keeps them"


def test_duplicate_ids_same_text_skipped_different_text_stop(tmp_path):
    paths = write(tmp_path, corpus=jsonl(DOCS + [DOCS[0]]))
    with pytest.warns(IRDataWarning, match=r"exact repeats skipped.*: 1 \(line 4: document 'd1'\)"):
        assert load_files(*paths, name="t").corpus == EXPECTED_CORPUS
    paths = write(tmp_path, corpus=jsonl(DOCS + [{"_id": "d2", "text": "another"}]))
    with pytest.raises(IRDataError, match=r"c\.jsonl, line 4: document id 'd2' appears a second time with a "
                                          r"different text \(first: .*c\.jsonl, line 2\)"):
        load_files(*paths, name="t")


def test_qrels_naming_unknown_documents_or_queries_are_skipped_by_line(tmp_path):
    paths = write(tmp_path, qrels=qrels_tsv(QRELS + [("q1", "d404", 1), ("q404", "d1", 1)]))
    with pytest.warns(IRDataWarning) as record:
        ds = load_files(*paths, name="t")
    message = str(record[0].message)
    assert "r.tsv: skipped 2 problem(s)" in message
    assert "judgments of unknown documents skipped: 1 (line 5: document 'd404' is not in the corpus)" in message
    assert "judgments of unknown queries skipped: 1 (line 6: query 'q404' (not in the queries))" in message
    assert ds.qrels == EXPECTED_QRELS
    with pytest.raises(IRDataError, match=r"r\.tsv, line 5: document 'd404'.*same collection"):
        load_files(*paths, name="t", strict=True)


def test_repeated_judgments_same_grade_skipped_different_grade_stop(tmp_path):
    paths = write(tmp_path, qrels=qrels_tsv(QRELS + [("q1", "d1", 2)]))
    with pytest.warns(IRDataWarning, match=r"line 5: judgment 'q1' 'd1'"):
        load_files(*paths, name="t")
    paths = write(tmp_path, qrels=qrels_tsv(QRELS + [("q1", "d1", 3)]))
    with pytest.raises(IRDataError, match=r"r\.tsv, line 5: query 'q1' judges document 'd1' again with "
                                          r"grade 3 \(grade 2 at line 2\)"):
        load_files(*paths, name="t")


def test_non_utf8_bytes_name_the_line_and_the_fix(tmp_path):
    corpus = jsonl(DOCS) + '{"_id": "d4", "text": "caf\u00e9"}\n'.encode("latin-1")
    paths = write(tmp_path, corpus=corpus)
    with pytest.warns(IRDataWarning, match=r"line 4: not UTF-8 \(byte 26 of the line: b'\\xe9.*iconv"):
        load_files(*paths, name="t")
    with pytest.raises(IRDataError, match=r"c\.jsonl, line 4: not UTF-8"):
        load_files(*paths, name="t", strict=True)


def test_malformed_tsv_collection_line_names_the_line(tmp_path):
    (tmp_path / "c.tsv").write_text("d1\tHeat transfer in flow\nd2 has no tab\nd3\tMach numbers\n")
    _, q, r = write(tmp_path, qrels=qrels_tsv([("q1", "d1", 1)]))
    with pytest.warns(IRDataWarning, match=r"(?s)c\.tsv.*line 2: expected `id<TAB>text`, got 'd2 has no tab'"):
        ds = load_files(tmp_path / "c.tsv", q, r, name="t")
    assert set(ds.corpus) == {"d1", "d3"}


def test_unreadable_parquet_and_truncated_gzip_name_the_file(tmp_path):
    _, q, r = write(tmp_path)
    (tmp_path / "c.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(IRDataError, match=r"c\.parquet: not a readable parquet file.*download it again"):
        load_files(tmp_path / "c.parquet", q, r, name="t")
    whole = gzip.compress(jsonl({"_id": f"d{i}", "text": f"passage {i * 7919}"} for i in range(2000)))
    (tmp_path / "c.jsonl.gz").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(IRDataError, match=r"c\.jsonl\.gz: cannot be decompressed.*truncated or corrupt"):
        load_files(tmp_path / "c.jsonl.gz", q, r, name="t")


def test_null_text_in_parquet_is_an_empty_text_named_by_row(tmp_path):
    (tmp_path / "c.parquet").write_bytes(parquet({"_id": ["d1", "d2"], "text": ["x", None]}))
    _, q, r = write(tmp_path, qrels=qrels_tsv([("q1", "d1", 1)]))
    with pytest.warns(IRDataWarning, match=r"(?s)c\.parquet.*row 2: document 'd2'"):
        ds = load_files(tmp_path / "c.parquet", q, r, name="t")
    assert ds.corpus == {"d1": "x"}


def test_jsonl_qrels_with_other_field_names_name_the_fields(tmp_path):
    c, q, _ = write(tmp_path)
    (tmp_path / "r.jsonl").write_bytes(jsonl([{"qid": "q1", "docid": "d1", "score": 1}]))
    with pytest.warns(IRDataWarning, match=r"line 1: no field \['query-id', 'corpus-id'\] \(fields: "
                                           r"\['docid', 'qid', 'score'\]\)"), \
            pytest.raises(IRDataError, match=r"r\.jsonl: no judgment of any of the 3 queries"):
        load_files(c, q, tmp_path / "r.jsonl", name="t")


# ---------------------------------------------------------------------------------------------
# a dataset that cannot be evaluated is refused at load time, naming the file


@pytest.mark.parametrize("case, file, message", [
    ("empty queries file", "q.jsonl", r"q\.jsonl: no queries: the file is empty"),
    ("queries the qrels do not judge", "r.tsv", r"r\.tsv: no judgment of any of the 3 queries of "
                                                r".*q\.jsonl \(query ids such as 'x1', 'x2', 'x3'\)"),
    ("qrels of another corpus", "r.tsv", r"r\.tsv: no judgment of any of the 3 queries"),
    ("empty corpus file", "c.jsonl", r"c\.jsonl: no documents"),
    ("empty streamed corpus", "c.jsonl", r"c\.jsonl: no documents"),
])
def test_dataset_that_cannot_be_evaluated_is_an_error_naming_the_file(tmp_path, case, file, message):
    c, q, r = write(tmp_path)
    in_memory = None
    if case == "empty queries file":
        q.write_bytes(b"")
    elif case == "queries the qrels do not judge":
        q.write_bytes(jsonl([{"_id": f"x{i}", "text": "heat"} for i in (1, 2, 3)]))
    elif case == "qrels of another corpus":
        r.write_bytes(qrels_tsv([("q1", "other1", 1), ("q2", "other2", 1)]))
    else:
        c.write_bytes(b"")
        in_memory = case == "empty corpus file"
    with pytest.raises(IRDataError, match=message) as error, warnings.catch_warnings():
        warnings.simplefilter("ignore", IRDataWarning)
        load_files(c, q, r, name="t", corpus_in_memory=in_memory)
    assert "Fix:" in str(error.value) and file in str(error.value)


def test_check_evaluable_on_datasets_built_in_code():
    from data.ir_datasets import IRDataset
    good = IRDataset("t", dict(EXPECTED_CORPUS), {"q1": "heat", "q2": "lift"}, dict(EXPECTED_QRELS))
    good.check_evaluable()
    with pytest.raises(IRDataError, match=r"t \(qrels\): 1 judged queries have no text in t "
                                          r"\(queries\) \('q2'\), so no system can run them"):
        IRDataset("t", dict(EXPECTED_CORPUS), {"q1": "heat"}, dict(EXPECTED_QRELS)).check_evaluable()
    with pytest.raises(IRDataError, match=r"none of the 2 judged documents \('a', 'b'\) is in t "
                                          r"\(corpus\)"):
        IRDataset("t", dict(EXPECTED_CORPUS), {"q": "x"}, {"q": {"a": 1, "b": 0}}).check_evaluable()
    with pytest.raises(IRDataError, match=r"t \(corpus\): no documents"):
        IRDataset("t", None, {"q": "x"}, {"q": {"a": 1}}).check_evaluable()


@pytest.mark.parametrize("files, part, split, expected", [
    # NanoBEIR
    (["README.md", "corpus/train-00000-of-00001.parquet", "queries/train-00000-of-00001.parquet",
      "qrels/train-00000-of-00001.parquet"], "qrels", "train", ["qrels/train-00000-of-00001.parquet"]),
    # BeIR/<name> as first uploaded, and its parquet conversion (sharded)
    (["corpus.jsonl.gz", "queries.jsonl.gz", "scifact.py"], "corpus", None, ["corpus.jsonl.gz"]),
    (["corpus.jsonl.gz", "corpus/corpus-00001-of-00002.parquet", "corpus/corpus-00000-of-00002.parquet"],
     "corpus", None, ["corpus/corpus-00000-of-00002.parquet", "corpus/corpus-00001-of-00002.parquet"]),
    (["corpus/corpus/0000.parquet", "queries/queries/0000.parquet", "corpus/corpus/index.duckdb"],
     "queries", None, ["queries/queries/0000.parquet"]),
    # BeIR/<name>-qrels, as tsv and as a parquet conversion
    (["README.md", "dev.tsv", "test.tsv", "train.tsv"], "qrels", "test", ["test.tsv"]),
    (["data/dev-00000-of-00001.parquet", "data/test-00000-of-00001.parquet"], "qrels", "dev",
     ["data/dev-00000-of-00001.parquet"]),
    # MTEB-style repo (whybe-choi/trec-dl-2020)
    (["corpus.jsonl", "queries.jsonl", "qrels/test.jsonl"], "qrels", "test", ["qrels/test.jsonl"]),
    (["corpus.jsonl", "queries.jsonl", "qrels/test.jsonl"], "queries", None, ["queries.jsonl"]),
])
def test_hub_file_discovery_finds_each_known_layout(files, part, split, expected):
    from data.ir_datasets import _hub_part
    assert _hub_part(files, part, split) == expected
