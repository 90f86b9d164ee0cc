"""What the experiment drivers share: the command line, the job loop, timing, results.json /
results.md and the plots. A driver is its settings, its plan and its report:

    DEFAULTS = dict(out_dir="out/x", ..., jobs=2, threads=1, action="all")
    def plan(C, out):   return [Job("a train", "train_splade.py", [...], output=out / "a"),
                                Job("a eval", "eval/retrieval.py", [...], needs=["a train"], ...)]
    def report(C, out, outcome):   return Report(markdown_of_the_tables, record, plots=lambda: [...])
    main = Driver(__file__, DEFAULTS, plan, report).main

Driver.main reads the command line (configs/*.py, then --key=value), locks the output folder, runs the
plan (action=all: what is missing; table: nothing; publish: as all, then the rows written under docs/results/
to be committed), records the time in timing.json and writes results.md, results.json and the plots. The plan
is called again whenever a job ends (a job may start from what earlier jobs made). A failed job stops only the
jobs that need it (or would fail the same way, UserError.needs); the driver then exits 2 naming each. A job
dies with its driver, a SIGKILL included. slots=0 runs the jobs in this process (the tests).

Finished (docs/reuse.md): a job that succeeds writes its key in its `marker` (job.json in its output folder);
a finished job is skipped, one whose key changed runs again after its output is set aside under its old key,
one whose key is in a row committed under docs/results/<out_dir name>/ runs only when a job that runs needs it
or another job of its row runs (the row is then made whole here).
"""
import contextlib
import csv
import datetime
import glob
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

import cli
from checkpoint import RunLock
from cli import OS_INPUT_ERRORS, ConfigError, UserError
from data import manifest
from data.atomic import ExclusiveLock, atomic_write, write_json, write_text

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_FLAGS = ("out", "out_dir")   # the arguments by which the scripts name the folder they write


@dataclass
class Job:
    name: str
    script: str                     # a script of this repository: train_lm.py, eval/retrieval.py, ...
    argv: list                      # its paths absolute (or relative to the current directory)
    needs: list = field(default_factory=list)      # names of the jobs that must succeed first
    done: Callable[[], bool] = lambda: False       # True when its output exists: then it is skipped
    log: Path | None = None         # where its process writes, appended (None, or in process: the terminal)
    launcher: list | None = None    # e.g. ["torchrun", "--nproc_per_node=8"]; None: this Python
    on_success: Callable[[float], None] | None = None   # called here with its wall seconds
    marker: Path | None = None      # its key, written when it succeeds (default: job.json in its output folder)
    output: Path | None = None      # set aside before a run of another key (None: the script decides)
    started_with: dict | None = field(default=None, repr=False)   # its key when it started
    plan: list = field(default_factory=list, repr=False)          # the other jobs (run_jobs): who makes an input

    def __post_init__(self):
        named = [text for key, text in _arguments(self.argv) if key in OUTPUT_FLAGS]
        self._folder = Path(self.output) if self.output is not None else Path(named[0]) if named else None
        if self.marker is None and self._folder is not None:
            self.marker = self._folder / "job.json"

    def command(self):
        return [*(self.launcher or [sys.executable]), str(ROOT / self.script), *self.argv]

    def output_folder(self):
        """`output`, or the folder its --out / --out_dir argument names (None: it names none)."""
        return self._folder   # made once: a plan asks every job for it, for every key

    def named_inputs(self):
        """(config files, other paths) its arguments name that exist or a job makes, none in its output."""
        outputs = [os.path.abspath(p) for p in (self.output_folder(), self.marker, self.log) if p is not None]
        configs, paths = [], []
        made = [os.path.abspath(j.output_folder()) for j in self.plan if j.output_folder() is not None]
        for key, text in _arguments(self.argv):
            if key in OUTPUT_FLAGS:
                continue
            for path in _paths_in(text, made):
                if _inside(path, outputs) or _inside(os.path.abspath(path), outputs, holding=True):
                    continue
                (configs if path.suffix == ".py" and path.is_file() else paths).append(path)
        return list(dict.fromkeys(configs)), list(dict.fromkeys(paths))

    def key(self):
        """What its output is computed from (module docstring); None while an input no job makes is missing."""
        configs, paths = self.named_inputs()
        settings = {"script": self.script, "argv": [_portable(a) for a in self.argv]}
        if configs:
            settings["configs"] = {_portable(p): _config_settings(p) for p in configs}
        inputs = {}
        for p in paths:
            made = self.made_by(p)
            if made is not None:   # another job's output: by that job's key, read or not yet made
                settings[f"made by {made[0]}"] = made[1]
            elif not p.exists():
                return None
            else:
                inputs[f"input {_portable(p)}"] = p
        return manifest.key(settings, inputs)

    def made_by(self, path):
        """(job name, key digest) of the job whose output holds `path` (its marker, else the plan's); or None."""
        for folder in list(Path(os.path.abspath(path)).parents)[:6]:
            marker = manifest.read_json(folder / "job.json")
            if isinstance(marker, dict) and "key" in marker:
                return marker.get("job"), manifest.digest(marker["key"])
        maker = next((j for j in self.plan if j is not self and j.output_folder() is not None
                      and _inside(path, [os.path.abspath(j.output_folder())])), None)
        key = maker.key() if maker is not None else None
        return None if key is None else (maker.name, manifest.digest(key))

    def finished(self):
        """done() holds and, with a marker, the marker holds the job's key now."""
        return self.done() and (self.marker is None or (manifest.read_json(self.marker) or {}).get("key") == self.key())

    def make_room(self):
        """Before a run: an output of another key is set aside under that key's name, saying what changed."""
        old = manifest.read_json(self.marker) if self.marker is not None else None
        if not isinstance(old, dict) or self.output is None or not Path(self.output).exists():
            return
        now = self.key()
        if now is not None and old.get("key") != now:
            aside = manifest.aside(self.output, name=Path(self.marker).name)
            manifest.note(f"note: {self.name}: its output {self.output} was made from other inputs "
                          f"({manifest.differences(old.get('key'), now)}); moved it to {aside.name}, running it again")

    def taken_back(self):
        """True when an output of its key now, set aside earlier, was put back and is finished."""
        if self.marker is None or self.output is None or Path(self.marker).parent != Path(self.output):
            return False
        now = self.key()
        return (now is not None and manifest.take_back(self.output, now, f"{self.name}: its output",
                                                       name=Path(self.marker).name) and self.finished())


