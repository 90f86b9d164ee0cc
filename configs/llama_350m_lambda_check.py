# SimReg's λ at scale, checked before the 1.3B / 7B / MoE runs spend their budget. The default λ = 0.06·√d
# (1.92 / 2.72 / 3.84 at d = 1024 / 2048 / 4096) was fit at d = 64-256 on a CPU, where the best λ did not grow
# with d (docs/simreg.md, "λ"), and an earlier guess, λ = 8 at d = 1024, diverged on a GPU. One short run per λ
# at 350M, the same data order; λ = 0 is the baseline (SimReg computed, weighted 0: the same cost):
#   for lam in 0 0.5 1 1.92 4; do torchrun --nproc_per_node=8 train_lm.py configs/llama_350m_lambda_check.py \
#       --simreg_lambda=$lam --out_dir=out/lambda_check/lam$lam; done
#   python eval/compare_runs.py out/lambda_check/lam0 out/lambda_check/lam{0.5,1,1.92,4}
# Read: λ* = the λ with the lowest final val_loss (CE) whose log shows no loss or grad_norm spikes. λ* = 1.92
# keeps the default for the big runs; otherwise pass them --simreg_lambda=λ*·√(d/1024) (x1.41 at 1.3B and MoE,
# x2 at 7B), or λ* itself if 0.5 or 1 won (the CPU-scale finding: no growth with d).
# Budget: 3 000 steps x 524 288 = 1.57B tokens per run (0.16 of a pass over sample-10BT), ~3 GPU-hours at 40 %
# MFU on H100s, ~15 for the five. Differences from llama_350m_simreg.py: 3 000 steps, not 19 000, and a
# warm-up of 300, so that the cosine schedule ends inside the check.
from configs.llama_350m_simreg import *  # noqa: F401,F403

out_dir = "out/lambda_check/default"
max_steps = 3000
warmup_steps = 300
eval_interval = 250
ckpt_interval = 1000
