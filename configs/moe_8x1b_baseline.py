# SimReg paper (Paper 2), Mixtral-style MoE baseline ("Mixtral-8x1B"): the 1.3B LLaMA block with
# its MLP replaced by 8 SwiGLU experts, top-2 routing, Switch load-balancing loss (weight 0.01).
# The paper's MoE config is unpublished; expert width = the 1.3B model's MLP.
from configs.llama_1b_baseline import *  # noqa: F401,F403

out_dir = "out/moe_8x1b_baseline"
n_experts = 8
expert_top_k = 2
moe_aux_weight = 0.01
fsdp = True
