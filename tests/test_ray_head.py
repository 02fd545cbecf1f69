"""`--ray auto`'s local head (run.ray_head) and its joining (run.ray_connect) without Ray's
processes: the head is a real child process standing in for `ray start --head --block`, which
prints what Ray 2.60's did here (tests/fixtures/ray_head/: a head that started, then was stopped
by SIGTERM; one whose GCS port was taken), and Ray in the driver a module object. What is real:
the process, its output read as it comes, its stop (SIGTERM, then SIGKILL to its group), the
parent-death signal of the head's own script, the exit handlers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.run import ray_connect, ray_head

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "fixtures" / "ray_head"
STARTED = RECORDED / "started.txt"
ADDRESS = "192.0.2.2:34043"  # (its ready line's)


_STARTED: list[ray_head.Head] = []


@pytest.fixture(autouse=True)
def _no_head_left() -> Iterator[None]:
    """Every stand-in head stopped after its test, whatever the test did (killed at once)."""
    yield
    while _STARTED:
        _STARTED.pop().stop(timeout=0.2)


def stand_in(tmp_path: Path, code: str) -> ray_head.Head:
    """A head whose process runs `code` (Python), its folder made as start() makes one."""
    folder = tmp_path / "head"
    folder.mkdir()
    head = ray_head.spawn([sys.executable, "-c", code], folder)
    _STARTED.append(head)
    return head


def printing(recorded: Path, after: float = 0.0, then: str = "time.sleep(60)") -> str:
    """A head's code: `recorded` printed after `after` seconds, then `then`."""
    return (
        f"import sys, time; time.sleep({after}); sys.stdout.write(open({str(recorded)!r}).read());"
        f" sys.stdout.flush(); {then}"
    )


def test_a_heads_address_is_its_ready_line_and_an_error_its_exception() -> None:
    started = STARTED.read_text().splitlines()
    assert [m.group(1) for line in started if (m := ray_head.READY.search(line))] == [ADDRESS]
    head = ray_head.Head(subprocess.Popen(["true"]), Path("/nonexistent"), 0.0)
    head.process.wait()
    for line in RECORDED.joinpath("port_taken.txt").read_text().splitlines():
        if line.strip():
            head.last.append(ray_head.LOG_PREFIX.sub("", line.strip()))
    # (its last line is "...Please check .../gcs_server.out for details. Last connection
    # error: None"; the exception's says what failed)
    assert head.last_line() == "RuntimeError: Failed to start GCS.  Last 1 lines of error files:"
    head.last.clear()
    head.last.append(ray_head.LOG_PREFIX.sub("", started[1]))
    assert head.last_line() == "Local node IP: 192.0.2.2"  # (no exception: the last line)


def test_a_head_is_joined_once_up_and_stopped_with_its_folder(tmp_path: Path) -> None:
    head = stand_in(tmp_path, printing(STARTED))
    assert head.address_when_ready(10) == ADDRESS
    assert head.ready_at is not None and head.ready_at >= head.began
    (head.folder / "session").mkdir()
    head.stop()
    assert head.process.returncode == -signal.SIGTERM and not head.folder.exists()
    head.stop()  # (once: release's and the exit's)


def test_a_head_that_ignores_sigterm_is_killed_with_its_process_group(tmp_path: Path) -> None:
    # Ray's processes are the head's children: killed with it where it does not stop
    pid_file = tmp_path / "child"
    code = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f"open({str(pid_file)!r}, 'w').write(str(subprocess.Popen(['sleep', '60']).pid));"
        + printing(STARTED).replace("import sys, time; ", "")
    )
    head = stand_in(tmp_path, code)
    head.address_when_ready(10)
    child = int(pid_file.read_text())
    began = time.time()
    head.stop(timeout=0.5)
    assert head.process.returncode == -signal.SIGKILL and time.time() - began < 5
    assert _ended(child)


def test_a_head_that_ends_before_it_is_up_is_exit_3_with_why_and_its_logs_kept(
    tmp_path: Path,
) -> None:
    head = stand_in(tmp_path, printing(RECORDED / "port_taken.txt", then="sys.exit(1)"))
    with pytest.raises(ToolMissingError) as raised:
        head.address_when_ready(10)
    message = str(raised.value)
    assert message.startswith("--ray auto: the local Ray head ended before it was up (exit 1): ")
    assert "RuntimeError: Failed to start GCS." in message and str(head.folder) in message
    assert head.folder.is_dir()  # (Ray's logs of why)


def test_a_head_not_up_in_time_is_stopped_and_exit_3(tmp_path: Path) -> None:
    head = stand_in(tmp_path, "import time; time.sleep(60)")
    with pytest.raises(ToolMissingError, match=r"did not start in 0.3 s \(no output; its logs"):
        head.address_when_ready(0.3)
    assert head.process.returncode == -signal.SIGTERM


