# MLM-vs-CLM reproduction: MLM with 50 % of the tokens masked (the paper's ratios: 20-50 %); same
# masks' random draws as the 30 % run, so its masked positions are a superset of those.
from configs.repro_mlm_clm_mlm30 import *  # noqa: F401,F403

out_dir = "out/repro_mlm_clm/pretrain/mlm50"
mask_ratio = 0.5