def _inside(path, folders, holding=False):
    """Whether `path` is one of `folders` or inside one (holding: or holds one)."""
    path = os.path.abspath(path)
    return any(path == f or path.startswith(f + os.sep) or (holding and f.startswith(path + os.sep)) for f in folders)


def _portable(text):
    """A path or argument with this repository's root left out: the same key in another clone."""
    return str(text).replace(str(ROOT) + os.sep, "")


def _arguments(argv):
    """(key with underscores, or None for a bare argument, text) of each value of a command line."""
    argv, out = [str(a) for a in argv], []
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            if "=" in arg:
                key, text = arg[2:].split("=", 1)
                out.append((key.replace("-", "_"), text))
            continue
        before = argv[i - 1] if i else ""
        key = before[2:].replace("-", "_") if before.startswith("--") and "=" not in before else None
        out.append((key, arg))
    return out


def _paths_in(text, made=()):
    """The files and folders a value names (a path, a glob, a list, NAME=PATH) that exist or lie in `made`
    (absolute folders)."""
    parts = [text] if text and os.path.exists(text) else text.split(",")
    for part in parts:
        if part and not os.path.exists(part) and "=" in part:
            part = part.split("=", 1)[1]
        if any(c in part for c in "*?"):
            found = sorted(glob.glob(part))
            yield from (Path(p) for p in found or ([part] if os.path.isabs(part) and _inside(part, made) else []))
        elif part and (os.path.exists(part) or (os.path.isabs(part) and _inside(part, made))):
            yield Path(part)


def _config_settings(path):
    """A config file as the script reads it: the settings it makes (its text, where it does not run)."""
    try:
        return cli.config_file(path)
    except Exception:  # noqa: BLE001 - a config that cannot run fails its job; its key is its content
        return manifest.identity(path)


@dataclass
class Outcome:
    """What run_jobs did, filled in as the jobs end (a caller's `finally` records an interrupted run)."""
    skipped: list = field(default_factory=list)    # finished before: not run
    started: list = field(default_factory=list)    # in the order they started
    timing: dict = field(default_factory=dict)     # name -> {"seconds", "cpu_seconds", ...}
    failed: dict = field(default_factory=dict)     # name -> exit status
    reasons: dict = field(default_factory=dict)    # name -> what a failed job said last (its error, or its log's)
    blocked: list = field(default_factory=list)    # not run: a job they need failed, or what they need is missing
    missing: dict = field(default_factory=dict)    # what of the environment a failed job needed -> its name
    history: dict = field(default_factory=dict)    # timing.json: every job's and invocation's time (Driver.main)
    code: dict = field(default_factory=dict)       # code_version() of this invocation, in each job's timing


