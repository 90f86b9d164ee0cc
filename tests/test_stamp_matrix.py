"""Nothing lost, round 5 (issue 35): every input of a reused result is in its stamp by content, and
every output folder has one writer.

The matrix: for each command that reuses work (retrieval, fine-tuning, data preparation, the
preflight's text corpus, train_lm's and train_splade's resume) and each input file its stamp
names - read from the stamp the command wrote, so an input added to a stamp is covered without a
new test - the file's content is changed with its name and size kept, and the command must compute
again or refuse in one `error:` line. So too for what a command reuses of its own (issue 42): each
array of a retrieval's index (index/MANIFEST.json) and each file of the newest checkpoint a resume
reads (MANIFEST.json's hashes). Then a second writer on each output folder (retrieval,
fine-tuning, both data preparations, both training scripts, export) must be refused, naming the
holder. Then the cases of the issue, each a test that failed on the code before it (case 3, the
experiment drivers, is left to a later phase). Every input is generated here; each command run takes
about a second."""
import dataclasses
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import cli
import model as M
from hf.models import from_pretrained, save_pretrained
import train_lm
import train_splade
from data import manifest
from data.fineweb_edu import PreparationError
from data.shards import HEADER_BYTES, read_shard, read_shard_header, write_shard
from eval import finetune as FT
from eval import retrieval as R
from hf.safetensors_io import read_header
from test_config_rules import run as run_cli  # (exit status, stderr) of a main as its command line runs it
from test_finetune import quick_cfg, tiny_model, write_sc_folder  # noqa: F401 - tiny_model is a fixture
from test_retrieval import tiny_dataset, tiny_splade, tiny_tokenizer, write_beir_folder
from test_shards import corpus, run_prepare  # noqa: F401 - corpus is a fixture
from test_splade import run_args as splade_args
from test_splade import write_data, write_tiny_model
from test_train_lm import args as lm_args
from test_train_lm import shards  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------- changing a file, keeping its name and size


