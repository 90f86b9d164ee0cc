# MLM-vs-CLM paper (Paper 3), continued pretraining: start from an existing checkpoint (a CLM one
# from eurobert_210m_clm.py, an MLM one, or a Hub model with the same block) and continue with MLM.
#   python train_lm.py configs/eurobert_210m_cpt.py --init_from=out/eurobert_210m_clm/checkpoints/step_00042000/model
from configs.eurobert_210m_mlm import *  # noqa: F401,F403

out_dir = "out/eurobert_210m_cpt_mlm"
init_from = "hf:EuroBERT/EuroBERT-210m"
objective = "mlm"
max_steps = 12000
warmup_steps = 500
