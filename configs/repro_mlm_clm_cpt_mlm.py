# MLM-vs-CLM reproduction, the control of repro_mlm_clm_cpt_clm.py: the finished MLM-30 % model
# continued with MLM-30 % for the same 600 steps, same fresh optimizer, schedule and batches.
from configs.repro_mlm_clm_cpt_clm import *  # noqa: F401,F403

out_dir = "out/repro_mlm_clm/pretrain/cpt_mlm"
init_from = "out/repro_mlm_clm/pretrain/mlm30/checkpoints/step_00001200/model"
