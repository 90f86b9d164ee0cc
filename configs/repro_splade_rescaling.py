# The small-scale reproduction of the SPLADE rescaling paper on a CPU, from local files: a real
# SPLADE checkpoint (BERT, tied head) fine-tuned on CACM + CISI title -> abstract pairs and evaluated
# on Cranfield's real queries, under five head/k conditions, each tied and with an untied decoder.
#   python experiments/repro_splade_rescaling.py configs/repro_splade_rescaling.py --out_dir=out/repro_splade
out_dir = "out/repro_splade"
init = "data/repro/models/splade-tiny"
train_beir = "data/repro/ir/cacm,data/repro/ir/cisi"
eval_beir = "data/repro/ir/cranfield"
train_config = "configs/repro_splade_train.py"
# name -> (head_scale m, k): m emulates a backbone whose head is m times larger; k is the paper's division
conditions = {
    "original_k1": (1, 1),      # standard SPLADE on the checkpoint as published (the control)
    "large_k1": (16, 1),        # a 16x larger head, standard SPLADE: the paper's failure case
    "large_k4": (16, 4),        # partial rescaling
    "large_k16": (16, 16),      # the right k: the same weights as the control
    "original_k16": (1, 16),    # over-rescaling a head that is already small
}
untie = [False, True]
eval_max_len = 128
eval_query_max_len = 64
jobs = 2                        # processes at a time, one thread each (the machine is shared)
threads = 1
