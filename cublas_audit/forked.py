"""Calls run at once, each in a child forked from this process, while this process goes on with
other work: what a full map's report splits into (its pictures, its findings' JSON), whose
parts are independent and each pure Python or matplotlib, so that threads would wait on one
interpreter lock. A fork starts at once and shares this process's memory (the judged map: no
pickling of the inputs); only each call's result comes back, pickled through a pipe. Below
every stage, as gc_pause is.

Where this system has no fork, or `enabled` is false (a small map: a fork costs more than it
saves), the calls run here in turn when their results are asked for: the same results either
way.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ForkedCallError(RuntimeError):
    """A forked call raised what could not be sent back whole (its traceback is the message)."""


class Forks(Generic[T]):
    """Calls started in children (or held to run here): `results()` waits for them, in order."""

    def __init__(self, calls: Sequence[Callable[[], T]], enabled: bool = True) -> None:
        self._calls = list(calls)
        self._started: list[tuple[Any, Any]] = []  # (process, reading end of its pipe)
        if enabled and can_fork():
            context = multiprocessing.get_context("fork")
            for call in self._calls:
                reading, writing = context.Pipe(duplex=False)
                process = context.Process(target=_child, args=(call, writing), daemon=True)
                process.start()
                writing.close()  # (here: the child's end; a dead child is EOF, not a hang)
                self._started.append((process, reading))

    def results(self) -> list[T]:
        """Each call's result, in the order given; the first failed call's exception raised."""
        if not self._started:
            return [call() for call in self._calls]
        outcomes = []
        try:
            for process, reading in self._started:
                try:
                    outcomes.append(pickle.loads(reading.recv_bytes()))
                except EOFError:  # (killed, or it ended without a word: out of memory)
                    process.join()
                    outcomes.append((False, ForkedCallError(f"exit code {process.exitcode}")))
        finally:
            for process, reading in self._started:
                reading.close()
                process.join()
        for ok, value in outcomes:
            if not ok:
                raise value
        return [value for _, value in outcomes]


def can_fork() -> bool:
    """Whether this system forks (not Windows) and has more than one CPU to run forks on."""
    return "fork" in multiprocessing.get_all_start_methods() and (os.cpu_count() or 1) > 1


def _child(call: Callable[[], Any], writing: Any) -> None:
    # a child may fork calls of its own (a map rule judged in a child, its parts in children of
    # that one): multiprocessing lets no daemonic process start one; this process is still
    # stopped with its parent, whose record of it stays daemonic
    multiprocessing.current_process().daemon = False
    try:
        outcome: tuple[bool, Any] = (True, call())
    except BaseException as exc:  # (sent back and raised there, KeyboardInterrupt included)
        outcome = (False, exc)
    try:
        data = pickle.dumps(outcome, pickle.HIGHEST_PROTOCOL)
        if not outcome[0]:
            pickle.loads(data)  # (an exception whose class is not made again from its args)
    except Exception:  # (an exception or result that does not pickle: its text goes back)
        text = "".join(traceback.format_exception(outcome[1])) if not outcome[0] else ""
        data = pickle.dumps((False, ForkedCallError(text or "a result that does not pickle")))
    writing.send_bytes(data)
    writing.close()