def run_jobs(jobs, slots, threads=None, cwd=None, dry_run=False, outcome=None, more=None, committed=None,
             plan=None) -> Outcome:
    """Run the unfinished jobs, `slots` processes at a time (0: in this process), each once the jobs it needs
    have succeeded, in list order. threads: each process's OMP/MKL threads (None: as here); more: returns the
    plan again when a job has ended (new names join); committed: {key digest: row name} of committed rows' jobs."""
    outcome = Outcome() if outcome is None else outcome
    jobs = list(jobs)
    for job in plan or jobs:
        job.plan = plan or jobs

    def elsewhere(job):   # its row is committed, its output is not here
        return bool(committed) and (key := job.key()) is not None and manifest.digest(key) in committed

    def in_fresh(job):   # of a committed row that a job here runs for (of_row): the row is made whole here
        return any(of_row(job.name, row) for row in fresh)
    names = {job.name for job in jobs} | set(outcome.skipped) | set(outcome.timing)  # and earlier rounds'
    for job in jobs:
        unknown = sorted(set(job.needs) - names)
        if unknown:
            raise ValueError(f"job {job.name!r} needs {unknown}, which the plan does not have")
    pending = [job for job in jobs if not (job.finished() or job.taken_back())]
    kept = [job for job in pending if elsewhere(job)]
    pending = [job for job in pending if job not in kept]
    # a committed row with a job whose key it lacks (to run, or finished here after the row was committed) is
    # made whole here: its committed jobs run too, so that it is published with every job's key
    rows = set((committed or {}).values())
    fresh = {row for row in rows if any(of_row(job.name, row) and not elsewhere(job) for job in jobs)}
    while True:  # a job that needs one that runs may see other inputs: it is checked again when it may start;
        names = {p.name for p in pending}   # a committed one that a job here needs runs, and one of a fresh row
        later = [job for job in jobs if job not in pending and (any(n in names for n in job.needs) or (
            job in kept and (any(job.name in p.needs for p in pending) or in_fresh(job))))]
        if not later:
            break
        pending += later
    pending.sort(key=jobs.index)
    finished = [job.name for job in jobs if job not in pending]
    outcome.skipped += finished
    print(f"{len(pending)} job(s) to run, {len(finished)} finished already; {slots or 1} at a time", flush=True)
    if dry_run:
        for job in pending:
            print("$ " + shlex.join(job.command()))
        return outcome
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}   # a log shows what a job does while it runs
    if threads is not None:  # tiny models run fastest on one thread per process, N processes at once
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    errors = Path(tempfile.mkdtemp(prefix="runner_errors_"))  # each process's error (cli.run_cli: REPRLAB_ERROR_FILE)
    error_of = {}  # job name -> its error file
    running, rechecked = {}, set()   # name -> (process, open log or None, start time, job)
    # `kill` (SIGTERM) stops the jobs too, as Ctrl-C does: each training script saves a checkpoint
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        while pending or running:
            _block_dependents(pending, outcome)
            succeeded = set(outcome.skipped) | (set(outcome.timing) - set(outcome.failed))
            ready = [job for job in pending if set(job.needs) <= succeeded]
            rechecks = [j for j in ready if j.needs and j.name not in rechecked]
            rechecked.update(j.name for j in rechecks)
            found = [j for j in rechecks if j.finished() or j.taken_back() or (elsewhere(j) and not in_fresh(j))]
            for job in found:  # its inputs came out the same
                pending.remove(job)
                outcome.skipped.append(job.name)
                print(f"{job.name}: finished already (the jobs it needs left its inputs as they were)", flush=True)
            if found:  # the jobs that need those may start now
                continue
            if slots == 0 and ready:
                pending.remove(ready[0])
                _run_here(ready[0], outcome, pending)
                continue
            for job in ready[:max(0, slots - len(running))]:
                pending.remove(job)
                error_of[job.name] = errors / f"{len(error_of)}.json"
                running[job.name] = (*_start(job, outcome, {**env, "REPRLAB_ERROR_FILE": str(error_of[job.name]),
                                                            DRIVER_PID: str(os.getpid())}, cwd), job)
            if not running:
                if pending:  # only a cycle in `needs` leaves jobs that can never start
                    raise ValueError(f"jobs {[j.name for j in pending]} wait for each other")
                break
            time.sleep(0.2)
            before = len(running)
            _reap(running, outcome, pending, error_of)
            if more is not None and len(running) < before:
                _join(jobs, pending, more(), outcome)
    finally:
        shutil.rmtree(errors, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
        for proc, log, _, _ in running.values():   # interrupted: stop the jobs (their whole group), let them save
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            if log:
                log.close()
    return outcome


def last_line(path, tail=1 << 16):
    """The last line of a log with text on it (a progress bar's last state counts: after its last \\r)."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
        text = f.read().decode("utf-8", "replace")
    lines = [ln.strip() for ln in text.replace("\r", "\n").split("\n") if ln.strip()]
    return lines[-1] if lines else None


def _block_dependents(pending, outcome):
    """Take out of `pending` (and report) the jobs that need a job that failed or could not run."""
    for job in list(pending):
        lost = [n for n in job.needs if n in outcome.failed or n in outcome.blocked]
        if lost:
            pending.remove(job)
            outcome.blocked.append(job.name)
            print(f"{job.name}: not run, since {', '.join(lost)} did not succeed", flush=True)


def _begin(job, outcome, log=None):
    """A job about to run: its output made room for, its key kept, its command said."""
    job.make_room()
    job.started_with = job.key()
    outcome.started.append(job.name)
    print(f"$ {shlex.join(job.command())}" + (f"  >> {log}" if log else ""), flush=True)


def _start(job, outcome, env, cwd):
    """The job's process, with its output in its log (after a line with the command)."""
    _wait_for_an_ending_job(job)
    _begin(job, outcome, job.log)
    log = None
    if job.log:
        Path(job.log).parent.mkdir(parents=True, exist_ok=True)
        log = open(job.log, "a")
        print(f"$ {shlex.join(job.command())}", file=log, flush=True)
    # its own session: its group (a launcher's workers too) is stopped as one, and a Ctrl-C of the
    # terminal reaches the driver alone, which stops its jobs
    proc = subprocess.Popen(_dying_with_this_process(job.command()), cwd=cwd, env=env, stdout=log,
                            stderr=subprocess.STDOUT if log else None, start_new_session=True)
    return proc, log, time.time()


# A job must not outlive its driver: a driver killed by SIGKILL runs no code of ours, so the job
# asks the kernel (prctl PR_SET_PDEATHSIG) for a SIGTERM when its parent dies, which a training
# script answers by saving and stopping; then it becomes the command (exec: the same pid). A driver
# that died before the request was made is seen by the parent pid. Linux only.
DIE_WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); os.getppid() == "
                   "int(sys.argv[1]) or os.kill(os.getpid(), signal.SIGTERM); os.execvp(sys.argv[2], sys.argv[2:])")


