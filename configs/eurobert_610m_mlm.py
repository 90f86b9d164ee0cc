# MLM-vs-CLM paper (Paper 3) at 610M: 26 layers, d 1152, 18 heads / 6 kv heads, SwiGLU 4096.
# Same objective switches as the 210M configs (--objective, --clm_fraction, --mask_ratio).
# Budget: the 210M config's 99.1B tokens in 42k steps (its comment: the data command for one pass);
# ~236 GPU-hours at 40 % MFU on H100s (docs/real_runs.md).
from configs.eurobert_210m_mlm import *  # noqa: F401,F403

out_dir = "out/eurobert_610m_mlm30"
d_model = 1152
n_layers = 26
n_heads = 18
n_kv_heads = 6
d_ff = 4096
batch_size = 18             # x 8 GPUs x 16 = 2 304 sequences per step
grad_accum = 16