def same_size_edit(path: Path) -> str:
    """Change `path`'s content, keeping its name and its size, and where the format allows it its
    validity: a safetensors file gets 32 values of its largest tensor negated; a token shard two
    different neighbouring tokens swapped; a JSON file one space moved (same meaning, other bytes)
    or, when compact, two integers of the same width swapped (a tokenizer's ids); a text file two
    different neighbouring lines swapped (the line count kept); anything else one bit flipped.
    Returns what was done."""
    data = bytearray(path.read_bytes())
    if path.suffix == ".safetensors":
        header, start = read_header(path)
        entries = [v for k, v in header.items() if k != "__metadata__" and v["dtype"] in ("F32", "F16", "BF16")]
        info = max(entries, key=lambda v: v["data_offsets"][1] - v["data_offsets"][0])
        width, (begin, end) = (4 if info["dtype"] == "F32" else 2), info["data_offsets"]
        middle = start + begin + (end - begin) // width // 2 * width
        for at in range(middle, min(middle + 32 * width, start + end), width):
            data[at + width - 1] ^= 0x80  # the sign bit (little-endian: the last byte of a value)
        what = "32 weights negated"
    elif path.suffix == ".bin" and len(data) > HEADER_BYTES:
        tokens = np.frombuffer(bytes(data[HEADER_BYTES:]), dtype=read_shard_header(path)[1]).copy()
        i = next(i for i in range(len(tokens) // 2, len(tokens) - 1) if tokens[i] != tokens[i + 1])
        tokens[[i, i + 1]] = tokens[[i + 1, i]]
        data[HEADER_BYTES:] = tokens.tobytes()
        what = f"tokens {i} and {i + 1} swapped"
    elif path.suffix == ".json":
        text = data.decode("utf-8")
        if ": " in text:
            at = text.index(": ")
            text = text[:at + 1] + text[at + 2:]
            text = text[:text.index("{") + 1] + " " + text[text.index("{") + 1:]
            what = "a space moved"
        else:
            ints = list(re.finditer(r"(?<=:)\d+(?=[,}])", text[max(text.find('"vocab"'), 0):]))
            shift = max(text.find('"vocab"'), 0)
            a, b = next((a, b) for a, b in zip(ints, ints[1:]) if len(a[0]) == len(b[0]) and a[0] != b[0])
            text = (text[:shift + a.start()] + b[0] + text[shift + a.end():shift + b.start()] + a[0]
                    + text[shift + b.end():])
            what = f"ids {a[0]} and {b[0]} swapped"
        data = bytearray(text.encode("utf-8"))
    else:
        lines = bytes(data).split(b"\n")
        pick = [i for i in range(max(1, len(lines) // 2), len(lines) - 2) if lines[i] and lines[i] != lines[i + 1]]
        if pick:
            i = pick[0]
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
            data = bytearray(b"\n".join(lines))
            what = f"lines {i + 1} and {i + 2} swapped"
        else:
            data[len(data) // 2] ^= 1
            what = "one bit flipped"
    assert len(data) == path.stat().st_size and bytes(data) != path.read_bytes(), f"{path}: no same-size edit"
    path.write_bytes(bytes(data))
    return what


def older(folder) -> list[Path]:
    """The outputs of other keys kept beside `folder` (data/manifest.py aside)."""
    folder = Path(folder)
    return sorted(p for p in folder.parent.glob(folder.name + ".*") if re.fullmatch(r"[0-9a-f]{12}", p.suffix[1:]))


def refused_in_one_line(status, err, *names):
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    return status == 2 and len(lines) == 1 and "Traceback" not in err and all(n in lines[0] for n in names)


# ---------------------------------------------------------------- the commands


@dataclasses.dataclass
class Command:
    """A command that reuses work: `setup` makes its inputs in a folder, `run` runs it, `inputs`
    reads its stamp for the files it holds, `outcome` says (after a run following an edit) whether
    it computed again or refused; `lock` is its output folder's lock file."""
    setup: callable
    run: callable
    inputs: callable
    outcome: callable
    lock: callable
    restores: bool = False   # a refusing command: the edited file is put back before the next one


def retrieval_command():
    def setup(tmp):
        model = tmp / "model"
        save_pretrained(tiny_splade(), model, tokenizer=tiny_tokenizer())
        from hf.models import write_sparse_encoder_files
        write_sparse_encoder_files(model, from_pretrained(model), 64)
        write_beir_folder(tmp / "coll", tiny_dataset())
        return {"argv": ["--model", str(model), "--bench", str(tmp / "coll"), "--out", str(tmp / "R"),
                         "--chunk-size", "16", "--no-progress"], "out": tmp / "R"}

    def inputs(s):
        key = manifest.read(s["out"] / "coll" / "vectors")["key"]
        return [Path(s["argv"][1]) / n for n in key["model"]] + [s["out"].parent / "coll" / n for n in key["corpus"]]

    def run(s, capsys):
        s["before"] = manifest.read(s["out"] / "coll" / "vectors")
        return run_cli(R.main, s["argv"], capsys)

    def outcome(s, status, err, edited):
        key = manifest.read(s["out"] / "coll" / "vectors")["key"]
        return (status == 0 and key != s["before"]["key"] and "made from other inputs" in err and edited in inputs(s)
                and any(manifest.read(p) == s["before"] for p in older(s["out"] / "coll" / "vectors")))

    return Command(setup, run, inputs, outcome, lambda s: s["out"] / "RUN.lock")


def finetune_command(model_folder):
    def setup(tmp):
        model = tmp / "model"
        shutil.copytree(model_folder, model)
        return {"model": str(model), "task": f"sc:kw={write_sc_folder(tmp / 'kw')}", "out": tmp / "F"}

    def run(s, capsys):
        capsys.readouterr()
        try:
            s["result"] = FT.run_grid([s["model"]], [s["task"]], lrs=(1e-3,), seeds=(0,), out=s["out"],
                                      cfg=quick_cfg(steps=2, max_len=32))
            return 0, capsys.readouterr().err
        except cli.UserError as e:
            return 2, f"error: {e}\n"

    def inputs(s):
        key = manifest.read_json(FT.run_path(s["out"], s["model"], "kw", 1e-3, 0))["stamp"]
        task = Path(s["task"].split("=", 1)[1])
        return [Path(s["model"]) / n for n in key["model_files"]] + [task / n for n in key["task_files"][task.name]]

    return Command(setup, run, inputs, lambda s, status, err, edited: status == 0 and s["result"]["executed"] == 1,
                   lambda s: s["out"] / "RUN.lock")


def preparation_command(corpus_files):
    def setup(tmp):  # the corpus fixture's files are this test's own
        return {"corpus": corpus_files, "out": tmp / "prepared"}

    def run(s, capsys):
        try:
            run_prepare(s["corpus"], s["out"])
            return 0, ""
        except PreparationError as e:
            return 2, f"error: {e}\n"

    def inputs(s):  # the local files the progress record holds by content: the inputs and the tokenizer.json
        from data.fineweb_edu import resolve_tokenizer
        settings = manifest.read_json(s["out"] / "corpus_progress.json")["settings"]
        tokenizer = resolve_tokenizer(settings["tokenizer"], settings["delimiter"]).source
        return [*map(Path, settings["sources"]), Path(tokenizer)]

    return Command(setup, run, inputs, lambda s, status, err, edited: refused_in_one_line(status, err),
                   lambda s: s["out"] / "PREPARE.lock", restores=True)


def text_corpus_command():
    """The text corpus train_lm.py's preflight writes (shards_from_text) and checks at every start."""
    def setup(tmp):
        rng = np.random.default_rng(0)
        words = [f"w{i}" for i in range(40)]
        text = "\n\n".join(" ".join(rng.choice(words, 30)) + "\n" + " ".join(rng.choice(words, 20))
                           for _ in range(60))
        (tmp / "text.txt").write_text(text + "\n")
        folder = tmp / "corpus"
        return {"cfg": {"shards_from_text": str(tmp / "text.txt"), "train_shards": str(folder / "corpus_train_*.bin"),
                        "val_shards": str(folder / "corpus_val_*.bin")}, "out": folder}

    def run(s, capsys):
        from data.preflight import shards_from_text
        try:
            shards_from_text(s["cfg"])
            return 0, ""
        except cli.UserError as e:
            return 2, f"error: {e}\n"

    return Command(setup, run, lambda s: [Path(manifest.read_json(s["out"] / "corpus.json")["text_file"])],
                   lambda s, status, err, edited: refused_in_one_line(status, err, "differs in: text"),
                   lambda s: s["out"] / "PREPARE.lock", restores=True)


def train_lm_command(shard_folder):
    def setup(tmp):
        own = tmp / "shards"
        shutil.copytree(shard_folder, own)
        return {"argv": lm_args(own, tmp / "lm", max_steps=4, ckpt_interval=4), "out": tmp / "lm", "shards": own}

    def run(s, capsys):
        status, err = run_cli(train_lm.main, s["argv"], capsys)
        s["argv"] = [a for a in s["argv"] if not a.startswith("--max_steps")] + ["--max_steps=6"]  # resumes next
        return status, err

    def inputs(s):
        trainer = json.loads((s["out"] / "checkpoints" / "step_00000004" / "trainer.json").read_text())
        return [s["shards"] / name for name in trainer["loader"]["shard_files"]]

    return Command(setup, run, inputs,
                   lambda s, status, err, edited: refused_in_one_line(status, err, edited.name, "--accept_changed_data=True"),
                   lambda s: s["out"] / "RUN.lock", restores=True)


def splade_setup(max_steps):
    """A tiny train_splade run's setup: its model and data in tmp, checkpoints every 2 steps."""
    def setup(tmp):
        model = write_tiny_model(tmp / "model")
        data = write_data(tmp / "data", n_train=48, n_test=4)[0]
        return {"argv": splade_args(model, data / "train.tsv", tmp / "sp", max_steps=max_steps, ckpt_interval=2,
                                    batch_size=8), "out": tmp / "sp"}
    return setup


def train_splade_command():
    setup = splade_setup(max_steps=2)

    def run(s, capsys):
        status, err = run_cli(train_splade.main, s["argv"], capsys)
        s["argv"] = [a for a in s["argv"] if not a.startswith("--max_steps")] + ["--max_steps=3"]
        return status, err

    def inputs(s):
        trainer = json.loads((s["out"] / "checkpoints" / "step_00000002" / "trainer.json").read_text())
        data = next(Path(a.split("=", 1)[1]) for a in s["argv"] if a.startswith("--train_data="))
        assert list(trainer["train_data"]["files"]) == [data.name], "the key holds the training file"
        return [data]

    return Command(setup, run, inputs,
                   lambda s, status, err, edited: refused_in_one_line(status, err, "train_data", "--accept_changed_data=True"),
                   lambda s: s["out"] / "RUN.lock", restores=True)


def retrieval_index_command():
    """The index a retrieval reuses: each array by content (index/MANIFEST.json)."""
    def inputs(s):
        index = s["out"] / "coll" / "index"
        return [index / name for name in manifest.read(index)["files"]]

    base = retrieval_command()
    return Command(base.setup, lambda s, capsys: run_cli(R.main, s["argv"], capsys), inputs,
                   lambda s, status, err, edited: status == 0 and edited.name in err and "computing it again" in err,
                   base.lock)


def checkpoint_command(train, out):
    """A resume reads every file of its newest checkpoint (MANIFEST.json: each one's size and
    SHA-256): one changed makes it fall back to the checkpoint before, which saves the newest again."""
    def run(s, capsys):
        return run_cli(train.main, s["argv"], capsys)

    def inputs(s):
        return [newest(s) / name for name in json.loads((newest(s) / "MANIFEST.json").read_text())["files"]]

    def newest(s):
        return s["out"] / "checkpoints" / "step_00000004"

    def outcome(s, status, err, edited):
        return (status == 0 and f"skipping checkpoint {newest(s)}: {edited.relative_to(newest(s))} is not the file"
                in err and steps_saved(s["out"]) == [2, 4])

    return Command(out, run, inputs, outcome, lambda s: s["out"] / "RUN.lock")


def train_lm_checkpoint_command(shard_folder):
    def setup(tmp):
        return {"argv": lm_args(shard_folder, tmp / "lm", max_steps=4, ckpt_interval=2), "out": tmp / "lm"}
    return checkpoint_command(train_lm, setup)


def train_splade_checkpoint_command():
    return checkpoint_command(train_splade, splade_setup(max_steps=4))


def export_command():
    """hf.models --export: it has no stamp (it refuses a folder that is not empty), only a writer."""
    def setup(tmp):
        model = tmp / "model"
        save_pretrained(tiny_splade(), model, tokenizer=tiny_tokenizer())
        return {"model": str(model), "out": tmp / "exported"}

    def run(s, capsys):
        from hf.models import export_main
        return run_cli(export_main, ["--export", s["model"], str(s["out"])], capsys)

    return Command(setup, run, None, None, lambda s: s["out"].with_name("exported.lock"))


WRITERS = ["retrieval", "finetune", "preparation", "text_corpus", "train_lm", "train_splade"]   # their own folders
COMMANDS = ["retrieval", "finetune", "preparation", "text_corpus", "train_lm", "train_splade", "retrieval_index",
            "train_lm_checkpoint", "train_splade_checkpoint"]


@pytest.fixture
def command(request, tiny_model, corpus, shards):  # noqa: F811
    return {"retrieval": retrieval_command, "finetune": lambda: finetune_command(tiny_model),
            "preparation": lambda: preparation_command(corpus), "text_corpus": text_corpus_command,
            "train_lm": lambda: train_lm_command(shards), "train_splade": train_splade_command,
            "retrieval_index": retrieval_index_command,
            "train_lm_checkpoint": lambda: train_lm_checkpoint_command(shards),
            "train_splade_checkpoint": train_splade_checkpoint_command, "export": export_command}[request.param]()


@pytest.mark.parametrize("command", COMMANDS, indirect=True)
def test_every_stamped_input_changed_in_place_is_computed_again_or_refused(command, tmp_path, capsys):
    """For each input file the command's stamp names: the same name and size, other content; the
    command must not reuse what it computed from the old content."""
    state = command.setup(tmp_path)
    status, err = command.run(state, capsys)
    assert status == 0, err
    inputs = command.inputs(state)
    assert inputs, "the stamp names no input file"
    for path in inputs:
        original = path.read_bytes()
        size = path.stat().st_size
        what = same_size_edit(path)
        assert path.stat().st_size == size != 0
        status, err = command.run(state, capsys)
        assert command.outcome(state, status, err, path), \
            f"{path.name} ({what}, same size): neither computed again nor refused (status {status}):\n{err[-2000:]}"
        if command.restores:
            path.write_bytes(original)


# ---------------------------------------------------------------- one writer per output folder


HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {sys.argv[2]}".encode())
    print("held", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def holder():
    """Another process holding a lock file (an fcntl lock, as data/atomic.py takes them): its pid."""
    procs = []

    def hold(path, label):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), label], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        procs.append(p)
        return p.pid

    yield hold
    for p in procs:
        p.stdin.close()
        p.wait(timeout=30)
        p.stdout.close()


@pytest.mark.parametrize("command", [c for c in COMMANDS if c in WRITERS] + ["export"], indirect=True)
def test_a_second_writer_on_an_output_folder_is_refused_naming_the_first(command, tmp_path, capsys, holder):
    state = command.setup(tmp_path)
    pid = holder(command.lock(state), "another writer")
    status, err = command.run(state, capsys)
    assert refused_in_one_line(status, err, f"pid {pid}"), f"not refused in one line naming pid {pid}:\n{err[-2000:]}"


# ---------------------------------------------------------------- the cases of issue 35


def with_out(argv, out, *extra):
    i = argv.index("--out")
    return argv[:i + 1] + [str(out)] + argv[i + 2:] + list(extra)


def ndcg(out):
    return json.loads((Path(out) / "metrics.json").read_text())["mean"]["nDCG@10"]


def test_case1_a_second_retrieval_on_the_same_out_is_refused_while_the_first_runs(tmp_path, capsys, monkeypatch):
    """Two retrievals on one --out, --max-len 64 and 32: the second, started while the first
    encodes, stops at once naming the first (before: both ran, the first's vectors were moved
    aside under it and it reported another number than alone)."""
    s = retrieval_command().setup(tmp_path)
    second, real = {}, R.encode_sparse

    def encoding(*a, **kw):
        if kw.get("bar") is not None and not second:  # the first run's first corpus chunk
            second["run"] = subprocess.run([sys.executable, str(ROOT / "eval" / "retrieval.py"), *s["argv"],
                                            "--max-len", "32"], capture_output=True, text=True, timeout=300,
                                           cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
        return real(*a, **kw)

    monkeypatch.setattr(R, "encode_sparse", encoding)
    status, err = run_cli(R.main, s["argv"] + ["--max-len", "64"], capsys)
    monkeypatch.setattr(R, "encode_sparse", real)
    assert status == 0, err
    other = second["run"]
    assert other.returncode == 2 and f"is in use by another retrieval (pid {os.getpid()}" in other.stderr, \
        other.stderr[-2000:]
    alone = tmp_path / "alone"
    assert run_cli(R.main, with_out(s["argv"], alone, "--max-len", "64"), capsys)[0] == 0
    assert ndcg(s["out"]) == ndcg(alone), "the first run's number is its number alone"
    vectors = s["out"] / "coll" / "vectors"
    assert manifest.read(vectors)["key"]["max_len"] == 64


def embedding_values(path):
    """(the word embeddings' values as a writable float32 view, a function that writes them back)."""
    header, start = read_header(path)
    name = next(k for k in header if "word_embeddings" in k)
    begin, end = header[name]["data_offsets"]
    raw = bytearray(path.read_bytes())
    values = np.frombuffer(raw, dtype=np.float32, count=(end - begin) // 4, offset=start + begin)
    return values, lambda: path.write_bytes(bytes(raw))


def test_case2_an_edited_model_or_tokenizer_in_the_same_folder_is_encoded_again(tmp_path, capsys):
    """The word embeddings permuted in model.safetensors (same size, same names; the 16 values the
    old fingerprint sampled left in place), then two words' ids swapped in tokenizer.json: each
    time the vectors are encoded again and the number is a fresh --out's (before: the old vectors
    were reused; the tokenizer was in no stamp)."""
    s = retrieval_command().setup(tmp_path)
    model = Path(s["argv"][1])
    assert run_cli(R.main, s["argv"], capsys)[0] == 0
    before = ndcg(s["out"])
    values, save = embedding_values(model / "model.safetensors")
    kept = np.zeros(values.size, bool)
    kept[np.arange(0, values.size, max(1, values.size // 16))[:16]] = True
    values[~kept] = np.roll(values[~kept], 97)
    save()
    status, err = run_cli(R.main, s["argv"], capsys)
    fresh = tmp_path / "fresh"
    assert status == 0 and run_cli(R.main, with_out(s["argv"], fresh), capsys)[0] == 0
    assert ndcg(fresh) != before, "the test needs an edit that changes the number"
    assert ndcg(s["out"]) == ndcg(fresh), "reused the vectors of the old weights"
    assert "model/model.safetensors" in err

    text = (model / "tokenizer.json").read_text()
    ids = {w: re.search(rf'"{w}": (\d+)', text)[1] for w in ("w10", "w11")}
    text = text.replace(f'"w10": {ids["w10"]}', '"w10": X').replace(f'"w11": {ids["w11"]}', f'"w11": {ids["w10"]}')
    (model / "tokenizer.json").write_text(text.replace('"w10": X', f'"w10": {ids["w11"]}'))
    before = ndcg(s["out"])
    status, err = run_cli(R.main, s["argv"], capsys)
    shutil.rmtree(fresh)
    assert status == 0 and run_cli(R.main, with_out(s["argv"], fresh), capsys)[0] == 0
    assert ndcg(fresh) != before, "the test needs an edit that changes the number"
    assert ndcg(s["out"]) == ndcg(fresh), "reused the vectors of the old tokenizer"
    assert "tokenizer" in err and "made from other inputs" in err


def steps_saved(out):
    return sorted(int(p.name[5:]) for p in (Path(out) / "checkpoints").glob("step_*") if "." not in p.name)


def test_case4_train_lm_resumed_on_shards_prepared_again_from_another_text_refuses(shards, tmp_path, capsys):  # noqa: F811
    """The shards' folder prepared again from another text (the same names and token counts):
    the resume refuses in one line naming the shards and the flag that accepts them (before: it
    trained on the other tokens without a word); with the flag it continues, saying so."""
    own = tmp_path / "shards"
    shutil.copytree(shards, own)
    a = lm_args(own, tmp_path / "out", max_steps=4, ckpt_interval=4)
    assert run_cli(train_lm.main, a, capsys)[0] == 0
    rng = np.random.default_rng(1)
    for path in sorted(own.glob("s_train_*.bin")):
        tokens = np.asarray(read_shard(path))
        write_shard(path, rng.permutation(tokens), tokens.dtype, delimiter=0, vocab_size=64)
    status, err = run_cli(train_lm.main, a + ["--max_steps=8"], capsys)
    assert refused_in_one_line(status, err, "s_train_000001.bin", "another content", "--accept_changed_data=True"), err
    assert steps_saved(tmp_path / "out") == [4], "nothing trained on the other shards"
    status, err = run_cli(train_lm.main, a + ["--max_steps=8", "--accept_changed_data=True"], capsys)
    assert status == 0 and "continuing on them (accept_changed_data=True)" in err
    assert steps_saved(tmp_path / "out")[-1] == 8


def test_case5_train_splade_resumed_on_other_train_data_refuses(tmp_path, capsys):
    """train_data with other content and the same line count, then with one line more: each resume
    refuses in one line naming train_data and the flag (before: the first resumed silently, the
    second with a warning); with the flag it continues, saying so."""
    model = write_tiny_model(tmp_path / "model")
    data = write_data(tmp_path / "data", n_train=48, n_test=4)[0] / "train.tsv"
    a = splade_args(model, data, tmp_path / "out", max_steps=2, ckpt_interval=2, batch_size=8)
    assert run_cli(train_splade.main, a, capsys)[0] == 0
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[1:] + lines[:1]))  # the same lines, another order: other examples at each position
    status, err = run_cli(train_splade.main, a + ["--max_steps=3"], capsys)
    assert refused_in_one_line(status, err, f"train_data {data}", "--accept_changed_data=True"), err
    data.write_text("".join(lines + lines[:1]))
    status, err = run_cli(train_splade.main, a + ["--max_steps=3"], capsys)
    assert refused_in_one_line(status, err, "examples 48 -> 49", "--accept_changed_data=True"), err
    assert steps_saved(tmp_path / "out") == [2]
    status, err = run_cli(train_splade.main, a + ["--max_steps=3", "--accept_changed_data=True"], capsys)
    assert status == 0 and "continuing on it (accept_changed_data=True)" in err and steps_saved(tmp_path / "out")[-1] == 3


def test_case6_a_full_disk_during_retrieval_is_one_error_line_and_the_rerun_finishes(tmp_path, capsys, monkeypatch):
    """No space left while the second chunk is written: `error:` naming the folder and the space
    needed, exit 2, no traceback (before: an OSError traceback); with space again the same command
    finishes with a fresh run's number."""
    import errno
    s = retrieval_command().setup(tmp_path)
    real, calls = np.savez, []

    def full(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(np, "savez", full)
    status, err = run_cli(R.main, s["argv"], capsys)
    monkeypatch.setattr(np, "savez", real)
    vectors = s["out"] / "coll" / "vectors"
    assert refused_in_one_line(status, err, f"no space left on the device of {vectors}", "B in all)",
                               "B are free"), err
    assert run_cli(R.main, s["argv"], capsys)[0] == 0
    assert run_cli(R.main, with_out(s["argv"], tmp_path / "fresh"), capsys)[0] == 0
    assert ndcg(s["out"]) == ndcg(tmp_path / "fresh")


def test_case7_a_damaged_chunk_behind_a_valid_manifest_is_encoded_again(tmp_path, capsys):
    """A chunk cut short after its encoding finished, then a chunk damaged before its manifest recorded
    it (with the index to rebuild): each rerun encodes the chunk again and gives the same number
    (before: a traceback on every rerun until the file was deleted by hand)."""
    s = retrieval_command().setup(tmp_path)
    assert run_cli(R.main, s["argv"], capsys)[0] == 0
    before = ndcg(s["out"])
    vectors = s["out"] / "coll" / "vectors"
    chunk = vectors / "chunk-000001.npz"
    chunk.write_bytes(chunk.read_bytes()[:100])
    status, err = run_cli(R.main, s["argv"] + ["--export-anserini"], capsys)
    assert status == 0 and "chunk-000001.npz is not the chunk file(s) this encoding wrote" in err, err
    assert ndcg(s["out"]) == before and R.load_chunk(chunk)
    chunk.write_bytes(b"\0" * chunk.stat().st_size)  # damaged, and its manifest vouching for the damage
    record = manifest.read(vectors)
    record["files"][chunk.name] = manifest.sha256(chunk)
    (vectors / "MANIFEST.json").write_text(json.dumps(record))
    (s["out"] / "coll" / "index" / "MANIFEST.json").unlink()  # an index build that died
    status, err = run_cli(R.main, s["argv"], capsys)
    assert status == 0 and "not a readable chunk file" in err and "encoding it again" in err, err
    assert ndcg(s["out"]) == before


def test_case8_a_stale_copy_of_the_asked_encoding_is_taken_back_and_at_most_two_are_kept(tmp_path, capsys,
                                                                                       monkeypatch):
    """--max-len 64, 32, then 64 again: the third run takes its first encoding back, encoding no
    document (before: it encoded the corpus again); three more lengths leave at most two stale
    copies, the oldest deleted with a line naming them (before: one full copy per change)."""
    s = retrieval_command().setup(tmp_path)
    encoded, real = [], R.encode_sparse
    monkeypatch.setattr(R, "encode_sparse", lambda *a, **kw: (encoded.append(1) if kw.get("bar") else None)
                        or real(*a, **kw))
    for length in ("64", "8"):
        assert run_cli(R.main, s["argv"] + ["--max-len", length], capsys)[0] == 0
    assert run_cli(R.main, with_out(s["argv"], tmp_path / "fresh", "--max-len", "64"), capsys)[0] == 0
    encoded.clear()
    status, err = run_cli(R.main, s["argv"] + ["--max-len", "64"], capsys)
    assert status == 0 and encoded == [] and "was made from these inputs: took it back" in err, err
    assert ndcg(s["out"]) == ndcg(tmp_path / "fresh")
    notes = ""
    for length in ("12", "16", "24"):
        status, err = run_cli(R.main, s["argv"] + ["--max-len", length], capsys)
        notes += err
    vectors = s["out"] / "coll" / "vectors"
    assert len(older(vectors)) == len(older(vectors.with_name("index"))) == 2
    assert re.search(r"removed vectors\.[0-9a-f]{12} \(at most 2 older outputs of vectors are kept, the newest\)", notes)


def test_case9_an_export_killed_midway_leaves_nothing_at_the_next_export(tmp_path, capsys, monkeypatch):
    """OUT.tmp of an export that was killed (SIGKILL runs no cleanup) is removed by the next
    export of OUT (before: it stayed); an export that fails leaves none."""
    from hf import models as H
    model = tmp_path / "model"
    save_pretrained(tiny_splade(), model, tokenizer=tiny_tokenizer())
    out = tmp_path / "exported"
    killed = tmp_path / "exported.tmp"
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"half written")
    status, err = run_cli(H.export_main, ["--export", str(model), str(out)], capsys)
    assert status == 0 and not killed.exists() and f"removing {killed}" in err
    assert (out / "model.safetensors").exists() and not list(tmp_path.glob("exported.lock"))

    def fail(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(H, "save_safetensors", fail)
    with pytest.raises(OSError):
        H.export_model(str(model), tmp_path / "again")
    assert not list(tmp_path.glob("again*")), "a failed export leaves no folder and no lock"


def test_case10_a_judged_query_with_an_empty_text_counts_as_zero(tmp_path, capsys):
    """Every judged query counts: one whose text is empty cannot be run, so it scores 0 and stays in
    the denominator (before: it was dropped with its judgments, and the mean was over the others)."""
    ds = tiny_dataset()
    s = retrieval_command().setup(tmp_path)
    queries = tmp_path / "coll" / "queries.jsonl"
    queries.write_text("".join(json.dumps({"_id": q, "text": "" if q == "q1" else t}) + "\n"
                               for q, t in ds.queries.items()))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        status, err = run_cli(R.main, s["argv"], capsys)
    assert status == 0, err
    record = json.loads((s["out"] / "metrics.json").read_text())["datasets"]["coll"]
    assert record["num_queries"] == len(ds.qrels) and record["num_empty_queries"] == 1
    assert record["per_query"]["q1"]["nDCG@10"] == 0
    assert record["mean"]["nDCG@10"] == pytest.approx(
        sum(v["nDCG@10"] for v in record["per_query"].values()) / len(ds.qrels))
    assert any(re.search(r"1 judged queries have an empty text \('q1'\).*counts in the mean", str(w.message))
               for w in said), "and a warning says so"