def _dying_with_this_process(command):
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), *command]


# A driver run again right after it was killed finds its job's folder still locked by the old job,
# saving after its SIGTERM: the new job waits for it (at most ENDING_WAIT seconds) instead of failing
# "in use". A job's environment names its driver (DRIVER_PID), which tells such a lock from another
# run's, refused at once as before.
DRIVER_PID, ENDING_WAIT = "REPRLAB_DRIVER_PID", 600.0


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"   # a zombie has ended
    except (OSError, IndexError):
        return False


def _a_job_whose_driver_is_gone(pid):
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    driver = next((e.split(b"=", 1)[1] for e in environ if e.startswith(DRIVER_PID.encode() + b"=")), b"")
    return driver.isdigit() and int(driver) != os.getpid() and not _alive(int(driver))


def _wait_for_an_ending_job(job):
    """While the job's output folder's RUN.lock is held by a job of a driver that is gone, wait."""
    if not job.output or not (Path(job.output) / "RUN.lock").is_file():
        return
    lock_file = Path(job.output) / "RUN.lock"
    probe, deadline, said = ExclusiveLock(lock_file), time.time() + ENDING_WAIT, False
    while not probe.acquire():
        if not (str(probe.holder).isdigit() and _a_job_whose_driver_is_gone(int(probe.holder))) \
                or time.time() > deadline:
            return   # another run's lock: the job says so itself
        if not said:
            print(f"{job.name}: waiting for pid {probe.holder}, this job as an earlier driver started it, to end "
                  f"(its driver is gone: it is saving) and let go of {lock_file.parent}", flush=True)
            said = True
        time.sleep(0.5)
    probe.release()