def test_the_head_runs_rays_command_line_and_dies_with_the_command_that_started_it(
    tmp_path: Path,
) -> None:
    # HEAD_SCRIPT's parent-death signal: the command killed outright (SIGKILL, the OOM killer),
    # its head is sent SIGTERM; `ray` stood in for by a package first on PYTHONPATH
    fake = tmp_path / "fake" / "ray" / "scripts"
    fake.mkdir(parents=True)
    for folder in (fake, fake.parent):
        (folder / "__init__.py").write_text("")
    (fake / "scripts.py").write_text(
        "import json, os, signal, sys, time\n"
        "def main():\n"
        "    def stop(*_):\n"
        "        open(os.environ['HEAD_MARKER'], 'w').write('SIGTERM')\n"
        "        sys.exit(0)\n"
        "    signal.signal(signal.SIGTERM, stop)\n"
        "    seen = {'argv': sys.argv, 'mode': os.environ.get('RAY_AUTH_MODE'),\n"
        "            'token': len(os.environ.get('RAY_AUTH_TOKEN', ''))}\n"
        "    open(os.environ['HEAD_SEEN'], 'w').write(json.dumps(seen))\n"
        "    sys.stdout.write(open(os.environ['HEAD_OUTPUT']).read()); sys.stdout.flush()\n"
        "    while True: time.sleep(0.05)\n"
    )
    marker = tmp_path / "marker"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")},
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), str(REPO)]),
        "HEAD_MARKER": str(marker),
        "HEAD_SEEN": str(tmp_path / "seen.json"),
        "HEAD_OUTPUT": str(STARTED),
    }
    command = (
        "import json, time; from cublas_audit.run import ray_head; head = ray_head.start(3);"
        "address = head.address_when_ready(20);"
        "print(json.dumps([head.process.pid, address, str(head.folder)]), flush=True);"
        "time.sleep(60)"
    )
    starter = subprocess.Popen(
        [sys.executable, "-c", command], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert starter.stdout is not None
        pid, address, folder = json.loads(starter.stdout.readline())
        assert address == ADDRESS
        assert json.loads((tmp_path / "seen.json").read_text()) == {
            "argv": ["ray", "start", "--head", "--block", "--port=0",
                     "--include-dashboard=false", "--disable-usage-stats",
                     f"--temp-dir={folder}", "--num-cpus=3"],
            "mode": "token",  # (the driver joins it by its address: the same mode and token)
            "token": 64,
        }  # fmt: skip
        starter.kill()
        starter.wait()
        deadline = time.time() + 10
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == "SIGTERM"
        # (its folder, Ray's logs, is left: its command could not remove it)
        shutil.rmtree(folder)
    finally:
        starter.kill()
        if "pid" in locals() and not _ended(pid, wait=0):
            os.kill(pid, signal.SIGKILL)


def test_token_authentication_is_the_same_on_both_sides() -> None:
    made = ray_head.auth({})
    assert made["RAY_AUTH_MODE"] == "token" and len(made["RAY_AUTH_TOKEN"]) == 64
    assert made["RAY_AUTH_TOKEN"] != ray_head.auth({})["RAY_AUTH_TOKEN"]  # (a run's own)
    assert ray_head.auth({"RAY_AUTH_MODE": "disabled"}) == {}  # (a mode set is kept)
    assert ray_head.auth({"RAY_AUTH_TOKEN_PATH": "/t"}) == {"RAY_AUTH_MODE": "token"}
    assert ray_head.auth({"RAY_AUTH_TOKEN": "x"}) == {"RAY_AUTH_MODE": "token"}


def test_an_existing_cluster_is_one_whose_recorded_address_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert not ray_head.existing_cluster()  # (nothing recorded)
    recorded = tmp_path / "ray" / "ray_current_cluster"
    recorded.parent.mkdir()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        recorded.write_text(f"127.0.0.1:{port}")
        assert ray_head.existing_cluster()
    # stopped (a `ray start --block` ended by a signal leaves its address behind, as here)
    assert not ray_head.existing_cluster()
    recorded.write_text("garbage")
    assert not ray_head.existing_cluster()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    assert ray_head.existing_cluster()


def test_a_head_is_started_only_where_ray_init_would_start_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[int | None] = []
    monkeypatch.setattr(ray_head, "start", lambda cpus: started.append(cpus) or "head")
    monkeypatch.setattr(ray_connect, "local_cpus", lambda: 6)
    monkeypatch.setattr(ray_head, "existing_cluster", lambda: False)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert ray_connect._local_head("auto") == "head" and started == [6]
    assert ray_connect._local_head("10.0.0.9:6379") is None  # (that cluster's)
    monkeypatch.setattr(ray_head, "existing_cluster", lambda: True)
    assert ray_connect._local_head("auto") is None  # (`ray start`'s: joined as it is)
    monkeypatch.setattr(ray_head, "existing_cluster", lambda: False)
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))
    assert ray_connect._local_head("auto") is None  # (imported before: ray.init starts it)
    assert started == [6]


