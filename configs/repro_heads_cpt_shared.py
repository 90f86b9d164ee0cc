# The real case, continued pretraining (experiments/repro_heads.py with configs/repro_heads_cpt.py): what the
# three recipes share when each continues the same real checkpoint (splade-tiny: BERT, 2 layers, d 128, tied
# head; the driver passes it as --init_from, so the architecture is the checkpoint's and no recipe sets one).
# Shared: the text, the tokenizer and the shards the driver wrote with it, the token budget, the batches and
# their order, the warm-up and the seed. What differs is each family's published optimizer recipe
# (repro_heads_cpt_{bert,modernbert,eurobert}.py take it from the from-scratch recipes' files).
# The special ids, the batches, the warm-up, the seed and the system keys of the from-scratch experiment:
from configs.repro_heads_shared import (batch_size, bos_id, compile, device, dtype, eval_batches,  # noqa: F401
                                        keep_checkpoints, log_interval, mask_id, min_lr_ratio, objective, pad_id,
                                        seed, seq_len, warmup_steps)

train_shards = "out/repro_heads_cpt/corpus/corpus_train_*.bin"
val_shards = "out/repro_heads_cpt/corpus/corpus_val_*.bin"
max_steps = 3000                # 6.1M tokens, 3.2 passes over the 1.9M training tokens (~0.3 s a step on one free
                                # core: the 30 522-id head at the masked positions dominates). A probe of 1 000
                                # steps (2026-12-03) grew ModernBERT's head at an even pace, 0.68 -> 1.09 by step
                                # 721 (BERT's: 0.71), its loss flat from step 400: the longer run lets the head
                                # grow by pretraining alone, each recipe at its own rate
eval_interval = 100
ckpt_interval = 200             # every checkpoint is kept: the driver records the head's norms at each
