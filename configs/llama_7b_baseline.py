# SimReg paper (Paper 2), baseline at 7B: 32 layers, d 4096, 32 heads, SwiGLU 11008 (the common LLaMA-7B shape; docs/simreg.md).
# 7B with AdamW does not fit on one 80 GB GPU under DDP (weights + grads + Adam = 16 bytes/param),
# so parameters, gradients and optimizer state are sharded with FSDP2.
# Budget: twice the tokens per step of the 350M config, so half its steps: 9 500 steps x 1 048 576 = 9.96B tokens,
# one pass over sample-10BT (same shards), with the 350M's warm-up tokens (1 000 steps); ~300 GPU-hours at 40 % MFU
# on H100s per run (docs/real_runs.md). The paper's step count is unpublished; more steps repeat the data unless
# more is prepared (--name sample-100BT).
from configs.llama_350m_baseline import *  # noqa: F401,F403

out_dir = "out/llama_7b_baseline"
d_model = 4096
n_layers = 32
n_heads = 32
n_kv_heads = 32
d_ff = 11008
fsdp = True
batch_size = 4              # x 2048 x 8 GPUs x 16 = 1,048,576 tokens per step
grad_accum = 16
max_steps = 9500
warmup_steps = 1000
lr = 1.5e-4
