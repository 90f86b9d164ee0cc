"""eval/sparse_index.py: exact search against brute-force dense scoring, build/save/load, FLOPS,
active dims and the Anserini JsonVectorCollection export."""
import json

import numpy as np
import pytest
import scipy.sparse as sp

from eval.metrics import trec_order
from eval.sparse_index import (SparseIndex, active_dims, build_index, flops, iter_csr_chunks,
                               sparsity_stats, write_impact_queries, write_json_vectors)

VOCAB = 64


def dyadic_sparse(rng, rows, density, levels=4):
    """Weights in {1/4, 1/2, 3/4, 1}: every dot product is exact in float32 whatever the summation
    order, and the few distinct values make many tied scores."""
    m = sp.random(rows, VOCAB, density=density, format="csr", dtype=np.float32, random_state=rng)
    m.data = (np.ceil(m.data * levels) / levels).astype(np.float32)
    return m


def brute_force_run(docs, queries, doc_ids, k):
    """Reference: dense float64 scores of every doc, trec_eval order, positive scores only."""
    scores = queries.toarray().astype(np.float64) @ docs.toarray().astype(np.float64).T
    run = {}
    for qi, row in enumerate(scores):
        ranked = sorted((d for d in range(len(row)) if row[d] > 0),
                        key=lambda d: (row[d], doc_ids[d]), reverse=True)[:k]
        run[str(qi)] = {doc_ids[d]: row[d] for d in ranked}
    return run


@pytest.fixture
def corpus():
    rng = np.random.default_rng(0)
    docs = dyadic_sparse(rng, 300, 0.08)
    queries = dyadic_sparse(rng, 25, 0.1)
    ids = [str(i) for i in rng.permutation(300)]      # numeric strings: "9" > "10" as trec_eval sees it
    return docs, queries, ids


@pytest.mark.parametrize("k", [1, 7, 50, 1000])
def test_top_k_equals_brute_force_including_ties(tmp_path, corpus, k):
    docs, queries, ids = corpus
    index = build_index([(ids[:100], docs[:100]), (ids[100:], docs[100:])], tmp_path, VOCAB,
                        progress=False)
    run = index.search(queries, k=k, progress=False)
    expected = brute_force_run(docs, queries, ids, k)
    for q in expected:
        assert list(run[q]) == list(expected[q]), f"query {q} k={k}: ranking differs from brute force"
        assert list(run[q].values()) == list(expected[q].values()), f"query {q}: scores differ"
        assert list(run[q]) == trec_order(run[q]), f"query {q}: not in trec_eval order"
    ties = sum(len(set(r.values())) < len(r) for r in run.values())
    assert k == 1 or ties > 0, "the data should produce tied scores"


def test_search_query_ids_and_queries_without_matches(tmp_path, corpus):
    docs, _, ids = corpus
    index = build_index([(ids, docs)], tmp_path, VOCAB, progress=False)
    queries = sp.lil_matrix((2, VOCAB), dtype=np.float32)
    queries[0, int(docs[0].indices[0])] = 1.0
    run = index.search(queries, query_ids=["a", "b"], k=5, progress=False)
    assert list(run) == ["a", "b"] and len(run["a"]) > 0
    assert run["b"] == {}, "a query with no terms matches nothing"


def test_chunked_build_equals_one_shot_and_scipy_transpose(tmp_path, corpus):
    docs, _, ids = corpus
    one = build_index([(ids, docs)], tmp_path / "one", VOCAB, progress=False)
    bounds = [0, 1, 1, 57, 200, 300]                   # includes an empty chunk
    chunks = [(ids[a:b], docs[a:b]) for a, b in zip(bounds, bounds[1:])]
    many = build_index(chunks, tmp_path / "many", VOCAB, block_postings=7, progress=False)
    for name in ["indptr", "docs", "weights", "doc_ids"]:
        assert np.array_equal(getattr(one, name), getattr(many, name)), f"{name} differs"
    inverted = docs.tocsc()
    assert np.array_equal(one.indptr, inverted.indptr), "postings lengths differ from scipy"
    assert np.array_equal(one.docs, inverted.indices) and np.array_equal(one.weights, inverted.data)
    assert not (tmp_path / "many" / "_build").exists(), "scratch files must be removed"


def test_save_load_round_trip_is_memory_mapped(tmp_path, corpus):
    docs, queries, ids = corpus
    built = build_index([(ids, docs)], tmp_path, VOCAB, progress=False)
    loaded = SparseIndex.load(tmp_path)
    assert isinstance(loaded.docs, np.memmap) and isinstance(loaded.weights, np.memmap)
    assert loaded.meta == json.loads((tmp_path / "meta.json").read_text())
    assert (loaded.num_docs, loaded.vocab_size, loaded.num_postings) == (300, VOCAB, docs.nnz)
    assert loaded.search(queries, k=20, progress=False) == built.search(queries, k=20, progress=False)


