"""The real-case reproduction (experiments/repro_heads.py) on generated text, a generated tokenizer and
generated BEIR folders, every stage for a few steps, in this process; the rule for k (train_splade.py
--k=auto, model.auto_k, model.py --inspect); and the recipe switches it needs from train_lm.py and
training.adamw (each family's own tie, which parameters are decayed, ModernBERT's windowed layers)."""
import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import cli
import model as M
from hf.models import from_pretrained
import train_lm
import train_splade as S
import training
from cli import ConfigError
from test_repro_splade import write_beir
from test_splade import make_corpus, write_data, write_tiny_model, write_tokenizer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# ---------------------------------------------------------------- train_lm's recipe switches


def lm_cfg(**over):
    return {**train_lm.DEFAULTS, "vocab_size": 64, "d_model": 16, "n_layers": 3, "n_heads": 2, "d_ff": 32,
            "max_seq_len": 32, **over}


@pytest.mark.parametrize("family, tied", [("bert", True), ("modernbert", True), ("eurobert", False), ("llama", False)])
def test_a_model_from_scratch_has_its_family_s_own_tie_unless_the_config_says(family, tied):
    """train_lm's default used to be tie_embeddings=False, which untied BERT and ModernBERT too."""
    assert train_lm.DEFAULTS["tie_embeddings"] is None
    assert train_lm.model_config(lm_cfg(family=family)).tie_embeddings is tied
    assert train_lm.model_config(lm_cfg(family=family, tie_embeddings=not tied)).tie_embeddings is (not tied)
    m = M.Transformer(train_lm.model_config(lm_cfg(family=family)))
    assert (m.head.decoder.weight is m.embed.tok.weight) is tied


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_tied_model_built_on_the_meta_device_stays_tied(family):
    """train_lm builds on the meta device, then to_empty: that gave the decoder its own tensor, so a
    tied head trained apart from the word embeddings, and only the embeddings were saved."""
    cfg = lm_cfg(family=family)
    with torch.device("meta"):
        m = M.Transformer(train_lm.model_config(cfg))
    train_lm.init_weights(m, cfg, "cpu")
    assert m.head.decoder.weight is m.embed.tok.weight
    reference = M.Transformer(train_lm.model_config(cfg))
    reference.init_weights(torch.Generator().manual_seed(cfg["seed"]))
    assert torch.equal(m.embed.tok.weight, reference.embed.tok.weight), "the same draws as a model built on the CPU"


def test_tie_embeddings_and_decay_params_are_checked():
    for bad in (dict(tie_embeddings="yes"), dict(decay_params="embeddings"), dict(global_every=0)):
        (key, value), = bad.items()
        with pytest.raises(ConfigError, match=f"{key}={value!r}"):  # each key named with its value
            train_lm.check_config(lm_cfg(**bad))
    train_lm.check_config(lm_cfg(tie_embeddings=False, decay_params="all"))


def test_modernbert_s_windowed_layers_from_window_and_global_every():
    arch = train_lm.model_config(lm_cfg(family="modernbert", n_layers=4, window=8))
    assert (arch.window, arch.local_layers) == (8, (1, 2)), "layers i % 3 != 0 are local, as ModernBERT's"
    assert train_lm.model_config(lm_cfg(family="modernbert")).local_layers == (), "window=0: every layer global"


@pytest.mark.parametrize("decay_params, decayed", [
    ("matrices", {"layers.0.attn.qkv.weight"}),
    ("matrices+embeddings", {"layers.0.attn.qkv.weight", "embed.tok.weight", "embed.pos.weight"}),
    ("all", {"layers.0.attn.qkv.weight", "embed.tok.weight", "embed.pos.weight", "embed.norm.weight",
             "layers.0.attn.qkv.bias", "head.decoder.bias"}),
])
def test_adamw_decays_the_parameters_the_recipe_names(decay_params, decayed):
    m = M.Transformer(train_lm.model_config(lm_cfg(family="bert")))
    opt = training.adamw(m, 1e-3, 0.1, decay_params=decay_params)
    names = {id(p): n for n, p in m.named_parameters()}
    groups = {g["weight_decay"]: {names[id(p)] for p in g["params"]} for g in opt.param_groups}
    assert decayed <= groups[0.1], decayed - groups[0.1]
    assert not decayed & groups[0.0]
    if decay_params != "all":
        assert "embed.norm.weight" in groups[0.0] and "head.decoder.bias" in groups[0.0]
    if decay_params == "matrices":
        assert "embed.tok.weight" in groups[0.0], "the old behaviour stays the default"


# ---------------------------------------------------------------- the rule for k


