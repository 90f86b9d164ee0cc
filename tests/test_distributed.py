"""Training across processes and machines, on the CPU (gloo):

- FSDP2 (what configs/llama_7b_* and moe_8x1b_* use) evaluates, saves right after the evaluation,
  is killed with SIGTERM and resumes with the losses of an uninterrupted run - eager in the
  default suite, with torch.compile and with 2 ranks in the slow one;
- two torchrun launchers with one process each (two "nodes" that meet at a c10d rendezvous on
  127.0.0.1, as the README's multi-node launch does) give the losses of one 2-process launcher.

Training data and argument lists come from the single-machine tests (test_train_lm.py,
test_splade.py)."""
import subprocess
import weakref

import pytest
import torch

import procs
import train_lm
import training
from test_splade import losses as splade_losses
from test_splade import run_args as splade_args
from test_splade import tiny  # noqa: F401 - a fixture
from test_train_lm import args, log, shards  # noqa: F401 - shards is a fixture

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs compare bit for bit with scripts


def records(out, key):
    return [(r["step"], r[key]) for r in log(out) if key in r]


def run_lm(argv, nproc):
    """A train_lm.py run to its end: in this process under a 1-rank process group (what FSDP needs,
    without launching torchrun), or under torchrun with `nproc` ranks."""
    if nproc == 1:
        with procs.single_rank_group():
            train_lm.main(argv)
        return
    p = procs.run_script("train_lm.py", argv, torchrun=nproc)
    assert p.wait(timeout=600) == 0, p.stdout.read()


def fsdp_kill_and_resume(shards, tmp_path, nproc, compile):  # noqa: F811 - shards is the fixture's value
    """Evaluation every 2 steps and a checkpoint every 4, so the checkpoints at steps 4 and 8 are
    saved right after an evaluation (where FSDP2 used to fail with KeyError); SIGTERM during the
    run (saving one more checkpoint), then the same command resumes. Losses, validation losses and
    inter-class angles must equal the uninterrupted run's, bit for bit."""
    common = dict(max_steps=12, batch_size=4, fsdp=True, compile=compile, eval_interval=2, eval_batches=1,
                  ckpt_interval=4)
    a, b = (args(shards, tmp_path / x, **common) for x in "ab")
    run_lm(a, nproc)  # uninterrupted
    p = procs.run_script("train_lm.py", b, torchrun=nproc)
    procs.kill_after(p, tmp_path / "b" / "log.jsonl", 9, timeout=600)  # at step 6, after the checkpoint at 4
    out = p.stdout.read()
    assert "checkpoint saved at step" in out, out
    stopped = len(records(tmp_path / "b", "loss"))
    assert 6 <= stopped < 12
    ckpt = tmp_path / "b" / "checkpoints" / "step_00000004"
    assert all((ckpt / f"optimizer_rank{r}.pt").exists() for r in range(nproc)), "one optimizer shard per rank"
    run_lm(b, nproc)  # the same command resumes
    assert [s for s, _ in records(tmp_path / "b", "loss")] == list(range(1, 13))
    for key in ("loss", "val_loss", "interclass_angle"):
        assert records(tmp_path / "a", key) == records(tmp_path / "b", key), f"{key}: resumed after step {stopped}"
    from hf.models import from_pretrained
    wa, wb = (from_pretrained(tmp_path / x / "checkpoints" / "step_00000012" / "model").state_dict() for x in "ab")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), "the final weights differ"


def test_fsdp_saves_after_evaluation_and_resumes_exactly(shards, tmp_path):  # noqa: F811
    """1 rank, eager: the SIGTERM goes through torchrun, as from a cluster's scheduler."""
    fsdp_kill_and_resume(shards, tmp_path, nproc=1, compile=False)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_fsdp_compiled_saves_after_evaluation_and_resumes_exactly(shards, tmp_path, nproc):  # noqa: F811
    """torch.compile (inductor on the CPU: ~30 s of compilation per run)."""
    fsdp_kill_and_resume(shards, tmp_path, nproc=nproc, compile=True)


