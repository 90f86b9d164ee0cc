"""What the experiment drivers share: running their jobs, and writing their tables.

A driver plans its experiment as jobs - a script of this repository with its arguments, the jobs
it needs first, a test of whether its output already exists, a log - and hands them to run_jobs:

    jobs = [Job("a train", "train_splade.py", [...], done=lambda: model.exists(), log=out / "train.out"),
            Job("a eval", "eval/retrieval.py", [...], needs=["a train"], done=lambda: metrics.exists())]
    outcome = run_jobs(jobs, slots=2, threads=1)   # outcome.failed: {job name: exit status}

A finished job is skipped, and the training scripts resume a killed run from its checkpoint, so
running a driver again continues its experiment. A failed job stops only the jobs that need it;
the driver decides how to report it. A job that fails for want of something of the environment
(its error's UserError.needs: the Hub, a missing file) also stops the jobs that would fail the same
way - for the Hub, the other jobs of its script; for a file, the jobs whose arguments name it - and
the jobs that need those, said in one line, instead of failing them one after another.
slots=0 runs the jobs inside this process, one after the other, by calling the scripts'
main(argv) (the tests do that: no interpreter start per job).

What counts as finished (data/stamp.py's rule): a job with a `marker` records there, when it
succeeds, its stamp - its script, its arguments and the identity of its `inputs` (a model folder it
evaluates, say); it is finished only when `done()` holds (its output parses) and the marker holds
the stamp it has now. A job whose stamp changed is run again after its `output` is moved aside to
NAME.stale-N, with one line saying what changed; a job with no readable marker is run (a killed one
resumes). A job that needs a job that runs is checked again when it may start, since its inputs may
have changed (and skipped then if they did not).
"""
import importlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cli import OS_INPUT_ERRORS, UserError
from data import stamp as stamps

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Job:
    name: str
    script: str                     # a script of this repository: train_lm.py, eval/retrieval.py, ...
    argv: list
    needs: list = field(default_factory=list)      # names of the jobs that must succeed first
    done: Callable[[], bool] = lambda: False       # True when its output exists: then it is skipped
    log: Path | None = None         # where its process writes, appended (None, or in process: the terminal)
    launcher: list | None = None    # e.g. ["torchrun", "--nproc_per_node=8"]; None: this Python
    on_success: Callable[[float], None] | None = None   # called here with its wall seconds
    marker: Path | None = None      # its stamp, written there when it succeeds (None: done() alone decides)
    output: Path | None = None      # moved aside before a run of another stamp (None: the script decides)
    inputs: list = field(default_factory=list)     # files/folders its output is computed from
    started_with: dict | None = field(default=None, repr=False)   # its stamp when it started

    def command(self):
        return [*(self.launcher or [sys.executable]), str(ROOT / self.script), *self.argv]

    def stamp(self):
        """What its output is computed from; None while an input is missing (not produced yet)."""
        if not all(Path(p).exists() for p in self.inputs):
            return None
        return stamps.make({"script": self.script, "argv": [str(a) for a in self.argv]},
                           {"inputs": self.inputs} if self.inputs else None)

    def finished(self):
        """done() holds and, with a marker, the marker holds the job's stamp now."""
        if not self.done():
            return False
        return self.marker is None or stamps.same(stamps.read(self.marker), self.stamp())

    def make_room(self):
        """Before a run: a marker of another stamp means the output was made from other inputs:
        say what changed, and move the output aside."""
        old = stamps.read(self.marker) if self.marker is not None else None
        if old is None or self.output is None or not Path(self.output).exists():
            return
        now = self.stamp()
        if now is not None and not stamps.same(old, now):
            aside = stamps.move_aside(self.output)
            stamps.note(f"note: {self.name}: its output {self.output} was made from other inputs "
                        f"({stamps.differences(old, now)}); moved it to {aside.name}, running it again")


@dataclass
class Outcome:
    """What run_jobs did. It is filled in as the jobs end, so that a caller's `finally` can record
    the part of an interrupted run."""
    skipped: list = field(default_factory=list)    # finished before: not run
    started: list = field(default_factory=list)    # in the order they started
    timing: dict = field(default_factory=dict)     # name -> {"seconds", "cpu_seconds"}
    failed: dict = field(default_factory=dict)     # name -> exit status
    blocked: list = field(default_factory=list)    # not run: a job they need failed, or what they need is missing
    missing: dict = field(default_factory=dict)    # what of the environment a failed job needed -> its name