def test_auto_k_on_emulated_heads_gives_m(shared_data):
    """splade-tiny's head times m, with the rule's target at the unscaled head's norm: k = m."""
    base = M.head_norms(from_pretrained(shared_data / "models" / "splade-tiny"))["mean_row_l2"]
    for m in (1.0, 4.0, 16.0, 0.5):
        model = from_pretrained(shared_data / "models" / "splade-tiny")
        rec = S.rescale_backbone(model, "auto", False, head_scale=m, k_target=base)
        assert rec["k"] == pytest.approx(m, abs=1e-6) and rec["k_target"] == base
        assert rec["after"]["mean_row_l2"] == pytest.approx(base, rel=1e-6)


def test_auto_k_on_a_head_whose_norm_the_test_sets(tmp_path):
    model = from_pretrained(write_tiny_model(tmp_path / "m", "eurobert", tie_embeddings=False, decoder_bias=True))
    with torch.no_grad():
        w = M.mlm_head_weight(model)
        w.copy_(torch.nn.functional.normalize(torch.randn_like(w), dim=1) * 3.0)   # every row of L2 norm 3
    rec = S.rescale_backbone(model, "auto", False, k_target=0.75)
    assert rec["k"] == pytest.approx(4.0, rel=1e-6) and rec["scaled"]["mean_row_l2"] == pytest.approx(3.0, rel=1e-6)
    assert M.head_norms(model)["mean_row_l2"] == pytest.approx(0.75, rel=1e-6)
    given = S.rescale_backbone(model, 2.0, False)
    assert given["k"] == 2.0 and given["k_target"] is None


def test_train_splade_k_auto_records_and_logs_the_k_it_picked(tmp_path, capsys):
    folder, _, _ = write_data(tmp_path / "data", n_train=16, n_test=4)
    init = write_tiny_model(tmp_path / "m", "modernbert")
    expected = M.head_norms(from_pretrained(init))["mean_row_l2"] * 3 / 0.2
    out = tmp_path / "run"
    S.main([f"--init={init}", f"--train_data={folder / 'train.tsv'}", f"--out_dir={out}", "--k=auto",
            "--k_target=0.2", "--head_scale=3", "--max_steps=1", "--batch_size=4", "--eval_interval=0",
            "--device=cpu", "--dtype=float32", "--compile=False", "--log_interval=1", "--warmup_steps=0"])
    rec = json.loads((out / "head_norms.json").read_text())
    assert rec["k"] == pytest.approx(expected, rel=1e-5) and rec["k_target"] == 0.2
    assert rec["after"]["mean_row_l2"] == pytest.approx(0.2, rel=1e-5)
    logged = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert next(r for r in logged if "rescaling" in r)["rescaling"]["k"] == pytest.approx(expected, rel=1e-5)
    assert f"/ k={expected:g} (--k=auto: mean row L2" in capsys.readouterr().out
    saved = json.loads(next((out / "checkpoints").glob("step_*/trainer.json")).read_text())
    assert saved["config"]["k"] == "auto"


def test_k_words_and_numbers(tmp_path):
    import cli
    C = cli.parse_config(S.DEFAULTS, ["--k=auto"], words={"k": ("auto",)})
    S.check_config(C)
    assert cli.parse_config(S.DEFAULTS, ["--k=4"], words={"k": ("auto",)})["k"] == 4.0
    with pytest.raises(ConfigError, match="or one of: auto"):
        cli.parse_config(S.DEFAULTS, ["--k=automatic"], words={"k": ("auto",)})
    with pytest.raises(ConfigError, match="--k_target 0"):
        S.check_config({**C, "k_target": 0.0})


def test_inspect_prints_the_rule_s_k(tmp_path, capsys):
    from hf.models import inspect_main
    init = write_tiny_model(tmp_path / "m", "bert")
    norm = M.head_norms(from_pretrained(init))["mean_row_l2"]
    inspect_main(["--inspect", str(init), "--k-target", "0.25"])
    assert f"k the rule picks (train_splade.py --k=auto): {norm / 0.25:.4f} = mean row L2 {norm:.4f} / k_target 0.25" \
        in capsys.readouterr().out
    inspect_main(["--inspect", str(init)])
    assert f"{norm / M.K_TARGET:.4f} = mean row L2 {norm:.4f} / k_target {M.K_TARGET:g}" in capsys.readouterr().out


# ---------------------------------------------------------------- the driver


def generated_texts(tmp_path, rng):
    """text.txt (the pretraining text) and two BEIR folders, (train: titled documents, held out:
    documents and queries), of the test vocabulary."""
    docs, _ = make_corpus(rng, 300)
    (tmp_path / "text.txt").write_text("\n\n".join(docs) + "\n")
    train_docs, titles = make_corpus(rng, 40)
    test_docs, test_queries = make_corpus(rng, 20)
    return (write_beir(tmp_path / "train", train_docs, titles=titles),
            write_beir(tmp_path / "heldout", test_docs, test_queries))


