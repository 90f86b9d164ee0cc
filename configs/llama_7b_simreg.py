# SimReg paper (Paper 2) at 7B (paper: up to 38 % fewer steps, +1.22 % zero-shot average).
# λ: the default 0.06·√d is an extrapolation; run configs/llama_350m_lambda_check.py first (its comment says
# how to carry its result to this width).
from configs.llama_7b_baseline import *  # noqa: F401,F403

out_dir = "out/llama_7b_simreg"
simreg = True
simreg_chunk = 512
