# Calibration of SimReg's λ (the paper: the best λ grows roughly like √d, no values published):
# widths 64/128/256 (same depth, tokens and data order) x 7 λ x 3 seeds = 63 runs of 200 steps;
# 67 min of wall time on a 2-core CPU shared with other jobs (load 8-13), 2 runs at a time.
#   python experiments/simreg_sweep.py configs/repro_simreg_lambda.py
mode = "lambda"
root = "out/repro_simreg_lambda"
train_config = "configs/repro_simreg_lm.py"
widths = [64, 128, 256]
lambdas = [0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]   # 0 = SimReg off (the baseline of that width)
seeds = [0, 1, 2]
parallel = 2
