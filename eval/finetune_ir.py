"""Retrieval fine-tuning for the encoder evaluation (paper 3, IR family): a bi-encoder trained on
MS MARCO (query, positive passage) pairs with in-batch negatives, evaluated by dense exact search
on MS MARCO, NQ and MLDR with nDCG@10 and MRR@10 (eval/metrics.py, trec_eval semantics).

Model and loss (EncodEval: sentence-transformers with mean pooling and
MultipleNegativesRankingLoss): a text's vector is the mean of its final hidden states over real
tokens; for a batch of B pairs the B x B matrix of cosine similarities, times 20, is the logits of
a B-way classification whose answer for query i is passage i, so every other passage of the batch
is a negative (Henderson et al. 2017; Karpukhin et al. 2020). Texts are prefixed "Query: " and
"Document: " as in the paper's code. The paper computes this loss with gradient caching in
mini-batches of 4 (CachedMultipleNegativesRankingLoss); that gives the same gradients as the
whole batch at once, which is what we do.

One training run per (model, lr, seed) serves every retrieval task of the grid: the trained
bi-encoder is evaluated on each requested set and one result file is written per set.

Evaluation sets, as the paper's code builds them (validation picks the lr, test is reported):

| task    | validation                         | test                         | source                          |
|---------|------------------------------------|------------------------------|---------------------------------|
| msmarco | MS MARCO dev (BeIR/msmarco-qrels dev) | TREC DL 2019 (BeIR "test")  | data/ir_datasets.py             |
| nq      | a seeded half of the NQ test queries | the other half              | BeIR/nq + BeIR/nq-qrels (test)  |
| mldr    | MLDR-en dev                        | MLDR-en test                 | Shitao/MLDR mldr-v1.0-en/{dev,test}.jsonl.gz (positive_passages) |

The corpus searched is, as in the paper's code, only the documents that appear in the judgments
of the two splits (any grade), not the full collection: numbers are therefore much higher than
full-corpus retrieval and comparable only with the paper's protocol. The NQ halves are drawn with
a fixed seed (the paper's draw was unseeded). A local BEIR-format folder (`nq=PATH`) uses its
qrels/dev.tsv (or validation.tsv) and qrels/test.tsv, or halves test.tsv when it has no dev file.
"""
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from data.tokenizer import pad_batch, token_ids
from eval.dense import dense_search
from eval.finetune_data import IR_EVAL_SETS
from eval.finetune_loop import (FinetuneConfig, forward_all, mean_pool, model_max_len, pad_id_of, resolve_device,
                                train_loop, train_order)
from eval.metrics import evaluate, mean_metrics
from training import seed_everything

QUERY_PREFIX, DOC_PREFIX = "Query: ", "Document: "
SCALE = 20.0          # sentence-transformers MultipleNegativesRankingLoss: cos_sim x 20
TOP_K = 100
MEASURES = ("nDCG@10", "RR@10")
MLDR_REPO = "Shitao/MLDR"
MLDR_FILES = {"validation": "mldr-v1.0-en/dev.jsonl.gz", "test": "mldr-v1.0-en/test.jsonl.gz"}
SPLIT_SEED = 0


@dataclass
class IREvalSet:
    name: str
    queries: dict            # qid -> text
    corpus: dict             # docid -> text (the judged documents)
    qrels: dict              # split -> {qid: {docid: grade}}


# ----------------------------------------------------------------------------- evaluation sets


def halve_queries(qrels: dict, seed=SPLIT_SEED) -> dict:
    """{"validation": half of the judged queries, "test": the other half}, a seeded draw."""
    qids = sorted(qrels)
    order = np.random.default_rng(seed).permutation(len(qids))
    half = len(qids) // 2
    pick = lambda idx: {qids[i]: qrels[qids[i]] for i in sorted(idx)}
    return {"validation": pick(order[:half]), "test": pick(order[half:])}


def judged_docs(dataset, wanted: set) -> dict:
    """The texts of the `wanted` documents of an IRDataset, streaming its corpus when it is large."""
    out = {}
    for batch in dataset.iter_corpus():
        out.update((d, t) for d, t in batch if d in wanted)
    return out


def _judged(qrels_by_split):
    return {d for qrels in qrels_by_split.values() for docs in qrels.values() for d in docs}


def load_msmarco_eval() -> IREvalSet:
    from data.ir_datasets import load_benchmark
    dev, dl19 = load_benchmark("msmarco-dev")[0], load_benchmark("dl19")[0]
    qrels = {"validation": dev.qrels, "test": dl19.qrels}
    return IREvalSet("msmarco", {**dev.queries, **dl19.queries}, judged_docs(dev, _judged(qrels)), qrels)


def load_nq_eval() -> IREvalSet:
    from data.ir_datasets import load_beir
    nq = load_beir("nq", "test")
    qrels = halve_queries(nq.qrels)
    return IREvalSet("nq", nq.queries, judged_docs(nq, _judged(qrels)), qrels)


