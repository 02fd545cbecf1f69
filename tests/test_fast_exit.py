"""The end of a cublas-audit process (cublas_audit.fast_exit): the exit code as SystemExit gave
it, the atexit handlers run (Ray's shutdown is one) and the output flushed, and no teardown of
the heap after (an object's finalizer does not run: a full map's ~7 s of freeing objects)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import atexit, sys, threading, time
from cublas_audit.fast_exit import run_and_end

class Held:
    def __del__(self):
        print("torn down", flush=True)

held = Held()  # (freed by Python's teardown of the module, were it run)
atexit.register(print, "atexit ran")
print("buffered", end="")
threading.Thread(target=lambda: (time.sleep(0.05), print(" thread done"))).start()
run_and_end(lambda: sys.exit({code!r}))
"""


@pytest.mark.parametrize(("code", "status"), [(3, 3), (None, 0), ("no GPU here", 1)])
def test_the_exit_code_stands_the_atexit_handlers_run_and_no_teardown_follows(
    code: object, status: int
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(code=code)], capture_output=True, text=True
    )
    assert done.returncode == status
    # a thread still running joined first, the atexit handlers next, flushed, no "torn down"
    assert done.stdout == "buffered thread done\natexit ran\n"
    assert done.stderr == ("no GPU here\n" if isinstance(code, str) else "")
