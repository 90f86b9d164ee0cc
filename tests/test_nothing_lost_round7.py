"""Nothing lost, round 7 (issue 49's cases outside reuse, and issue 47's own-text recipe), each case a
test that failed on the code before it: a mistyped data path, a config with a syntax error, a text
that is not UTF-8, a tokenizer with ids beyond its model's embedding, a run without evaluations, an
empty list of seeds, a k that makes the head infinite, a UTF-8 byte-order mark, a text smaller than
one shard, and the messages of the recipe. Every input is generated here."""
import errno
import json
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import cli
import train_lm
import train_splade as S
from data import fineweb_edu, text_corpus
from data.ir_datasets import load_beir_folder
from eval import compare_runs
from experiments import quickstart, simreg_sweep
from hf.models import export_model, from_pretrained, save_pretrained
from test_config_rules import run  # (exit status, stderr) of a main as its command line runs it
from test_retrieval import WORDS, tiny_dataset, tiny_splade, write_beir_folder

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def speeches(n=300):
    """A play-like text: n paragraphs of a few words each (one document per paragraph)."""
    return "".join(f"Speaker {i % 7}:\nthe king and the queen went to {i} towns, and {i % 5} came back.\n\n"
                   for i in range(n))


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A 2 048-id byte-level BPE as the one-minute block writes it (data/tiny/tokenizer.json)."""
    folder = tmp_path_factory.mktemp("bpe")
    (folder / "text.txt").write_text(speeches())
    text_corpus.prepare_text_corpus(folder / "text.txt", folder / "corpus", special_tokens=("<|endoftext|>", "<|mask|>"))
    return folder / "corpus" / "tokenizer.json"


def one_line(status, err, *words):
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert status == 2 and len(lines) == 1 and all(w in lines[0] for w in words), (status, err[-2000:])


# ---------------------------------------------------------------- a typo never trains on other data


def test_a_mistyped_data_folder_is_an_error_naming_it_not_shards_of_the_sample_text(tmp_path, monkeypatch, capsys):
    """`train_lm.py configs/tiny_lm.py --train_shards=data/mien3/...` wrote the config's sample text
    (shards_from_text) into the mistyped folder and trained on it."""
    monkeypatch.chdir(ROOT)  # the config's sample text is relative to the repository
    typo = tmp_path / "mien3"
    argv = [str(ROOT / "configs" / "tiny_lm.py"), f"--train_shards={typo}/corpus_train_*.bin",
            f"--val_shards={typo}/corpus_val_*.bin", f"--out_dir={tmp_path / 'out'}", "--max_steps=1"]
    one_line(*run(train_lm.main, argv, capsys), f"no token shards match '{typo}/corpus_train_*.bin'",
             f"--out {typo}")
    assert not typo.exists() and not (tmp_path / "out").exists()


# ---------------------------------------------------------------- tracebacks that are now one line


@pytest.mark.parametrize("main", [train_lm.main, S.main, simreg_sweep.main], ids=["train_lm", "train_splade", "driver"])
def test_a_config_file_with_a_syntax_error_is_one_line_naming_the_file_and_line(tmp_path, capsys, main):
    bad = tmp_path / "mine.py"
    bad.write_text("max_steps = 10\nlr = (3e-4\n")
    one_line(*run(main, [str(bad)], capsys), str(bad), "line 2", "'(' was never closed")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-16-le", "latin-1"])
def test_a_text_that_is_not_utf8_is_refused_in_one_line_by_both_preparations(tmp_path, capsys, bpe, encoding):
    """A UTF-16 text was 1 document of nonsense with rc 0 (data.fineweb_edu) or a UnicodeDecodeError
    (data/text_corpus.py, shards_from_text, a driver's --text)."""
    text = tmp_path / "text.txt"
    text.write_text(speeches().replace("queen", "reine élue"), encoding=encoding)
    name = {"utf-16": "UTF-16", "utf-32": "UTF-32", "utf-16-le": "UTF-16LE", "latin-1": "LATIN1"}[encoding]
    one_line(*run(text_corpus.main, [str(text), "--out", str(tmp_path / "a")], capsys), str(text), f"-f {name}")
    one_line(*run(fineweb_edu.main, ["--input", str(text), "--out", str(tmp_path / "b"), "--tokenizer", str(bpe),
                                     "--shard-tokens", "500", "--workers", "0"], capsys), str(text), f"-f {name}")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists(), "refused before --out is created"


def test_a_utf8_byte_order_mark_is_not_text(tmp_path, bpe):
    """A BOM before the first line: data preparation wrote it as tokens of the first document, and
    a BEIR folder's first query (or document) was dropped with a warning."""
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text(speeches())
    marked.write_text(speeches(), encoding="utf-8-sig")
    sizes = [fineweb_edu.prepare(tmp_path / p.stem, inputs=[str(p)], tokenizer=str(bpe), shard_tokens=500,
                                 workers=0)["tokens"] for p in (plain, marked)]
    assert sizes[0] == sizes[1]
    ds = tiny_dataset()
    folder = write_beir_folder(tmp_path / "beir", ds)
    for name in ("corpus.jsonl", "queries.jsonl"):
        (folder / name).write_text((folder / name).read_text(), encoding="utf-8-sig")
    loaded = load_beir_folder(folder)
    assert loaded.corpus.keys() == ds.corpus.keys() and loaded.queries.keys() == ds.queries.keys()


def test_a_tokenizer_with_ids_beyond_the_models_embedding_is_refused_before_encoding_or_export(tmp_path):
    """retrieval and train_splade stopped on an IndexError at the first text holding such an id, and
    --export wrote the folder without a word."""
    model = tiny_splade()
    V = model.config.vocab_size
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)}
    vocab["w7"] = V + 100  # another model's id for a word of the texts
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = save_pretrained(model, tmp_path / "model", tokenizer=tok)
    with pytest.raises(cli.UserError, match=rf"{folder / 'tokenizer.json'} holds ids up to {V + 100}.*vocab_size"):
        from_pretrained(folder)
    with pytest.raises(cli.UserError, match="holds ids up to"):
        export_model(str(folder), tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_runs_without_evaluations_are_refused_before_a_sweep_runs_and_compared_in_one_line(tmp_path, capsys):
    """A driver whose train_args held --eval_interval=0 ran its jobs, then stopped on a ValueError;
    so did eval/compare_runs.py on such a run."""
    argv = [str(ROOT / "configs" / "repro_simreg.py"), f"--text={tmp_path / 'text.txt'}",
            f"--root={tmp_path / 'root'}", "--train_args=['--max_steps=2', '--eval_interval=0']"]
    one_line(*run(simreg_sweep.main, argv, capsys), "eval_interval=0")
    assert not (tmp_path / "root").exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text("".join(json.dumps({"step": s, "ce": 5.0}) + "\n" for s in (1, 2)))
    one_line(*run(compare_runs.main, [str(tmp_path / "run")], capsys), "no val_loss records", "--target")


def test_an_empty_list_of_seeds_runs_nothing_and_is_refused(tmp_path, capsys):
    argv = [str(ROOT / "configs" / "repro_simreg.py"), f"--text={tmp_path / 'text.txt'}",
            f"--root={tmp_path / 'root'}", "--seeds=[]"]
    one_line(*run(simreg_sweep.main, argv, capsys), "seeds=[]", "at least one")


@pytest.mark.parametrize("key,value", [("k", 1e-30), ("k", 1e6), ("head_scale", 1e30)])
def test_a_k_that_makes_the_head_infinite_or_vanish_is_refused_before_step_1(key, value):
    """--k=1e-30 skipped every step as non-finite, then exited 0 without a model."""
    with pytest.raises(cli.ConfigError, match=re.escape(f"--{key} {value!r}: ") + ".*1/1024 to 1024"):
        S.check_config(dict(S.DEFAULTS, **{key: value}))


# ---------------------------------------------------------------- the own-text recipe (issue 47)


def test_a_text_smaller_than_one_shard_is_refused_with_the_shard_size_that_works(tmp_path, capsys, bpe):
    """--shard-tokens 50000 on a smaller text wrote the validation shard alone and exited 0; then
    train_lm.py found no training shard."""
    text = tmp_path / "input.txt"
    text.write_text(speeches())
    out = tmp_path / "mine"
    argv = ["--input", str(text), "--out", str(out), "--tokenizer", str(bpe), "--workers", "0"]
    status, err = run(fineweb_edu.main, argv + ["--shard-tokens", "50000"], capsys)
    one_line(status, err, "all in the validation shard", "--shard-tokens 50,000")
    assert not out.exists(), "nothing kept: the same --out takes the next command"
    suggested = err.split("run again with --shard-tokens ")[1].split()[0]
    assert run(fineweb_edu.main, argv + ["--shard-tokens", suggested], capsys)[0] == 0
    assert len(list(out.glob("corpus_train_*.bin"))) >= 9


def test_the_own_text_recipe_trains_on_shards_of_the_users_text_after_the_one_minute_block(tmp_path, monkeypatch,
                                                                                            capsys):
    """data/text_corpus.py's shards, then the tiny configs with --train_shards/--val_shards: the
    config's sample text (shards_from_text) refused the folder as a corpus of other settings."""
    monkeypatch.chdir(ROOT)
    (tmp_path / "input.txt").write_text(speeches(400))
    mine = tmp_path / "mine"
    assert run(text_corpus.main, [str(tmp_path / "input.txt"), "--out", str(mine)], capsys)[0] == 0
    for config in ("tiny_lm.py", "tiny_encoder.py"):
        argv = [f"configs/{config}", f"--train_shards={mine}/corpus_train_*.bin", f"--val_shards={mine}/corpus_val_*.bin",
                f"--out_dir={tmp_path / config}", "--max_steps=2", "--eval_interval=2", "--eval_batches=1"]
        status, err = run(train_lm.main, argv, capsys)
        assert status == 0, err[-2000:]
    assert json.loads((mine / "corpus.json").read_text())["special_ids"] == {"<|endoftext|>": 0, "<|mask|>": 1}


def test_the_recipes_messages_name_the_fix(bpe, monkeypatch, tmp_path):
    with pytest.raises(fineweb_edu.PreparationError, match=r"'\[SEP\]' .*special tokens: <\|endoftext\|>, <\|mask\|>"):
        fineweb_edu.resolve_tokenizer(str(bpe), "[SEP]")

    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(fineweb_edu.tiktoken, "get_encoding", offline)
    with pytest.raises(fineweb_edu.PreparationError, match=r"data/text_corpus.py FILE.txt"):
        fineweb_edu.resolve_tokenizer("gpt2")
    fetched = tmp_path / "repro"  # fetch_data got splade-tiny, not the collections
    (fetched / "models" / "splade-tiny").mkdir(parents=True)
    (fetched / "models" / "splade-tiny" / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(quickstart, "SPLADE_DATA", str(fetched))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe, line = quickstart.splade_run(tmp_path / "splade", 40)
    assert recipe is None and "lacks cranfield, cacm, cisi" in line and "no pretrained checkpoint" not in line


def test_a_full_disk_names_the_target_s_folder_never_the_current_one(tmp_path, monkeypatch, capsys):
    """An export to a full disk said 'no space left on the device of <the current folder> (76 GB free)': the
    lock file's pid was written with os.write, whose error names no file, and the fallback guessed."""
    import errno
    from data import atomic

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic.os, "write", full)
    with pytest.raises(atomic.DiskFull, match=f"device of {tmp_path} while writing x.lock"):
        atomic.ExclusiveLock(tmp_path / "x.lock").acquire()

    def unexplained():
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(SystemExit) as stopped:
        cli.run_cli(unexplained)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith("error: no space left on the device: "), err
    assert str(Path.cwd()) not in err, err


class RankOneOfTwo:
    """training.Dist's interface as rank 1 sees it when rank 0's save met `rank0_error` (its flags OR'd in)."""
    enabled, rank, world_size, master = True, 1, 2, False

    def __init__(self, rank0_error):
        self.rank0_error = rank0_error

    def any(self, flag):
        return bool(flag) or self.rank0_error is not None

    def any_of(self, flags):
        e = self.rank0_error
        return [bool(flags[0]) or e is not None, bool(flags[1]) or (e is not None and e.errno != errno.ENOSPC)]

    def barrier(self):
        pass


def test_a_full_disk_on_rank_0_during_a_periodic_save_lets_every_rank_go_on(tmp_path):
    """Rank 0 warns and trains on after a periodic save met a full disk: the other ranks must do the same (raising
    there left rank 0 alone in the next collective); any other failure stops every rank."""
    import torch
    from checkpoint import Checkpoints
    model = torch.nn.Linear(2, 2)
    full = OSError(errno.ENOSPC, "No space left on device")
    ckpts = Checkpoints(tmp_path, dist_=RankOneOfTwo(full))
    assert ckpts.save(10, model, {}, {}, periodic=True) is None
    with pytest.raises(cli.UserError, match="No space left"):
        ckpts.save(20, model, {}, {}, final=True)
    ckpts = Checkpoints(tmp_path, dist_=RankOneOfTwo(OSError(errno.EIO, "I/O error")))
    with pytest.raises(cli.UserError, match="failed on another rank"):
        ckpts.save(30, model, {}, {}, periodic=True)
