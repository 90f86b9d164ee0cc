# MLM-vs-CLM paper (Paper 3): the same 210M encoder architecture trained with causal LM only
# (same data order, optimizer and schedule as eurobert_210m_mlm.py). Fine-tune it bidirectionally.
# Budget: eurobert_210m_mlm.py's 99.1B tokens; ~96 GPU-hours at 40 % MFU on H100s (every token through the
# vocabulary head, where MLM computes it at the masked 30 % only).
from configs.eurobert_210m_mlm import *  # noqa: F401,F403

out_dir = "out/eurobert_210m_clm"
objective = "clm"
