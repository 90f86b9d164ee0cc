"""Every setting checked before step 1, every key classified for a resume, the choice tables
(issues 26.5, 29 and 36). Each script's SETTINGS is walked: one entry per key holds its default, its
rule (what it accepts), its class on resume (fixed or free) and its help, and everything reads that
table - check_config, --help, the resume check; a key both loops have is declared once
(training.SHARED)."""
import ast
import json
import math
from pathlib import Path

import pytest
import torch

import cli
import model as M
from hf.models import from_pretrained
import train_lm
import train_splade as S
import training
from test_splade import run_args as splade_args
from test_splade import tiny, write_tiny_model  # noqa: F401 - tiny is a fixture
from test_train_lm import args, shards  # noqa: F401 - shards is a fixture

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {"train_lm": train_lm, "train_splade": S}
pytestmark = pytest.mark.usefixtures("one_thread")


def check(script, cfg):
    return script.check_config(cfg) if script is train_lm else script.check_config(cfg, 1)


def run(main, argv, capsys):
    """(exit status, stderr) of a script's main as its command line runs it."""
    capsys.readouterr()
    try:
        cli.run_cli(main, argv)
        status = 0
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err


# ---------------------------------------------------------------- every key has a rule, and it holds


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_key_has_a_rule_and_each_bad_value_is_refused_naming_key_and_value(name):
    script = SCRIPTS[name]
    table = script.SETTINGS
    untyped = [key for key, s in table.items() if not isinstance(s.rule, cli.Rule)]
    assert not untyped, f"{name}: give {untyped} a rule (cli.ANY if any value works)"
    assert script.DEFAULTS == table.defaults and table.rules.keys() == script.DEFAULTS.keys()
    check(script, dict(script.DEFAULTS))  # the defaults pass
    probed = 0
    for key, s in table.items():
        for bad in s.rule.bad:
            with pytest.raises(cli.ConfigError) as e:
                check(script, dict(script.DEFAULTS, **{key: bad}))
            assert key in str(e.value) and (repr(bad) in str(e.value) or str(bad) in str(e.value)), str(e.value)
            probed += 1
    declared_free = {k for k, s in table.items() if s.rule is cli.ANY}
    assert all(table[k].rule.bad for k in set(table) - declared_free), "each checked key is probed"
    assert probed > len(table) / 2


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_key_is_fixed_or_free_on_resume(name):
    table = SCRIPTS[name].SETTINGS
    unclassified = sorted(k for k, s in table.items() if s.resume not in (cli.FIXED, cli.FREE))
    assert not unclassified, f"{name}: say whether a resumed run may change {unclassified} (cli.fixed or cli.free)"
    assert table.fixed == {k for k, s in table.items() if s.resume == cli.FIXED} and table.fixed < set(table)
    with pytest.raises(ValueError, match="'x': declared twice, not a Setting"):
        cli.Settings({"x": cli.Setting(0, resume="sometimes")})


def test_a_key_both_loops_have_is_declared_once_in_training():
    both = set(train_lm.SETTINGS) & set(S.SETTINGS)
    assert both == set(training.SHARED), "a key of both scripts: declare it in training.SHARED, use training.shared"
    for key in both:
        for script in (train_lm, S):
            s = script.SETTINGS[key]
            assert (s.rule, s.resume) == (training.SHARED[key].rule, training.SHARED[key].resume), (script, key)


def test_no_other_table_lists_the_keys():
    """What a key accepts and whether a resume keeps it are read from SETTINGS only: no module-level
    set, dict or tuple of key names beside it."""
    keys = set(train_lm.SETTINGS) | set(S.SETTINGS)
    for path in ("train_lm.py", "train_splade.py", "training.py", "checkpoint.py"):
        for node in ast.parse((ROOT / path).read_text()).body:
            if not isinstance(node, ast.Assign) or {getattr(t, "id", "") for t in node.targets} & {"SETTINGS", "SHARED"}:
                continue
            named = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and c.value in keys}
            assert len(named) < 3, f"{path}:{node.lineno} lists the keys {sorted(named)}: read them from SETTINGS"


def with_entries(table, **entries):
    """`table` (a cli.Settings) with `entries` added at its end: what one entry in a script adds."""
    parts = [part for title, keys in table.groups for part in (title, {k: table[k] for k in keys})]
    return cli.Settings(*parts, entries)


