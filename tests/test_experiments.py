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


# A stand-in for a script that needs the environment: a Hub file (offline, with an empty cache:
# conftest) or a local model folder, through the project's own loaders and cli.run_cli
NEEDY_SCRIPT = """import sys
sys.path.insert(0, {root!r})
import cli
from hf import hub
from hf.models import resolve_model_folder

def main(argv):
    name, what, record = argv
    with open(record, "a") as f:
        f.write(name + "\\n")
    if what == "hub":
        hub.hf_hub_download("org/backbone", "config.json")
    elif what != "nothing":
        resolve_model_folder(what)

if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
"""


def sweep_plan(tmp_path, folder):
    """splade_sweep.py's shape: trainings that need the Hub, each evaluated twice; trainings from a
    local folder; and an unrelated job."""
    train, local, plain = tmp_path / "train_hub.py", tmp_path / "train_local.py", tmp_path / "job.py"
    for script in (train, local):
        script.write_text(NEEDY_SCRIPT.format(root=str(ROOT)))
    plain.write_text(JOB_SCRIPT)
    record = str(tmp_path / "ran.txt")
    jobs = []
    for i in range(4):
        jobs.append(Job(f"hub{i} train", str(train), [f"hub{i}", "hub", record]))
        jobs += [Job(f"hub{i} eval {b}", str(plain), [f"hub{i}-{b}", "0", record], needs=[f"hub{i} train"])
                 for b in ("x", "y")]
    jobs += [Job(f"local{i} train", str(local), [f"local{i}", str(folder), record]) for i in range(3)]
    jobs.append(Job("other", str(local), ["other", "nothing", record]))
    return jobs


@pytest.mark.parametrize("slots", [1, 0], ids=["processes", "in_process"])
def test_a_missing_hub_or_file_stops_the_jobs_that_need_it_after_the_first_failure(tmp_path, capsys, slots, monkeypatch):
    """experiments/splade_sweep.py without the Hub used to fail its 48 trainings one after another
    (~37 s each) and list 192 blocked evaluations. The first failure names what it needed
    (UserError.needs, through REPRLAB_ERROR_FILE for a process); the runner stops the jobs that
    need the same and says so in one line; jobs that need neither still run."""
    if slots == 0:
        monkeypatch.syspath_prepend(str(tmp_path))
    jobs = sweep_plan(tmp_path, tmp_path / "no_such_model")
    if slots == 0:
        for job in jobs:
            job.script = Path(job.script).name
    outcome = run_jobs(jobs, slots=slots, threads=1)
    ran = (tmp_path / "ran.txt").read_text().split()
    assert ran == ["hub0", "local0", "other"], "one attempt at each missing thing; the unrelated job runs"
    assert outcome.failed == {"hub0 train": 2, "local0 train": 2}
    assert sorted(outcome.blocked) == sorted(j.name for j in jobs if j.name not in ("hub0 train", "local0 train",
                                                                                      "other"))
    assert outcome.missing == {"the Hub": "hub0 train", str(tmp_path / "no_such_model"): "local0 train"}
    said = [ln for ln in capsys.readouterr().out.splitlines() if "not run" in ln]
    assert said == [
        "11 more job(s) not run: the Hub is out of reach (hub0 train failed for it), and they need it or what it makes; "
        "once it is there, run the same command again (finished jobs are skipped)",
        f"2 more job(s) not run: {str(tmp_path / 'no_such_model')!r} is missing (local0 train failed for it), and they "
        "need it or what it makes; once it is there, run the same command again (finished jobs are skipped)"]


def test_a_failure_that_names_nothing_of_the_environment_stops_only_its_dependents(make_job, tmp_path):
    jobs = [make_job("bad", status=2), make_job("bad2", status=2), make_job("after", needs=["bad"])]
    outcome = run_jobs(jobs, slots=1, threads=1)
    assert outcome.failed == {"bad": 2, "bad2": 2} and outcome.blocked == ["after"] and outcome.missing == {}


def test_a_comment_continued_under_its_key_joins_that_key_s_help_line(tmp_path):
    """A DEFAULTS comment on the lines under a key (indented past the keys) goes on with that key's
    help; a comment at the keys' indentation is a group title."""
    import cli
    script = tmp_path / "driver.py"
    script.write_text('"""A driver.\n\n    python driver.py\n"""\nDEFAULTS = dict(\n    # the group\n'
                      '    init="",          # a checkpoint to continue;\n'
                      '                      # "": from scratch\n    # another group\n    jobs=1,\n)\n')
    lines = cli.config_help({"init": "", "jobs": 1}, script=str(script)).splitlines()
    at = lines.index("the group")
    assert lines[at + 1].split(None, 1) == ["--init=''", 'a checkpoint to continue; "": from scratch']
    assert lines[at + 2:at + 5] == ["", "another group", "  --jobs=1"]


def test_runner_plans_again_when_a_job_ends_so_what_it_made_possible_starts_at_once(make_job, tmp_path):
    """`more`: the plan asked again as each job ends. "next" exists only once "quick" has run; with two
    slots it starts while "slow" still runs, instead of waiting for the whole first plan to end."""
    slow = tmp_path / "slow.py"
    slow.write_text("import sys, time\ntime.sleep(4)\nopen(sys.argv[1], 'a').write('slow\\n')\n")
    first = [make_job("quick"), Job("slow", str(slow), [str(tmp_path / "ran.txt")], log=tmp_path / "logs" / "slow.log")]

    def plan():
        ran = (tmp_path / "ran.txt").read_text().split() if (tmp_path / "ran.txt").exists() else []
        return first + ([make_job("next")] if "quick" in ran else [])
    outcome = run_jobs(first, slots=2, threads=1, more=plan)
    assert (tmp_path / "ran.txt").read_text().split() == ["quick", "next", "slow"]
    assert outcome.started == ["quick", "slow", "next"], "next ran (and ended, ran.txt) while slow ran"
