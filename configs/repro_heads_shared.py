# Real-case SPLADE reproduction (experiments/repro_heads.py), step 1: what the three recipes share
# (repro_heads_bert.py, repro_heads_modernbert.py and repro_heads_eurobert.py each import this file, then
# set their family's architecture and its published pretraining recipe). Shared: the text and the tokenizer
# (splade-tiny's bert-base-uncased WordPiece, so that SPLADE later reads a vocabulary real text matches;
# the driver passes both, and the shards it wrote), the width and depth, the token budget, the batches and
# their order, the warm-up, the initialisation (train_lm.init_weights, N(0, 0.02)) and the seed.
train_shards = "out/repro_heads/corpus/corpus_train_*.bin"
val_shards = "out/repro_heads/corpus/corpus_val_*.bin"
vocab_size = 30522
bos_id = 101                    # [CLS], written before every document of the shards; never masked
mask_id = 103                   # [MASK]
pad_id = 0
d_model = 128                   # splade-tiny's width
n_layers = 4
n_heads = 2                     # head dimension 64, as in every published base model of the three families
max_seq_len = 128               # BERT's phase 1 (90 % of its steps) used 128-token sequences
seq_len = 128
batch_size = 16                 # 2 048 tokens per step (BERT: 256 x 512)
objective = "mlm"
max_steps = 400                 # 0.8M tokens, 0.43 passes over the 1.9M training tokens (a step costs 2.5-3.5 s
                                # on a shared core, the 30 522-id head dominating)
warmup_steps = 50               # 50 steps (BERT's 10k of 1M steps, 1 %, would be 4 here; ModernBERT's 3B of
                                # 1.7T tokens 1; EuroBERT's 1 % 4)
min_lr_ratio = 0.0              # every recipe decays to 0
seed = 1337
device = "cpu"
dtype = "float32"
compile = False
log_interval = 25
eval_interval = 50
eval_batches = 8
ckpt_interval = 50              # every checkpoint is kept: the driver records the head's norms at each
keep_checkpoints = 100
