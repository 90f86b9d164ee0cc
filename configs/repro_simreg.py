# The SimReg paper's comparison at CPU scale: baseline vs SimReg chunked (32 of 128 positions) and
# full (the whole sequence), λ = train_lm.py's default c·√d, 3 seeds; steps to the baseline's final
# validation loss, step-time overhead, inter-class angle, validation curves with seed bands.
#   python experiments/simreg_sweep.py configs/repro_simreg.py
mode = "compare"
root = "out/repro_simreg"
train_config = "configs/repro_simreg_lm.py"
train_args = ["--eval_interval=25"]        # a denser curve for the steps-to-target interpolation
d_model = 128
conditions = {"baseline": {"simreg": False},
              "simreg_chunked": {"simreg": True, "simreg_chunk": 32},
              "simreg_full": {"simreg": True, "simreg_chunk": 0}}
seeds = [0, 1, 2]
# One run at a time: with two, three conditions share two slots, so a run's step time depends on
# which run it shared the CPU with (measured: -11 ± 31 % "overhead" for full SimReg). One at a time
# takes about as long (a lone run is ~2x faster) and times every condition alike.
parallel = 1
