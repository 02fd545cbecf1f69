"""The end of a `cublas-audit` process: what a normal exit runs (the atexit handlers: Ray's
shutdown, multiprocessing's, logging's), the output flushed, then the process ends at once,
without Python's own teardown, which frees every object one by one. After a full map's command
(262,144 cases, its tables and 86,000 findings) that teardown took ~7 s here, after the report was
written; it grows with the map, so a `--ray` or `--devices` run paid four times a quarter shard's.
Nothing is written in it: every output file is closed when written (files.py). Below every
stage, as gc_pause is."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def run_and_end(main: Callable[[], object]) -> NoReturn:
    """`main` (a command line that ends in SystemExit, as typer's app does), then `end` with its
    exit code. Any other exception goes on as Python's own (its traceback, then its teardown)."""
    try:
        main()
    except SystemExit as done:
        end(done.code)
    end(0)


def end(code: object) -> NoReturn:
    """Exits with `code` (SystemExit's: None is 0; a text is printed on stderr and is 1) once
    the running threads are joined, the atexit handlers have run and stdout and stderr are
    flushed, as a normal exit would have."""
    status = code if isinstance(code, int) else 0 if code is None else 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    # what a normal exit does first, then second: the threads that are not daemons joined (and
    # the executors' shut down), then the atexit handlers
    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # (a closed pipe, a closed stream)
            stream.flush()
    os._exit(status)
