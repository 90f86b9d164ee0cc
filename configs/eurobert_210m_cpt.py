# MLM-vs-CLM paper (Paper 3), continued pretraining as the paper's CPT: the CLM run's own final checkpoint
# (configs/eurobert_210m_clm.py, 42k steps) continued with MLM at 40 % for 22k steps. Adapting a decoder so beats
# continuing MLM from an MLM checkpoint (the paper's control: --init_from=out/eurobert_210m_mlm30/...). The public
# EuroBERT-210m (--init_from=hf:EuroBERT/EuroBERT-210m) was trained with MLM on other, multilingual data: an
# MLM -> MLM run, not this one. A short re-warm-up (500 steps) for the new objective, then the paper's schedule.
#   torchrun --nproc_per_node=8 train_lm.py configs/eurobert_210m_clm.py      # first, if not yet run
#   torchrun --nproc_per_node=8 train_lm.py configs/eurobert_210m_cpt.py
# Budget: 22 000 steps x 2 359 296 = 51.9B tokens, 0.52 of a pass over the shards, ~38 GPU-hours at 40 % MFU on
# H100s. A new run reads the shards from their start: tokens the CLM run has seen (all of them, after its 42k
# steps), which the budget line, counting this run only, does not call a repeat; the paper does not say which
# tokens its CPT read.
from configs.eurobert_210m_mlm import *  # noqa: F401,F403

out_dir = "out/eurobert_210m_cpt_mlm40"
init_from = "out/eurobert_210m_clm/checkpoints/step_00042000/model"
objective = "mlm"
mask_ratio = 0.4
max_steps = 22000
warmup_steps = 500
