# The rescaling paper's real case at CPU scale (experiments/repro_heads.py): tiny MLM backbones of three
# recipes pretrained on the same text, their heads measured at every checkpoint, an ablation of the
# recipe switches, and the SPLADE rescaling table (k in {1, 4, 16} and the rule) on each backbone.
#   python experiments/repro_heads.py configs/repro_heads.py
out_dir = "out/repro_heads"
# movie reviews (modern English prose) and the abstracts of CACM and CISI (the texts SPLADE is later
# fine-tuned on; Cranfield, the evaluation collection, is not in it): 2.1M tokens of splade-tiny's
# bert-base-uncased vocabulary, the first 200k (reviews) held out
text = "data/repro/text/movie_reviews.txt,data/repro/ir/cacm/corpus.jsonl,data/repro/ir/cisi/corpus.jsonl"
tokenizer = "data/repro/models/splade-tiny"
recipes = {"bert": "configs/repro_heads_bert.py", "modernbert": "configs/repro_heads_modernbert.py",
           "eurobert": "configs/repro_heads_eurobert.py"}
# One switch at a time on the ModernBERT recipe, set to BERT's value: the learning rate (with the
# weight decay per step kept at ModernBERT's 1e-5: wd = 1e-5 / lr) and the tie.
ablations = {
    "modernbert_lr_of_bert": ("modernbert", ["--lr=1e-3", "--weight_decay=0.01"]),
    "modernbert_untied": ("modernbert", ["--tie_embeddings=False"]),
}
splade_backbones = ["bert", "modernbert", "eurobert"]
ks = [1, 4, 16, "auto"]
train_beir = "data/repro/ir/cacm,data/repro/ir/cisi"
eval_beir = "data/repro/ir/cranfield"
train_config = "configs/repro_splade_train.py"   # the rescaling reproduction's recipe: same steps and seed
jobs = 1                        # one process at a time, one thread (the machine is shared)
threads = 1
