# Real-case SPLADE reproduction (experiments/repro_heads.py), step 1: a tiny BERT-style MLM backbone
# pretrained with BERT's own recipe, scaled down. The three recipes (this file, repro_heads_modernbert.py,
# repro_heads_eurobert.py) share the text, the tokenizer (splade-tiny's bert-base-uncased WordPiece, so that
# SPLADE later reads a vocabulary real text matches), the width and depth, the token budget, the batches and
# their order, the initialisation (train_lm.init_weights, N(0, 0.02)) and the seed; what differs is each
# family's architecture and its published pretraining recipe. Where each value comes from:
#   BERT: Devlin et al. 2019 (NAACL), section A.2, and google-research/bert optimization.py / run_pretraining.py.
#   python train_lm.py configs/repro_heads_bert.py --tokenizer=../shared/data/models/splade-tiny  (the driver passes
#   the tokenizer, the shards it wrote with it and the output folder)
out_dir = "out/repro_heads/pretrain/bert"
train_shards = "out/repro_heads/corpus/corpus_train_*.bin"
val_shards = "out/repro_heads/corpus/corpus_val_*.bin"
family = "bert"                 # post-norm, learned positions, segment table, head transform, biases
tie_embeddings = True           # BERT's MLM decoder is the word-embedding matrix (+ its own bias)
vocab_size = 30522
bos_id = 101                    # [CLS], written before every document of the shards; never masked
mask_id = 103                   # [MASK]
pad_id = 0
d_model = 128                   # the same width and depth in every recipe; splade-tiny's width
n_layers = 4
n_heads = 2                     # head dimension 64, as in every published base model of the three families
d_ff = 512                      # BERT: 4 d (3 072 at d 768)
norm_eps = 1e-12                # BERT's LayerNorm epsilon
dropout = 0.1                   # BERT: 0.1 on every layer and the attention probabilities
max_seq_len = 128               # BERT's phase 1 (90 % of its steps) used 128-token sequences
seq_len = 128
batch_size = 16                 # 2 048 tokens per step in every recipe (BERT: 256 x 512)
objective = "mlm"
mask_ratio = 0.15               # BERT: 15 % of the tokens,
mask_replacement = "80_10_10"   # of which 80 % [MASK], 10 % a random token, 10 % unchanged
max_steps = 400                 # 0.8M tokens, 0.43 passes over the 1.9M training tokens (same in every recipe; a step
                                # costs 2.5-3.5 s on a shared core, the 30 522-id head dominating)
warmup_steps = 50               # every recipe: 50 steps (BERT's 10k of 1M steps, 1 %, would be 4 here)
schedule = "linear"             # BERT: linear warm-up, then linear decay to 0
min_lr_ratio = 0.0
lr = 1e-3                       # BERT's 1e-4 x 10: every recipe's published peak lr x 10 for a ~0.5M-parameter
                                # body (the ratio between the recipes' rates is kept: it is one of the switches)
beta1 = 0.9                     # BERT's Adam: beta (0.9, 0.999), eps 1e-6 (optimization.py)
beta2 = 0.999
adam_eps = 1e-6
weight_decay = 0.01             # BERT: decoupled weight decay 0.01 x lr (AdamWeightDecayOptimizer, as torch AdamW)
decay_params = "matrices+embeddings"  # on everything but LayerNorm and biases: the embedding tables (and so the tied head) too
grad_clip = 1.0                 # BERT: clip_by_global_norm(1.0)
seed = 1337
device = "cpu"
dtype = "float32"
compile = False
log_interval = 25
eval_interval = 50
eval_batches = 8
ckpt_interval = 50              # every checkpoint is kept: the driver records the head's norms at each
keep_checkpoints = 100
