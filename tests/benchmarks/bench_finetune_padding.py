"""Fine-tuning throughput with dynamic padding vs fixed-length padding, measured in one run.

    python tests/benchmarks/bench_finetune_padding.py [--steps 20] [--threads N] [--fixed 128,512]

The same sequence-classification fine-tuning loop (eval/finetune.py: forward, backward, AdamW
step) runs on the same batches with four paddings: to the longest sequence of each batch
(dynamic), dynamic with length-bucketed batches, and to a fixed length (128 and 512, what a
`padding="max_length"` pipeline does). Texts are the SST-2 dev sentences of ../shared/data when
present (872 real sentences, tokenised with the bert-base-uncased vocabulary of splade-tiny), else
generated sentences with SST-2-like lengths (log-normal, median ~20 words). The model is a small
EuroBERT-style encoder (4 layers, d 256) so that a CPU run takes about a minute; the ratio is what
carries over to larger models, where it is larger still because attention cost grows with T^2.
"""
import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, processors  # noqa: E402

import model as M  # noqa: E402
from eval import finetune as FT  # noqa: E402
from eval.finetune_data import TASKS, load_local_task  # noqa: E402
from hf.models import from_pretrained, load_tokenizer, save_pretrained  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"


def real_or_generated_texts(seed=0):
    sst2 = SHARED / "labeled" / "sst2"
    splade = SHARED / "models" / "splade-tiny" / "tokenizer.json"
    if sst2.is_dir() and splade.exists():
        dev = load_local_task(sst2, TASKS["sst2"])["test"]
        return dev, Tokenizer.from_file(str(splade)), "SST-2 dev (872 sentences), bert-base-uncased vocabulary"
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(500)]
    examples = [{"text": " ".join(rng.choice(words) for _ in range(max(1, round(rng.lognormvariate(3.0, 0.5))))),
                 "label": rng.randrange(2)} for _ in range(872)]
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return examples, tok, "generated SST-2-like lengths (872 sentences; shared data absent)"


def make_model(tokenizer, folder):
    cfg = M.ModelConfig(**{**M.FAMILY_TRAITS["eurobert"], "family": "eurobert",
                           "vocab_size": tokenizer.get_vocab_size(), "d_model": 256, "n_layers": 4,
                           "n_heads": 4, "d_ff": 512, "pad_id": 0, "max_seq_len": 1024})
    torch.manual_seed(0)
    save_pretrained(M.Transformer(cfg), folder, tokenizer=tokenizer)
    return folder


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="training steps per padding mode and round")
    ap.add_argument("--rounds", type=int, default=3, help="the modes run in turn this many times; best kept")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--fixed", default="128,512", help="fixed lengths to compare against")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    examples, tokenizer, source = real_or_generated_texts()
    data = {"train": examples, "validation": examples[:8], "test": examples[:8]}
    tokenizer.no_padding()  # a tokenizer.json may carry its own padding setting
    lengths = sorted(len(e.ids) for e in tokenizer.encode_batch([ex["text"] for ex in examples]))
    print("command: python tests/benchmarks/bench_finetune_padding.py " + " ".join(sys.argv[1:]))
    print(f"texts: {source}; tokens per text: median {lengths[len(lengths) // 2]}, "
          f"p95 {lengths[int(0.95 * len(lengths))]}, max {lengths[-1]}")
    print(f"model: EuroBERT-style 4 layers, d 256, vocab {tokenizer.get_vocab_size()}; batch {args.batch_size}, "
          f"{args.steps} steps per mode; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    fixed = [int(x) for x in args.fixed.split(",") if x]
    modes = [("dynamic", {}), ("dynamic + length buckets", {"bucket": True})] + \
            [(f"fixed {n}", {"pad_to": n, "max_len": n}) for n in fixed]
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model(tokenizer, Path(tmp) / "model")
        tok = load_tokenizer(folder)
        results = {name: [] for name, _ in modes}
        # the modes take turns, so a burst of load from other processes hits all of them alike;
        # the best round of each mode is kept
        for _ in range(args.rounds):
            for name, over in modes:
                cfg = FT.FinetuneConfig(lr=1e-4, steps=args.steps, batch_size=args.batch_size, device="cpu",
                                        progress=False, **{"max_len": max(fixed), **over})
                r = FT.finetune(from_pretrained(folder), tok, TASKS["sst2"], data, cfg)
                results[name].append(r["train"]["examples_per_s"])
        for name, _ in modes:
            print(f"  {name:<26} {max(results[name]):8.1f} examples/s   (rounds: "
                  + ", ".join(f"{x:.1f}" for x in results[name]) + ")")
        results = {name: max(v) for name, v in results.items()}
    base = results["dynamic"]
    print("ratios (dynamic / fixed):  " + ",  ".join(f"{n}: {base / results[n]:.1f}x" for n, _ in modes[2:]))
    print(f"length buckets / plain dynamic: {results['dynamic + length buckets'] / base:.2f}x")


if __name__ == "__main__":
    main()
