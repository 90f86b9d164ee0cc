# Real-case SPLADE reproduction (experiments/repro_heads.py), step 1: a tiny BERT-style MLM backbone
# pretrained with BERT's own recipe, scaled down; what the three recipes share is in repro_heads_shared.py.
# Where each value comes from:
#   BERT: Devlin et al. 2019 (NAACL), section A.2, and google-research/bert optimization.py / run_pretraining.py.
#   python train_lm.py configs/repro_heads_bert.py --tokenizer=data/repro/models/splade-tiny  (the driver passes
#   the tokenizer, the shards it wrote with it and the output folder)
from configs.repro_heads_shared import *  # noqa: F401,F403

out_dir = "out/repro_heads/pretrain/bert"
family = "bert"                 # post-norm, learned positions, segment table, head transform, biases
tie_embeddings = True           # BERT's MLM decoder is the word-embedding matrix (+ its own bias)
d_ff = 512                      # BERT: 4 d (3 072 at d 768)
norm_eps = 1e-12                # BERT's LayerNorm epsilon
dropout = 0.1                   # BERT: 0.1 on every layer and the attention probabilities
mask_ratio = 0.15               # BERT: 15 % of the tokens,
mask_replacement = "80_10_10"   # of which 80 % [MASK], 10 % a random token, 10 % unchanged
schedule = "linear"             # BERT: linear warm-up, then linear decay to 0
lr = 1e-3                       # BERT's 1e-4 x 10: every recipe's published peak lr x 10 for a ~0.5M-parameter
                                # body (the ratio between the recipes' rates is kept: it is one of the switches)
beta1 = 0.9                     # BERT's Adam: beta (0.9, 0.999), eps 1e-6 (optimization.py)
beta2 = 0.999
adam_eps = 1e-6
weight_decay = 0.01             # BERT: decoupled weight decay 0.01 x lr (AdamWeightDecayOptimizer, as torch AdamW)
decay_params = "matrices+embeddings"  # on everything but LayerNorm and biases: the embedding tables (and so the tied head) too
grad_clip = 1.0                 # BERT: clip_by_global_norm(1.0)