def test_repro_heads_runs_every_stage_then_resumes_without_rerunning(tmp_path, monkeypatch):
    import experiments.repro_heads as H
    tok = tmp_path / "tok"
    tok.mkdir()
    V = write_tokenizer(tok)
    train, heldout = generated_texts(tmp_path, random.Random(0))
    out = tmp_path / "out"
    tiny = ["--vocab_size=%d" % V, "--bos_id=2", "--mask_id=4", "--pad_id=0", "--d_model=16", "--n_heads=2",
            "--n_kv_heads=2", "--d_ff=32", "--n_layers=3", "--seq_len=16", "--max_seq_len=64", "--batch_size=2",
            "--max_steps=4", "--ckpt_interval=2", "--eval_interval=2", "--eval_batches=1", "--log_interval=1",
            "--warmup_steps=1"]
    argv = [str(ROOT / "configs" / "repro_heads.py"), f"--out_dir={out}", f"--text={tmp_path / 'text.txt'}",
            f"--tokenizer={tok}", "--delimiter=[CLS]", "--shard_tokens=1000", f"--pretrain_args={tiny}",
            "--ablations={'modernbert_untied': ('modernbert', ['--tie_embeddings=False'])}", "--heads_tokens=256",
            f"--train_beir={train}", f"--eval_beir={heldout}", "--ks=[1, 'auto']", "--jobs=0",
            "--eval_max_len=32", "--eval_query_max_len=16",
            "--train_args=['--max_steps=2', '--batch_size=8', '--query_max_len=16', '--doc_max_len=32', "
            "'--lambda_warmup=1', '--warmup_steps=1', '--ckpt_interval=2', '--k_target=0.5']"]
    record = H.main(argv)

    runs = {r["run"]: r for r in record["pretraining"]}
    assert list(runs) == ["bert", "modernbert", "eurobert", "modernbert_untied"]
    assert {n: r["tied"] for n, r in runs.items()} == {"bert": True, "modernbert": True, "eurobert": False,
                                                       "modernbert_untied": False}
    heads = json.loads((out / "heads.json").read_text())
    for name, r in runs.items():
        assert sorted(heads[name], key=int) == ["0", "2", "4"] and r["steps"] == 4
        # independent of the driver: the checkpoint's own decoder weight
        m = from_pretrained(out / "pretrain" / name / "checkpoints" / "step_00000004" / "model")
        w = m.head.decoder.weight.detach()
        assert heads[name]["4"]["mean_row_l2"] == pytest.approx(w.norm(dim=1).mean().item(), rel=1e-6)
        assert heads[name]["4"]["rule_k"] == pytest.approx(w.norm(dim=1).mean().item() / 0.5, rel=1e-6)
        assert heads[name]["4"]["logit_rms"] > 0 and 0 < heads[name]["4"]["logit_positive"] < 1
        # the part every row shares (their mean) and what is left of each row without it
        shared = w.double().mean(0)
        assert heads[name]["4"]["shared_row_l2"] == pytest.approx(shared.norm().item(), rel=1e-5)
        assert heads[name]["4"]["centred_row_l2"] == pytest.approx((w.double() - shared).norm(dim=1).mean().item(),
                                                                   rel=1e-5)
    # step 0 is the seed's initialisation: the same for the tied recipes' shared matrix at N(0, 0.02)
    assert heads["bert"]["0"]["mean_row_l2"] == pytest.approx(0.02 * 16 ** 0.5, rel=0.2)
    assert runs["modernbert"]["decay_params"] == "matrices+embeddings" and runs["eurobert"]["decay_params"] == "all"

    rows = {r["run"]: r for r in record["splade"]}
    assert list(rows) == ["bert_k1", "bert_kauto", "modernbert_k1", "modernbert_kauto", "eurobert_k1", "eurobert_kauto"]
    for b in ("bert", "modernbert", "eurobert"):
        auto, one = rows[f"{b}_kauto"], rows[f"{b}_k1"]
        assert auto["status"] == "done" and one["status"] == "done" and auto["k_rule"] and not one["k_rule"]
        assert auto["k"] == pytest.approx(heads[b]["4"]["mean_row_l2"] / 0.5, rel=1e-5)
        assert auto["head_row_l2"] == pytest.approx(0.5, rel=1e-5) and one["k"] == 1
    rules = {r["backbone"]: r for r in record["rule_vs_grid"]}
    assert rules["bert"]["chosen_k"] == 1 and rules["bert"]["rule_k"] == rows["bert_kauto"]["k"]
    md = (out / "results.md").read_text()
    assert f"| bert_kauto | 1 | auto: {rows['bert_kauto']['k']:.2f} |" in md and "| modernbert_untied | modernbert |" in md

    def no_run(*args, **kwargs):
        raise AssertionError(f"ran again: {args}")
    import train_splade
    from data import fineweb_edu
    from eval import retrieval
    for module in (train_lm, train_splade, retrieval, fineweb_edu):
        monkeypatch.setattr(module, "main", no_run)
    again = H.main(argv)
    assert again["splade"] == record["splade"] and again["pretraining"] == record["pretraining"]

    # the driver plans again each time a job ends: a pretraining run's checkpoint is checked (hashed) once per
    # plan, not once per SPLADE run on it (before: 6 checks of 4 runs here; 150 on the real config, 11 s of CPU)
    from experiments import pretraining
    checked, real = [], pretraining.pretrained
    monkeypatch.setattr(pretraining, "pretrained", lambda C: checked.append(C["out_dir"]) or real(C))
    C = cli.parse_config(H.DEFAULTS, argv, script=H.__file__)
    H.check(C)
    assert len(H.plan(C, out)) > len(runs) and sorted(checked) == sorted(set(checked)) and len(checked) == len(runs)


