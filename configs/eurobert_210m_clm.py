# MLM-vs-CLM paper (Paper 3): the same 210M encoder architecture trained with causal LM only
# (same data order, optimizer and schedule as eurobert_210m_mlm.py). Fine-tune it bidirectionally.
from configs.eurobert_210m_mlm import *  # noqa: F401,F403

out_dir = "out/eurobert_210m_clm"
objective = "clm"
