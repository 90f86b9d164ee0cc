# The paper's experiment: the seven backbones (plus EuroBERT) x rescaling factors k, one fixed
# SPLADE recipe (train_splade.py DEFAULTS), every model evaluated on MS MARCO dev, TREC DL 2019,
# BEIR-13 and NanoBEIR; one table and the NanoBEIR-vs-FLOPS / loss-curve plots.
#   python experiments/splade_sweep.py configs/splade_sweep.py --launcher "torchrun --nproc_per_node=8"
#   python experiments/splade_sweep.py configs/splade_sweep.py --only modernbert,ettin --ks "[1, 16]"
#   python experiments/splade_sweep.py configs/splade_sweep.py --action table       # collect only
root = "out/splade_sweep"
backbones = {
    "bert": "hf:google-bert/bert-base-uncased",
    "distilbert": "hf:distilbert/distilbert-base-uncased",
    "albert": "hf:albert/albert-base-v2",
    "gte-mlm": "hf:Alibaba-NLP/gte-en-mlm-base",
    "roberta": "hf:FacebookAI/roberta-base",
    "modernbert": "hf:answerdotai/ModernBERT-base",
    "ettin": "hf:jhu-clsp/ettin-encoder-150m",
    "eurobert": "hf:EuroBERT/EuroBERT-210m",
}
ks = [1, 2, 4, 8, 16, 32]
benchmarks = ["msmarco-dev", "dl19", "beir13", "nanobeir"]