def test_repro_heads_names_a_bad_ablation_and_backbone(tmp_path):
    import experiments.repro_heads as H
    here = [f"--out_dir={tmp_path}", *(f"--{key}={tmp_path}" for key in ("tokenizer", "text", "train_beir", "eval_beir"))]
    # (paths that exist, with or without ../shared: the checks under test come before any is read)
    with pytest.raises(ConfigError, match=r"ablations\['x'\].*a recipe of"):
        H.main([*here, "--ablations={'x': ('roberta', [])}", "--action=table"])
    with pytest.raises(ConfigError, match="splade_backbones: 'x' is not a pretraining run"):
        H.main([*here, "--splade_backbones=['x']", "--action=table"])
    with pytest.raises(ConfigError, match="splade_backbones: 'x@50' is not a pretraining run"):
        H.main([*here, "--splade_backbones=['x@50']", "--action=table"])
    for step in ("75", "0", "450", "last"):   # bert keeps a checkpoint every 50 steps up to 400
        with pytest.raises(ConfigError, match=rf"'bert@{step}': bert keeps a checkpoint every 50 steps up to 400"):
            H.main([*here, f"--splade_backbones=['bert@{step}']", "--action=table"])


# ---------------------------------------------------------------- the driver, continued pretraining


def test_repro_heads_continues_a_checkpoint_transplants_heads_and_runs_two_seeds(tmp_path, monkeypatch):
    """configs/repro_heads_cpt.py's route on generated data: every recipe continues one checkpoint
    (--init), a transplant takes one run's body and another's head, each condition has two SPLADE
    seeds, and the gate and the per-condition table come from them. Then the same command runs nothing."""
    import experiments.repro_heads as H
    init = write_tiny_model(tmp_path / "init", "bert", d_model=16, n_heads=2, d_ff=32, max_seq_len=64)
    train, heldout = generated_texts(tmp_path, random.Random(1))
    out = tmp_path / "out"
    tiny = ["--bos_id=2", "--mask_id=4", "--seq_len=16", "--batch_size=2", "--max_steps=4", "--ckpt_interval=2",
            "--eval_interval=2", "--eval_batches=1", "--log_interval=1", "--warmup_steps=1"]
    argv = [str(ROOT / "configs" / "repro_heads_cpt.py"), f"--out_dir={out}", f"--text={tmp_path / 'text.txt'}",
            f"--tokenizer={init}", f"--init={init}", "--shard_tokens=1000", f"--pretrain_args={tiny}",
            "--transplants={'bert_body_modernbert_head': ('bert', 'modernbert')}", "--heads_tokens=256",
            # the published-peak candidates too, which round 3's config leaves out (this machine's time)
            "--recipes={'bert': 'configs/repro_heads_cpt_bert.py', 'modernbert': 'configs/repro_heads_cpt_modernbert.py',"
            " 'roberta': 'configs/repro_heads_cpt_roberta.py'}",
            "--ablations={'bert_head_lr8': ('bert', ['--tie_embeddings=False', '--head_lr_scale=8']),"
            " 'modernbert_peak': ('modernbert', ['--lr=8e-4', '--weight_decay=0.0125'])}",
            "--splade_backbones=['bert', 'bert_body_modernbert_head', 'bert@2']", "--ks=[1, 'auto']",
            "--splade_seeds=[7]", "--dev_beir=", "--backbone_ks={}", "--backbone_seeds={}", "--k_bias_backbones=[]", "--long_arm={}",
            "--eval_every_k=True", "--step0_eval=True",
            f"--train_beir={train}", f"--eval_beir={heldout}", "--jobs=0", "--eval_max_len=32", "--eval_query_max_len=16",
            "--train_args=['--max_steps=2', '--batch_size=8', '--query_max_len=16', '--doc_max_len=32', "
            "'--lambda_warmup=1', '--warmup_steps=1', '--ckpt_interval=2', '--k_target=0.5']"]
    record = H.main(argv)

    heads = json.loads((out / "heads.json").read_text())
    start = M.head_norms(from_pretrained(init))
    assert [r["run"] for r in record["pretraining"]] == ["bert", "modernbert", "roberta", "bert_head_lr8",
                                                         "modernbert_peak", "bert_body_modernbert_head"]
    for run in ("bert", "modernbert", "roberta"):   # step 0 is the checkpoint every recipe continues, not an initialisation
        assert heads[run]["0"]["mean_row_l2"] == pytest.approx(start["mean_row_l2"], rel=1e-6)
        assert sorted(heads[run], key=int) == ["0", "2", "4"] and heads[run]["4"]["family"] == "bert"
        assert 0 < heads[run]["4"]["mlm_loss"] < 20 and heads["unigram"][run] > 0
    saved = json.loads((out / "pretrain" / "modernbert" / "config.json").read_text())
    assert saved["init_from"] == str(init) and saved["lr"] == 2.4e-3 and saved["mask_ratio"] == 0.3
    ablation = json.loads((out / "pretrain" / "bert_head_lr8" / "config.json").read_text())   # BERT's recipe, its head untied at 8x
    assert (ablation["lr"], ablation["head_lr_scale"], ablation["tie_embeddings"]) == (3e-4, 8, False)
    assert heads["bert_head_lr8"]["4"]["mean_row_l2"] != heads["bert"]["4"]["mean_row_l2"]
    peak = json.loads((out / "pretrain" / "modernbert_peak" / "config.json").read_text())   # ModernBERT's published peak
    assert (peak["lr"], peak["lr"] * peak["weight_decay"]) == (8e-4, pytest.approx(1e-5))
    roberta = json.loads((out / "pretrain" / "roberta" / "config.json").read_text())
    assert (roberta["lr"], roberta["beta2"], roberta["grad_clip"], roberta["decay_params"]) == (6e-4, 0.98, 0.0, "all")

    # the transplant, against the two checkpoints' own tensors
    final = {r: from_pretrained(out / "pretrain" / r / "checkpoints" / "step_00000004" / "model")
             for r in ("bert", "modernbert")}
    hybrid = from_pretrained(out / "transplant" / "bert_body_modernbert_head" / "model")
    assert hybrid.head.decoder.weight is not hybrid.embed.tok.weight, "untied: the body's input, the other's head"
    assert torch.equal(hybrid.embed.tok.weight, final["bert"].embed.tok.weight)
    assert torch.equal(hybrid.head.decoder.weight, final["modernbert"].embed.tok.weight)
    assert torch.equal(hybrid.head.decoder.bias, final["modernbert"].head.decoder.bias)
    assert torch.equal(hybrid.layers[0].attn.qkv.weight, final["bert"].layers[0].attn.qkv.weight)
    assert heads["bert_body_modernbert_head"]["4"]["mean_row_l2"] == pytest.approx(
        final["modernbert"].head.decoder.weight.norm(dim=1).mean().item(), rel=1e-6)

    rows = {r["run"]: r for r in record["splade"]}
    assert sorted(rows) == sorted(f"{b}_k{k}{s}" for b in ("bert", "bert_body_modernbert_head", "bert@2")
                                  for k in ("1", "auto") for s in ("", "_s7"))
    assert all(r["status"] == "done" and r["untied"] for r in rows.values())
    trained = json.loads((out / "splade" / "bert_k1_s7" / "config.json").read_text())
    assert trained["seed"] == 7 and trained["untie_head"] is True
    assert rows["bert_k1"]["after"] != rows["bert_k1_s7"]["after"], "another seed, another run"
    conds = {(c["backbone"], c["k"]): c for c in record["splade_conditions"]}
    one = conds[("bert", 1)]
    ndcg = [rows["bert_k1"]["after"]["nDCG@10"], rows["bert_k1_s7"]["after"]["nDCG@10"]]
    assert (one["runs"], one["done"]) == (2, 2) and one["ndcg_0"] == pytest.approx(sum(ndcg) / 2)
    assert one["ndcg_1"] == pytest.approx(abs(ndcg[0] - ndcg[1]) / 2 ** 0.5)
    gates = {g["backbone"]: g for g in record["gate"]}
    assert gates["bert"]["mlm_loss"] == heads["bert"]["4"]["mlm_loss"]
    assert gates["bert"]["margin"] == pytest.approx(heads["unigram"]["bert"] - heads["bert"]["4"]["mlm_loss"])
    assert gates["bert"]["best_ndcg"] == max(c["ndcg_0"] for c in record["splade_conditions"] if c["backbone"] == "bert")
    # an earlier checkpoint as a backbone: its SPLADE runs start from it, its gate reads its own probe
    step2 = json.loads((out / "splade" / "bert@2_k1" / "config.json").read_text())
    assert Path(step2["init"]) == out / "pretrain" / "bert" / "checkpoints" / "step_00000002" / "model"
    assert gates["bert@2"]["mlm_loss"] == heads["bert"]["2"]["mlm_loss"] != gates["bert"]["mlm_loss"]
    assert gates["bert@2"]["unigram_loss"] == gates["bert"]["unigram_loss"]
    md = (out / "results.md").read_text()
    assert "## The gate" in md and "| bert_body_modernbert_head (body bert, head modernbert) |" in md
    times = md.split("Job time ")[1]   # the jobs' own time per stage, beside the invocations' wall time
    for stage, n in (("corpus", 1), ("pretraining", 5), ("transplants", 1), ("SPLADE training", 12),
                     ("SPLADE evaluations", 12)):
        assert re.search(rf"{stage}: \d+\.\d min, {n} job\(s\)", times), (stage, times)
    assert re.search(r"SPLADE step-0 evaluations: \d+\.\d min, \d+ job\(s\)\); wall time \d+\.\d min over 1 "
                     r"invocation\(s\)", times), times

    def no_run(*args, **kwargs):
        raise AssertionError(f"ran again: {args}")
    import train_splade
    from data import fineweb_edu
    from eval import retrieval
    from experiments import head_transplant
    for module in (train_lm, train_splade, retrieval, fineweb_edu, head_transplant):
        monkeypatch.setattr(module, "main", no_run)
    again = H.main(argv)
    assert again["splade"] == record["splade"] and again["gate"] == record["gate"]
    assert json.loads((out / "heads.json").read_text()) == heads, "the same measurement: every record kept"
    H.main([*argv, "--heads_tokens=128"])   # other held-out texts: every head measured again, nothing trained
    fewer = json.loads((out / "heads.json").read_text())
    for run in ("bert", "bert_body_modernbert_head"):
        assert all(fewer[run][s]["source"] != heads[run][s]["source"] for s in heads[run])
    assert fewer["bert"]["4"]["mlm_loss"] != heads["bert"]["4"]["mlm_loss"]


