# configs/tiny_lm.py with SimReg: the CPU-scale version of llama_350m_simreg.py.
from configs.tiny_lm import *  # noqa: F401,F403

out_dir = "out/tiny_lm_simreg"
simreg = True
simreg_chunk = 32
