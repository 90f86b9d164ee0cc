# SimReg paper (Paper 2), Mixtral-style MoE baseline ("Mixtral-8x1B"): the 1.3B LLaMA block with
# its MLP replaced by 8 SwiGLU experts, top-2 routing, Switch load-balancing loss (weight 0.01).
# The paper's MoE config is unpublished; expert width = the 1.3B model's MLP (7.3B parameters in all, 2.3B
# active per token).
# Budget: as the 1.3B config, 9.96B tokens, one pass over sample-10BT; ~99 GPU-hours at 40 % MFU on H100s.
# Memory (estimated, not measured): FSDP shards the 16 bytes/param of weights, gradients and AdamW (~15 GB per GPU
# of 8), but the activations of the 1.3B config's micro-batch of 8 x 2048, through two experts per token, leave
# 80 GB cards (H100, A100) too little room: there, micro-batches of 4 (below; the same 524,288 tokens per step).
# 141 GB cards (H200) can take --batch_size=8 --grad_accum=4 (fewer, larger micro-steps).
from configs.llama_1b_baseline import *  # noqa: F401,F403

out_dir = "out/moe_8x1b_baseline"
n_experts = 8
expert_top_k = 2
moe_aux_weight = 0.01
fsdp = True
batch_size = 4              # x 2048 x 8 GPUs x 8 = 524,288 tokens per step
grad_accum = 8
