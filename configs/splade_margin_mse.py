# Distillation variant: MarginMSE to the BERT_CAT-ensemble margins of sentence-transformers/msmarco
# (bert-ensemble-margin-mse, ids resolved to texts with its queries/corpus subsets; ~3 GB of
# passages held per process), with naver/splade's lambdas for MarginMSE distillation (SPLADE++,
# github.com/naver/splade conf/config_splade++_ensembledistil.yaml, loss DistilMarginMSE; its
# document FLOPS is the per-set mean, doc_reg_batch="per_set"). In-batch InfoNCE is kept at a small
# weight; set it to 0 for pure MarginMSE.
#   torchrun --nproc_per_node=8 train_splade.py configs/splade_margin_mse.py --init hf:answerdotai/ModernBERT-base --k 16
out_dir = "out/splade_margin_mse"
train_data = "msmarco-margin-mse"
n_negatives = 1
margin_mse_weight = 1.0
infonce_weight = 0.1
lambda_q = 0.1
lambda_d = 0.08
