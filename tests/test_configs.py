"""Every config in configs/ builds, trains 4 steps (an evaluation and a checkpoint at step 2 and at
step 4) and leaves a loadable checkpoint - at a tiny width, on the CPU, in seconds - so that a
config can never again crash only at scale (as configs/llama_7b_* did, at their first checkpoint
after an evaluation under FSDP).

Only sizes, paths and the device change (TINY_KEYS; the test checks that nothing else did): the
family, objective, CLM -> MLM fraction, SimReg, experts, FSDP, gradient accumulation, schedule,
tied embeddings, GQA ratio, whether the run evaluates, k, the loss weights... are the config's
own. Hugging Face specs (init, init_from, tokenizer) stay as written and are served by the fake
Hub as a tiny model of the same family (HUB_STANDINS). Training data are generated: token shards,
triplets (with teacher margins when the config's losses need them) and a BEIR folder.

A config is read by the script whose settings hold every key it sets: train_lm.py, train_splade.py or
an experiment driver (configs/splade_sweep.py drives experiments/splade_sweep.py; the drivers' own
tests run them at a tiny size)."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

import procs
import train_lm
import train_splade
import cli
import checkpoint
from data.shards import write_shard
from fakehub import fake_hub  # noqa: F401 - a fixture
from hf.models import HF_FAMILIES, from_pretrained
from test_driver_inputs import driver_modules, driver_of
from test_splade import write_data, write_tiny_model

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.py") if p.name != "__init__.py")
SCRIPTS = {"train_lm": train_lm.DEFAULTS, "train_splade": train_splade.DEFAULTS,
           **{name: driver_of(module).defaults for name, module in driver_modules().items()}}
READ_BY = {n: [s for s, keys in SCRIPTS.items() if set(cli.config_file(ROOT / "configs" / n)) <= set(keys)]
           for n in CONFIGS}
# train_lm configs that take their data, tokenizer and init_from from a driver's earlier steps
# (experiments/repro_mlm_clm.py; experiments/repro_heads.py with configs/repro_heads_cpt.py): the
# drivers' tests (tests/test_repro_mlm_clm.py, tests/test_repro_heads.py) run each at a tiny width
DRIVEN = tuple(n for n in CONFIGS if n.startswith(("repro_mlm_clm_", "repro_heads_cpt_")))
SPLADE = [n for n in CONFIGS if READ_BY[n] == ["train_splade"]]
LM = [n for n in CONFIGS if READ_BY[n] == ["train_lm"] and n not in DRIVEN]
V, STEPS = 512, 4  # the vocabulary holds the tiny stand-in tokenizers (405 ids)
# Hub repos named by configs -> the family of the tiny stand-in the fake Hub serves under that name
HUB_STANDINS = {"EuroBERT/EuroBERT-210m": "eurobert", "answerdotai/ModernBERT-base": "modernbert",
                "jhu-clsp/ettin-encoder-17m": "modernbert"}
# what the tiny runs may change: sizes, lengths, step counts, paths, device and precision
TINY_KEYS = {"out_dir", "train_shards", "val_shards", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
             "d_ff", "max_seq_len", "seq_len", "batch_size", "max_steps", "log_interval", "eval_interval",
             "eval_batches", "ckpt_interval", "simreg_chunk", "bos_id", "eos_id", "pad_id", "mask_id",
             "angle_min_count", "compile", "device", "dtype", "init_from",  # init_from: a local folder only
             # train_splade
             "train_data", "max_train_examples", "query_max_len", "doc_max_len", "eval_benchmark", "eval_max_len",
             "eval_batch_size"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Token shards, triplets (.tsv, and .jsonl with teacher margins) and a BEIR folder, shared by
    every config; and one tiny Hugging Face model folder per stand-in family."""
    root = tmp_path_factory.mktemp("config_data")
    rng = np.random.default_rng(0)
    write_shard(root / "lm_train_000000.bin", rng.integers(0, V - 4, 20_000))
    write_shard(root / "lm_val_000000.bin", rng.integers(0, V - 4, 4_000))
    folder, _, _ = write_data(root / "ir", n_train=48, n_test=16)
    rows = [line.split("\t") for line in (folder / "train.tsv").read_text().splitlines()]
    (folder / "train_margins.jsonl").write_text("".join(
        json.dumps({"query": q, "positive": p, "negative": n, "margin": float(i % 5)}) + "\n"
        for i, (q, p, n) in enumerate(rows)))
    models = {fam: write_tiny_model(root / f"standin_{fam}", family=fam, d_model=16, n_heads=2, d_ff=24,
                                  vocab_size=V)
              for fam in sorted(set(HUB_STANDINS.values()))}
    return root, folder, models


def serve_standins(C, hub, models):
    """Serve a tiny model of the right family under every hf: spec of the config."""
    for key in ("init", "init_from", "tokenizer"):
        spec = C.get(key, "")
        if isinstance(spec, str) and spec.startswith("hf:"):
            repo = spec[3:].split("@")[0]
            assert repo in HUB_STANDINS, f"{key}={spec!r}: add a tiny stand-in for {repo} to HUB_STANDINS"
            for f in sorted(models[HUB_STANDINS[repo]].iterdir()):
                hub.add_file(repo, f.name, f.read_bytes())


def tiny_special_ids(C):
    """The config's special ids moved to the top of the tiny vocabulary; unset ids stay unset and
    ids that coincide (EuroBERT: eos = pad) still coincide."""
    keys = ("bos_id", "eos_id", "pad_id", "mask_id")
    set_ids = sorted({C[k] for k in keys if C[k] >= 0})
    return {k: V - 1 - set_ids.index(C[k]) for k in keys if C[k] >= 0}


