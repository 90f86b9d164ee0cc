# Real-case SPLADE reproduction (experiments/repro_heads.py), step 1: the ModernBERT-style backbone with
# ModernBERT's recipe, scaled down; what the three recipes share is in repro_heads_shared.py. Where each
# value comes from: Warner et al. 2024 ("Smarter, Better, Faster, Longer", arXiv 2412.13663) and
# AnswerDotAI/ModernBERT yamls/modernbert/modernbert-base-pretrain.yaml (optimizer, schedule, masking) and
# src/sequence_packer.py (mlm_masking: 80/10/10).
#   python train_lm.py configs/repro_heads_modernbert.py   (the driver passes the tokenizer, data and folder)
from configs.repro_heads_shared import *  # noqa: F401,F403

out_dir = "out/repro_heads/pretrain/modernbert"
family = "modernbert"           # pre-norm, RoPE, LayerNorm on the embeddings, GeGLU, no biases, final norm
tie_embeddings = True           # ModernBERT's decoder is the word-embedding matrix (+ a bias)
window = 8                      # ModernBERT: layers i % 3 != 0 attend within +-64 of 1 024 (1/8 of the sequence);
global_every = 3                # +-8 of 128 here. rope_theta 10 000 on every layer, as in its pretraining yaml
d_ff = 192                      # ModernBERT-base: GLU width 1 152 per half at d 768 (1.5 d)
norm_eps = 1e-5                 # ModernBERT: LayerNorm eps 1e-5, no bias
dropout = 0.0                   # ModernBERT: 0 on embeddings, MLP and attention probabilities (0.1 on the
                                # attention output only, which train_lm's single dropout key cannot express)
mask_ratio = 0.3                # ModernBERT: mlm_probability 0.3,
mask_replacement = "80_10_10"   # masked as BERT: 80 % [MASK], 10 % random, 10 % unchanged (sequence_packer.py)
schedule = "wsd"                # ModernBERT: warmup, then a constant rate, decayed at the end
decay_fraction = 0.1
lr = 8e-3                       # ModernBERT-base's 8e-4 x 10 (the factor of every recipe)
beta1 = 0.9                     # ModernBERT: (0.9, 0.98), eps 1e-6
beta2 = 0.98
adam_eps = 1e-6
# ModernBERT: StableAdamW with fully decoupled weight decay 1e-5: each step multiplies a weight by
# 1 - 1e-5 x lr(t) / peak lr, independent of the rate's size. torch's AdamW multiplies by 1 - lr(t) x wd,
# so wd = 1e-5 / peak lr is exactly that. StableAdamW's per-parameter update clipping is not implemented:
# plain AdamW, and no gradient clipping (ModernBERT's yaml clips none).
weight_decay = 1.25e-3          # = 1e-5 / 8e-3
decay_params = "matrices+embeddings"  # filter_bias_norm_wd: every parameter but norms and biases, embeddings included
grad_clip = 0.0
