"""train_lm.py runs as an experiment's jobs: the config a run's arguments make, its checkpoints, and
whether it has finished. Shared by experiments/repro_mlm_clm.py and experiments/repro_heads.py."""
from pathlib import Path

import cli
import train_lm
from checkpoint import Checkpoints
from experiments.runner import Job


def parsed(argv):
    """The config train_lm.py will run with these arguments."""
    return cli.parse_config(train_lm.DEFAULTS, argv)


def checkpoint(C, step):
    return Path(C["out_dir"]) / "checkpoints" / f"step_{step:08d}"


def final_checkpoint(C):
    return checkpoint(C, C["max_steps"]) / "model"


def pretrained(C):
    """True when the run's final checkpoint is complete (then train_lm would have nothing to do)."""
    folder = checkpoint(C, C["max_steps"])
    return folder.is_dir() and Checkpoints(C["out_dir"]).problem(folder) is None


def pretrain_job(name, argv, log, needs=()):
    """The train_lm.py job of `argv`: finished when its final checkpoint is complete."""
    C = parsed(argv)
    return Job(name, "train_lm.py", argv, needs=list(needs), done=lambda: pretrained(C), log=log,
               output=Path(C["out_dir"]))
