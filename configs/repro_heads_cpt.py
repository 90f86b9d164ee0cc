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
# The head alone at ModernBERT's rate: BERT's recipe with the head untied and learning at 8x the body's rate (2.4e-3,
# ModernBERT's peak; the body at BERT's 3e-4): a head grown by pretraining beside a body that BERT's recipe keeps
ablations = {"bert_head_lr8": ("bert", ["--tie_embeddings=False", "--head_lr_scale=8"])}
transplants = {"bert_body_modernbert_head": ("bert", "modernbert"),
               "modernbert_body_bert_head": ("modernbert", "bert")}
heads_tokens = 16384            # 128 held-out texts of 128 tokens: the head's records and the MLM probe's loss
# the final checkpoints, the transplants, ModernBERT's recipe a third and two thirds of the way (its head grows at an
# even pace: 1.22, 1.59; 1.81 at step 3 000) and the head alone at its rate
splade_backbones = ["bert", "modernbert", "eurobert", "bert_body_modernbert_head", "modernbert_body_bert_head",
                    "modernbert@1000", "modernbert@2000", "bert_head_lr8"]
ks = [1, 4, 16, "auto"]
splade_seeds = [1338]           # a second SPLADE seed per condition (data order and dropout), beside the config's 1337
# k divides an untied copy of the head: a BERT block adds its position and segment embeddings before its
# embedding LayerNorm, so dividing a tied matrix also changes what the body reads (the rescaling table of
# splade-tiny: tied k = 16 leaves nDCG@10 0.006, untied 0.181), which ModernBERT's LayerNorm right after the
# word embeddings would absorb; the transplants are untied anyway.
untie_head = True
jobs = 1                        # one process at a time, one thread
threads = 1
