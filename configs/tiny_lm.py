# A tiny LLaMA for CPU, a minute from a fresh clone and offline:  python train_lm.py configs/tiny_lm.py
# Its data: the public-domain text shipped in data/sample/, written on first use into data/tiny/ as
# a 2 048-id byte-level BPE and its shards (data/preflight.py; ids 0 = <|endoftext|>, the document
# delimiter, and 1 = <|mask|>, tiny_encoder.py's mask token). The tests override data and vocabulary.
# Shards of your own text (README: "Train on your own text or tokenizer"): --train_shards, --val_shards,
# and the vocabulary and ids of their tokenizer.
out_dir = "out/tiny_lm"
train_shards = "data/tiny/corpus_train_*.bin"
val_shards = "data/tiny/corpus_val_*.bin"
shards_from_text = "data/sample/tinyshakespeare.txt"
family = "llama"
vocab_size = 2048
eos_id = 0
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
