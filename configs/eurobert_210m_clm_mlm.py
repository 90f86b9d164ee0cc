# MLM-vs-CLM paper (Paper 3), the best fixed-budget recipe: 25 % of the steps causal LM, then 75 %
# MLM with bidirectional attention; same data order, optimizer state carried over.
# Other splits: --clm_fraction=0.5 | 0.75.
from configs.eurobert_210m_mlm import *  # noqa: F401,F403

out_dir = "out/eurobert_210m_clm25_mlm75"
objective = "mlm"
clm_fraction = 0.25
