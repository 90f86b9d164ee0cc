# A tiny LLaMA for CPU: the quick start and the tests. Shards: python -m data.fineweb_edu (see README)
# or any token shards; with the tiny tokenizer of the quick start the vocabulary is small.
out_dir = "out/tiny_lm"
family = "llama"
vocab_size = 512
d_model = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
d_ff = 172
max_seq_len = 128
batch_size = 8
seq_len = 64
max_steps = 200
warmup_steps = 20
lr = 3e-3
eval_interval = 100
eval_batches = 4
ckpt_interval = 100
log_interval = 10
compile = False
device = "cpu"
dtype = "float32"
