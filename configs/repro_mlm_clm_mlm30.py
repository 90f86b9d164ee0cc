# Small-scale reproduction of the MLM-vs-CLM paper (Gisserot-Boukhlef et al., 2025, "Should We Still
# Pretrain Encoders with Masked Language Modeling?"), run by experiments/repro_mlm_clm.py on a 2-core CPU:
# a tiny EuroBERT-style encoder (the LLaMA block, bidirectional for MLM) pretrained on in-domain
# movie reviews with a byte-level BPE of 4 096 ids (data/text_corpus.py). This file is the MLM-30 %
# run and the base of the other repro_mlm_clm_*.py configs: same architecture, optimizer, schedule,
# steps, seed and batches (no shard shuffling), so every objective sees the same tokens in the
# same order. The paper's recipe scaled down: AdamW (0.9, 0.95), eps 1e-5, wd 0.1, clip 1.0,
# warmup-stable-decay; lr 2e-3 instead of 1e-4 (a 0.7M-parameter model takes a larger step).
#   python -m data.text_corpus data/repro/text/movie_reviews.txt --out out/repro_mlm_clm/corpus
#   python train_lm.py configs/repro_mlm_clm_mlm30.py
out_dir = "out/repro_mlm_clm/pretrain/mlm30"
train_shards = "out/repro_mlm_clm/corpus/corpus_train_*.bin"
val_shards = "out/repro_mlm_clm/corpus/corpus_val_*.bin"
tokenizer = "out/repro_mlm_clm/corpus/tokenizer.json"
family = "eurobert"
vocab_size = 4096
bos_id = 0                  # <|begin_of_text|>: the document delimiter, never masked
eos_id = 1
mask_id = 2                 # <|mask|>
pad_id = 3
d_model = 64
n_layers = 4
n_heads = 4
n_kv_heads = 4
d_ff = 172                  # SwiGLU width ~ 8/3 d
max_seq_len = 128
seq_len = 128
batch_size = 16             # 2 048 tokens per step
objective = "mlm"
mask_ratio = 0.3
mask_replacement = "mask"   # every selected token becomes <|mask|>, as in the paper
max_steps = 1200            # 2.5M tokens: 1.4 passes over the 1.8M training tokens
warmup_steps = 50
schedule = "wsd"
decay_fraction = 0.1
min_lr_ratio = 0.0
lr = 2e-3
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
adam_eps = 1e-5
grad_clip = 1.0
seed = 1337
device = "cpu"
dtype = "float32"
compile = False
log_interval = 25
eval_interval = 150
eval_batches = 20
ckpt_interval = 150         # every checkpoint is kept: the intermediate ones are fine-tuned too
keep_checkpoints = 100
