"""Running training scripts as real processes, for the kill/resume and DDP tests."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# one intra-op thread per process: tiny models on a shared 2-core machine spin-wait otherwise
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_script(script, argv, torchrun=0):
    """Start `script` (a file at the repo root) with `argv`; under torchrun with `torchrun` ranks.
    --standalone picks a free rendezvous port (--master_port=0 makes the workers dial port 0)."""
    cmd = [sys.executable, str(ROOT / script), *argv]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={torchrun}", "--standalone",
               str(ROOT / script), *argv]
    proc = subprocess.Popen(cmd, env={**os.environ, **ENV}, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    STARTED.append(proc)
    return proc


STARTED = []   # the processes run_script started: tests/conftest.py ends them after each test


def end_started():
    """Stop what a test left running (its group, killed) and close every pipe it opened."""
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def kill_after(proc, logfile, lines, sig=signal.SIGTERM, timeout=180):
    """Send `sig` once `logfile` has `lines` lines; returns the exit code."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if logfile.exists() and len(logfile.read_text().splitlines()) >= lines:
            proc.send_signal(sig)
            return proc.wait(timeout=timeout)
        if proc.poll() is not None:
            raise AssertionError(f"run ended before the signal:\n{proc.stdout.read()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"run too slow: {logfile} did not reach {lines} lines in {timeout} s")


def free_port():
    """A TCP port of 127.0.0.1 that was free a moment ago (for a rendezvous endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_node(script, argv, nnodes, node_rank, endpoint, log, nproc_per_node=1):
    """One torchrun launcher of a multi-node job, as on each machine of a cluster: the `nnodes`
    launchers meet at the c10d rendezvous `endpoint` (host:port) and start `nproc_per_node` ranks
    each. (On a cluster the endpoint is the first node's address; here every "node" is 127.0.0.1.)
    Its output goes to the file `log`, not a pipe: a launcher waited on while another one's pipe is
    full would block on its writes, and the two would wait for each other."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node_rank={node_rank}",
           f"--nproc_per_node={nproc_per_node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
           "--rdzv-id=test", str(ROOT / script), *argv]
    with open(log, "w") as f:
        return subprocess.Popen(cmd, env={**os.environ, **ENV}, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)


@contextlib.contextmanager
def single_rank_group():
    """Within the block, this process sees the environment torchrun gives a 1-process job (RANK,
    WORLD_SIZE, a free MASTER_PORT), so a training script called in-process initialises a real
    1-rank gloo group (what FSDP needs) without the second or so that launching torchrun costs.
    The group and the environment are cleaned up even when the run fails."""
    import torch.distributed as dist
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