def run_jobs(jobs, slots, threads=None, cwd=None, dry_run=False, outcome=None) -> Outcome:
    """Run the unfinished jobs, `slots` processes at a time (0: in this process), each once the
    jobs it needs have succeeded; jobs start in list order as slots free up. `threads`: the
    OMP/MKL threads of each process (None: as in this environment, e.g. under torchrun); `cwd`:
    the processes' working directory. dry_run prints the commands of the unfinished jobs."""
    outcome = Outcome() if outcome is None else outcome
    names = {job.name for job in jobs}
    for job in jobs:
        unknown = sorted(set(job.needs) - names)
        if unknown:
            raise ValueError(f"job {job.name!r} needs {unknown}, which the plan does not have")
    pending = [job for job in jobs if not job.finished()]
    while True:  # a job that needs one that runs may see other inputs: it is checked again when it may start
        later = [job for job in jobs if job not in pending and any(n in {p.name for p in pending} for n in job.needs)]
        if not later:
            break
        pending += later
    pending.sort(key=jobs.index)
    outcome.skipped += [job.name for job in jobs if job not in pending]
    print(f"{len(pending)} job(s) to run, {len(outcome.skipped)} finished already; {slots or 1} at a time", flush=True)
    if dry_run:
        for job in pending:
            print("$ " + shlex.join(job.command()))
        return outcome
    env = process_env(threads)
    errors = Path(tempfile.mkdtemp(prefix="runner_errors_"))  # each process's error (cli.run_cli: REPRLAB_ERROR_FILE)
    error_of = {}  # job name -> its error file
    running, rechecked = {}, set()   # name -> (process, open log or None, start time, job)
    # `kill` (SIGTERM) stops the jobs too, as Ctrl-C does: each training script saves a checkpoint
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        while pending or running:
            _block_dependents(pending, outcome)
            ready = [job for job in pending if all(_succeeded(n, outcome) for n in job.needs)]
            for job in [j for j in ready if j.needs and j.name not in rechecked]:
                rechecked.add(job.name)
                if job.finished():  # its inputs came out the same
                    pending.remove(job)
                    ready.remove(job)
                    outcome.skipped.append(job.name)
                    print(f"{job.name}: finished already (the jobs it needs left its inputs as they were)", flush=True)
            if slots == 0 and ready:
                pending.remove(ready[0])
                _run_here(ready[0], outcome, pending)
                continue
            for job in ready[:max(0, slots - len(running))]:
                pending.remove(job)
                error_of[job.name] = errors / f"{len(error_of)}.json"
                running[job.name] = (*_start(job, {**env, "REPRLAB_ERROR_FILE": str(error_of[job.name])}, cwd), job)
                outcome.started.append(job.name)
            if not running:
                if pending:  # only a cycle in `needs` leaves jobs that can never start
                    raise ValueError(f"jobs {[j.name for j in pending]} wait for each other")
                break
            time.sleep(0.2)
            _reap(running, outcome, pending, error_of)
    finally:
        shutil.rmtree(errors, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
        for proc, log, _, _ in running.values():   # interrupted: stop the jobs, let them save
            proc.terminate()
            proc.wait()
            if log:
                log.close()
    return outcome


def process_env(threads=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}   # a log shows what a job does while it runs
    if threads is not None:  # tiny models run fastest on one thread per process, N processes at once
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    return env


def _succeeded(name, outcome):
    """Finished before this run, or run now without failing."""
    return name in outcome.skipped or (name in outcome.timing and name not in outcome.failed)


def _block_dependents(pending, outcome):
    """Take out of `pending` (and report) the jobs that need a job that failed or could not run."""
    for job in list(pending):
        lost = [n for n in job.needs if n in outcome.failed or n in outcome.blocked]
        if lost:
            pending.remove(job)
            outcome.blocked.append(job.name)
            print(f"{job.name}: not run, since {', '.join(lost)} did not succeed", flush=True)


def _start(job, env, cwd):
    """The job's process, with its output in its log (after a line with the command)."""
    job.make_room()
    job.started_with = job.stamp()
    command = job.command()
    print(f"$ {shlex.join(command)}" + (f"  >> {job.log}" if job.log else ""), flush=True)
    log = None
    if job.log:
        Path(job.log).parent.mkdir(parents=True, exist_ok=True)
        log = open(job.log, "a")
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT if log else None)
    return proc, log, time.time()


