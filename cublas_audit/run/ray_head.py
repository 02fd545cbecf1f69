"""The local Ray head of a `--ray auto` run where this machine is part of no cluster:
`ray start --head --block` in a process of its own (Ray's own command line, run by this
interpreter), started as the command line begins to plan the run, so that Ray's ~5 s start-up
passes beside the planning instead of competing with it for this process's interpreter lock (as
ray.init in a thread did: 4.7 s alone, 9.7 s beside a full map's planning on an H100 x4 host).
run.ray_connect waits for its address and joins it. It never outlives the command: stopped at
release or at the exit (Ctrl-C and errors included), and bound to this process by Linux's
parent-death signal where the process is killed outright. Ray is not imported here."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from cublas_audit.errors import ToolMissingError

# How long a head may take to start before the run gives up on it.
START_S = 120.0
# How long a head has to stop once asked (SIGTERM: it drains, then stops Ray's processes, ~2 s
# here) before it and its process group are killed.
STOP_S = 10.0
# How long joining a cluster's recorded address may take to answer (existing_cluster).
PROBE_S = 0.5
# The line `ray start --head` prints once its processes are up: the command a node joins it
# with, its address (Ray's Java driver reads the same line for it, says ray/scripts/scripts.py).
READY = re.compile(r"ray start --address='([^']+)'")
# Ray's own log prefix on a line (time, level, source): left out of an error's message.
LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+\s+[A-Z]+ \S+ -- ")
LAST_LINES = 20
# A Python exception's line (Ray's own start-up ends in a traceback, then lines of detail).
RAISED = re.compile(r"^[\w.]*(Error|Exception): ")
# The head's own process: bound to the thread that started it (Linux's parent-death signal,
# PR_SET_PDEATHSIG = 1, as Ray binds its own processes to it): a command killed outright (SIGKILL,
# the OOM killer) leaves no Ray behind; SIGTERM lets it stop Ray's processes itself. Its parent
# is checked after the signal is set, as it may have ended just before. Then Ray's command line.
HEAD_SCRIPT = """\
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    if os.getppid() != int(sys.argv[1]):
        sys.exit("the command that started this Ray head has ended")
sys.argv = ["ray", *sys.argv[2:]]
from ray.scripts.scripts import main
main()
"""


@dataclass
class Head:
    """A head process being started, its output read in a thread of its own (kept drained, so
    that it never blocks writing): its address once ready, its last lines."""

    process: subprocess.Popen[str]
    folder: Path  # its --temp-dir: Ray's sessions, sockets and logs; removed once it stopped
    began: float
    ready: threading.Event = field(default_factory=threading.Event)  # (set at its address or end)
    address: str | None = None
    ready_at: float | None = None  # epoch seconds
    last: deque[str] = field(default_factory=lambda: deque(maxlen=LAST_LINES))
    keep: bool = False  # its folder kept (a head that failed: its logs)
    asked: bool = False  # asked to stop (its end is no failure of its own)
    stopping: threading.Lock = field(default_factory=threading.Lock)

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self.last.append(LOG_PREFIX.sub("", line.strip()))
            found = READY.search(line) if self.address is None else None
            if found:
                self.address, self.ready_at = found.group(1), time.time()
                self.ready.set()
        self.ready.set()  # (its end: whoever waits sees no address)

    def address_when_ready(self, timeout: float = START_S) -> str:
        """Its address once it is up; a head that ended first, or did not start in `timeout`,
        is exit 3 with its last line (its logs kept)."""
        if not self.ready.wait(timeout):
            self.keep = True
            self.stop()
            raise ToolMissingError(
                f"--ray auto: the local Ray head did not start in {timeout:g} s "
                f"({self.last_line()}; its logs: {self.folder})"
            )
        if self.address is None:
            code = self.process.wait()
            self.keep = not self.asked
            self.stop()
            raise ToolMissingError(
                f"--ray auto: the local Ray head ended before it was up (exit {code}): "
                f"{self.last_line()} (its logs: {self.folder})"
            )
        return self.address

    def last_line(self) -> str:
        """What ended it: its last exception's line where it printed one, else its last."""
        raised = [line for line in self.last if RAISED.match(line)]
        return (raised or list(self.last) or ["no output"])[-1]

    def stop(self, timeout: float = STOP_S) -> None:
        """SIGTERM (the head drains and stops Ray's processes), then, past `timeout`, SIGKILL
        to its whole process group (its session's, start_new_session: Ray's processes too).
        Once; a second caller waits for the first."""
        with self.stopping:
            self.asked = True
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):  # (gone meanwhile)
                        os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait()
            if not self.keep:
                shutil.rmtree(self.folder, ignore_errors=True)