class Driver:
    """Ray in the driver stood in for, joined through ray_connect from a clean state with a
    stand-in head: what it was asked, in order, and the exit handlers registered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, head: ray_head.Head) -> None:
        self.events: list[str] = []
        self.joined = False
        self.exits: list[tuple[Callable[..., object], tuple[object, ...]]] = []
        self.head = head
        ray = types.ModuleType("ray")
        ray.is_initialized = lambda: self.joined  # type: ignore[attr-defined]
        ray.init = self.init  # type: ignore[attr-defined]
        ray.shutdown = self.shutdown  # type: ignore[attr-defined]
        self.ray = ray
        monkeypatch.setitem(sys.modules, "ray", ray)
        monkeypatch.setattr(ray_connect, "require_ray", lambda: ray)
        monkeypatch.setattr(ray_connect, "warm_workers", lambda _ray: None)
        monkeypatch.setattr(ray_connect, "_joining", None)
        monkeypatch.setattr(ray_connect, "_clock", {})
        monkeypatch.setattr(ray_connect, "_ours", [])
        monkeypatch.setattr(ray_connect, "_local_head", lambda _address: head)
        monkeypatch.setattr(ray_connect, "STARTING_S", 5.0)
        monkeypatch.setattr(
            ray_connect.atexit, "register", lambda f, *args: self.exits.append((f, args))
        )

    def init(self, address: str | None, **_options: object) -> None:
        self.events += ["init", f"address {address}"]
        self.joined = True

    def shutdown(self) -> None:
        running = self.head.process.poll() is None
        self.events.append(f"shutdown (head running: {running})")
        self.joined = False

    def exit(self) -> None:
        for handler, args in reversed(self.exits):
            handler(*args)


def test_auto_joins_its_head_by_address_and_release_stops_it_after_leaving_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = stand_in(tmp_path, printing(STARTED, after=0.3))
    driver = Driver(monkeypatch, head)
    ray_connect.connect_soon("auto")
    assert ray_connect.connect("auto") is driver.ray
    record = ray_connect.clock_record()
    assert 0.3 <= record["head_ready_s"] <= record["connect_s"]
    ray_connect.release()
    driver.exit()  # (waits for release's thread)
    assert driver.events == ["init", f"address {ADDRESS}", "shutdown (head running: True)"]
    assert head.process.returncode == -signal.SIGTERM and not head.folder.exists()


def test_an_exit_before_the_head_is_up_stops_it_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C or bad input while the run is planned: no wait for a head still starting
    head = stand_in(tmp_path, "import time; time.sleep(60)")
    driver = Driver(monkeypatch, head)
    ray_connect.connect_soon("auto")
    joining = ray_connect._joining
    began = time.time()
    driver.exit()
    assert time.time() - began < 3 and head.process.returncode == -signal.SIGTERM
    assert joining is not None and joining.ready.wait(5)
    assert isinstance(joining.error, AuditError) and driver.events == []
    assert not head.folder.exists()  # (stopped by the exit: no failure of its own)


def test_an_exit_after_joining_leaves_ray_then_stops_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an error once Ray is joined (a shard missing: no release)
    head = stand_in(tmp_path, printing(STARTED))
    driver = Driver(monkeypatch, head)
    ray_connect.connect_soon("auto")
    ray_connect.connect("auto")
    driver.exit()
    assert driver.events[-1] == "shutdown (head running: True)"
    assert head.process.returncode == -signal.SIGTERM


def test_a_head_that_fails_to_start_is_the_error_where_ray_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = stand_in(tmp_path, printing(RECORDED / "port_taken.txt", then="sys.exit(1)"))
    driver = Driver(monkeypatch, head)
    ray_connect.connect_soon("auto")
    with pytest.raises(ToolMissingError, match=r"\(exit 1\): RuntimeError: Failed to start GCS"):
        ray_connect.connect("auto")
    assert driver.events == []


def _ended(pid: int, wait: float = 5.0) -> bool:
    """Whether `pid` ended within `wait` seconds (a zombie counts: its parent reaps it)."""
    deadline = time.time() + wait
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z" or time.time() >= deadline:
            return state == "Z"
        time.sleep(0.05)
