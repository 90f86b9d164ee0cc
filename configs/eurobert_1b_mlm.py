# MLM-vs-CLM paper (Paper 3) at ~1B: 26 layers, d 1728, 18 heads / 6 kv heads, SwiGLU 4096
# (the "1B" shape is inferred from the paper's size, see docs/mlm_vs_clm.md).
# Budget: the 210M config's 99.1B tokens in 42k steps (its comment: the data command for one pass);
# ~383 GPU-hours at 40 % MFU on H100s (docs/real_runs.md).
from configs.eurobert_610m_mlm import *  # noqa: F401,F403

out_dir = "out/eurobert_1b_mlm30"
d_model = 1728
batch_size = 12             # x 8 GPUs x 24 = 2 304 sequences per step
grad_accum = 24
