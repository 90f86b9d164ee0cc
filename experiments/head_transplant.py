"""One backbone's body with another's MLM head: the control that tells a head made large by pretraining
from a body that pretraining changed (experiments/repro_heads.py's `transplants`).

    python experiments/head_transplant.py --body A/model --head B/model --out C/model [--parts decoder]
        [--centre-rows]

Both checkpoints share the architecture and the vocabulary. The result keeps A's embeddings and blocks and
takes B's whole MLM head (transform and decoder; --parts decoder: the decoder's matrix and bias only), untied.
--centre-rows takes the rows' mean m out of the decoder matrix: every logit of a token moves by the same h.m,
which softmax (the MLM loss) does not see but SPLADE's relu does - a head that grew along m switches on every
term at once. Written beside `out` and renamed, so a folder named `out` is complete.
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


def transplant_head(body, head, parts="head"):
    """`body` with `head`'s MLM head (parts="decoder": its decoder's parameters only), both untied first."""
    from model import untie_mlm_head
    untie_mlm_head(body)
    untie_mlm_head(head)
    source = head.head if parts == "head" else head.head.decoder
    target = body.head if parts == "head" else body.head.decoder
    mine, theirs = dict(target.named_parameters()), dict(source.named_parameters())
    if {n: p.shape for n, p in mine.items()} != {n: p.shape for n, p in theirs.items()}:
        raise ConfigError("--head: its MLM head has other parameters or shapes than the body's "
                          f"({sorted(theirs)} against {sorted(mine)}); give two checkpoints of one architecture")
    with torch.no_grad():
        for name, p in mine.items():
            p.copy_(theirs[name])
    return body


def main(argv=None):
    from hf.models import from_pretrained, save_pretrained
    from model import mlm_head_weight
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--body", required=True, help="the checkpoint whose embeddings and blocks are kept")
    ap.add_argument("--head", required=True, help="the checkpoint whose MLM head is taken")
    ap.add_argument("--out", required=True, help="the new model folder")
    ap.add_argument("--parts", choices=("head", "decoder"), default="head",
                    help="head: the whole MLM head (transform, decoder matrix and bias); decoder: its matrix and bias")
    ap.add_argument("--centre-rows", action="store_true", help="take the mean row out of the decoder matrix")
    args = ap.parse_args(argv)
    out = Path(args.out)
    model = transplant_head(from_pretrained(args.body), from_pretrained(args.head), args.parts)
    if args.centre_rows:
        with torch.no_grad():
            w = mlm_head_weight(model)
            w.sub_(w.mean(0, keepdim=True))
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, tmp)   # the body's tokenizer files come with it (model.source)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    what = "MLM head" if args.parts == "head" else "decoder matrix and bias"
    print(f"wrote {out}: the body of {args.body}, the {what} of {args.head}"
          + (", its rows centred" if args.centre_rows else ""))


if __name__ == "__main__":
    run_cli(main)
