"""The GPU path right by construction (issue 22), checked on the CPU: what a GPU run would pay for
- reads from the device between log steps, graph breaks and recompilations under torch.compile,
gradient collectives per micro-step, weights that depend on the number of processes - is counted
here on the same code. What only a GPU can show (speed, MFU, the kernels themselves) is in
tests/test_fast_paths.py's `-k cuda` tests and README's GPU section."""
import ast
import functools
import json
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch

import fast_paths
import procs
import train_lm
import train_splade as S
import training
from hf.safetensors_io import load_safetensors
from test_splade import run_args as splade_args
from test_splade import tiny  # noqa: F401 - a fixture
from test_train_lm import args, shards  # noqa: F401 - shards is a fixture

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------- no read back from the device


READS = ("item", "tolist", "__bool__", "__float__", "__int__", "nonzero")


def in_host_side(frame):
    """Whether `frame` or one of its callers runs a function marked @fast_paths.host_side: batch
    preparation that reads the host tensors it is given. Everything else in a step must not read."""
    while frame is not None:
        fn = frame.f_globals
        for part in frame.f_code.co_qualname.split("."):  # the function by its module and qualified name
            fn = fn.get(part) if isinstance(fn, dict) else getattr(fn, part, None)
        if getattr(fn, "host_side", False):
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def reads(monkeypatch):
    """Records every .item(), .tolist(), bool(), float(), int() and nonzero of a tensor made during
    the steps that end between log steps (from Loop.set_lr, the start of a step, to the end of
    Loop.finish_step), except in host-side batch preparation (@fast_paths.host_side, in_host_side).
    On a GPU each of them would wait for the device to catch up."""
    state = {"on": False, "hits": []}

    def watch(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            if state["on"] and not in_host_side(sys._getframe(1)):
                frames = traceback.extract_stack()[:-1]
                state["hits"].append(f"{name}:\n" + "".join(traceback.format_list(frames[-4:])))
            return fn(*a, **k)
        return wrapper

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, watch(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch, "nonzero", watch("torch.nonzero", torch.nonzero))
    set_lr, finish = training.Loop.set_lr, training.Loop.finish_step

    def start(self, optimizer):
        state["on"] = not (self._due_at(self.step + 1))
        return set_lr(self, optimizer)

    def end(self, *a, **k):
        out = finish(self, *a, **k)
        state["on"] = False
        return out

    monkeypatch.setattr(training.Loop, "_due_at", lambda self, step: step % self.cfg["log_interval"] == 0
                        or step % self.cfg["ckpt_interval"] == 0 or step == self.cfg["max_steps"], raising=False)
    monkeypatch.setattr(training.Loop, "set_lr", start)
    monkeypatch.setattr(training.Loop, "finish_step", end)
    return state


@pytest.mark.parametrize("objective", ["clm_simreg", "mlm", "clm_then_mlm"])
def test_an_lm_step_between_log_steps_reads_nothing_from_the_device(shards, tmp_path, reads, objective):
    over = {"clm_simreg": dict(simreg=True), "mlm": dict(objective="mlm", family="eurobert"),
            "clm_then_mlm": dict(objective="mlm", clm_fraction=0.5)}[objective]
    train_lm.main(args(shards, tmp_path, max_steps=10, log_interval=5, grad_accum=2, **over))
    assert reads["hits"] == []


def test_a_splade_step_between_log_steps_reads_nothing_from_the_device(tiny, tmp_path, reads):  # noqa: F811
    model, data, _, _ = tiny
    S.main(splade_args(model, data / "train.tsv", tmp_path, max_steps=8, log_interval=4, grad_accum=2))
    assert reads["hits"] == []


def test_the_read_counter_sees_a_read_inside_a_step(shards, tmp_path, reads, monkeypatch):
    """The control: a loss read back inside a step (what the loop did before) is caught."""
    finish = training.Loop.finish_step

    def reading(self, tokens, **values):
        values["loss"].item()
        return finish(self, tokens, **values)

    monkeypatch.setattr(training.Loop, "finish_step", reading)
    train_lm.main(args(shards, tmp_path, max_steps=4, log_interval=4))
    assert len(reads["hits"]) == 3 and reads["hits"][0].startswith("item")


@fast_paths.host_side
def count_marked(mask):
    return int(mask.sum())


def count_unmarked(mask):
    return int(mask.sum())


def test_the_read_counter_exempts_host_side_functions_and_only_them(reads):
    """The control of the exemption: the same read of a host tensor is not counted inside a
    function marked @fast_paths.host_side, and is counted inside an unmarked one."""
    reads["on"] = True
    count_marked(torch.ones(3))
    assert reads["hits"] == []
    count_unmarked(torch.ones(3))
    reads["on"] = False
    assert len(reads["hits"]) == 1 and reads["hits"][0].startswith("__int__")
    assert all(getattr(f, "host_side", False) for f in (fast_paths.find_padding, train_lm.masked_rows, S.make_batch))


# ---------------------------------------------------------------- torch.compile: graphs, recompilations


@pytest.fixture
def eager_backend(monkeypatch):
    """torch.compile's tracing (dynamo: graphs, breaks, guards, recompilations) with the eager
    backend: the same graphs as inductor, without minutes of CPU code generation."""
    compile_, module_compile = torch.compile, torch.nn.Module.compile
    monkeypatch.setattr(torch, "compile", lambda model=None, **kw: compile_(model, **{**kw, "backend": "eager"}))
    monkeypatch.setattr(torch.nn.Module, "compile",
                        lambda self, **kw: module_compile(self, **{**kw, "backend": "eager"}))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("objective", ["mlm", "clm_simreg", "clm_z_loss"])
def test_a_compiled_lm_step_is_one_graph(shards, tmp_path, monkeypatch, eager_backend, objective):
    """The whole loss module compiles without a graph break (fullgraph=True raises at the first
    one): the masked-LM head and loss too, on their bucket of masked rows; evaluation included; and
    a term the fused loss does not cover (z-loss: the plain formula, chosen before compiling)."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model=None, **kw: compile_(model, **{**kw, "fullgraph": True}))
    over = {"mlm": dict(objective="mlm", family="eurobert"), "clm_simreg": dict(simreg=True),
            "clm_z_loss": dict(z_loss=1e-4)}[objective]
    train_lm.main(args(shards, tmp_path, compile=True, max_steps=6, log_interval=3, eval_interval=3,
                       eval_batches=2, **over))
    assert len(train_lm_log(tmp_path)) == 2 + 2  # log and evaluation lines at steps 3 and 6


def train_lm_log(out):
    return [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]


def test_compiled_splade_blocks_recompile_at_most_twice_over_varying_lengths(tiny, tmp_path, eager_backend):  # noqa: F811
    """train_splade.py compiles each encoder block with dynamic shapes (the pooling stays eager):
    12 steps whose padded lengths vary compile the block at most 3 times (<= 2 recompilations),
    and nothing inside a block breaks the graph. (The tiny ModernBERT has a global and a windowed
    layer: two graphs, measured; every batch, padded or not, is packed the same way.)"""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    import model as M
    model, data, _, _ = tiny
    counters.clear()
    S.main(splade_args(model, data / "train.tsv", tmp_path, max_steps=12, compile=True, batch_size=8))
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert 1 <= len(_debug_get_cache_entry_list(M.Block.forward.__code__)) <= 3


# ---------------------------------------------------------------- FSDP: the same start, one reduce per step


COUNT_COLLECTIVES = """
import runpy, sys, torch.distributed as dist
counts = {"reduce_scatter": 0, "all_reduce": 0}
# FSDP2 reduce-scatters through dist.reduce_scatter_single (torch >= 2.12) or reduce_scatter_tensor
for name, key in (("reduce_scatter_single", "reduce_scatter"), ("reduce_scatter_tensor", "reduce_scatter"),
                  ("all_reduce", "all_reduce")):
    if not hasattr(dist, name):
        continue
    def make(fn, key):
        def counted(*a, **k):
            counts[key] += 1
            return fn(*a, **k)
        return counted
    setattr(dist, name, make(getattr(dist, name), key))
sys.argv = sys.argv[1:]
sys.path.insert(0, str(__import__("pathlib").Path(sys.argv[0]).parent))
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    # one write: under PYTHONUNBUFFERED print() writes each piece on its own, and the other rank's
    # lines can land between them
    sys.stdout.write("COLLECTIVES %d %r\\n" % (int(__import__("os").environ.get("RANK", 0)), counts))
    sys.stdout.flush()
"""


@pytest.mark.slow
def test_fsdp_with_one_and_two_processes_starts_from_the_same_weights(shards, tmp_path):
    """A model built on the meta device and drawn from the seed, each rank keeping its slices:
    with lr = 0 the step-1 checkpoint holds the initial weights, bitwise equal for 1 and 2 processes."""
    common = dict(fsdp=True, max_steps=1, ckpt_interval=1, lr=0.0, warmup_steps=0, batch_size=2)
    for n in (1, 2):
        p = procs.run_script("train_lm.py", args(shards, tmp_path / str(n), **common), torchrun=n)
        out = p.communicate(timeout=600)[0]
        assert p.returncode == 0, out
    one, two = (load_safetensors(tmp_path / str(n) / "checkpoints" / "step_00000001" / "model" / "model.safetensors")
                for n in (1, 2))
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert all(t.std() > 0 for k, t in one.items() if "norm" not in k), "drawn, not left empty"


@pytest.mark.slow
def test_fsdp_reduces_gradients_once_per_optimizer_step(shards, tmp_path):
    """grad_accum = 4 under FSDP on 2 processes: every micro-step but the last keeps its gradients
    local (set_requires_gradient_sync), so each optimizer step reduce-scatters once per FSDP unit
    (the 2 blocks and the root), not 4 times."""
    wrapper = tmp_path / "count.py"
    wrapper.write_text(COUNT_COLLECTIVES)
    steps, units = 3, 2 + 1
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(wrapper),
           str(ROOT / "train_lm.py"), *args(shards, tmp_path / "out", fsdp=True, grad_accum=4, batch_size=2,
                                            max_steps=steps, ckpt_interval=1000)]
    p = subprocess.run(cmd, env={**os.environ, **procs.ENV}, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    counts = re.findall(r"COLLECTIVES (\d+) (\{[^}]*\})", p.stdout)
    assert sorted(rank for rank, _ in counts) == ["0", "1"], p.stdout
    for rank, line in counts:
        reduce_scatters = ast.literal_eval(line)["reduce_scatter"]
        assert reduce_scatters == steps * units, (rank, line)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_cuda_resume_agrees_with_an_uninterrupted_run_to_rounding(shards, tmp_path):  # noqa: F811
    """On a GPU the resumed run is the same computation, but flash attention's backward (and bf16
    reductions) are not deterministic: the losses agree to rounding, not bit for bit."""
    common = dict(device="cuda", dtype="bfloat16", max_steps=20, ckpt_interval=10)
    train_lm.main(args(shards, tmp_path / "a", **common))
    train_lm.main(args(shards, tmp_path / "b", **{**common, "max_steps": 10}))
    train_lm.main(args(shards, tmp_path / "b", **common))
    a, b = ([r["loss"] for r in train_lm_log(tmp_path / x) if "loss" in r] for x in "ab")
    assert len(a) == len(b) == 20 and a[:10] == pytest.approx(b[:10], rel=1e-2)
    assert a[10:] == pytest.approx(b[10:], rel=5e-2)
