"""The shards of a --devices run, each in a process of its own.

A shard's host work outside its probe child (starting up, reading the probe's timing.jsonl back,
building the shard's table, folding its streams) is Python: in threads of one process the four
shards of a full map took 83-84 s each against 47 s alone, every one of them waiting on the one
interpreter lock (benchmarks/results/fleet_scaling_h100x4.json, "shard_contention"). Here each
shard's sweep runs in a process of its own, forked from multiprocessing's fork server: a fresh
interpreter started once (never a fork of this process: it holds no CUDA context to fork and must
never need one), which imports the sweep's modules once (pandas: ~1 s of CPU) before it forks a
shard, so that four shards, or a resumed run's shards, pay for one start-up. This process only
relays what they report:

- progress: the child's Progress hooks are batched onto one queue, at most every FLUSH_S, and
  replayed here in order on the hooks the caller gave for that GPU (its bar);
- the end: each child's error (an AuditError crosses whole: its class, message and exit code) or
  None;
- Ctrl-C: the terminal sends SIGINT to every process of the group, the shards included; this
  process forwards it too (for a SIGINT sent to it alone), a shard acts on the first it gets,
  stops its probe and keeps what it finished, and this process waits for every shard to say so.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any, Final

from cublas_audit.errors import AuditError, InterruptedSweepError
from cublas_audit.planning.cases import Case
from cublas_audit.planning.shards import PlanPart
from cublas_audit.run.sweep import Progress
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.run.sweep_setup import sweep
from cublas_audit.table import rundir

START_METHOD: Final = "forkserver"  # forks of a fresh interpreter: never of this process
# What the fork server imports before it forks a shard (its sweep, the table, pandas).
PRELOADED: Final = ["cublas_audit.run.shard_processes"]
FLUSH_S = 0.05  # progress events are batched this long: a map reports two a case, ~65k cases
WAIT_S = 0.2  # how often the parent looks for a shard process that ended without a word
# Run first in every shard process, before its sweep. Tests stand in for the machine with it (a
# shard process sees none of the parent's patches); a module-level callable (it is pickled).
CHILD_SETUP: Callable[[], None] | None = None


@dataclass(frozen=True)
class Outcome:
    """How the shards ended: each failed one's error by job index; whether Ctrl-C came here;
    `timeline`: when (seconds from run_all's start, this process's clock) each shard's process
    began (its first word, before it made its cases), said it was done, and when every process
    had exited ("exited"): what a --devices run's wall time holds beyond its shards' sweeps."""

    failures: dict[int, BaseException]
    interrupted: bool
    timeline: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SentJob:
    """A shard's options as sent to its process: its cases as rows of their fields (Case.fields),
    or as its part of a stated plan (`part`: a grid's axes, a few hundred bytes), made there.
    Pickled whole, a full map's shard of 65,536 cases took 0.6 s here, one shard after another,
    and 3.8 s to load in the shard's process; as rows 0.13 s, and 1.45 s with the cases made
    again there; as a part, the parent's split of the plan (~0.35 s of CPU here) and its rows
    (~0.25 s) are each shard's own, at once, and the fork server hands each shard its job
    without waiting for the one before to read 3 MB of rows."""

    options: SweepOptions  # (its cases left out)
    rows: list[tuple[Any, ...]]
    part: PlanPart | None = None

    @classmethod
    def of(cls, options: SweepOptions, part: PlanPart | None = None) -> SentJob:
        """`part`: the shard's cases as that part of a stated plan (options' cases unused)."""
        if part is not None:
            return cls(replace(options, cases=[]), [], part)
        return cls(replace(options, cases=[]), [case.fields() for case in options.cases])

    def received(self) -> SweepOptions:
        if self.part is not None:
            return replace(self.options, cases=self.part.cases())
        return replace(self.options, cases=[Case(*row) for row in self.rows])


def folded_sweep(options: SweepOptions, progress: Progress | None) -> None:
    """A shard's sweep, then its raw streams folded (rundir.compact_results: a full map's
    timing.jsonl, ~285 MB, gzipped to about a seventh) while the other shards still run; a
    map's shards are folded by the parent instead, beside its merge (options.fold False)."""
    sweep(options, progress)
    where = options.out or options.resume
    if where is not None and options.fold:
        rundir.compact_results(where)


def start_server() -> None:
    """The fork server started now, where it is not running yet; returns at once. Its own
    interpreter then imports PRELOADED (~1 s of CPU: Python, pandas, the sweep's modules), which
    a --devices command has it do while it plans the run (cli.spread_options.start_shards_soon)
    instead of after, before its first shard can start; run_all forks the shards from the same
    server."""
    multiprocessing.get_context(START_METHOD).set_forkserver_preload(PRELOADED)
    multiprocessing.forkserver.ensure_running()