def test_a_new_key_is_one_entry(shards, tmp_path, capsys, monkeypatch):  # noqa: F811
    """One entry added to train_lm's SETTINGS, nothing else: parsed from flags, listed by --help,
    checked before step 1, saved in the run's config, refused on resume when it is fixed."""
    entry = cli.fixed(0.0, cli.interval("[0, 1)"), "a key for this test: read by every reader of the table")
    monkeypatch.setattr(train_lm, "SETTINGS", with_entries(train_lm.SETTINGS, test_key=entry))
    with pytest.raises(SystemExit):
        train_lm.main(["--help"])
    out = capsys.readouterr().out
    assert "--test_key=0.0" in out and "a key for this test" in out and "test_key; the others" in out
    status, err = run(train_lm.main, args(shards, tmp_path, test_key=1.5), capsys)
    assert status == 2 and err.startswith("error: test_key=1.5: give a number in [0, 1)"), err
    assert not tmp_path.exists() or not any(tmp_path.iterdir()), "refused before anything is created"
    train_lm.main(args(shards, tmp_path, max_steps=2, ckpt_interval=2, test_key=0.25))
    assert json.loads((tmp_path / "config.json").read_text())["test_key"] == 0.25
    status, err = run(train_lm.main, args(shards, tmp_path, max_steps=3, test_key=0.5), capsys)
    assert status == 2 and "test_key: saved 0.25, this command 0.5" in err, err


def test_rules_say_what_they_accept():
    assert cli.count(1).problem(0) == "give a whole number >= 1" and cli.count(1).problem(2) is None
    assert cli.count(0).problem(1.5) is not None and cli.count(0).problem(True) is not None
    half_open = cli.interval("[0, 1)")
    assert [half_open.problem(v) is None for v in (0, 0.5, 1, -0.1, math.nan)] == [True, True, False, False, False]
    assert sorted(half_open.bad, key=str) == sorted([-1.0, 1.0, math.nan], key=str)
    assert cli.interval("(0, inf)").problem(math.inf) is not None and cli.interval("(0, inf)").problem(1e9) is None
    table = {"a": None, "b": None}
    rule = cli.one_of(table, "why")
    assert rule.problem("c") == "use 'a' or 'b' (why)" and rule.problem("a") is None
    table["c"] = None  # an entry added to the table is a choice at once
    assert rule.problem("c") is None and rule.problem("d") == "use one of 'a', 'b', 'c' (why)"
    # a word of a str key stays a word: Python reads 80_10_10 as the number 801010
    C = cli.parse_config(train_lm.DEFAULTS, ["--mask_replacement=80_10_10", "--out_dir=1e3", "--tokenizer='t'"])
    assert (C["mask_replacement"], C["out_dir"], C["tokenizer"]) == ("80_10_10", "1e3", "t")
    assert training.missing_device("cpu") is None and training.missing_device("auto") is None
    assert "cuda:N" in training.missing_device("gpu") and training.missing_device("cuda:99") is not None


# ---------------------------------------------------------------- before step 1, not after it


@pytest.mark.parametrize("flag, key", [("--schedule=cosinee", "schedule"), ("--batch_size=0", "batch_size"),
                                       ("--grad_accum=0", "grad_accum"), ("--eval_batches=0", "eval_batches"),
                                       ("--seq_len=100000", "seq_len"), ("--device=cuda:99", "device"),
                                       ("--max_steps=0", "max_steps"), ("--mask_replacement=all", "mask_replacement")])
def test_train_lm_refuses_a_bad_setting_before_anything_is_created(shards, tmp_path, capsys, flag, key):  # noqa: F811
    """Each is refused before anything is created, not later (--schedule=cosinee after warm-up,
    --eval_batches=0 at the first evaluation) or with a traceback."""
    status, err = run(train_lm.main, args(shards, tmp_path / "out", eval_interval=10) + [flag], capsys)
    assert status == 2 and err.startswith(f"error: {key}=") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists(), "nothing is created before the check"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_device_cuda_on_a_machine_without_one_is_a_config_error(shards, tmp_path, capsys):  # noqa: F811
    status, err = run(train_lm.main, args(shards, tmp_path / "out") + ["--device=cuda"], capsys)
    assert status == 2 and err.startswith("error: device='cuda': use auto, cpu") and "0 CUDA devices" in err


