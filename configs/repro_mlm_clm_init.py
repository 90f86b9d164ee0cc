# MLM-vs-CLM reproduction, "no pretraining": the initialisation every from-scratch run starts from
# (same shape and seed, so the same weights), saved as a checkpoint by one optimizer step at
# learning rate 0 (AdamW's update and its decoupled weight decay both scale with lr, so the
# weights do not move). Fine-tuned as the step-0 point of the accuracy-vs-steps curve.
from configs.repro_mlm_clm_mlm30 import *  # noqa: F401,F403

out_dir = "out/repro_mlm_clm/pretrain/init"
max_steps = 1
warmup_steps = 0
lr = 0.0
eval_interval = 1
ckpt_interval = 1