def test_repro_heads_round3_chooses_k_on_dev_moves_heads_and_publishes_rows_a_reader_can_check(tmp_path, monkeypatch):
    """configs/repro_heads_cpt.py as it stands (round 3), at a tiny width on generated data: k is chosen
    on two dev benchmarks (by the mean of their nDCG@10 over the seeds, read here from the runs' own
    metrics.json files), eval_beir evaluates k = 1, the rule's k and the chosen k only, the long arm
    trains the chosen k longer, the transplants take the head alone (whole, centred, decoder only),
    k_bias divides the bias, a registered rule k that the run does not pick is reported, and
    action=publish writes rows from which the tables are made again exactly."""
    import experiments.repro_heads as H
    from experiments import runner
    init = write_tiny_model(tmp_path / "init", "bert", d_model=16, n_heads=2, d_ff=32, max_seq_len=64)
    train, heldout = generated_texts(tmp_path, random.Random(2))
    devs = []
    for name, seed in (("dev_a", 3), ("dev_b", 4)):
        docs, queries = make_corpus(random.Random(seed), 20)
        devs.append(write_beir(tmp_path / name, docs, queries))
    out = tmp_path / "out"
    tiny = ["--bos_id=2", "--mask_id=4", "--seq_len=16", "--batch_size=2", "--max_steps=4", "--ckpt_interval=2",
            "--eval_interval=2", "--eval_batches=1", "--log_interval=1", "--warmup_steps=1"]
    modern = ["bert_body_modernbert_head", "bert_body_modernbert_head_centred", "bert_body_modernbert_decoder"]
    argv = [str(ROOT / "configs" / "repro_heads_cpt.py"), f"--out_dir={out}", f"--text={tmp_path / 'text.txt'}",
            f"--tokenizer={init}", f"--init={init}", "--shard_tokens=1000", f"--pretrain_args={tiny}",
            "--heads_tokens=256", f"--splade_backbones={['bert', 'bert_body_lr8_head', *modern]}", "--ks=[1, 2, 'auto']",
            f"--backbone_ks={ {b: [1, 2] for b in modern} }", f"--backbone_seeds={ {b: [] for b in modern} }", "--k_bias_backbones=['bert_body_modernbert_head']",
            "--splade_seeds=[7]", f"--dev_beir={devs[0]},{devs[1]}",
            "--long_arm={'backbones': ['bert'], 'max_steps': 3, 'ks': [1, 'dev'], 'seeds': []}", "--rule_k_registered={'bert': 99.0}",
            f"--train_beir={train}", f"--eval_beir={heldout}", "--jobs=0", "--eval_max_len=32", "--eval_query_max_len=16",
            "--dev_max_len=24", "--train_args=['--max_steps=2', '--batch_size=8', '--query_max_len=16', "
            "'--doc_max_len=32', '--lambda_warmup=1', '--warmup_steps=1', '--ckpt_interval=2', '--k_target=0.5']"]
    record = H.main(argv)
    splade = out / "splade"
    rows = {r["run"]: r for r in record["splade"]}

    # k chosen on dev: the mean over the seeds of the mean over the two dev benchmarks, from the files
    def dev_score(run):
        m = json.loads((splade / run / "dev" / "metrics.json").read_text())
        assert m["max_len"] == 24 and sorted(m["datasets"]) == ["dev_a", "dev_b"]
        return sum(d["mean"]["nDCG@10"] for d in m["datasets"].values()) / 2
    for b in ("bert", "bert_body_lr8_head", *modern, "bert_body_modernbert_head+k_bias"):
        ks, seeds = [1, 2], ["", "_s7"] if b in ("bert", "bert_body_lr8_head") else [""]   # backbone_seeds: one
        assert not any(f"{b}_k{k}_s7" in rows for k in ks) == (seeds == [""]), b
        score = {k: sum(dev_score(f"{b}_k{k}{s}") for s in seeds) / len(seeds) for k in ks}
        best = min(score, key=lambda k: (-score[k], k))
        assert record["chosen_k"][b] == best, b
        # eval_beir at k = 1, the rule's k and the chosen one only
        for k in ks:
            assert (splade / f"{b}_k{k}" / "eval" / "metrics.json").exists() == (k in (1, best)), (b, k)
    assert (splade / "bert_kauto" / "eval" / "metrics.json").exists()
    assert all(r["status"] == "done" for r in rows.values()), {n: r["status"] for n, r in rows.items()}
    assert not (splade / "step0").exists(), "step0_eval=False: no starting model saved or evaluated"
    # the long arm: k = 1 and the chosen k, trained max_steps, evaluated on eval_beir only; its seeds=[]: the
    # config's seed alone, where bert's grid has two
    chosen = record["chosen_k"]["bert"]
    long_runs = sorted(n for n in rows if n.startswith("bert_3steps"))
    assert long_runs == sorted({f"bert_3steps_k{k}" for k in (1, chosen)})
    for n in long_runs:
        assert json.loads((splade / n / "config.json").read_text())["max_steps"] == 3 and rows[n]["steps"] == 3
        assert (splade / n / "eval" / "metrics.json").exists() and not (splade / n / "dev").exists()

    # the transplants: the head alone, whole, centred and its decoder only
    final = lambda r: from_pretrained(out / "pretrain" / r / "checkpoints" / "step_00000004" / "model")   # noqa: E731
    bert, lr8, modernbert = final("bert"), final("bert_head_lr8"), final("modernbert")
    t = {name: from_pretrained(out / "transplant" / name / "model") for name in ("bert_body_lr8_head", *modern)}
    assert torch.equal(t["bert_body_lr8_head"].head.decoder.weight, lr8.head.decoder.weight)
    assert torch.equal(t["bert_body_lr8_head"].embed.tok.weight, bert.embed.tok.weight)
    centred, whole = t["bert_body_modernbert_head_centred"], t["bert_body_modernbert_head"]
    assert centred.head.decoder.weight.mean(0).abs().max() < 1e-6
    assert torch.allclose(centred.head.decoder.weight, whole.head.decoder.weight - whole.head.decoder.weight.mean(0))
    ids = torch.randint(5, 60, (2, 12))
    with torch.no_grad():   # a shift every logit of a token shares: softmax, and so the MLM loss, cannot see it
        assert torch.allclose(torch.log_softmax(centred(ids), -1), torch.log_softmax(whole(ids), -1), atol=1e-4)
        assert not torch.allclose(centred(ids), whole(ids), atol=1e-3)
    decoder = t["bert_body_modernbert_decoder"]
    assert torch.equal(decoder.head.transform[0].weight, bert.head.transform[0].weight)
    assert torch.equal(decoder.head.decoder.weight, modernbert.embed.tok.weight)
    assert torch.equal(decoder.head.decoder.bias, modernbert.head.decoder.bias)
    # k_bias: the run's bias divided by its k too, the grid's kept
    norms = {n: json.loads((splade / n / "head_norms.json").read_text())
             for n in ("bert_body_modernbert_head_k2", "bert_body_modernbert_head+k_bias_k2")}
    kept, divided = norms["bert_body_modernbert_head_k2"], norms["bert_body_modernbert_head+k_bias_k2"]
    assert kept["after"]["bias_l2"] == pytest.approx(kept["before"]["bias_l2"])
    assert divided["after"]["bias_l2"] == pytest.approx(divided["before"]["bias_l2"] / 2, rel=1e-5)
    md = (out / "results.md").read_text()
    assert f"note: bert: the rule picked k = {rows['bert_kauto']['k']:.2f}, not the 99.00 registered" in md
    assert "## The long arm" in md and "| bert_body_modernbert_head+k_bias |" in md.split("## nDCG@10 on dev_beir")[1]

    # published: rows with the commit and date of their jobs, and the tables made again from them alone
    monkeypatch.setattr(runner, "RESULTS", tmp_path / "results")
    H.main([*argv, "--action=publish"])
    folder = tmp_path / "results" / "out"
    lines = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()]
    assert sorted(r["run"] for r in lines) == sorted(rows)
    assert all(r["made"]["ended"] and re.fullmatch(r"[0-9a-f]{12}", r["made"]["commit"] or "") for r in lines)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["published"]["driver"] == "experiments/repro_heads.py"
    again = H.tables(runner.read_published(folder, "splade"))
    assert again == runner.published_tables(folder) and "grid" in again and "dev grid" in again

    # a later session, whose out/ has lost the dev numbers (the committed rows hold them): the plan still knows
    # the chosen k, so it plans the long arm and the chosen k's evaluation
    for dev in splade.glob("*/dev"):
        shutil.rmtree(dev)
    C = cli.parse_config(H.DEFAULTS, argv, script=H.__file__)
    planned = {r["name"]: r for r in H.splade_runs(C, H.configs_of(C, out), out)}
    assert set(long_runs) <= set(planned) and planned[f"bert_k{chosen}"]["eval"]


