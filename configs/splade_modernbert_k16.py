# The paper's headline model: ModernBERT-base with its MLM head divided by 16 before training,
# everything else the fixed recipe of train_splade.py (DEFAULTS). One node:
#   torchrun --nproc_per_node=8 train_splade.py configs/splade_modernbert_k16.py
# (batch_size is global, so the same file trains the same model on 1 GPU: python train_splade.py ...)
# Budget: 30 000 steps x 128 queries = 3.84M examples over msmarco-bm25-50's ~0.5M queries: ~7.6 passes, on
# purpose (naver/splade's recipe sees each query many times), each pass with another of a query's 8 BM25 negatives
# kept (data/triplets.py), so no (query, negative) pair repeats; the budget line warns of the passes all the same.
out_dir = "out/splade_modernbert_k16"
init = "hf:answerdotai/ModernBERT-base"
k = 16.0
