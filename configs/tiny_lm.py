# A tiny LLaMA for CPU (the quick start; the tests override the data and vocabulary). GPT-2 shards
# from any text file:  python -m data.fineweb_edu --input input.txt --out data/tiny --shard-tokens 50000
out_dir = "out/tiny_lm"
train_shards = "data/tiny/corpus_train_*.bin"
val_shards = "data/tiny/corpus_val_*.bin"
family = "llama"
vocab_size = 50304          # GPT-2's 50257 ids padded; ids 50257.. are free (the encoder uses 50257 as mask)
eos_id = 50256
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
