# SimReg paper (Paper 2) at 7B (paper: up to 38 % fewer steps, +1.22 % zero-shot average).
from configs.llama_7b_baseline import *  # noqa: F401,F403

out_dir = "out/llama_7b_simreg"
simreg = True
simreg_chunk = 512