def test_a_sequence_longer_than_the_position_table_is_refused_before_step_1(shards, tmp_path, capsys):  # noqa: F811
    """Learned positions (BERT) bound seq_len: from scratch in check_config; for init_from, once the
    model is loaded (before step 1). RoPE models are not bound by max_seq_len."""
    bert = dict(family="bert", max_seq_len=32, seq_len=48, mask_id=63, objective="mlm", n_kv_heads=0)
    status, err = run(train_lm.main, args(shards, tmp_path / "a", **bert), capsys)
    assert status == 2 and "error: seq_len=48: the bert model has learned positions for 32 tokens" in err
    assert not (tmp_path / "a").exists()
    train_lm.main(args(shards, tmp_path / "a", **dict(bert, seq_len=32), max_steps=2))
    status, err = run(train_lm.main, args(shards, tmp_path / "b", **bert, init_from=tmp_path / "a" / "checkpoints" / "step_00000002" / "model"),
                      capsys)
    assert status == 2 and "error: seq_len=48: the bert model has learned positions for 32 tokens" in err
    assert not (tmp_path / "b" / "checkpoints").exists() and not (tmp_path / "b" / "log.jsonl").exists()
    train_lm.check_config(dict(train_lm.DEFAULTS, seq_len=100_000))  # llama: RoPE


def test_simreg_layer_beyond_the_model_is_refused(shards, tmp_path):  # noqa: F811
    with pytest.raises(cli.ConfigError, match=r"simreg_layer=2: the model has 2 blocks: use one of 0..1, or -1"):
        train_lm.main(args(shards, tmp_path, simreg=True, simreg_layer=2))


@pytest.mark.parametrize("flag, key", [("--batch_size=0", "batch_size"), ("--schedule=foo", "schedule"),
                                       ("--doc_reg=l2", "doc_reg"), ("--eval_batch_size=0", "eval_batch_size")])
def test_train_splade_refuses_a_bad_setting_before_anything_is_created(tiny, tmp_path, capsys, flag, key):  # noqa: F811
    model, data, _, _ = tiny
    status, err = run(S.main, splade_args(model, data / "train.tsv", tmp_path / "out") + [flag], capsys)
    assert status == 2 and err.startswith(f"error: {key}=") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_train_splade_checks_lengths_against_a_backbone_with_learned_positions(tiny, tmp_path):  # noqa: F811
    _, data, _, _ = tiny
    bert = write_tiny_model(tmp_path / "bert", "bert", type_vocab_size=2, max_seq_len=24)
    with pytest.raises(cli.ConfigError, match="doc_max_len=32: the bert model has learned positions for 24 tokens"):
        S.main(splade_args(bert, data / "train.tsv", tmp_path / "out"))
    with pytest.raises(cli.ConfigError, match="eval_max_len=256: the bert model has learned positions for 24"):
        S.main(splade_args(bert, data / "train.tsv", tmp_path / "out", doc_max_len=24, eval_interval=10))
    S.check_model(dict(S.DEFAULTS, query_max_len=24, doc_max_len=24, eval_interval=0), from_pretrained(bert).config)
    assert not (tmp_path / "out" / "checkpoints").exists()


# ---------------------------------------------------------------- choice tables: one entry plus its formula


def test_help_lists_the_choices_of_each_table(capsys):
    for script, keys in ((S, ("query_reg", "doc_reg", "doc_reg_batch", "schedule", "dtype")),
                         (train_lm, ("family", "objective", "mask_selection", "mask_replacement", "schedule"))):
        with pytest.raises(SystemExit):
            script.main(["--help"])
        out = capsys.readouterr().out
        for key in keys:
            choices = " | ".join(script.SETTINGS[key].rule.choices)
            line = next(ln for ln in out.splitlines() if f"--{key}=" in ln)
            assert choices in line, f"{key}: {line}"


