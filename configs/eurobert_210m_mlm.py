# MLM-vs-CLM paper (Paper 3): the 210M EuroBERT-style encoder pretrained with MLM from scratch.
# Architecture: the LLaMA block with bidirectional attention (12 layers, d 768, 12 heads, SwiGLU
# 3072), RMSNorm 1e-5, RoPE theta 10 000, no biases, untied embeddings, Llama-3 vocabulary.
# Optimizer and schedule as the paper: AdamW lr 1e-4, wd 0.1, betas (0.9, 0.95), eps 1e-5,
# clip 1.0, warmup-stable-decay; 2 304 sequences x 1 024 tokens (~2.36M tokens) per step.
# Variants: --mask_ratio=0.2|0.3|0.4|0.5; eurobert_210m_clm.py; eurobert_210m_clm_mlm.py;
# --max_steps=12000|22000|42000 for the three budgets.
# Budget: 42 000 steps x 2 359 296 = 99.1B tokens (12k: 28.3B, 22k: 51.9B), ~67 GPU-hours at 40 % MFU on H100s
# (docs/real_runs.md). The paper's runs see 100B unique FineWeb-Edu tokens once, in the same order. sample-100BT
# holds ~90B Llama-3 tokens (~0.9 per GPT-2 token): one pass for 12k and 22k, ~1.1 passes for 42k. For 42k, the
# first 99.3B tokens of sample-350BT (a validation shard and 992 training shards of 100M: 42k steps in one pass;
# ~320 GB of parquet downloaded into the Hub cache, ~400 GB of uint32 shards):
#   python -m data.fineweb_edu --out data/fineweb_edu_llama3 --tokenizer hf:EuroBERT/EuroBERT-210m \
#       --name sample-350BT --max-tokens 99_300_000_000
# (for 12k / 22k: --name sample-100BT, ~290 GB of parquet and ~360 GB of shards, or --max-tokens for less)
out_dir = "out/eurobert_210m_mlm30"
family = "eurobert"
vocab_size = 128256
d_model = 768
n_layers = 12
n_heads = 12
n_kv_heads = 12
d_ff = 3072
max_seq_len = 1024
seq_len = 1024
rope_theta = 10000.0
bos_id = 128000             # <|begin_of_text|>: the document delimiter in the shards, never masked
eos_id = 128001
pad_id = 128001
mask_id = 128002            # <|mask|>
tokenizer = "hf:EuroBERT/EuroBERT-210m"   # shipped inside every checkpoint (tokenizer.json)
train_shards = "data/fineweb_edu_llama3/fineweb_edu_train_*.bin"
val_shards = "data/fineweb_edu_llama3/fineweb_edu_val_*.bin"
objective = "mlm"
mask_ratio = 0.3
mask_replacement = "mask"   # every selected token becomes <|mask|> (no 80/10/10 in the paper)
batch_size = 36             # x 8 GPUs x grad_accum 8 = 2 304 sequences per step
grad_accum = 8
max_steps = 42000
warmup_steps = 2000
schedule = "wsd"
decay_fraction = 0.1
min_lr_ratio = 0.0
lr = 1e-4
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
adam_eps = 1e-5
grad_clip = 1.0
dtype = "bfloat16"
compile = True
eval_interval = 1000
ckpt_interval = 2000