def _join(jobs, pending, plan, outcome):
    """The jobs of `plan` of new names join `jobs` and `pending` (unless finished), in the plan's order."""
    known = {job.name for job in jobs}
    new = [job for job in plan if job.name not in known]
    if not new:
        return
    jobs += new
    for job in plan:
        job.plan = plan
    for job in new:
        if job.finished() or job.taken_back():
            outcome.skipped.append(job.name)
        else:
            pending.append(job)
    order = {job.name: i for i, job in enumerate(plan)}
    pending.sort(key=lambda job: order.get(job.name, -1))
    print(f"{len(new)} more job(s) planned", flush=True)


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
        said = (manifest.read_json(error_of[name]) or {}) if proc.returncode else {}  # cli.run_cli's
        _ended(job, proc.returncode, time.time() - t0, usage.ru_utime + usage.ru_stime, outcome, said.get("message"))
        if proc.returncode:
            _stop_those_that_need(said.get("needs"), job, pending, outcome)


def _stop_those_that_need(needs, failed, pending, outcome):
    """`failed` failed for want of `needs` (UserError.needs: "the Hub", or a path): take out of
    `pending` the jobs that would fail the same way and those that need them, said in one line."""
    if not needs:
        return
    outcome.missing.setdefault(needs, failed.name)
    hub = needs == "the Hub"   # then the jobs of its script, else those that name the missing path
    same = [job for job in pending if (job.script == failed.script if hub else any(needs in str(a) for a in job.argv))]
    what = "the Hub is out of reach" if hub else f"{needs!r} is missing"
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


def _run_here(job, outcome, pending):
    """The job's main(argv) in this process; a failure becomes its exit status: 2 for a user error, 1 else."""
    import torch
    _begin(job, outcome)
    main = importlib.import_module(job.script.removesuffix(".py").replace("/", ".")).main
    threads, t0, c0 = torch.get_num_threads(), time.time(), time.process_time()
    rc, needs, said = 0, None, None
    try:
        main(list(job.argv))
    except (UserError, *OS_INPUT_ERRORS) as e:
        said = f"error: {e}"
        print(said, file=sys.stderr)
        rc, needs = 2, getattr(e, "needs", None)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        said = e.code if isinstance(e.code, str) else None
    except Exception as e:  # noqa: BLE001 - one broken job must not stop the experiment
        traceback.print_exc()
        rc, said = 1, f"{type(e).__name__}: {e}"
    finally:
        torch.set_num_threads(threads)  # the scripts may set their own
    _ended(job, rc, time.time() - t0, time.process_time() - c0, outcome, said)
    _stop_those_that_need(needs, job, pending, outcome)


def _utc_now(fmt="%Y-%m-%d %H:%M UTC"):
    return datetime.datetime.now(datetime.timezone.utc).strftime(fmt)


def _ended(job, rc, seconds, cpu_seconds, outcome, said=None):
    """Record a job that ended; `said`: its error line, when it wrote one (else its log's last line)."""
    outcome.timing[job.name] = {"seconds": seconds, "cpu_seconds": cpu_seconds, **outcome.code,
                                "ended": _utc_now()}
    if rc:
        outcome.failed[job.name] = rc
        has_log = job.log and Path(job.log).exists()
        last = said or (last_line(job.log) if has_log else None)
        outcome.reasons[job.name] = (f"exit {rc}" + (f": {' '.join(str(last).split())}" if last else "")
                                     + (f" (the last line of its log {job.log})" if has_log and not said else
                                        f" (its log: {job.log})" if has_log else ""))
        print(f"{job.name}: FAILED (exit {rc}{f', see {job.log}' if has_log else ''})", flush=True)
        return
    print(f"{job.name}: done in {seconds:.0f} s", flush=True)
    if job.on_success:
        job.on_success(seconds)
    if job.marker is not None:  # last: a job that did not get this far is not finished
        key = job.started_with or job.key()
        if key is not None:
            Path(job.marker).parent.mkdir(parents=True, exist_ok=True)
            write_json(job.marker, {"key": key, "files": {}, "job": job.name, "needs": list(job.needs)}, default=str)


