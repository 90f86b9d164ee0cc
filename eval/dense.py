"""Exact dense retrieval (the fine-tuning IR evaluation): top-k of query embeddings against document
embeddings, a block of queries at a time. eval/metrics.py orders a run by score, then doc id
descending (trec_eval), so documents tied with the k-th score are kept by largest doc id: the top-k
evaluates as the full ranking cut at k. Scores are float32 (trec_eval's precision), ties kept exact.
"""
import torch
import torch.nn.functional as F

from eval.sparse_index import id_rank, top_k

SCORES_PER_BLOCK = 1 << 26   # floats of the (queries x docs) score block: 256 MB in fp32


@torch.no_grad()
def dense_search(query_emb: torch.Tensor, doc_emb: torch.Tensor, query_ids, doc_ids, k: int = 1000,
                 similarity: str = "cosine") -> dict:
    """Exact top-k run `{qid: {docid: score}}` of (Q, d) query against (N, d) document embeddings;
    similarity: "cosine" (both sides L2-normalised) or "dot"; fp32 on the embeddings' device."""
    if similarity not in ("cosine", "dot"):
        raise ValueError(f"similarity={similarity!r}: use 'cosine' or 'dot'")
    if query_emb.shape[0] != len(query_ids) or doc_emb.shape[0] != len(doc_ids):
        raise ValueError(f"{query_emb.shape[0]} query embeddings for {len(query_ids)} ids, "
                         f"{doc_emb.shape[0]} document embeddings for {len(doc_ids)} ids")
    q, d = query_emb.float(), doc_emb.float()
    if similarity == "cosine":
        q, d = F.normalize(q, dim=-1), F.normalize(d, dim=-1)
    k = min(k, d.shape[0])
    rank = id_rank(doc_ids).to(d.device)
    block = max(1, SCORES_PER_BLOCK // max(1, d.shape[0]))
    run = {}
    for start in range(0, q.shape[0], block):
        scores = q[start:start + block] @ d.T
        index = top_k(scores, k, rank)
        values = scores.gather(1, index).double().cpu().tolist()
        for row, (idx, vals) in enumerate(zip(index.cpu().tolist(), values)):
            run[query_ids[start + row]] = {doc_ids[i]: v for i, v in zip(idx, vals)}
    return run
