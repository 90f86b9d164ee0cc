# SimReg paper (Paper 2): LLaMA-350M with cross-entropy + SimReg on the last layer (after the final
# norm), tau = 0.01, chunks of 512 tokens. Identical to configs/llama_350m_baseline.py otherwise.
# Claim to check: >30 % fewer steps to the baseline's final loss, inter-class angle 61 -> ~74 deg.
from configs.llama_350m_baseline import *  # noqa: F401,F403

out_dir = "out/llama_350m_simreg"
simreg = True
simreg_tau = 0.01
simreg_chunk = 512
simreg_lambda = -1.0        # default 0.06 * sqrt(1024) = 1.9 (fit on a CPU): llama_350m_lambda_check.py checks it