def _reap(running, outcome, pending, error_of):
    """Record the jobs whose process has ended; the CPU seconds are the process's own (rusage)."""
    for name, (proc, log, t0, job) in list(running.items()):
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == 0:
            continue
        proc.returncode = os.waitstatus_to_exitcode(status)
        if log:
            log.close()
        del running[name]
        error_file = error_of[name]
        _ended(job, proc.returncode, time.time() - t0, usage.ru_utime + usage.ru_stime, outcome)
        if proc.returncode and error_file.exists():
            try:
                needs = json.loads(error_file.read_text()).get("needs")
            except (OSError, ValueError):
                needs = None
            _stop_those_that_need(needs, job, pending, outcome)


def _stop_those_that_need(needs, failed, pending, outcome):
    """`failed` failed for want of `needs` (UserError.needs: "the Hub", or a path): take out of
    `pending` the jobs that would fail the same way, and the jobs that need those or `failed`,
    and say so in one line."""
    if not needs:
        return
    outcome.missing.setdefault(needs, failed.name)
    if needs == "the Hub":
        same = [job for job in pending if job.script == failed.script]
        what = "the Hub is out of reach"
    else:
        same = [job for job in pending if any(needs in str(a) for a in job.argv)]
        what = f"{needs!r} is missing"
    lost = {failed.name} | {job.name for job in same}
    grew = True
    while grew:  # and everything downstream of them
        more = {job.name for job in pending if job.name not in lost and set(job.needs) & lost}
        lost, grew = lost | more, bool(more)
    stopped = [job for job in pending if job.name in lost]
    if not stopped:
        return
    for job in stopped:
        pending.remove(job)
        outcome.blocked.append(job.name)
    print(f"{len(stopped)} more job(s) not run: {what} ({failed.name} failed for it), and they need it or what it "
          f"makes; once it is there, run the same command again (finished jobs are skipped)", flush=True)


def _run_here(job, outcome, pending=None):
    """The job's script, main(argv) in this process; a failure becomes an exit status, as it would
    for a process: 2 for a user error (cli.run_cli's), 1 with the traceback for anything else."""
    import torch
    job.make_room()
    job.started_with = job.stamp()
    print(f"$ {shlex.join(job.command())}", flush=True)
    outcome.started.append(job.name)
    main = importlib.import_module(job.script.removesuffix(".py").replace("/", ".")).main
    threads, t0, c0 = torch.get_num_threads(), time.time(), time.process_time()
    needs = None
    try:
        main(list(job.argv))
        rc = 0
    except (UserError, *OS_INPUT_ERRORS) as e:
        print(f"error: {e}", file=sys.stderr)
        rc, needs = 2, getattr(e, "needs", None)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:  # noqa: BLE001 - one broken job must not stop the experiment
        traceback.print_exc()
        rc = 1
    finally:
        torch.set_num_threads(threads)  # the scripts may set their own
    _ended(job, rc, time.time() - t0, time.process_time() - c0, outcome)
    _stop_those_that_need(needs, job, [] if pending is None else pending, outcome)


def _ended(job, rc, seconds, cpu_seconds, outcome):
    outcome.timing[job.name] = {"seconds": seconds, "cpu_seconds": cpu_seconds}
    if rc:
        outcome.failed[job.name] = rc
        see = f", see {job.log}" if job.log and Path(job.log).exists() else ""
        print(f"{job.name}: FAILED (exit {rc}{see})", flush=True)
        return
    print(f"{job.name}: done in {seconds:.0f} s", flush=True)
    if job.on_success:
        job.on_success(seconds)
    if job.marker is not None:  # last: a job that did not get this far is not finished
        stamp = job.started_with or job.stamp()
        if stamp is not None:
            stamps.write(job.marker, stamp)


# ------------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------------


def markdown_table(head, rows) -> str:
    """A markdown table: the header cells, then one list of cell texts per row."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def cell(value, spec, missing="-"):
    """`value` formatted by `spec`, or `missing` where a run has not produced it (None)."""
    return missing if value is None else format(value, spec)