def lm_overrides(C, root, out):
    heads_per_kv = C["n_heads"] // (C["n_kv_heads"] or C["n_heads"])
    n_heads = 2 * heads_per_kv
    over = dict(out_dir=out, train_shards=root / "lm_train_*.bin", val_shards=root / "lm_val_*.bin",
                vocab_size=V, d_model=8 * n_heads, n_layers=2, n_heads=n_heads,
                n_kv_heads=2 if C["n_kv_heads"] else 0, d_ff=24, max_seq_len=16, seq_len=16, batch_size=2,
                max_steps=STEPS, log_interval=1, eval_interval=2 if C["eval_interval"] else 0, eval_batches=1,
                ckpt_interval=2, angle_min_count=1, compile=False, device="cpu", dtype="float32",
                **tiny_special_ids(C))
    if C["simreg_chunk"]:  # the same fraction of the sequence
        over["simreg_chunk"] = max(2, C["simreg_chunk"] * 16 // C["seq_len"])
    return over


def splade_overrides(C, folder, out):
    teacher = C["margin_mse_weight"] > 0 or C["kl_weight"] > 0
    return dict(out_dir=out, train_data=folder / ("train_margins.jsonl" if teacher else "train.tsv"),
                max_train_examples=0, query_max_len=8, doc_max_len=16, batch_size=4 * C["grad_accum"],
                max_steps=STEPS, log_interval=1, eval_interval=2 if C["eval_interval"] else 0,
                eval_benchmark=folder / "heldout", eval_max_len=16, eval_batch_size=8, ckpt_interval=2,
                compile=False, device="cpu", dtype="float32")


def tiny_config(script, name, over):
    """(the tiny config, its argv); fails if an override touched a structural key of the config."""
    path = str(ROOT / "configs" / name)
    argv = [path] + [f"--{k}={v}" for k, v in over.items()]
    C, tiny = (cli.parse_config(script.DEFAULTS, a) for a in ([path], argv))
    changed = {k for k in C if C[k] != tiny[k]}
    assert changed <= TINY_KEYS, f"the tiny run changed structural keys {changed - TINY_KEYS}"
    return tiny, argv


def check_checkpoint(out, step):
    folder = Path(out) / "checkpoints" / f"step_{step:08d}"
    assert checkpoint.Checkpoints(out).problem(folder) is None
    return folder


def test_every_config_is_read_by_one_script():
    """A config's keys are one script's settings: a mistyped key would hide it from the tests below."""
    assert {n: scripts for n, scripts in READ_BY.items() if len(scripts) != 1} == {}


@pytest.mark.parametrize("name", LM)
def test_lm_config_trains_and_saves_at_a_tiny_width(name, data, tmp_path, fake_hub):  # noqa: F811
    root, _, models = data
    C = cli.parse_config(train_lm.DEFAULTS, [str(ROOT / "configs" / name)])
    over = lm_overrides(C, root, tmp_path)
    if C["init_from"] != "scratch" and not C["init_from"].startswith("hf:"):  # an earlier run's checkpoint (CPT)
        over["init_from"] = models[C["family"]]
    C, argv = tiny_config(train_lm, name, over)
    serve_standins(C, fake_hub, models)
    if C["fsdp"]:
        with procs.single_rank_group():  # FSDP needs a process group: one rank, as under torchrun
            train_lm.main(argv)
    else:
        train_lm.main(argv)

    recs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in recs if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1)) and all(math.isfinite(r["loss"]) for r in train)
    expected = [train_lm.step_objective(C, s) for s in range(STEPS)]
    assert [r["objective"] == "clm" for r in train] == [c for c, _ in expected]
    assert ["simreg" in r for r in train] == [s for _, s in expected]
    assert all(("moe_aux" in r) == bool(C["n_experts"]) for r in train)
    assert [r["step"] for r in recs if "val_loss" in r] == ([2, 4] if C["eval_interval"] else [])
    for step in (2, STEPS):
        folder = check_checkpoint(tmp_path, step)
        assert (folder / ("optimizer_rank0.pt" if C["fsdp"] else "optimizer.pt")).exists()
    m = from_pretrained(folder / "model")
    family = "mixtral" if C["n_experts"] and C["family"] == "llama" else C["family"]
    assert (m.config.family, m.config.n_experts) == (family, C["n_experts"])
    assert m.config.causal == HF_FAMILIES[family].hf_class.endswith("ForCausalLM")
    if C["init_from"] == "scratch":
        assert m.config.tie_embeddings == train_lm.model_config(C).tie_embeddings  # None: the family's own
    if C["tokenizer"]:
        assert (folder / "model" / "tokenizer.json").exists(), "the checkpoint ships the tokenizer"


@pytest.mark.parametrize("name", SPLADE)
def test_splade_config_trains_and_saves_at_a_tiny_width(name, data, tmp_path, fake_hub):  # noqa: F811
    _, folder, models = data
    C = cli.parse_config(train_splade.DEFAULTS, [str(ROOT / "configs" / name)])
    C, argv = tiny_config(train_splade, name, splade_overrides(C, folder, tmp_path))
    serve_standins(C, fake_hub, models)
    train_splade.main(argv)

    recs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert recs[0]["rescaling"]["k"] == C["k"]
    train = [r for r in recs if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1)) and all(math.isfinite(r["loss"]) for r in train)
    assert all(("margin_mse" in r) == (C["margin_mse_weight"] > 0 or C["kl_weight"] > 0) for r in train)
    assert [r["step"] for r in recs if "eval_nDCG@10" in r] == ([2, 4] if C["eval_interval"] else [])
    check_checkpoint(tmp_path, 2)
    check_checkpoint(tmp_path, STEPS)
    m = from_pretrained(tmp_path / "model")
    assert m.config.family == HUB_STANDINS[C["init"][3:].split("@")[0]]
