# MLM-vs-CLM reproduction, continued pretraining (CPT): the finished CLM model (repro_mlm_clm_clm.py,
# annealed at max_steps) continues with MLM-30 % for half as many steps, with a fresh optimizer,
# warm-up and decay, on the corpus from its start (the first half of the batches every run saw).
# Its fair comparison is repro_mlm_clm_cpt_mlm.py: the finished MLM-30 % model continued the same
# way, so both have 1.5x the from-scratch budget; the paper's finding: CPT of a CLM model beats
# CPT of an MLM model. (experiments/repro_mlm_clm.py passes init_from for its own output folder.)
from configs.repro_mlm_clm_mlm30 import *  # noqa: F401,F403

out_dir = "out/repro_mlm_clm/pretrain/cpt_clm"
init_from = "out/repro_mlm_clm/pretrain/clm/checkpoints/step_00001200/model"
max_steps = 600
