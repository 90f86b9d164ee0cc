"""Running training scripts as real processes, for the kill/resume and DDP tests."""
import os
import signal
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
    return subprocess.Popen(cmd, env={**os.environ, **ENV}, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


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