# ----- A driver: its settings, its plan and its report; the rest is here, once
MAX_ROUNDS = 20   # a plan that keeps returning new jobs is a bug, not an experiment


class JobsFailed(UserError):
    """A driver's job failed: the driver exits with status 2, naming each one and what it said last."""


@dataclass
class Report:
    """What a driver makes of its jobs' outputs."""
    markdown: str                    # results.md, printed
    record: dict | list              # results.json (a dict gets the timing under "timing"); main returns it
    plots: Callable[[], list] | None = None   # draws the plots (pyplot() first), returns the paths written
    csv: list | None = None          # rows (dicts) for results.csv
    rows: str | None = None          # the key of `record` that holds one row per run: what action=publish commits
    tables: Callable[[dict], dict] | None = None   # tables(record) -> {name: markdown}, from the record alone


@dataclass
class Driver:
    script: str                      # the driver's __file__: its --help shows its docstring's usage
    defaults: dict                   # its settings: DEFAULTS, read by cli.parse_config
    plan: Callable                   # plan(C, out) -> [Job], in launch order
    report: Callable                 # report(C, out, outcome) -> Report
    check: Callable | None = None    # check(C): the settings checked (and paths resolved) before anything runs
    out_key: str = "out_dir"         # the setting that names the output folder
    slots_key: str = "jobs"          # the setting of the processes at a time (0: every job in this process)
    actions: tuple = ("all", "table", "publish")  # table runs nothing: it reports what exists

    def main(self, argv=None):
        argv = list(sys.argv[1:] if argv is None else argv)
        C = cli.parse_config(self.defaults, argv, script=self.script)
        empty = [key for key, value in C.items() if value in ([], {}) and self.defaults[key]]
        if empty:  # seeds=[] would run nothing and say it succeeded
            raise ConfigError(f"{empty[0]}={C[empty[0]]!r} runs nothing: give at least one (default "
                              f"{self.defaults[empty[0]]!r})")
        action = C.get("action", "all")
        if action not in self.actions:
            raise ConfigError(f"action={action!r}: use {' | '.join(self.actions)} (all: run what is missing, "
                              "then the tables; table: the tables of what exists, running nothing; publish: "
                              "as all, and the rows written under docs/results/ as each job ends, to be committed)")
        slots = C[self.slots_key]
        if slots < 0 or C.get("threads", 1) < 1:
            raise ConfigError(f"{self.slots_key} must be >= 0 (0: every job in this process) and threads >= 1")
        C[self.out_key] = str(Path(C[self.out_key]).resolve())  # the jobs run in the repository root
        if self.check is not None:
            self.check(C)
        out = Path(C[self.out_key])
        out.mkdir(parents=True, exist_ok=True)
        with RunLock(out):  # one invocation at a time writes here
            return self._run(C, out, argv, action, slots)

    def _run(self, C, out, argv, action, slots):
        t0, dry_run = time.time(), C.get("dry_run", False)
        timing_path = out / "timing.json"
        outcome = Outcome(history=manifest.read_json(timing_path) or {}, code=code_version())  # unreadable: fresh
        try:
            if action in ("all", "publish"):
                # {key digest: row name} of the jobs whose rows are committed (publish)
                planned, committed = set(), {k: _row_name(row) for row in committed_rows(out)
                                             for k in (row.get("keys") or {}).values()}
                for _ in range(MAX_ROUNDS):
                    full = self.plan(C, out)
                    jobs = [job for job in full if job.name not in planned]
                    if not jobs:
                        break
                    planned |= {job.name for job in jobs}
                    started = len(outcome.started)
                    def more():   # the plan again once a job has ended: what that job made possible
                        again = self.plan(C, out)
                        planned.update(job.name for job in again)
                        if action == "publish":   # the ended job's row, ready to commit before the next ends
                            report = self.report(C, out, outcome)
                            history = dict(outcome.history, jobs={**outcome.history.get("jobs", {}), **outcome.timing})
                            with contextlib.suppress(UserError):   # no row yet: nothing to publish so far
                                self._publish(C, out, report, dict(report.record, timing=history))
                        return again
                    run_jobs(jobs, slots, threads=C.get("threads"), cwd=ROOT, dry_run=dry_run, outcome=outcome,
                             more=None if dry_run else more, committed=committed, plan=full)
                    if dry_run:
                        return None
                    if len(outcome.started) == started:  # nothing ran, so nothing new exists to plan from
                        break
                else:
                    raise RuntimeError(f"the plan of {self.script} returned new jobs {MAX_ROUNDS} times")
        finally:
            if not dry_run:
                outcome.history.setdefault("jobs", {}).update(outcome.timing)
                outcome.history.setdefault("invocations", []).append(
                    {"argv": argv, "action": action, "seconds": round(time.time() - t0, 1), **outcome.code,
                     "executed": outcome.started, "skipped": outcome.skipped})
                # failing: the error on its way out is the one to report, not timing.json's
                with contextlib.suppress(*([OSError] if sys.exc_info()[1] else [])):
                    write_json(timing_path, outcome.history)
        report = self.report(C, out, outcome)
        write_text(out / "results.md", report.markdown)  # atomically: a kill leaves the old file or the new one
        record = dict(report.record, timing=outcome.history) if isinstance(report.record, dict) else report.record
        write_json(out / "results.json", record)
        if report.csv is not None:
            with atomic_write(out / "results.csv", "w") as f:
                writer = csv.DictWriter(f, fieldnames=list(report.csv[0]) if report.csv else ["run"])
                writer.writeheader()
                writer.writerows(report.csv)
        print(report.markdown)
        for path in (report.plots() if report.plots else []):
            print(f"wrote {path}")
        print(f"wrote {out / 'results.md'} and {out / 'results.json'}"
              + (f" and {out / 'results.csv'}" if report.csv is not None else ""))
        if action == "publish":
            self._publish(C, out, report, record)
        if outcome.failed:  # the report is written; the exit status says that it is not complete
            blocked = f"; {len(outcome.blocked)} job(s) that need them did not run" if outcome.blocked else ""
            raise JobsFailed(f"{len(outcome.failed)} job(s) failed: " + "; ".join(
                f"{name}: {outcome.reasons.get(name, f'exit {rc}')}" for name, rc in outcome.failed.items())
                + f"{blocked}. The tables above show what finished; fix the cause and run the same command again "
                  "(finished jobs are skipped)")
        return record

    def _publish(self, C, out, report, record):
        jobs = self.plan(C, out)
        for job in jobs:
            job.plan = jobs
        publish(report, record, RESULTS / out.name, Path(self.script).resolve().relative_to(ROOT).as_posix(), jobs)