def test_a_new_document_regulariser_is_one_table_entry(tiny, tmp_path, capsys, monkeypatch):  # noqa: F811
    """An L2 regulariser added to REGS: accepted by check_config, listed by --help, used by the loss."""
    calls = []

    def l2_reg(w):
        calls.append(w.shape)
        return (w ** 2).sum(-1).mean(-1)

    monkeypatch.setitem(S.REGS, "l2", l2_reg)
    with pytest.raises(SystemExit):
        S.main(["--help"])
    assert "flops | l1 | l2" in next(ln for ln in capsys.readouterr().out.splitlines() if "--doc_reg=" in ln)
    model, data, _, _ = tiny
    S.main(splade_args(model, data / "train.tsv", tmp_path / "out", max_steps=1, doc_reg="l2"))
    assert calls and all(len(shape) == 3 for shape in calls), "per_set: one batch of documents per set"


CONTINUES = torch.arange(100) >= 60   # the test vocabulary: ids 60-99 are "##" pieces, 0 the special id


def plain_token_selection(tokens, g):  # each non-special token (not 0) with probability 0.5
    return (torch.rand(tokens.shape, generator=g) < 0.5) & (tokens != 0)


def plain_word_selection(tokens, g):
    """Word by word: a token that is no piece (or follows the special id) starts a word, drawn at its
    start; its pieces take that draw."""
    draw, chosen = torch.rand(tokens.shape, generator=g) < 0.5, torch.zeros(tokens.shape, dtype=torch.bool)
    for b in range(tokens.shape[0]):
        start = None
        for t, tok in enumerate(tokens[b].tolist()):
            if tok == 0:
                start = None
                continue
            if start is None or not CONTINUES[tok]:
                start = t
            chosen[b, t] = draw[b, start]
    return chosen


def plain_80_10_10(tokens, chosen, g):
    r, rand_tok = torch.rand(tokens.shape, generator=g), torch.randint(100, tokens.shape, generator=g)
    return torch.where(chosen & (r < 0.8), 2, torch.where(chosen & (r < 0.9), rand_tok, tokens))


# the plain formula of every selection and every replacement, the generator's draws in the same order:
# the test runs every pair of train_lm's two tables, so a new rule is a table entry and its formula here
PLAIN_SELECTION = {"token": plain_token_selection, "word": plain_word_selection}
PLAIN_REPLACEMENT = {"mask": lambda x, m, g: torch.where(m, 2, x), "80_10_10": plain_80_10_10}


@pytest.mark.parametrize("selection", sorted(train_lm.MASK_SELECTION))
@pytest.mark.parametrize("replacement", sorted(train_lm.MASK_REPLACEMENT))
def test_mlm_mask_is_its_plain_formula_for_every_rule(selection, replacement):
    assert (set(PLAIN_SELECTION), set(PLAIN_REPLACEMENT)) == (set(train_lm.MASK_SELECTION),
                                                               set(train_lm.MASK_REPLACEMENT))
    tokens = torch.randint(0, 100, (8, 64), generator=torch.Generator().manual_seed(0))
    spec = train_lm.Masking(0.5, selection, replacement, 2, torch.tensor([0]), 100, CONTINUES)
    inputs, labels = train_lm.mlm_mask(tokens, spec, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    chosen = PLAIN_SELECTION[selection](tokens, g)
    expected = PLAIN_REPLACEMENT[replacement](tokens, chosen, g)
    assert torch.equal(inputs, expected) and torch.equal(labels, torch.where(chosen, tokens, train_lm.IGNORE))


def test_a_new_mask_selection_is_one_table_entry(monkeypatch):
    tokens = torch.randint(3, 100, (8, 64), generator=torch.Generator().manual_seed(0))
    first = lambda x, maskable, spec, g: torch.zeros_like(x, dtype=torch.bool).index_fill_(1, torch.tensor([0]),  # noqa: E731
                                                                                           True) & maskable
    monkeypatch.setitem(train_lm.MASK_SELECTION, "first", first)
    spec = train_lm.Masking(0.5, "first", "mask", 2, torch.tensor([0]), 100)
    inputs, labels = train_lm.mlm_mask(tokens, spec, torch.Generator().manual_seed(0))
    assert (labels[:, 1:] == train_lm.IGNORE).all() and (inputs[:, 0] == 2).all()
    train_lm.check_config(dict(train_lm.DEFAULTS, mask_selection="first"))
