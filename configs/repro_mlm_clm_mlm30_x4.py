# MLM-vs-CLM reproduction, the longer budget (experiments/repro_mlm_clm.py --long): MLM-30 % for 4x
# the steps of repro_mlm_clm_mlm30.py (4 800 steps of 2 048 tokens: 9.8M tokens, 5.5 passes over the
# 1.8M training tokens of the reviews), the same initialisation, schedule shape (warmup-stable-decay,
# the decay over the last 10 %) and batches in the same order; a checkpoint every 1/16 of the run,
# so that the driver fine-tunes the curve at 300, 600, 1 200, 2 400, 3 600 and 4 800 steps. The
# paper trains 12k-42k steps of 2.4M tokens; its finding that MLM overtakes CLM "when trained long
# enough" is what this budget probes, at a 0.7M-parameter scale where the text repeats.
from configs.repro_mlm_clm_mlm30 import *  # noqa: F401,F403

out_dir = "out/repro_mlm_clm/pretrain/mlm30_x4"
max_steps = 4800
ckpt_interval = 300
eval_interval = 300
