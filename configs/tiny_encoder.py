# A tiny EuroBERT-style encoder for CPU: the CPU-scale eurobert_210m_*.py. MLM by default;
# --objective=clm for CLM, --clm_fraction=0.25 for CLM -> MLM. mask_id must be an id the shards
# never contain: 1, the <|mask|> token of tiny_lm.py's BPE.
from configs.tiny_lm import *  # noqa: F401,F403

out_dir = "out/tiny_encoder"
family = "eurobert"
objective = "mlm"
mask_ratio = 0.3
mask_id = 1
schedule = "wsd"
