# MLM-vs-CLM reproduction: the paper's best fixed-budget recipe, the first 25 % of the steps causal
# LM, then MLM-30 % with bidirectional attention; one run, so the optimizer state and the batch
# order carry across the switch (at step round(0.25 * max_steps)).
from configs.repro_mlm_clm_mlm30 import *  # noqa: F401,F403

out_dir = "out/repro_mlm_clm/pretrain/clm25_mlm75"
clm_fraction = 0.25
