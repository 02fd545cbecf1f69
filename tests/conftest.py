"""Shared test setup: GPU tests carry the `gpu` marker and skip on machines without a GPU; the
slow, self-contained work of a few modules runs in the background while the others' tests run."""

from __future__ import annotations

import functools
import gc
import hashlib
import math
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import typer.testing
from hypothesis import settings

# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set (as on the shared development
# machine): without it every run, and under pytest-xdist every worker, rewrote the assertions of
# every test module again (6 s of CPU a process) and every probe child compiled the package anew.
# The caches land in __pycache__/ folders, which git ignores.
sys.dont_write_bytecode = False

from cublas_audit.judge.noise import NoiseModel  # noqa: E402

if TYPE_CHECKING:
    from cublas_audit.judge.audited import Audited

# Property tests run a few examples in the everyday command (each example runs the CLI) and at
# length in CI's second step: `pytest -q -m "heavy or hypothesis" --hypothesis-profile=thorough`
# (a profile named on the command line wins over the one loaded here).
settings.register_profile("quick", max_examples=5)
settings.register_profile("thorough", max_examples=50)
settings.load_profile("quick")

# CliRunner.invoke builds the Typer app's click command afresh on every call (30 ms of CPU, some
# 440 calls a run: 14 s); here it is built once per process, as `cublas-audit` itself does. A
# click command keeps no state between invocations (each gets its own context).
if hasattr(typer.testing, "_get_command"):
    typer.testing._get_command = functools.cache(typer.testing._get_command)

REPO = Path(__file__).resolve().parent.parent
# The tests make and drop millions of small objects (pandas frames of recorded runs, judged
# findings); Python's cyclic collector, at its default first threshold of 700 allocations, walked
# the heap again and again: raising the thresholds took `pytest -q` from ~91 to ~82 s of CPU,
# freezing what collection made (pytest_collection_finish) to ~76 s. Memory stays bounded: the
# collector still runs, every 100,000 allocations.
gc.set_threshold(100_000, 50, 1000)
FIXTURES = REPO / "tests" / "fixtures"
REPORTS = REPO / "reports"
# A noise model without run-to-run noise: time verdicts as the two measurements alone give them
# (the shipped one, cublas_audit/data/noise_h100.json, widens them by the H100's measured floor).
ZERO_NOISE = NoiseModel((math.inf,), (0.0,), {"device": "none: no run-to-run noise", "date": "-"})

# Modules whose slow part (rendering every bundled report, nvcc) starts as soon as the tests are
# collected, in another process, on the machine's other core, while the rest of the suite runs;
# their tests run last, when it is done. Each has a `background_work()` that returns what its
# tests check, through the fixture named here (which calls `background_result`); the work starts
# only if a selected test uses that fixture. A Path it returns is removed at the end.
BACKGROUND = {
    "tests.test_bundled": "rendered",
    "tests.test_reference_build": "ptxas_reports",
    "tests.test_fix_report": "compiled",
}
_STARTED = pytest.StashKey[dict[str, "Future[Any]"]]()
_POOL = pytest.StashKey[ThreadPoolExecutor]()
_PROCESSES: list[subprocess.Popen[str]] = []


def _gpu_available() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


def _module(item: pytest.Item) -> str:
    module = getattr(item, "module", None)
    return str(getattr(module, "__name__", ""))


# The quick suite's costliest tests, chosen by benchmarks/heavy_tests.py (each runs no line of
# the package that a quick test leaves unrun), carry the `heavy` marker: CI's second step runs
# them.
HEAVY_LIST = REPO / "tests" / "heavy_tests.txt"


@functools.cache
def listed_heavy() -> frozenset[str]:
    """The node ids HEAVY_LIST names (each line: its CPU seconds, then the node id)."""
    if not HEAVY_LIST.exists():
        return frozenset()
    lines = HEAVY_LIST.read_text().splitlines()
    return frozenset(line.split(None, 1)[1] for line in lines if line.strip() and line[0] != "#")


