# The rescaling paper's real case on backbones that retrieve (experiments/repro_heads.py): one real SPLADE
# checkpoint (splade-tiny, already past the unigram level) continued with MLM under each family's published
# optimizer recipe on the same text, batches and seed, so that only the recipe differs and a head that grows
# is grown by pretraining; two transplants (one run's body with the other's head) tell the head's part from
# the body's; then the gate and the rescaling table with two SPLADE seeds per condition.
#   python experiments/repro_heads.py configs/repro_heads_cpt.py
from configs.repro_heads import eval_beir, text, tokenizer, train_beir, train_config  # noqa: F401

out_dir = "out/repro_heads_cpt"
init = "../shared/data/models/splade-tiny"
recipes = {"bert": "configs/repro_heads_cpt_bert.py", "modernbert": "configs/repro_heads_cpt_modernbert.py",
           "eurobert": "configs/repro_heads_cpt_eurobert.py"}
transplants = {"bert_body_modernbert_head": ("bert", "modernbert"),
               "modernbert_body_bert_head": ("modernbert", "bert")}
heads_tokens = 16384            # 128 held-out texts of 128 tokens: the head's records and the MLM probe's loss
splade_backbones = ["bert", "modernbert", "eurobert", "bert_body_modernbert_head", "modernbert_body_bert_head",
                    "modernbert@1000", "modernbert@2000"]   # ModernBERT's recipe a third and two thirds of the way:
                                                            # its head grows at an even pace (1.22, 1.59; 1.81 at 3 000)
ks = [1, 4, 16, "auto"]
splade_seeds = [1338]           # a second SPLADE seed per condition (data order and dropout), beside the config's 1337
# k divides an untied copy of the head: a BERT block adds its position and segment embeddings before its
# embedding LayerNorm, so dividing a tied matrix also changes what the body reads (the rescaling table of
# splade-tiny: tied k = 16 leaves nDCG@10 0.006, untied 0.181), which ModernBERT's LayerNorm right after the
# word embeddings would absorb; the transplants are untied anyway.
untie_head = True
jobs = 1                        # one process at a time, one thread
threads = 1
