# configs/tiny_lm.py as a Mixtral-style MoE (4 experts, top-2): the CPU-scale moe_8x1b_baseline.py.
from configs.tiny_lm import *  # noqa: F401,F403

out_dir = "out/tiny_moe"
n_experts = 4
expert_top_k = 2
