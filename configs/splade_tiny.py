# SPLADE on CPU in a few minutes: the smallest Ettin encoder (17M parameters, ModernBERT
# architecture, one of the paper's backbones) rescaled with k = 16, on the first 2 000 MS MARCO
# BM25 triplets, evaluated once at the end on NanoNFCorpus. Needs the Hub (about 250 MB: the
# backbone, the first parquet file of the training set, NanoNFCorpus).
#   python train_splade.py configs/splade_tiny.py
out_dir = "out/splade_tiny"
init = "hf:jhu-clsp/ettin-encoder-17m"
k = 16.0
max_train_examples = 2000
batch_size = 8
query_max_len = 32
doc_max_len = 64
max_steps = 100
warmup_steps = 10
lr = 1e-4
lambda_warmup = 33
log_interval = 5
eval_interval = 100
eval_benchmark = "nanobeir/NFCorpus"
eval_max_len = 128
eval_batch_size = 32
ckpt_interval = 50
device = "cpu"
dtype = "float32"
compile = False
