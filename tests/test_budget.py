"""What a real run costs, said before it costs: the budget line of both training scripts (tokens or
examples against what the data holds, passes, GPU-hours) and its warnings when the data repeats;
the GPU configs' sizes against their names (on the meta device); the k warning of a SPLADE run
that leaves a large head undivided; one new negative per pass of a set with several."""
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import cli
import train_lm
import train_splade
import training
from data import triplets
from data.shards import write_shard
from hf.models import from_pretrained
from model import Transformer, head_norms
from test_splade import run_args, write_data, write_tiny_model

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def test_budget_line_counts_passes_and_gpu_hours():
    line, passes = training.budget_line(40, 32, 992, "tokens", flops_per_unit=6e9, peak=1e15)
    assert passes == pytest.approx(1280 / 992)
    hours = 1280 * 6e9 / (0.4 * 1e15) / 3600
    assert "40 steps x 32 tokens = 1,280 tokens; the data holds 992 (one pass): 1.29 passes" in line
    assert f"{hours:,.1f} GPU-hours at an assumed 40% MFU" in line
    assert "GPU-hours" not in training.budget_line(40, 32, 992, "tokens", 6e9, peak=None)[0]  # a CPU: no peak


def lm_run(tmp_path, capsys, tokens, max_steps):
    """A tiny causal LM of `max_steps` steps of 2 x 16 tokens on one training shard of `tokens`."""
    write_shard(tmp_path / "s_val_000000.bin", np.arange(2_000) % 60)
    write_shard(tmp_path / "s_train_000001.bin", np.arange(tokens) % 60)
    over = dict(train_shards=tmp_path / "s_train_*.bin", val_shards=tmp_path / "s_val_*.bin", out_dir=tmp_path / "o",
                vocab_size=64, eos_id=0, batch_size=2, seq_len=16, max_seq_len=16, max_steps=max_steps,
                log_interval=0, eval_interval=0, ckpt_interval=1000, warmup_steps=1)
    train_lm.main([str(ROOT / "configs" / "tiny_lm.py")] + [f"--{k}={v}" for k, v in over.items()])
    return capsys.readouterr()


def test_train_lm_says_its_budget_and_each_new_pass(tmp_path, capsys):
    # 1 000 tokens hold (1000 - 1) // 32 = 31 batches of 2 x 16: 992 tokens a pass (the tail is skipped)
    out = lm_run(tmp_path, capsys, 1_000, 70)
    assert "budget: 70 steps x 32 tokens = 2,240 tokens; the data holds 992 (one pass): 2.26 passes" in out.out
    assert "warning: this run makes 2.26 passes over its data" in out.err
    begins = re.findall(r"warning: step (\d+): pass (\d+) over the training data begins", out.err)
    assert begins == [("32", "2"), ("63", "3")]   # steps 1-31 read pass 1, 32-62 pass 2, 63-70 pass 3


def test_train_lm_within_one_pass_warns_of_nothing(tmp_path, capsys):
    out = lm_run(tmp_path, capsys, 1_000, 31)
    assert "the data holds 992 (one pass): 1.00 passes" in out.out
    assert "pass" not in out.err


def test_train_splade_says_its_budget_in_examples(tmp_path, capsys):
    data, _, _ = write_data(tmp_path / "data", n_train=40, n_test=4)
    model = write_tiny_model(tmp_path / "m")
    train_splade.main(run_args(model, data / "train.tsv", tmp_path / "run", batch_size=16, max_steps=5))
    out = capsys.readouterr()
    assert "budget: 5 steps x 16 examples = 80 examples; the data holds 40 (one pass): 2.00 passes" in out.out
    assert re.findall(r"step (\d+): pass (\d+) over", out.err) == [("3", "2")]  # examples 32-47 hold the 41st


@pytest.mark.parametrize("head_scale", [1, 16])
def test_k1_on_a_head_the_rule_divides_says_so(tmp_path, capsys, head_scale):
    """splade-like tiny head, with the rule's target at its own row norm: scaled up 16 times and left
    at k = 1, the run says what --k=auto would do (divide by 16); unscaled, it says nothing."""
    data, _, _ = write_data(tmp_path / "data", n_train=16, n_test=4)
    model = write_tiny_model(tmp_path / "m", "bert", type_vocab_size=2)
    target = head_norms(from_pretrained(model))["mean_row_l2"]
    train_splade.main(run_args(model, data / "train.tsv", tmp_path / "run", max_steps=1, head_scale=head_scale,
                               k_target=target))
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: k=1")]
    if head_scale == 1:
        assert warned == []
    else:
        assert len(warned) == 1 and "--k=auto would divide it by 16.0" in warned[0]
        assert f"mean row L2 {16 * target:.3f}" in warned[0] and "collapse" in warned[0]


# GPU configs: the size in a name is the parameters without the input token table (an untied head counts)
GPU_CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.py") if p.name.startswith(("llama_", "moe_",
                                                                                          "eurobert_")))
PAPER_SIZES = {("llama", "1b"): 1.3e9}   # the SimReg paper's "LLaMA-1.3B" is named 1b here


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_gpu_config_has_the_size_its_name_claims(name):
    cfg = cli.parse_config(train_lm.DEFAULTS, [str(ROOT / "configs" / name)])
    size = re.search(r"_(?:\d+x)?(\d+)([mb])_", name).group(1, 2)    # moe_8x1b: each of 8 experts is a 1b model's MLP
    claim = PAPER_SIZES.get((cfg["family"], "".join(size)), int(size[0]) * {"m": 1e6, "b": 1e9}[size[1]])
    arch = train_lm.model_config(dict(cfg, n_experts=0))   # an MoE with one expert per token: its dense block
    with torch.device("meta"):
        model = Transformer(arch)
    params = model.num_params() - model.embed.tok.weight.numel()
    assert abs(params / claim - 1) < 0.05, f"{name}: {params / 1e6:.0f}M parameters, the name claims {claim / 1e6:.0f}M"
    assert arch.d_ff % 256 == 0, f"{name}: d_ff={arch.d_ff}; GPU kernels prefer a multiple of 256 (LLaMA's rounding)"


def test_each_pass_draws_another_of_a_querys_negatives():
    negatives = [f"n{j}" for j in range(8)]
    data = triplets.TrainingSet("x", ["q"], [("p", *negatives)], None)
    drawn = [data.example(0, 1, seed=3, epoch=e)[1] for e in range(10)]
    assert all(d[0] == "p" for d in drawn)
    assert sorted(d[1] for d in drawn[:8]) == negatives and drawn[8:] == drawn[:2]   # all 8 before one repeats
