# The paper's headline model: ModernBERT-base with its MLM head divided by 16 before training,
# everything else the fixed recipe of train_splade.py (DEFAULTS). One node:
#   torchrun --nproc_per_node=8 train_splade.py configs/splade_modernbert_k16.py
# (batch_size is global, so the same file trains the same model on 1 GPU: python train_splade.py ...)
out_dir = "out/splade_modernbert_k16"
init = "hf:answerdotai/ModernBERT-base"
k = 16.0
