# SimReg paper (Paper 2) at 1.3B (paper: +1.14 % zero-shot average). Same as llama_1b_baseline.py + SimReg.
# λ: the default 0.06·√d is an extrapolation; run configs/llama_350m_lambda_check.py first (its comment says
# how to carry its result to this width).
from configs.llama_1b_baseline import *  # noqa: F401,F403

out_dir = "out/llama_1b_simreg"
simreg = True
simreg_chunk = 512