def test_rows_to_chunks(tmp_path, corpus):
    docs, queries, ids = corpus
    rows = ((ids[i], docs[i].indices, docs[i].data) for i in range(docs.shape[0]))
    chunks = list(iter_csr_chunks(rows, VOCAB, chunk_rows=128))
    assert [len(c[0]) for c in chunks] == [128, 128, 44]
    index = build_index(chunks, tmp_path, VOCAB, progress=False)
    assert index.search(queries, k=10, progress=False) == brute_force_run(docs, queries, ids, 10)


def test_active_dims_and_flops_on_hand_made_vectors(tmp_path):
    docs = sp.csr_matrix(np.array([[1.0, 0, 2.0, 0], [0, 0, 3.0, 0]], np.float32))
    queries = sp.csr_matrix(np.array([[1.0, 1.0, 0, 0], [0, 0.5, 0.25, 0]], np.float32))
    docs_with_stored_zero = docs.copy()
    docs_with_stored_zero.data[0] = 0.0                # explicit zero: not an active dim
    assert active_dims(docs).tolist() == [2, 1]
    assert active_dims(docs_with_stored_zero).tolist() == [1, 1]
    # p = (1/2, 0, 1, 0), q = (1/2, 1, 1/2, 0): FLOPS = 1/4 + 0 + 1/2
    assert flops([1, 0, 2, 0], 2, [1, 2, 1, 0], 2) == pytest.approx(0.75)
    expected = {"mean_query_active_dims": 2.0, "mean_doc_active_dims": 1.5, "flops": 0.75}
    assert sparsity_stats(docs, queries) == pytest.approx(expected)
    index = build_index([docs], tmp_path, 4, progress=False)
    assert index.sparsity_stats(queries) == pytest.approx(expected), "index stats differ"


def test_json_vector_export_format(tmp_path):
    docs = sp.csr_matrix(np.array([[1.234, 0.004, 0, 2.0], [0, 0, 0.5, 0]], np.float32))
    path = tmp_path / "docs.jsonl"
    n = write_json_vectors([(["d1", "d2"], docs)], path, ["the", "##s", "ü", "x"], progress=False)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert n == 2
    assert lines[0] == {"id": "d1", "contents": "", "vector": {"the": 123, "x": 200}}, \
        "x100 quantised, rounded, zero impacts dropped"
    assert lines[1] == {"id": "d2", "contents": "", "vector": {"ü": 50}}
    with pytest.raises(ValueError, match="repeats entry 0"):
        write_json_vectors([docs], path, ["a", "b", "c", "a"], progress=False)


def test_impact_query_topics_repeat_each_token_its_impact_times(tmp_path):
    """Pretokenized impact search weighs a query term by its count in the title: the counts must be
    the documents' quantisation of the query's weights, on the same token strings."""
    from collections import Counter
    queries = sp.csr_matrix(np.array([[1.234, 0.004, 0, 0.02], [0, 0.001, 0, 0]], np.float32))
    path = tmp_path / "queries.jsonl"
    assert write_impact_queries(["q1", "007"], queries, path, ["the", "##s", "ü", "x"]) == 2
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [x["id"] for x in lines] == ["q1", "007"], "ids as given, in order"
    assert Counter(lines[0]["title"].split()) == {"the": 123, "x": 2}, "x100 rounded, zero impacts dropped"
    assert lines[1]["title"] == "", "a query whose weights all round to 0"
    docs = tmp_path / "docs.jsonl"
    write_json_vectors([(["d"], queries[:1])], docs, ["the", "##s", "ü", "x"], progress=False)
    assert json.loads(docs.read_text())["vector"] == dict(Counter(lines[0]["title"].split())), \
        "a document and a query with the same weights must get the same impacts"
    with pytest.raises(ValueError, match="has whitespace"):
        write_impact_queries(["q"], queries[:1], path, ["the", "a b", "c", "d"])


def test_bad_input_is_reported_with_its_row(tmp_path):
    bad = sp.csr_matrix(np.array([[1.0, 0, 0, 0], [0, -0.5, 0, 0]], np.float32))
    with pytest.raises(ValueError, match="row 3: weights must be finite and >= 0"):
        build_index([sp.csr_matrix((2, 4), dtype=np.float32), bad], tmp_path / "a", 4,
                    progress=False)
    with pytest.raises(ValueError, match="has 4 columns, the vocabulary has 5"):
        build_index([bad], tmp_path / "b", 5, progress=False)
    good = sp.csr_matrix(np.eye(2, 4, dtype=np.float32))
    with pytest.raises(ValueError, match="doc id 'x' occurs more than once"):
        build_index([(["x", "y"], good), (["x", "z"], good)], tmp_path / "c", 4, progress=False)
    with pytest.raises(ValueError, match="'a b' is empty or contains whitespace"):
        build_index([(["a b", "c"], good)], tmp_path / "d", 4, progress=False)
    with pytest.raises(FileNotFoundError, match="not a sparse index"):
        SparseIndex.load(tmp_path)


def test_empty_corpus(tmp_path):
    index = build_index([], tmp_path, 4, progress=False)
    assert index.num_docs == 0 and index.num_postings == 0
    queries = sp.csr_matrix(np.ones((1, 4), np.float32))
    assert index.search(queries, progress=False) == {"0": {}}
