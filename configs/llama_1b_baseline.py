# SimReg paper (Paper 2), baseline at 1.3B: 24 layers, d 2048, 32 heads (the common LLaMA 1.3B shape; docs/simreg.md).
# SwiGLU width 5632: 8/3 x 2048 rounded up to a multiple of 256, LLaMA's rounding (GPU matmuls prefer it to 5461).
# Budget: as the 350M config, 19 000 steps x 524 288 = 9.96B tokens, one pass over sample-10BT (same shards);
# ~65 GPU-hours at 40 % MFU on H100s (docs/real_runs.md).
from configs.llama_350m_baseline import *  # noqa: F401,F403

out_dir = "out/llama_1b_baseline"
d_model = 2048
n_heads = 32
n_kv_heads = 32
d_ff = 5632
batch_size = 8              # x 2048 x 8 GPUs x 4 = 524,288 tokens per step (fits 80 GB with bf16)
grad_accum = 4
lr = 2e-4
