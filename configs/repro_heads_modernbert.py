# Real-case SPLADE reproduction (experiments/repro_heads.py), step 1: the ModernBERT-style backbone with
# ModernBERT's recipe, scaled down; everything shared with repro_heads_bert.py is the same value (its
# header says what is shared). Where each value comes from: Warner et al. 2024 ("Smarter, Better, Faster,
# Longer", arXiv 2412.13663) and AnswerDotAI/ModernBERT yamls/modernbert/modernbert-base-pretrain.yaml
# (optimizer, schedule, masking) and src/sequence_packer.py (mlm_masking: 80/10/10).
#   python train_lm.py configs/repro_heads_modernbert.py   (the driver passes the tokenizer, data and folder)
out_dir = "out/repro_heads/pretrain/modernbert"
train_shards = "out/repro_heads/corpus/corpus_train_*.bin"
val_shards = "out/repro_heads/corpus/corpus_val_*.bin"
family = "modernbert"           # pre-norm, RoPE, LayerNorm on the embeddings, GeGLU, no biases, final norm
tie_embeddings = True           # ModernBERT's decoder is the word-embedding matrix (+ a bias)
window = 8                      # ModernBERT: layers i % 3 != 0 attend within +-64 of 1 024 (1/8 of the sequence);
global_every = 3                # +-8 of 128 here. rope_theta 10 000 on every layer, as in its pretraining yaml
vocab_size = 30522
bos_id = 101
mask_id = 103
pad_id = 0
d_model = 128
n_layers = 4
n_heads = 2
d_ff = 192                      # ModernBERT-base: GLU width 1 152 per half at d 768 (1.5 d)
norm_eps = 1e-5                 # ModernBERT: LayerNorm eps 1e-5, no bias
dropout = 0.0                   # ModernBERT: 0 on embeddings, MLP and attention probabilities (0.1 on the
                                # attention output only, which train_lm's single dropout key cannot express)
max_seq_len = 128
seq_len = 128
batch_size = 16
objective = "mlm"
mask_ratio = 0.3                # ModernBERT: mlm_probability 0.3,
mask_replacement = "80_10_10"   # masked as BERT: 80 % [MASK], 10 % random, 10 % unchanged (sequence_packer.py)
max_steps = 400
warmup_steps = 50               # every recipe: 50 steps (ModernBERT's 3B of 1.7T tokens would be 1 here)
schedule = "wsd"                # ModernBERT: warmup, then a constant rate, decayed at the end
decay_fraction = 0.1
min_lr_ratio = 0.0
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
seed = 1337
device = "cpu"
dtype = "float32"
compile = False
log_interval = 25
eval_interval = 50
eval_batches = 8
ckpt_interval = 50
keep_checkpoints = 100
