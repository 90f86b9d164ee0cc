"""docs/vectors_elsewhere.md, run as written: its commands and snippets, taken from its code
blocks, in a folder laid out like the repository (the reproductions' data as data/repro). The pyserini part runs where pyserini and Java 21 or later are installed
(PYSERINI_PYTHON=path/to/its/python; java on PATH or under JAVA_HOME) and skips elsewhere; the
export, our evaluator's --binary-relevance and the sentence-transformers and transformers
snippets run wherever requirements-dev.txt is installed. Data: splade-tiny and Cranfield (the tests
skip without them)."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYSERINI_COMMAND = "~/venv-pyserini/bin/python"  # how the page calls pyserini's environment

pytestmark = pytest.mark.slow  # Cranfield encoded three times at 256-512 tokens, and Lucene: minutes


def section_blocks():
    """The page's code blocks, in order, as (language, text)."""
    return re.findall(r"```(bash|python)\n(.*?)```", (ROOT / "docs" / "vectors_elsewhere.md").read_text(), re.S)


def commands(block):
    """A bash block's commands: continuation lines joined, comments left out."""
    joined = block.replace("\\\n", " ")
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


@pytest.fixture
def clone_dir(shared_data, tmp_path):
    """A folder laid out as the page's commands expect (the repository's files, the data as
    data/repro), whose out/ is this test's own."""
    repo = tmp_path / "repr-lab"
    (repo / "data").mkdir(parents=True)
    for item in ROOT.iterdir():
        if item.name not in ("out", ".git", ".venv", "data"):
            (repo / item.name).symlink_to(item)
    for item in (ROOT / "data").iterdir():
        if item.name != "repro":
            (repo / "data" / item.name).symlink_to(item)
    (repo / "data" / "repro").symlink_to(shared_data)
    return repo


def run_bash_block(block, cwd, env, pyserini=None):
    """Each command of a bash block of the page, as a user types it: `python` in this project's
    environment (this interpreter), ~/venv-pyserini/bin/python as pyserini's, `cd` kept."""
    outputs = []
    for command in commands(block):
        if command.startswith("cd "):
            cwd = (cwd / command[3:].strip()).resolve()
            continue
        if command.startswith(PYSERINI_COMMAND + " "):
            assert pyserini, f"the page runs {command!r} in pyserini's environment"
            command = shlex.quote(pyserini) + command[len(PYSERINI_COMMAND):]
        elif command.startswith("python "):
            command = shlex.quote(sys.executable) + command[len("python"):]
        else:
            raise AssertionError(f"the page's command {command!r}: which environment runs it?")
        p = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
        assert p.returncode == 0, f"{command}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
        outputs.append(p.stdout)
    return outputs


def run_python_block(code, cwd, env, extra=""):
    p = subprocess.run([sys.executable, "-c", code + "\n" + extra], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def project_env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def java_major(java):
    p = subprocess.run([java, "-version"], capture_output=True, text=True)
    found = re.search(r'version "(\d+)', p.stderr + p.stdout)
    return int(found.group(1)) if p.returncode == 0 and found else 0


def pyserini_env():
    """(pyserini's python, its environment), or skip: pyserini is no dependency of this project."""
    pyserini = os.environ.get("PYSERINI_PYTHON")
    if not pyserini:
        pytest.skip("PYSERINI_PYTHON is unset (a python with pyserini installed; docs/vectors_elsewhere.md)")
    if subprocess.run([pyserini, "-c", "import pyserini"], capture_output=True).returncode:
        pytest.skip(f"PYSERINI_PYTHON={pyserini} cannot import pyserini")
    env = {**os.environ, "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "unused")}
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        env["PATH"] = f"{java_home}/bin{os.pathsep}{env['PATH']}"
    java = shutil.which("java", path=env["PATH"])
    if java is None or java_major(java) < 21:
        pytest.skip(f"Anserini needs Java 21 or later; {java or 'no java'} is {java and java_major(java)}")
    return pyserini, env


def test_the_section_names_an_environment_for_every_command():
    blocks = section_blocks()
    assert [lang for lang, _ in blocks] == ["bash", "bash", "bash", "python", "python"]
    for _, block in blocks[1:3]:
        for command in commands(block):
            assert command.startswith(("cd ", "python ", PYSERINI_COMMAND + " ")), command


def test_anserini_scores_as_ours_as_written(clone_dir):
    """The Anserini block end to end: our evaluation and export, pyserini's index and search from
    the folder the export names, and the run scored as ours, at splade-tiny's own 512 tokens."""
    pyserini, env = pyserini_env()
    outs = run_bash_block(section_blocks()[1][1], clone_dir, {**env, **project_env()}, pyserini)
    ours = json.loads((clone_dir / "out" / "cranfield" / "metrics.json").read_text())["mean"]["nDCG@10"]
    anserini = float(re.search(r"'nDCG@10': ([\d.]+)", outs[-1]).group(1))
    assert round(ours, 4) == 0.3548 and round(anserini, 4) == 0.3547, (ours, anserini)
    printed = outs[0].split("in pyserini's environment (Java 21 or later):\n")[1].splitlines()
    assert printed[0] == "cd out/cranfield/anserini", "the commands it prints are the page's"
    assert [ln.split()[2:] for ln in printed[1:3]] == [c.split()[2:] for c in commands(section_blocks()[1][1])[2:4]]


def test_export_binary_relevance_and_sentence_transformers_as_written(clone_dir):
    """The export at its own length, our evaluator scoring as sentence-transformers' does, then
    the SparseEncoder snippet (its evaluator on the same folder) and the transformers snippet
    (its vectors against ours)."""
    pytest.importorskip("sentence_transformers")
    blocks = section_blocks()
    env = project_env()
    run_bash_block(blocks[2][1], clone_dir, env)
    folder = clone_dir / "out" / "splade-tiny-256"
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == 256
    metrics = json.loads((clone_dir / "out" / "cranfield-st" / "cranfield" / "metrics.json").read_text())
    ours = metrics["mean"]["nDCG@10"]
    assert metrics["max_len"] == 256 and metrics["drop_self"] is False, "the page's lengths and self-hits"
    st_out = run_python_block(blocks[3][1], clone_dir, env, extra="print(model.max_seq_length)")
    st_ndcg, length = st_out.split()[-2:]
    assert length == "256", "the SparseEncoder reads the folder's length"
    # equal to the 16th digit on this project's machine; 1e-3 leaves room for two near-ties
    # of another CPU's kernels to swap a relevant and an irrelevant document (~4e-4 of the mean each)
    assert abs(float(st_ndcg) - ours) < 1e-3 and abs(ours - 0.3800) < 5e-4, (float(st_ndcg), ours)
    check = ("from eval.retrieval import encode_sparse\nfrom hf.models import from_pretrained, load_tokenizer\n"
             "ours = encode_sparse(from_pretrained(folder), load_tokenizer(folder), texts, max_len=length).toarray()\n"
             "print(length, float(abs(torch.from_numpy(ours) - w).max()))")
    length, diff = run_python_block(blocks[4][1], clone_dir, env, extra=check).split()[-2:]
    assert length == "256" and float(diff) < 2e-5, (length, diff)
