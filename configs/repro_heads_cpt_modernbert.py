# The real case, continued pretraining: splade-tiny continued with ModernBERT's optimizer recipe (the values
# and their sources are those of repro_heads_modernbert.py; shared: repro_heads_cpt_shared.py). A BERT block
# stays a BERT block: what changes is the learning rate, the decay, the masking and the schedule.
#   python train_lm.py configs/repro_heads_cpt_modernbert.py --init_from=data/repro/models/splade-tiny
from configs.repro_heads_cpt_shared import *  # noqa: F401,F403
from configs.repro_heads_modernbert import (adam_eps, beta1, beta2, decay_fraction, decay_params,  # noqa: F401
                                            dropout, grad_clip, mask_ratio, mask_replacement, schedule)

out_dir = "out/repro_heads_cpt/pretrain/modernbert"
lr = 2.4e-3                     # ModernBERT-base's 8e-4 x 3 (repro_heads_cpt_bert.py says why 3)
weight_decay = 1e-5 / lr        # ModernBERT's fully decoupled 1e-5 per step at the peak rate, as in the recipe file