def test_a_run_frees_its_ddp_model_before_it_destroys_the_process_group(shards, tmp_path, monkeypatch):  # noqa: F811
    """The end of a DDP run: the reducer goes while the process group is still registered. Freed
    after it, the reducer would be the group's last holder and destroy it with the GIL held, while
    gloo's worker thread may still need the GIL (a launcher of the two-node test hung so at exit)."""
    wrapped, alive = [], []
    real_ddp, real_destroy = training.Dist.ddp, training.dist.destroy_process_group

    def ddp(self, module):
        model = real_ddp(self, module)
        wrapped.append(weakref.ref(model))
        return model

    def destroy(*a, **kw):
        alive.append([type(w()).__name__ if w() is not None else None for w in wrapped])
        return real_destroy(*a, **kw)
    monkeypatch.setattr(training.Dist, "ddp", ddp)
    monkeypatch.setattr(training.dist, "destroy_process_group", destroy)
    with procs.single_rank_group():
        train_lm.main(args(shards, tmp_path / "run", max_steps=2, eval_interval=2, eval_batches=1, ckpt_interval=2))
    assert len(wrapped) == 1 and alive == [[None]], f"alive when the group was destroyed: {alive}"


# ---------------------------------------------------------------- beyond one machine


def two_nodes(script, argv, logs):
    """Two torchrun launchers (two "nodes" of one process each) at one c10d rendezvous; returns
    their combined output (each launcher's in `logs`/node_R.log). One that has not ended 10 minutes
    on is killed with the other, and the failure shows both outputs."""
    endpoint = f"127.0.0.1:{procs.free_port()}"
    logs.mkdir(parents=True, exist_ok=True)
    files = [logs / f"node_{r}.log" for r in (0, 1)]
    nodes = [procs.run_node(script, argv, nnodes=2, node_rank=r, endpoint=endpoint, log=files[r]) for r in (0, 1)]
    codes = []
    try:
        for n in nodes:
            codes.append(n.wait(timeout=600))
    except subprocess.TimeoutExpired:
        for n in nodes:
            n.kill()
            n.wait()
    outputs = [f"--- node {r} ---\n" + f.read_text(errors="replace") for r, f in enumerate(files)]
    assert codes == [0, 0], f"exit codes {codes} (a missing one: still running after 10 min)\n" + "\n".join(outputs)
    return "\n".join(outputs)


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_lm_on_two_nodes_equals_two_processes_on_one(shards, tmp_path, fsdp):  # noqa: F811
    common = dict(max_steps=6, batch_size=4, fsdp=fsdp, eval_interval=3, eval_batches=1, ckpt_interval=3)
    one, two = (args(shards, tmp_path / x, **common) for x in ("one", "two"))
    p = procs.run_script("train_lm.py", one, torchrun=2)
    assert p.wait(timeout=600) == 0, p.stdout.read()
    out = two_nodes("train_lm.py", two, tmp_path / "launchers")
    assert "2 process(es)" in out
    for key in ("loss", "val_loss"):
        assert records(tmp_path / "one", key) == records(tmp_path / "two", key), key
    assert len(records(tmp_path / "two", "loss")) == 6
    ckpt = tmp_path / "two" / "checkpoints" / "step_00000006"
    assert (ckpt / "rank0.pt").exists() and (ckpt / "rank1.pt").exists(), "both nodes write into the shared out_dir"


@pytest.mark.slow
def test_splade_on_two_nodes_equals_two_processes_on_one(tiny, tmp_path):  # noqa: F811
    model, data, _, _ = tiny
    one, two = (splade_args(model, data / "train.tsv", tmp_path / x, max_steps=6, ckpt_interval=3)
                for x in ("one", "two"))
    p = procs.run_script("train_splade.py", one, torchrun=2)
    assert p.wait(timeout=600) == 0, p.stdout.read()
    out = two_nodes("train_splade.py", two, tmp_path / "launchers")
    assert "2 process(es)" in out
    assert len(splade_losses(tmp_path / "two")) == 6
    assert splade_losses(tmp_path / "one") == splade_losses(tmp_path / "two")