def test_the_mlm_probe_and_the_unigram_model(tmp_path):
    """The probe masks the same tokens for every backbone (BERT's rule, a fixed draw) and never a
    special id; the unigram loss is the add-one unigram model's, computed by hand here."""
    import numpy as np
    import experiments.repro_heads as H
    from data.shards import write_shard
    ids = torch.randint(5, 50, (8, 32))
    ids[:, 0] = 2
    cfg = {"bos_id": 2, "eos_id": -1, "pad_id": 0, "mask_id": 4, "vocab_size": 50}
    x, y = H.mlm_probe(ids, cfg)
    x2, y2 = H.mlm_probe(ids, cfg)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    chosen = y != -100
    assert not chosen[:, 0].any() and 0.05 < chosen.float().mean() < 0.3
    assert torch.equal(y[chosen], ids[chosen]) and (x[chosen] == 4).float().mean() > 0.6
    tokens = np.array([5, 5, 5, 6, 7], dtype=np.uint16)
    write_shard(tmp_path / "t_train_000000.bin", tokens)
    labels = torch.tensor([[5, -100, 6, 9]])
    expected = -(np.log(4 / 55) + np.log(2 / 55) + np.log(1 / 55)) / 3   # (count + 1) / (5 + 50)
    assert H.unigram_loss(str(tmp_path / "t_train_*.bin"), labels, 50) == pytest.approx(expected)


