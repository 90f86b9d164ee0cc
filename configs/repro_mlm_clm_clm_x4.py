# MLM-vs-CLM reproduction, the longer budget: CLM for 4x the steps, everything else as
# repro_mlm_clm_mlm30_x4.py (same initialisation, batches and checkpoints).
from configs.repro_mlm_clm_mlm30_x4 import *  # noqa: F401,F403

out_dir = "out/repro_mlm_clm/pretrain/clm_x4"
objective = "clm"
