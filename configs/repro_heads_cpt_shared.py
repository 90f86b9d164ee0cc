# The real case, continued pretraining (experiments/repro_heads.py with configs/repro_heads_cpt.py): what the
# three recipes share when each continues the same real checkpoint (splade-tiny: BERT, 2 layers, d 128, tied
# head; the driver passes it as --init_from, so the architecture is the checkpoint's and no recipe sets one).
# Shared: the text, the tokenizer and the shards the driver wrote with it, the token budget, the batches and
# their order, the warm-up and the seed. What differs is each family's published optimizer recipe
# (repro_heads_cpt_{bert,modernbert,eurobert}.py take it from the from-scratch recipes' files).
train_shards = "out/repro_heads_cpt/corpus/corpus_train_*.bin"
val_shards = "out/repro_heads_cpt/corpus/corpus_val_*.bin"
bos_id = 101                    # [CLS], written before every document of the shards; never masked
mask_id = 103                   # [MASK] (splade-tiny's config.json names only the padding id)
pad_id = 0
seq_len = 128
batch_size = 16                 # 2 048 tokens per step
objective = "mlm"
max_steps = 1000                # 2.0M tokens, 1.07 passes over the 1.9M training tokens (~0.35 s a step on one
                                # free core: the 30 522-id head at the masked positions dominates)
warmup_steps = 50
min_lr_ratio = 0.0              # every recipe decays to 0
seed = 1337
device = "cpu"
dtype = "float32"
compile = False
log_interval = 25
eval_interval = 100
eval_batches = 8
ckpt_interval = 100             # every checkpoint is kept: the driver records the head's norms at each
keep_checkpoints = 100
