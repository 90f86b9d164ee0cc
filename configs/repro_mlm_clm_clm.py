# MLM-vs-CLM reproduction: causal LM throughout, everything else as repro_mlm_clm_mlm30.py.
# Fine-tuned with bidirectional attention, as in the paper.
from configs.repro_mlm_clm_mlm30 import *  # noqa: F401,F403

out_dir = "out/repro_mlm_clm/pretrain/clm"
objective = "clm"