SERIAL_AT_CORES = 2  # `-n auto` runs no worker on this many cores or fewer


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (pyproject's addopts): a worker per core, except on two cores or fewer, where the
    tests run in this process. The suite's budget is CPU time, and there two workers cost more
    of it (each imports and collects everything) for less wall time: on the 2-core machine,
    farm-bench medians of three runs each, 78.2 s of CPU and 42.8 s wall with two workers
    against 65.0 s and 63.8 s in one process (an hour earlier: 89.4 s against 73.2 s of CPU).
    PYTEST_XDIST_AUTO_NUM_WORKERS, where set, decides (None: pytest-xdist's own count)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    affinity = getattr(os, "sched_getaffinity", None)  # (Linux: the cores this process may use)
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    return 0 if cores <= SERIAL_AT_CORES else None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heavy = listed_heavy()
    for item in items:
        if item.nodeid in heavy:
            item.add_marker(pytest.mark.heavy)
    items.sort(key=lambda item: _module(item) in BACKGROUND)  # stable: those modules last
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (cupy + a CUDA device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.freeze()  # the modules and items collected live to the end: no collection walks them
    # Under pytest-xdist every worker collects every test: a module's slow work then runs in each
    # worker its tests are sent to, when its fixture first asks for it there.
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    work = {
        _module(item): item.module
        for item in session.items
        if isinstance(item, pytest.Function)
        and BACKGROUND.get(_module(item)) in item.fixturenames
        and not item.get_closest_marker("skip")
    }
    if not work:
        return
    pool = ThreadPoolExecutor(max_workers=len(work), thread_name_prefix="background")
    session.config.stash[_POOL] = pool
    session.config.stash[_STARTED] = {
        name: pool.submit(module.background_work) for name, module in work.items()
    }


def pytest_sessionfinish(session: pytest.Session) -> None:
    _stop_fork_server()
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' shared work, once all are done
        shutil.rmtree(_shared_root(os.getpid()), ignore_errors=True)
    for process in _PROCESSES:
        if process.poll() is None:
            process.kill()
    pool = session.config.stash.get(_POOL, None)
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a worker's results live under the shared directory the controller removes
    for future in session.config.stash.get(_STARTED, {}).values():
        finished = future.done() and not future.cancelled() and future.exception() is None
        if finished and isinstance(future.result(), Path):
            shutil.rmtree(future.result(), ignore_errors=True)


def _stop_fork_server() -> None:
    """--devices' shard processes are forks of multiprocessing's fork server (a child of this
    process): it is stopped and reaped here, so that the CPU time of every shard it forked counts
    in this process's children, as it would without it."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def background_result(request: pytest.FixtureRequest) -> Any:
    """The test module's `background_work()`: started at collection, or run now (under
    pytest-xdist once for all workers: the first to ask does it, the others wait for it)."""
    started = request.config.stash.setdefault(_STARTED, {})
    name = request.module.__name__
    if name not in started:
        started[name] = Future()
        work = request.module.background_work
        shared = os.environ.get("PYTEST_XDIST_WORKER")
        started[name].set_result(_once_for_all_workers(name, work) if shared else work())
    return started[name].result()


def once_per_session(name: str, work: Callable[[], Any]) -> Any:
    """work() once for the whole test session: under pytest-xdist the first worker to ask does it
    and the others wait for its result (a Path it returns moved under the run's shared directory,
    which the controller removes at the end)."""
    return _once_for_all_workers(name, work) if os.environ.get("PYTEST_XDIST_WORKER") else work()


def atlas_made_by_the_command(run: Path, out: Path) -> Path:
    """The map's atlas, made by `cublas-audit atlas`: its directory."""
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    result = CliRunner().invoke(app, ["atlas", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (made,) = [path for path in out.iterdir() if path.is_dir()]
    return made


@functools.cache
def audited_run(run: Path) -> Audited:
    """A recorded run (its directory, or a table of one GPU) loaded and judged as `report`
    judges it (default thresholds), once per test session (under pytest-xdist the first worker
    to ask judges it, the others read its pickle): several modules read the same run's findings
    and rows. Read it, never change it (a test that changes a run's findings works on a list of
    its own)."""

    def work() -> Audited:
        from cublas_audit.judge.audited import audit_dataset
        from cublas_audit.table.inputs import load_inputs

        (dataset,) = load_inputs([run])
        return audit_dataset(dataset)

    result: Audited = once_per_session(_shared_name("audited", str(run)), work)
    return result


@dataclass(frozen=True)
class Invoked:
    """What a command printed and its exit code (typer's Result, without its live objects)."""

    exit_code: int
    stdout: str
    stderr: str
    output: str


@functools.cache
def invoked(*argv: str) -> Invoked:
    """`cublas-audit ARGV` through CliRunner, once per test process for the modules that check
    facts of the same output: only for a command that writes no file and reads only committed
    inputs (a report printed to stdout); under pytest-xdist once for all workers."""

    def work() -> Invoked:
        from typer.testing import CliRunner

        from cublas_audit.cli import app

        result = CliRunner().invoke(app, list(argv))
        return Invoked(result.exit_code, result.stdout, result.stderr, result.output)

    shared: Invoked = once_per_session(_shared_name("invoked", *argv), work)
    return shared


def _shared_name(kind: str, *key: str) -> str:
    """A file name for once_per_session's shared result of `kind` for `key`."""
    return f"{kind}-{hashlib.blake2b(chr(0).join(key).encode(), digest_size=8).hexdigest()}"


def without_pictures(*_: object, **__: object) -> list[Any]:
    """report.map_plots.draw for tests of a map's tables and text: it draws nothing."""
    return []


def without_map_pictures(*_: object, **__: object) -> Any:
    """report.map_plots.drawing (a map report's pictures, started) for tests of its tables and
    text: it starts none."""
    from cublas_audit.forked import Forks

    return Forks([])


@pytest.fixture(scope="session")
def fp32_atlas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The atlas of the recorded H100 FP32 map of 3,000 random problems, made by the command once
    for the session, without its pictures: tests/test_atlas.py and test_atlas_interrupt.py read
    its tables and text, and a test that changes it works on a copy."""
    from cublas_audit.report import map_plots

    fp32 = REPORTS / "h100" / "maps" / "20261125-092546-fp32-random"

    def work() -> Path:
        out = tmp_path_factory.mktemp("fp32-atlas")
        with pytest.MonkeyPatch.context() as patch:
            # the pictures are the BF16 atlas's (tests/test_atlas.py); here they cost 3 s of CPU
            patch.setattr(map_plots, "draw", without_pictures)
            atlas_made_by_the_command(fp32, out)
        return out

    return Path(once_per_session("fp32_atlas", work)) / "fp32"


def _shared_root(controller_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"cublas-audit-tests-{controller_pid}"


def _once_for_all_workers(name: str, work: Any) -> Any:
    """The work done by the first worker to ask, its result pickled for the others (a Path it
    returns moved under the run's shared directory, which the controller removes at the end)."""
    root = _shared_root(os.getppid())  # the workers' parent: the controller
    root.mkdir(exist_ok=True)
    done = root / f"{name}.pickle"
    try:
        (root / name).mkdir()  # only the first worker to ask succeeds
    except FileExistsError:
        return _wait_for(done, name)
    try:
        result = work()
    except Exception as exc:
        _publish(done, RuntimeError(f"{name}'s background work failed in another worker: {exc}"))
        raise
    if isinstance(result, Path):
        result = Path(shutil.move(str(result), str(root / name / "result")))
    _publish(done, result)
    return result


def _publish(done: Path, outcome: Any) -> None:
    partial = done.with_suffix(".partial")
    partial.write_bytes(pickle.dumps(outcome))
    partial.rename(done)  # whole or not at all, for the workers polling for it


def _wait_for(done: Path, name: str, timeout: float = 900) -> Any:
    waited = time.monotonic()
    while not done.exists():
        if time.monotonic() - waited > timeout:
            raise TimeoutError(f"another worker's {name} background work never finished")
        time.sleep(0.05)
    outcome = pickle.loads(done.read_bytes())
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def run_process(argv: Sequence[str], timeout: float = 900) -> str:
    """Runs a command in the repository (killed if the session ends first); its stdout."""
    process = subprocess.Popen(
        list(argv), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _PROCESSES.append(process)
    out, err = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {process.returncode}:\n{err}")
    return out


# The article's table "B=8 | 5090 kernel | FMA% | Pro 6000 kernel | FMA% | H200 kernel | FMA%"
# (cublasSgemmStridedBatched, FP32, batch 8), as published: tests/fixtures/PUBLISHED.md.
ARTICLE_B8 = {
    # size: (5090 kernel, FMA %, Pro 6000 kernel, FMA %, H200 kernel, FMA %)
    256: ("simt_128x32_8x5", 33, "magma_Ex", 32, "xmma_32x32x8", 33),
    512: ("simt_128x32_8x5", 39, "magma_Ex", 32, "xmma_64x128x8", 69),
    1024: ("simt_128x32_8x5", 41, "simt_128x64_8x5", 64, "simt_256x128_8x4", 78),
    2048: ("simt_128x32_8x5", 41, "simt_128x128_8x4", 69, "simt_256x128_8x4", 79),
    4096: ("simt_128x32_8x5", 42, "simt_256x128_8x4", 73, "xmma_128x128x8", 82),
    8192: ("simt_128x32_8x5", 42, "simt_256x128_8x4", 73, "xmma_128x128x8", 82),
}


def table_under(markdown: str, *headings: str) -> list[list[str]]:
    """The cells of the first Markdown table after the given heading lines (each found after the
    one before it), header row first, the |---| rule left out. Parsed here, independently of the
    code that renders it."""
    lines = markdown.splitlines()
    at = 0
    for heading in headings:
        at = lines.index(heading, at) + 1
    while not lines[at].startswith("|"):
        at += 1
    rows = []
    while at < len(lines) and lines[at].startswith("|"):
        cells = [cell.strip() for cell in lines[at].strip().strip("|").split("|")]
        if not all(set(cell) <= {"-", ":"} for cell in cells):
            rows.append(cells)
        at += 1
    return rows


def cell(table: list[list[str]], first: str, column: str) -> str:
    """The cell of the row whose first cell is `first`, in the column headed `column`."""
    (row,) = [row for row in table[1:] if row[0] == first]
    return row[table[0].index(column)]


# `CUBLAS_AUDIT_TEST_CPU=FILE pytest ...` (benchmarks/test_suite_time.py --per-test) appends each
# test's CPU seconds (setup, call and teardown; this process and the children it waited for) to
# FILE as "seconds nodeid" lines: on a shared machine wall-clock durations say more about the
# neighbours than about the test.
_CPU_LOG = os.environ.get("CUBLAS_AUDIT_TEST_CPU")


def _cpu_now() -> float:
    now = os.times()
    return now.user + now.system + now.children_user + now.children_system


if _CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        start = _cpu_now()
        yield
        with open(_CPU_LOG, "a") as log:
            log.write(f"{_cpu_now() - start:.3f} {item.nodeid}\n")


def planning_noted(monkeypatch: pytest.MonkeyPatch, order: list[str]) -> None:
    """The CLI's planning (measure_commands.plan_cases) appends "plan" to `order` when it runs:
    what a command did before it planned is what precedes it."""
    from cublas_audit.cli import measure_commands

    planned = measure_commands.plan_cases
    monkeypatch.setattr(
        measure_commands, "plan_cases", lambda *a: order.append("plan") or planned(*a)
    )


def stop_here(*_args: object, **_kwargs: object) -> object:
    """Stands in for a run's GPU part: the command stops there with a bad-input error."""
    from cublas_audit.errors import AuditError

    raise AuditError("stop here")
