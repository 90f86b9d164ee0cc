"""The layout a reader relies on (issue 20): the reader's path stays short, and no two project
modules import each other (model.py's thin from_pretrained / save_pretrained / load_tokenizer /
--inspect entry points excepted), so each module can be read, and imported, without the other."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READER_PATH = ("model.py", "training.py", "train_lm.py", "train_splade.py", "simreg.py")
# model.py's entry points that load or save Hugging Face folders call into hf/ and data/ inside
# the function, so that `import model` needs neither
ALLOWED = {frozenset({"model", "hf.models"}), frozenset({"model", "data.tokenizer"})}


def project_modules():
    """{module name: its path} of the code (the tests and configs excluded)."""
    files = [p for p in ROOT.glob("*.py")] + [p for d in ("data", "eval", "hf", "experiments") for p in (ROOT / d).glob("*.py")]
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in files}


def imports_of(path, names):
    """The project modules `path` imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # from hf import hub
    return {m for m in found if m in names}


def test_no_two_project_modules_import_each_other():
    modules = project_modules()
    graph = {name: imports_of(path, modules) - {name} for name, path in modules.items()}
    pairs = {frozenset({a, b}) for a, deps in graph.items() for b in deps if a in graph.get(b, ())}
    assert pairs - ALLOWED == set(), sorted(sorted(p) for p in pairs - ALLOWED)
    assert graph["cli"] == set(), "cli.py imports nothing of the project: anyone may import it"
    assert not any(m.startswith(("data.", "hf.", "eval.")) for m in graph["training"]), graph["training"]


def test_the_readers_path_stays_short():
    lines = {name: len((ROOT / name).read_text().splitlines()) for name in READER_PATH}
    assert sum(lines.values()) <= 2200, lines
