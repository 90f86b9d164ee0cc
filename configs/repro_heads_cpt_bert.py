# The real case, continued pretraining: splade-tiny continued with BERT's optimizer recipe (the values and
# their sources are those of repro_heads_bert.py; what the recipes share: repro_heads_cpt_shared.py).
#   python train_lm.py configs/repro_heads_cpt_bert.py --init_from=data/repro/models/splade-tiny \
#       --tokenizer=data/repro/models/splade-tiny   (the driver passes these, the data and the folder)
from configs.repro_heads_cpt_shared import *  # noqa: F401,F403
from configs.repro_heads_bert import (adam_eps, beta1, beta2, decay_params, dropout, grad_clip,  # noqa: F401
                                      mask_ratio, mask_replacement, schedule, weight_decay)

out_dir = "out/repro_heads_cpt/pretrain/bert"
# BERT's 1e-4 x 3. The from-scratch recipes take 10x the published rates (a 0.5M-parameter body); a trained
# model continued at 10x moved back towards the unigram level under ModernBERT's rate (8e-3: an MLM loss of
# 5.46 after 300 steps against 4.40 under BERT's), so every recipe here takes 3x, the ratio between the
# recipes' rates kept (ModernBERT's is 8x BERT's and EuroBERT's, as published).
lr = 3e-4