# ----- Results a reader can check: the rows of a reproduction, committed under docs/results/<out_dir name>/
RESULTS = ROOT / "docs" / "results"


def code_version():
    """{"commit": HEAD, "changed": whether tracked files differ from it} (None where git cannot say)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = git("rev-parse", "HEAD")
    return {"commit": commit[:12] or None, "changed": bool(git("status", "--porcelain", "--untracked-files=no"))
            if commit else None}


def of_row(job, name):
    """Whether job `job` (a name) made the row `name`: it is `name`, "`name` <stage>" or "<stage>_`name`"."""
    return job == name or job.startswith(f"{name} ") or job.partition("_")[2] == name   # "pretrain_<name>"


def _published_rows(folder) -> list:
    path = Path(folder) / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def committed_rows(out) -> list:
    """The rows committed for the driver whose output folder is `out` (docs/results/<its name>/runs.jsonl)."""
    return _published_rows(RESULTS / Path(out).name)


def _row_name(row):
    return row.get("run") or row.get("name")


def made_by(name, history):
    """The commit and date of the latest job a row came from (of_row), from timing.json's records."""
    jobs = [t for job, t in history.get("jobs", {}).items() if of_row(job, name) and "ended" in t]
    if not jobs:
        return {"commit": None, "ended": None}
    last = max(jobs, key=lambda t: t["ended"])
    return {"commit": last.get("commit"), "changed": last.get("changed"), "ended": last["ended"]}


