# Distillation variant: MarginMSE to the BERT_CAT-ensemble margins of sentence-transformers/msmarco
# (bert-ensemble-margin-mse, ids resolved to texts with its queries/corpus subsets; ~3 GB of
# passages held per process), with naver/splade's lambdas for MarginMSE distillation (SPLADE++,
# github.com/naver/splade conf/config_splade++_ensembledistil.yaml, loss DistilMarginMSE; its
# document FLOPS is the per-set mean, doc_reg_batch="per_set"). In-batch InfoNCE is kept at a small
# weight; set it to 0 for pure MarginMSE.
# The backbone is train_splade.py's default, ModernBERT-base, with the paper's k = 16 for it (k = 1 would train the
# collapse the paper fixes); set --k for another backbone (--k=auto, or the paper's grid).
# Budget: 30 000 steps x 128 = 3.84M examples of the 39.8M rows: 0.1 of a pass.
#   torchrun --nproc_per_node=8 train_splade.py configs/splade_margin_mse.py
out_dir = "out/splade_margin_mse"
k = 16.0
train_data = "msmarco-margin-mse"
n_negatives = 1
margin_mse_weight = 1.0
infonce_weight = 0.1
lambda_q = 0.1
lambda_d = 0.08
