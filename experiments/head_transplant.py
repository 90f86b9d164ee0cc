"""One backbone's body with another's MLM head: the control that tells a head made large by
pretraining from a body that pretraining changed (experiments/repro_heads.py's `transplants`).

    python experiments/head_transplant.py --body A/model --head B/model --out C/model

Both checkpoints must share the architecture and the vocabulary (two continuations of one model,
say). The result keeps A's embeddings and blocks and takes B's whole MLM head: the transform
(dense, norm) and the decoder's matrix and bias. A tied decoder shares its matrix with the input
embeddings, so the result is untied: its input embeddings are A's, its decoder matrix B's.
Written beside `out` and renamed, so a folder named `out` is complete.
"""
import argparse
import os
import shutil
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo root

import torch

from cli import ConfigError, run_cli


def untied(model):
    """`model` with a decoder matrix of its own (a copy of the shared one, if tied)."""
    from model import untie_mlm_head
    untie_mlm_head(model)
    return model


def transplant_head(body, head):
    """`body` with `head`'s MLM head (every parameter under model.head), untied."""
    body, head = untied(body), untied(head)
    mine, theirs = dict(body.head.named_parameters()), dict(head.head.named_parameters())
    if {n: p.shape for n, p in mine.items()} != {n: p.shape for n, p in theirs.items()}:
        raise ConfigError("--head: its MLM head has other parameters or shapes than the body's "
                          f"({sorted(theirs)} against {sorted(mine)}); give two checkpoints of one architecture")
    with torch.no_grad():
        for name, p in mine.items():
            p.copy_(theirs[name])
    return body


def main(argv=None):
    from model import from_pretrained, save_pretrained
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--body", required=True, help="the checkpoint whose embeddings and blocks are kept")
    ap.add_argument("--head", required=True, help="the checkpoint whose MLM head is taken")
    ap.add_argument("--out", required=True, help="the new model folder")
    args = ap.parse_args(argv)
    out = Path(args.out)
    model = transplant_head(from_pretrained(args.body), from_pretrained(args.head))
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, tmp)   # the body's tokenizer files come with it (model.source)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    print(f"wrote {out}: the body of {args.body}, the MLM head of {args.head}")


if __name__ == "__main__":
    run_cli(main)