def test_a_transplant_of_another_architecture_is_refused(tmp_path):
    from experiments.head_transplant import transplant_head
    a = from_pretrained(write_tiny_model(tmp_path / "a", "bert"))
    b = from_pretrained(write_tiny_model(tmp_path / "b", "modernbert"))
    with pytest.raises(ConfigError, match="other parameters or shapes"):
        transplant_head(a, b)


# ---------------------------------------------------------------- the head's own learning rate


def test_head_lr_scale_moves_the_untied_head_alone_faster(tmp_path):
    """train_lm --init_from a tied checkpoint with tie_embeddings=False continues it untied, and
    head_lr_scale=8 makes the head's first AdamW step 8x the body's rate: the decoder's (and the
    transform's) change is 8x the one at scale 1, every other parameter's the same."""
    from data.shards import write_shard
    init = write_tiny_model(tmp_path / "init", "bert", d_model=16, n_heads=2, d_ff=32, max_seq_len=32)
    vocab = from_pretrained(init).config.vocab_size
    ids = np.random.default_rng(0).integers(5, vocab, size=4000)
    for split, part in (("train", ids[:3000]), ("val", ids[3000:])):
        write_shard(tmp_path / f"s_{split}_000000.bin", part, vocab_size=vocab)
    start = from_pretrained(init)

    def step_one(scale):
        out = tmp_path / f"scale{scale}"
        train_lm.main([f"--init_from={init}", "--tie_embeddings=False", f"--head_lr_scale={scale}", "--objective=mlm",
                       "--mask_id=4", "--bos_id=2", f"--train_shards={tmp_path / 's_train_*.bin'}",
                       f"--val_shards={tmp_path / 's_val_*.bin'}", f"--out_dir={out}", "--seq_len=16", "--batch_size=4",
                       "--max_steps=1", "--warmup_steps=0", "--lr=1e-3", "--weight_decay=0", "--eval_interval=0",
                       "--ckpt_interval=1", "--device=cpu", "--dtype=float32", "--compile=False"])
        return from_pretrained(out / "checkpoints" / "step_00000001" / "model")
    one, eight = step_one(1), step_one(8)
    assert one.head.decoder.weight is not one.embed.tok.weight and not eight.config.tie_embeddings, "untied"
    before = dict(start.named_parameters())
    before["head.decoder.weight"] = start.embed.tok.weight   # the tied matrix both copies start from
    for (name, a), (_, b) in zip(one.named_parameters(), eight.named_parameters()):
        moved_1, moved_8 = (a - before[name]).abs().max().item(), (b - before[name]).abs().max().item()
        if name.startswith("head."):
            assert moved_1 > 0 and moved_8 == pytest.approx(8 * moved_1, rel=1e-3), name
        else:
            assert torch.equal(a, b), f"{name}: the body's first step does not depend on the head's rate"
    with pytest.raises(ConfigError, match="head_lr_scale=0"):
        train_lm.check_config({**train_lm.DEFAULTS, "head_lr_scale": 0})