def load_mldr_eval() -> IREvalSet:
    """MLDR-en: every dev/test line carries its query and positive passages with their texts."""
    from hf import hub
    queries, corpus, qrels = {}, {}, {}
    for split, name in MLDR_FILES.items():
        path = hub.hf_hub_download(MLDR_REPO, name, repo_type="dataset")
        qrels[split] = {}
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                row = json.loads(line)
                try:
                    qid = str(row["query_id"])
                    queries[qid] = row["query"]
                    qrels[split][qid] = {str(p["docid"]): 1 for p in row["positive_passages"]}
                    corpus.update((str(p["docid"]), p["text"]) for p in row["positive_passages"])
                except (KeyError, TypeError) as e:
                    raise ValueError(f"{path}, line {lineno}: no {e} field; MLDR lines have query_id, "
                                     f"query and positive_passages [{{docid, text}}]. Fix: download "
                                     f"the file again or give a BEIR folder (mldr=PATH).") from e
    return IREvalSet("mldr", queries, corpus, qrels)


def load_local_eval(name, folder) -> IREvalSet:
    from data.ir_datasets import load_beir_folder
    folder = Path(folder)
    dev = next((s for s in ("dev", "validation") if (folder / "qrels" / f"{s}.tsv").exists()), None)
    test = load_beir_folder(folder, "test", name=name)
    if dev is None:
        qrels = halve_queries(test.qrels)
        queries = test.queries
    else:
        val = load_beir_folder(folder, dev, name=name)
        qrels, queries = {"validation": val.qrels, "test": test.qrels}, {**val.queries, **test.queries}
    return IREvalSet(name, queries, judged_docs(test, _judged(qrels)), qrels)


def load_ir_eval(name, path=None) -> IREvalSet:
    if path:
        return load_local_eval(name, path)
    loaders = {"msmarco": load_msmarco_eval, "nq": load_nq_eval, "mldr": load_mldr_eval}
    if name not in loaders:
        raise ValueError(f"no retrieval evaluation set {name!r}; use one of {IR_EVAL_SETS} or NAME=BEIR_FOLDER")
    return loaders[name]()


# ----------------------------------------------------------------------------- the bi-encoder


class BiEncoder(nn.Module):
    """Unit-length mean-pooled text vectors (cosine similarity = dot product)."""

    def __init__(self, encoder, causal=False):
        super().__init__()
        encoder.head = nn.Identity()  # the vocabulary projection is unused here
        self.encoder, self.causal = encoder, causal

    def forward(self, input_ids, attention_mask):
        h = self.encoder.encode(input_ids, attention_mask, causal=self.causal)
        return F.normalize(mean_pool(h, attention_mask), dim=-1)


def contrastive_loss(q, d):
    """In-batch negatives: query i must pick passage i among the batch's passages."""
    scores = SCALE * q @ d.T
    return F.cross_entropy(scores.float(), torch.arange(len(q), device=q.device))


def train_biencoder(encoder, tokenizer, pairs, cfg: FinetuneConfig):
    device = resolve_device(cfg)
    seed_everything(cfg.seed)
    max_len = model_max_len(encoder, cfg)
    pairs = pairs if cfg.max_train is None else pairs[:cfg.max_train]
    q_ids = token_ids(tokenizer, [QUERY_PREFIX + p["query"] for p in pairs], max_len)
    d_ids = token_ids(tokenizer, [DOC_PREFIX + p["positive"] for p in pairs], max_len)
    pad = pad_id_of(tokenizer, encoder)
    model = BiEncoder(encoder, cfg.causal).to(device)

    def loss_of_batch(idx):
        q = model(*pad_batch([q_ids[i] for i in idx], pad, cfg.pad_to, device))
        d = model(*pad_batch([d_ids[i] for i in idx], pad, cfg.pad_to, device))
        return contrastive_loss(q, d)

    batches = train_order([len(x) for x in d_ids], cfg.batch_size, cfg.steps, cfg.seed, cfg.bucket)
    stats = train_loop(model, loss_of_batch, batches, cfg, device, f"ir lr={cfg.lr:g} seed={cfg.seed}")
    return model, stats


def embed(model, tokenizer, texts, cfg, device):
    ids = token_ids(tokenizer, texts, model_max_len(model.encoder, cfg))
    vectors = forward_all(model, ids, pad_id_of(tokenizer, model.encoder), cfg, device)
    return torch.from_numpy(np.stack([v[0] for v in vectors])).to(device)


def evaluate_ir(model, tokenizer, evalset: IREvalSet, split: str, cfg, device, doc_vectors=None):
    """nDCG@10 and MRR@10 of one split: its judged queries against the judged-document corpus."""
    qrels = evalset.qrels[split]
    qids = [q for q in qrels if q in evalset.queries]
    docids = list(evalset.corpus)
    if doc_vectors is None:
        doc_vectors = embed(model, tokenizer, [DOC_PREFIX + evalset.corpus[d] for d in docids], cfg, device)
    q_vectors = embed(model, tokenizer, [QUERY_PREFIX + evalset.queries[q] for q in qids], cfg, device)
    run = dense_search(q_vectors, doc_vectors, qids, docids, k=TOP_K, similarity="dot")  # unit vectors
    means = mean_metrics(evaluate(qrels, run, MEASURES))
    return {"nDCG@10": means.get("nDCG@10", 0.0), "MRR@10": means.get("RR@10", 0.0),
            "queries": len(qids), "documents": len(docids)}


def evaluate_set(model, tokenizer, evalset, cfg, device):
    docids = list(evalset.corpus)
    doc_vectors = embed(model, tokenizer, [DOC_PREFIX + evalset.corpus[d] for d in docids], cfg, device)
    return {split: evaluate_ir(model, tokenizer, evalset, split, cfg, device, doc_vectors)
            for split in ("validation", "test")}
