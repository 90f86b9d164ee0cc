"""Shared test fixtures.

The small real datasets and checkpoints of the reproductions are used when present: the folder named
by $REPR_LAB_TEST_DATA (CI points it at its machine's copy), else data/repro, where
experiments/fetch_data.py writes them; tests that need them skip cleanly without them.
"""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("REPR_LAB_TEST_DATA") or ROOT / "data" / "repro")
sys.path.insert(0, str(ROOT))  # scripts at the top level are importable as modules

# Tests never touch the network: any Hub access must go to a fake Hub on 127.0.0.1.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# A suite run under ATEN_CPU_CAPABILITY=avx2 keeps its compiled kernels apart from a default run's
# (tests compile with torch.compile directly, not only through the scripts)
import fast_paths  # noqa: E402

fast_paths.compile_cache_per_cpu_kernels()


@pytest.fixture
def shared_data():
    """The reproductions' data (module docstring), or skip when there is none."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (the real tiny datasets/checkpoints are optional)")
    return SHARED_DATA


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny models run fastest that way, and on a loaded 2-core machine two
    threads spin-wait on each other (up to 20x slower). Modules opt in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _processes_end_with_their_test():
    """The training processes a test started (tests/procs.py run_script) are stopped and their pipes
    closed when it ends, passed or failed."""
    yield
    import procs
    procs.end_started()


@pytest.fixture(autouse=True)
def _isolated_hf_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own empty Hub cache so no test sees a user's real cache."""
    cache = tmp_path_factory.mktemp("hf_cache")
    monkeypatch.setenv("HF_HOME", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache / "hub"))
