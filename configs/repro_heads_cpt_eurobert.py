# The real case, continued pretraining: splade-tiny continued with EuroBERT's optimizer recipe (the values and
# their sources are those of repro_heads_eurobert.py; shared: repro_heads_cpt_shared.py). The checkpoint's head
# stays tied (EuroBERT's is untied: last round's ablation found the tie is not what grows a head).
#   python train_lm.py configs/repro_heads_cpt_eurobert.py --init_from=data/repro/models/splade-tiny
from configs.repro_heads_cpt_shared import *  # noqa: F401,F403
from configs.repro_heads_eurobert import (adam_eps, beta1, beta2, decay_fraction, decay_params,  # noqa: F401
                                          dropout, grad_clip, mask_ratio, mask_replacement, schedule, weight_decay)

out_dir = "out/repro_heads_cpt/pretrain/eurobert"
lr = 3e-4                       # EuroBERT's 1e-4 x 3 (repro_heads_cpt_bert.py says why 3)
