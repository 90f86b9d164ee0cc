"""Nothing lost, round 5 (issue 35): every input of a reused result is in its stamp by content, and
every output folder has one writer.

The matrix: for each command that reuses work (retrieval, fine-tuning, data preparation, the
preflight's text corpus, train_lm's and train_splade's resume) and each input file its stamp
names - read from the stamp the command wrote, so an input added to a stamp is covered without a
new test - the file's content is changed with its name and size kept, and the command must compute
again or refuse in one `error:` line. Then a second writer on each output folder (retrieval,
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
from pathlib import Path

import numpy as np
import pytest

import cli
import model as M
import train_lm
import train_splade
from data import stamp as stamps
from data.fineweb_edu import PreparationError
from data.shards import HEADER_BYTES, read_shard, read_shard_header, write_shard
from eval import finetune as FT
from eval import retrieval as R
from hf.safetensors_io import read_header
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


def stamped_files(stamp: dict) -> list[Path]:
    """Every input file a stamp (data/stamp.py make) names, from its "info" section."""
    return [Path(f["path"]) for key, files in stamp["info"].items() if key != "written" for f in files.values()]


def run_cli(main, argv, capsys):
    """A script's main as its command line runs it: (exit status, stderr)."""
    capsys.readouterr()
    try:
        cli.run_cli(main, argv)
        status = 0
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err


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
        M.save_pretrained(tiny_splade(), model, tokenizer=tiny_tokenizer())
        from hf.models import write_sparse_encoder_files
        write_sparse_encoder_files(model, M.from_pretrained(model).config, 64)
        write_beir_folder(tmp / "coll", tiny_dataset())
        return {"argv": ["--model", str(model), "--bench", str(tmp / "coll"), "--out", str(tmp / "R"),
                         "--chunk-size", "16", "--no-progress"], "out": tmp / "R"}

    def newest_stale(s):
        copies = stamps.stale_copies(s["out"] / "coll" / "vectors")
        return int(copies[-1].name.rsplit("-", 1)[1]) if copies else 0

    def run(s, capsys):
        s["before"] = newest_stale(s)
        return run_cli(R.main, s["argv"], capsys)

    def outcome(s, status, err, edited):
        stamp = stamps.read(s["out"] / "coll" / "vectors" / "encoding.json")
        recorded = [f for key, files in stamp["info"].items() if key != "written"
                    for name, f in files.items() if Path(f["path"]) == edited.resolve()]
        return status == 0 and newest_stale(s) == s["before"] + 1 and "moved it to vectors.stale-" in err and recorded

    return Command(setup, run, lambda s: stamped_files(stamps.read(s["out"] / "coll" / "vectors" / "encoding.json")),
                   outcome, lambda s: s["out"] / "RUN.lock")


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
        return stamped_files(stamps.read(FT.run_path(s["out"], s["model"], "kw", 1e-3, 0))["stamp"])

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

    def inputs(s):
        from data.fineweb_edu import prepared_inputs
        return prepared_inputs(stamps.read(s["out"] / "corpus_progress.json")["settings"])

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

    return Command(setup, run, lambda s: [Path(stamps.read(s["out"] / "corpus.json")["text_file"])],
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


def train_splade_command():
    def setup(tmp):
        model = write_tiny_model(tmp / "model")
        data = write_data(tmp / "data", n_train=48, n_test=4)[0]
        return {"argv": splade_args(model, data / "train.tsv", tmp / "sp", max_steps=2, ckpt_interval=2, batch_size=8),
                "out": tmp / "sp"}

    def run(s, capsys):
        status, err = run_cli(train_splade.main, s["argv"], capsys)
        s["argv"] = [a for a in s["argv"] if not a.startswith("--max_steps")] + ["--max_steps=3"]
        return status, err

    def inputs(s):
        trainer = json.loads((s["out"] / "checkpoints" / "step_00000002" / "trainer.json").read_text())
        return stamped_files(trainer["train_data"])

    return Command(setup, run, inputs,
                   lambda s, status, err, edited: refused_in_one_line(status, err, "train_data", "--accept_changed_data=True"),
                   lambda s: s["out"] / "RUN.lock", restores=True)


def export_command():
    """hf.models --export: it has no stamp (it refuses a folder that is not empty), only a writer."""
    def setup(tmp):
        model = tmp / "model"
        M.save_pretrained(tiny_splade(), model, tokenizer=tiny_tokenizer())
        return {"model": str(model), "out": tmp / "exported"}

    def run(s, capsys):
        from hf.models import export_main
        return run_cli(export_main, ["--export", s["model"], str(s["out"])], capsys)

    return Command(setup, run, None, None, lambda s: s["out"].with_name("exported.lock"))


COMMANDS = ["retrieval", "finetune", "preparation", "text_corpus", "train_lm", "train_splade"]


@pytest.fixture
def command(request, tiny_model, corpus, shards):  # noqa: F811
    return {"retrieval": retrieval_command, "finetune": lambda: finetune_command(tiny_model),
            "preparation": lambda: preparation_command(corpus), "text_corpus": text_corpus_command,
            "train_lm": lambda: train_lm_command(shards), "train_splade": train_splade_command,
            "export": export_command}[request.param]()


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
        identity = stamps.file_identity(path)
        what = same_size_edit(path)
        assert stamps.file_identity(path)["size"] == identity["size"] != 0
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


@pytest.mark.parametrize("command", COMMANDS + ["export"], indirect=True)
def test_a_second_writer_on_an_output_folder_is_refused_naming_the_first(command, tmp_path, capsys, holder):
    state = command.setup(tmp_path)
    pid = holder(command.lock(state), "another writer")
    status, err = command.run(state, capsys)
    assert refused_in_one_line(status, err, f"pid {pid}"), f"not refused in one line naming pid {pid}:\n{err[-2000:]}"
