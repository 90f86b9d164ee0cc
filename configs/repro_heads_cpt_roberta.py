# The real case, continued pretraining: splade-tiny continued with RoBERTa's optimizer recipe at its published
# peak rate (no factor): a recipe whose head may grow at the rate it was published with. Where each value comes
# from: Liu et al. 2019 ("RoBERTa", arXiv 1907.11692), Table 9 (base: peak lr 6e-4, Adam betas (0.9, 0.98),
# eps 1e-6, weight decay 0.01, linear decay, no gradient clipping, dropout 0.1) and section 4.1 (dynamic
# masking, 15 % as BERT's 80/10/10); fairseq's Adam decays every parameter. Shared: repro_heads_cpt_shared.py.
#   python train_lm.py configs/repro_heads_cpt_roberta.py --init_from=data/repro/models/splade-tiny
from configs.repro_heads_cpt_shared import *  # noqa: F401,F403

out_dir = "out/repro_heads_cpt/pretrain/roberta"
dropout = 0.1                   # RoBERTa: 0.1 on every layer and the attention probabilities
mask_ratio = 0.15               # 15 % of the tokens, 80 % [MASK] / 10 % random / 10 % unchanged, drawn anew
mask_replacement = "80_10_10"   # for every batch (train_lm's masking is always dynamic)
schedule = "linear"             # linear warm-up, then linear decay to 0
lr = 6e-4                       # RoBERTa-base's published peak, not scaled (BERT's recipe here runs 3x its 1e-4)
beta1 = 0.9
beta2 = 0.98
adam_eps = 1e-6
weight_decay = 0.01
decay_params = "all"            # fairseq's Adam applies weight_decay to every parameter, norms and biases too
grad_clip = 0.0                 # Table 9: gradient clipping 0.0 (none)
