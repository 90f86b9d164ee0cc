"""The experiment drivers' shared runner (experiments/runner.py) on a generated stand-in script, and
the drivers' command lines: each runs by path and as a module, and the sweeps' --help shows their
usage (from the module docstring, with the experiments/ paths) and their keys."""
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.runner import Job, cell, markdown_table, run_jobs

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for a training script: appends its name to a file, then exits with the given status
JOB_SCRIPT = """import sys
name, status, record = sys.argv[1:]
print("working on", name)
with open(record, "a") as f:
    f.write(name + "\\n")
sys.exit(int(status))
"""


@pytest.fixture
def make_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB_SCRIPT)

    def make(name, status=0, needs=(), done=False):
        return Job(name, str(script), [name, str(status), str(tmp_path / "ran.txt")], needs=list(needs),
                   done=lambda: done, log=tmp_path / "logs" / f"{name}.log")
    return make


def test_runner_follows_needs_skips_finished_jobs_and_goes_on_after_a_failure(make_job, tmp_path):
    jobs = [make_job("b", needs=["a"]), make_job("a"), make_job("bad", status=3),
            make_job("after_bad", needs=["bad"]), make_job("finished", done=True), make_job("c", needs=["finished"])]
    outcome = run_jobs(jobs, slots=2, threads=1)
    ran = (tmp_path / "ran.txt").read_text().split()
    assert sorted(ran) == ["a", "b", "bad", "c"] and ran.index("a") < ran.index("b")
    assert outcome.failed == {"bad": 3}, "the exit status of the failed job"
    assert outcome.blocked == ["after_bad"] and outcome.skipped == ["finished"]
    assert sorted(outcome.started) == sorted(outcome.timing) == ["a", "b", "bad", "c"]
    assert all(t["seconds"] >= 0 and t["cpu_seconds"] >= 0 for t in outcome.timing.values())
    log = (tmp_path / "logs" / "a.log").read_text()
    assert log.startswith("$ ") and "job.py a 0" in log and "working on a" in log

    again = run_jobs([make_job("a", done=True), make_job("b", needs=["a"])], slots=1)
    assert again.started == ["b"] and (tmp_path / "logs" / "b.log").read_text().count("working on b") == 2, \
        "a log is appended to, so an earlier attempt's output stays"


def test_runner_dry_run_prints_the_commands_of_the_unfinished_jobs(make_job, tmp_path, capsys):
    outcome = run_jobs([make_job("a", done=True), make_job("b", needs=["a"])], slots=2, dry_run=True)
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert len(commands) == 1 and commands[0].endswith(f"job.py b 0 {tmp_path / 'ran.txt'}")
    assert not (tmp_path / "ran.txt").exists() and outcome.started == []


def test_runner_refuses_a_plan_whose_needs_cannot_be_met(make_job):
    with pytest.raises(ValueError, match=r"'b' needs \['nope'\]"):
        run_jobs([make_job("b", needs=["nope"])], slots=1)
    with pytest.raises(ValueError, match="wait for each other"):
        run_jobs([make_job("a", needs=["b"]), make_job("b", needs=["a"])], slots=1)


def test_markdown_table_and_missing_cells():
    table = markdown_table(["run", "loss"], [["a", cell(1.23456, ".3f")], ["b", cell(None, ".3f")]])
    assert table == "| run | loss |\n|---|---|\n| a | 1.235 |\n| b | - |\n"
    assert cell(None, ".1f", missing="–") == "–"


DRIVERS = ("repro_mlm_clm", "repro_splade_rescaling", "simreg_sweep", "splade_sweep")


def run_python(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", DRIVERS)
def test_drivers_run_by_path(name):
    r = run_python(f"experiments/{name}.py", "--help")
    assert r.returncode == 0, r.stderr
    assert f"python experiments/{name}.py" in r.stdout, "the usage names the driver's path"


@pytest.mark.parametrize("name", ["simreg_sweep", "splade_sweep"])
def test_sweep_help_shows_usage_description_and_keys(name):
    r = run_python("-m", f"experiments.{name}", "--help")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("The ") and "usage:" in lines, "the docstring's first paragraph, then the usage"
    usage = lines[lines.index("usage:") + 1:lines.index("usage:") + 3]
    assert all(u.startswith(f"  python experiments/{name}.py configs/") for u in usage), usage
    assert any(line.startswith("  --dry_run=False") for line in lines)
    assert any(line.startswith("  --root=") for line in lines)