def run_all(
    jobs: Sequence[SweepOptions | SentJob],
    progress: Sequence[Progress | None],
    finished: Callable[[int], None] | None = None,
) -> Outcome:
    """Every job's folded_sweep at once, a process each; returns when all have ended (a job
    given as options is sent with its cases as rows). `finished`: called here with a job's
    index as it ends well, while others may still run."""
    context = multiprocessing.get_context(START_METHOD)
    context.set_forkserver_preload(PRELOADED)
    events: Any = context.Queue()
    processes = [
        context.Process(
            target=shard_main,
            args=(index, job if isinstance(job, SentJob) else SentJob.of(job), events, CHILD_SETUP),
            name=f"cublas-audit shard {index}",
        )
        for index, job in enumerate(jobs)
    ]
    ended: dict[int, BaseException | None] = {}
    interrupted = False
    began = time.perf_counter()
    timeline: dict[str, Any] = {"began": {}, "done": {}}

    def said(index: int, kind: str) -> None:
        timeline[kind][index] = round(time.perf_counter() - began, 2)

    try:
        for process in processes:
            process.start()
        while len(ended) < len(processes):
            try:
                _relay(events, processes, progress, ended, finished, said)
            except KeyboardInterrupt:  # each shard keeps what it finished: wait for them to say so
                interrupted = True
                _forward_interrupt(processes)
    finally:
        for process in processes:  # alive only where this process failed (a hook, a deadline)
            if process.is_alive():
                process.terminate()
            if process.pid is not None:
                process.join()
    timeline["exited"] = round(time.perf_counter() - began, 2)
    failures = {index: error for index, error in ended.items() if error is not None}
    return Outcome(failures, interrupted, timeline)


def _relay(
    events: Any,
    processes: Sequence[Any],
    progress: Sequence[Progress | None],
    ended: dict[int, BaseException | None],
    finished: Callable[[int], None] | None = None,
    said: Callable[[int, str], None] | None = None,
) -> None:
    """Replays what the shards report until each has ended (its last word, or its exit); each
    that ended well is handed to `finished` at once; `said`: told of each shard's first word
    ("began") and last ("done") as they come."""
    while len(ended) < len(processes):
        # snapshot first: whatever a process wrote before it died is in the pipe by now
        dead = [i for i, p in enumerate(processes) if i not in ended and not p.is_alive()]
        try:
            index, kind, payload = events.get(timeout=WAIT_S)
        except queue.Empty:
            for i in dead:
                code = processes[i].exitcode
                ended[i] = AuditError(f"its process ended without a result (exit code {code})")
            continue
        if kind == "events":
            hooks = progress[index]
            for hook, value in payload if hooks is not None else ():
                getattr(hooks, hook)(value)
        elif kind == "began":
            if said is not None:
                said(index, "began")
        else:
            ended[index] = payload
            if said is not None:
                said(index, "done")
            if payload is None and finished is not None:
                finished(index)


def _forward_interrupt(processes: Sequence[Any]) -> None:
    for process in processes:
        if process.is_alive() and process.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # it ended in between
                os.kill(process.pid, signal.SIGINT)


# ----- in the shard's process ---------------------------------------------------------------------


class _Relay:
    """The shard's Progress, its events batched onto the queue by a thread every FLUSH_S."""

    def __init__(self, index: int, events: Any) -> None:
        self.index, self.events = index, events
        self.pending: list[tuple[str, object]] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._flush_every, daemon=True)
        self.thread.start()

    def progress(self) -> Progress:
        return Progress(
            start=lambda total: self._add("start", total),
            current=lambda case_id: self._add("current", case_id),
            advance=lambda case_id: self._add("advance", case_id),
            note=lambda message: self._add("note", message),
        )

    def _add(self, hook: str, value: object) -> None:
        with self.lock:
            self.pending.append((hook, value))

    def flush(self) -> None:
        with self.lock:
            batch, self.pending = self.pending, []
        if batch:
            self.events.put((self.index, "events", batch))

    def _flush_every(self) -> None:
        while not self.stopped.wait(FLUSH_S):
            self.flush()

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.flush()


def shard_main(index: int, job: SentJob, events: Any, setup: Callable[[], None] | None) -> None:
    """A shard process's whole life: its sweep, then its last word (None or the error)."""
    signal.signal(signal.SIGINT, _interrupt_once)
    signal.signal(signal.SIGTERM, _exit_on_term)
    events.put((index, "began", None))
    if setup is not None:
        setup()
    relay = _Relay(index, events)
    error: BaseException | None = None
    options = job.options
    try:
        options = job.received()
        folded_sweep(options, relay.progress())
    except KeyboardInterrupt:  # before the sweep's own handling started, or after it ended
        error = InterruptedSweepError(f"interrupted: {options.out or options.resume}")
    except Exception as exc:  # every error goes to the parent, which decides
        error = portable(exc)
    finally:
        relay.close()
    events.put((index, "done", error))


def _interrupt_once(signum: int, frame: FrameType | None) -> None:
    """The first SIGINT stops the sweep; later ones (the parent forwards what the terminal sent
    already) must not cut short the saving of what it finished."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _exit_on_term(signum: int, frame: FrameType | None) -> None:
    """Terminated by the parent: SystemExit unwinds through the sweep, which kills its probe."""
    raise SystemExit(128 + signum)


def portable(error: Exception) -> BaseException:
    """The error as the parent will read it: itself where it survives pickling (an AuditError:
    its class, message and exit code), else an AuditError or RuntimeError of its text; anything
    but an AuditError carries the shard's traceback as a note (the CLI logs it, exit 4)."""
    if not isinstance(error, AuditError):
        where = "".join(traceback.format_exception(error))
        error.add_note(f"in the shard's process {os.getpid()}:\n{where}")
    try:
        copy: BaseException = pickle.loads(pickle.dumps(error))
    except Exception:  # an exception class that does not pickle
        text = f"{type(error).__name__}: {error}"
        if isinstance(error, AuditError):
            stand_in = AuditError(str(error))
            stand_in.exit_code = error.exit_code
            return stand_in
        copy = RuntimeError(text)
        for note in getattr(error, "__notes__", []):
            copy.add_note(note)
    return copy