def start(cpus: int | None) -> Head:
    """A head sized to `cpus` logical CPUs (None: Ray's default, every core), no dashboard, no
    usage stats, on a port of its own (a `ray start` cluster may hold Ray's default one), in a
    temporary folder of its own: `ray start` records its address in its temp folder's
    ray_current_cluster, where every later ray.init() on this machine would look for a cluster
    and, once it stopped, find a stale one (/tmp/ray's held such an address here after a head
    was stopped, as ray.init(address=None) then tried to join)."""
    folder = Path(tempfile.mkdtemp(prefix="cublas-ray-"))
    command = [
        "start",
        "--head",
        "--block",
        "--port=0",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={folder}",
    ]
    if cpus is not None:
        command.append(f"--num-cpus={cpus}")
    os.environ.update(auth(os.environ))  # (before Ray is imported here: see auth)
    return spawn([sys.executable, "-P", "-c", HEAD_SCRIPT, str(os.getpid()), *command], folder)


def spawn(command: list[str], folder: Path) -> Head:
    """`command` started (its output read as a head's) in a session of its own: a Ctrl-C at the
    terminal is the command's to handle (exit 130, which stops the head as any exit does), and
    the head's processes form one group to kill if it does not stop. The thread calling this
    must live as long as the head (the parent-death signal of HEAD_SCRIPT is the thread's)."""
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    head = Head(process, folder, time.time())
    threading.Thread(target=head.read, name="cublas-audit ray head", daemon=True).start()
    return head


def auth(environ: os._Environ[str] | dict[str, str]) -> dict[str, str]:
    """What the head and this process must share to join each other under Ray's token
    authentication (Ray >= 2.52): RAY_AUTH_MODE the same on both sides (Ray reads it as it is
    imported), and a token. A mode set here is kept, and any token with it. Unset, a head of
    `ray start` turns tokens on where ~/.ray/auth_token exists, while a driver joining it by
    its address never does (refused: "Authentication token is missing or incorrect"); so the
    mode is set to token, Ray's own default for a local instance since 2.59, with a token of
    this run's unless one is given (RAY_AUTH_TOKEN, or a file at RAY_AUTH_TOKEN_PATH). An older
    Ray ignores both."""
    if "RAY_AUTH_MODE" in environ:
        return {}
    if environ.get("RAY_AUTH_TOKEN") or environ.get("RAY_AUTH_TOKEN_PATH"):
        return {"RAY_AUTH_MODE": "token"}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def existing_cluster() -> bool:
    """Whether ray.init(address=None) would join a cluster rather than start one: RAY_ADDRESS
    set, or the address the last `ray start` on this machine recorded (ray_current_cluster in
    Ray's temp folder: $RAY_TMPDIR, else $TMPDIR, else /tmp, then ray/) still answering. Ray
    itself joins a recorded address whether or not anything still listens there (one `ray
    start --block` stopped by a signal leaves it behind), then fails; a stale one is ignored
    here, and a head of the run's own started."""
    if os.environ.get("RAY_ADDRESS"):
        return True
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    try:
        recorded = (Path(base) / "ray" / "ray_current_cluster").read_text().strip()
    except OSError:
        return False
    host, _, port = recorded.rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S):
            return True
    except OSError:
        return False
