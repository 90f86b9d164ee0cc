# SimReg paper (Paper 2) on the Mixtral-style MoE. Same as moe_8x1b_baseline.py + SimReg.
# λ: the default 0.06·√d is an extrapolation; run configs/llama_350m_lambda_check.py first (its comment says
# how to carry its result to this width).
from configs.moe_8x1b_baseline import *  # noqa: F401,F403

out_dir = "out/moe_8x1b_simreg"
simreg = True
simreg_chunk = 512