def publish(report, record, folder, driver, jobs=()):
    """docs/results/<name>/: runs.jsonl (a line per row of record[report.rows], with the commit, date and keys
    of the jobs that made it), summary.json (the rest of the record) and tables.md (report.tables(record)).
    A committed row whose jobs have the same keys now but did not run here is kept. No rows: an error."""
    history = record.get("timing", {}) if isinstance(record, dict) else {}
    rows = record[report.rows] if report.rows else []
    if isinstance(rows, dict):   # {name: row}: one line each, named
        rows = [{"run": name, **row} for name, row in rows.items()]
    rows = _with_committed(rows, folder, jobs)
    if not rows:
        raise UserError(f"nothing to publish: {driver} has no rows {'in its record' if report.rows else 'to commit'}"
                        " (run its jobs first, --action=all); nothing was written under docs/results/")
    summary = {k: v for k, v in record.items() if k not in (report.rows, "timing")}
    summary["published"] = {"driver": driver, "rows": report.rows, **code_version(), "date": _utc_now("%Y-%m-%d"),
                            "job_seconds": round(sum(t["seconds"] for t in history.get("jobs", {}).values())),
                            "wall_seconds": round(sum(i["seconds"] for i in history.get("invocations", [])))}
    folder.mkdir(parents=True, exist_ok=True)
    lines = [r if "keys" in r else {**r, "made": made_by(_row_name(r), history),   # a committed row has them
                                    "keys": _keys_of(_row_name(r), jobs, done=True)} for r in rows]
    write_text(folder / "runs.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in lines))
    write_json(folder / "summary.json", summary)
    made = report.tables(dict(summary, **{report.rows: rows})) if report.tables else {}
    write_text(folder / "tables.md", "".join(f"## {name}\n\n{text}\n" for name, text in made.items()))
    print(f"wrote {folder}/runs.jsonl, summary.json and tables.md: commit them")


def _keys_of(name, jobs, done=False):
    """{job name: its key's digest} of the jobs that make row `name` (done: only those finished here,
    so that a row committed while some of its jobs had not run does not skip them next time)."""
    return {j.name: manifest.digest(key) for j in jobs
            if of_row(j.name, name) and (not done or j.finished()) and (key := j.key()) is not None}


def _with_committed(rows, folder, jobs):
    """`rows`, with `folder`'s committed rows in place of those whose jobs did not all finish here, where
    every job a committed row records has the same key now, in plan order."""
    out = {_row_name(r): r for r in rows}
    for row in _published_rows(folder):
        name = _row_name(row)
        mine, now = [j for j in jobs if of_row(j.name, name)], _keys_of(name, jobs)
        if row.get("keys") and all(now.get(job) == key for job, key in row["keys"].items()) \
                and not all(j.finished() for j in mine):
            out[name] = row
    first = {n: next((i for i, j in enumerate(jobs) if of_row(j.name, n)), len(jobs)) for n in out}
    return sorted(out.values(), key=lambda r: first[_row_name(r)])


def read_published(folder, rows_key):
    """The record publish() wrote to `folder`, its rows under `rows_key` again (without "made" and "keys")."""
    summary = json.loads((Path(folder) / "summary.json").read_text())
    rows = [{k: v for k, v in r.items() if k not in ("made", "keys")} for r in _published_rows(folder)]
    return {**summary, rows_key: rows}


def published_tables(folder):
    """{name: markdown} of a published tables.md (each table under a "## name" line)."""
    parts = ("\n" + (Path(folder) / "tables.md").read_text()).split("\n## ")[1:]
    return {name: body.rstrip("\n") + "\n" for name, _, body in (part.partition("\n\n") for part in parts)}


def pyplot():
    """matplotlib's pyplot for a driver's plots, or None after saying how to draw them later."""
    from eval.plots import pyplot_or_say
    return pyplot_or_say("run the same command again with --action=table")


# ----- Tables
def time_line(history, stage_of) -> str:
    """The invocations' wall time and the jobs' own time per stage (stage_of(job name); None: not counted)."""
    stages = {}
    for name, t in history.get("jobs", {}).items():
        stage = stage_of(name)
        if stage is not None:
            n, s = stages.get(stage, (0, 0.0))
            stages[stage] = (n + 1, s + t["seconds"])
    invocations = history.get("invocations", [])
    total = sum(s for _, s in stages.values())
    return (f"Job time {total / 60:.1f} min (" + "; ".join(f"{stage}: {s / 60:.1f} min, {n} job(s)"
                                                         for stage, (n, s) in stages.items())
            + f"); wall time {sum(i['seconds'] for i in invocations) / 60:.1f} min over {len(invocations)} "
              "invocation(s).")


def markdown_table(head, rows) -> str:
    """A markdown table: the header cells, then one list of cell texts per row."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def cell(value, spec, missing="-"):
    """`value` formatted by `spec`, or `missing` where a run has not produced it (None)."""
    return missing if value is None else format(value, spec)
