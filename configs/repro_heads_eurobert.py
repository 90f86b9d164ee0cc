# Real-case SPLADE reproduction (experiments/repro_heads.py), step 1: the EuroBERT-style backbone with
# EuroBERT's recipe, scaled down; what the three recipes share is in repro_heads_shared.py. Where each
# value comes from: Boizard et al. 2025 ("EuroBERT", arXiv 2503.05500) and its training library,
# Nicolas-BZRD/EuroBERT optimus/trainer/configuration/train.py (defaults: AdamW lr 1e-4, wd 0.1, betas
# (0.9, 0.95), eps 1e-5, clip 1.0, warmup-stable-decay with 1 % warm-up, mlm_probability 0.3 with
# mask_probability 1.0) and optimus/trainer/pretrain.py (AdamW over model.parameters(): every parameter
# decayed). The paper's own run may use another masking ratio than the library's default; this recipe
# takes the library's.
#   python train_lm.py configs/repro_heads_eurobert.py   (the driver passes the tokenizer, data and folder)
from configs.repro_heads_shared import *  # noqa: F401,F403

out_dir = "out/repro_heads/pretrain/eurobert"
family = "eurobert"             # the LLaMA block (pre-norm RMSNorm, RoPE, SwiGLU, no biases), bidirectional
tie_embeddings = False          # EuroBERT: a bare, untied vocabulary projection (tied_weights False)
n_kv_heads = 2
d_ff = 512                      # EuroBERT-210m: SwiGLU 3 072 at d 768 (4 d)
norm_eps = 1e-5
dropout = 0.0
mask_ratio = 0.3                # Optimus: mlm_probability 0.3,
mask_replacement = "mask"       # every selected token becomes [MASK] (mask 1.0, random 0, original 0)
schedule = "wsd"
decay_fraction = 0.1
lr = 1e-3                       # EuroBERT's 1e-4 x 10 (the factor of every recipe)
beta1 = 0.9
beta2 = 0.95
adam_eps = 1e-5
weight_decay = 0.1
decay_params = "all"            # AdamW(model.parameters(), weight_decay=0.1): norms and embeddings too
grad_clip = 1.0
