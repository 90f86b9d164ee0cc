# train_lm.py settings shared by every run of experiments/simreg_sweep.py (both modes): a 2-layer LLaMA on
# CPU, 200 steps of 8 x 128 tokens (205K tokens, 0.6 of a pass over tiny Shakespeare's training
# part). The driver adds the data (train/val shards, vocab_size, eos_id, tokenizer), the width
# (d_model, n_heads, d_ff), the seed and the SimReg settings of each run.
family = "llama"
n_layers = 2
n_kv_heads = 0              # = n_heads
max_seq_len = 128
seq_len = 128
batch_size = 8
max_steps = 200
warmup_steps = 20
lr = 2e-3
schedule = "cosine"
simreg_tau = 0.01           # the paper's temperature
simreg_chunk = 32           # "chunked" SimReg; the compare mode also runs 0 (the whole sequence)
eval_interval = 50
eval_batches = 16           # the first 16 x 8 x 128 = 16.4K of the validation part's 43.6K tokens
ckpt_interval = 100000      # only the final checkpoint (a killed run restarts from scratch)
log_interval = 10
compile = False
device = "cpu"
dtype = "float32"
