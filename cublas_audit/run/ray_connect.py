"""Ray joined for a `--ray` run (run.ray_fleet): Ray imported only here and only when asked
(an optional extra: its absence is a ToolMissingError naming the install command), the cluster
joined, possibly in a background thread while the command line plans the run (`connect_soon`:
starting a local Ray instance takes ~5 s, most of it waiting on Ray's own processes), and the
run's clock: seconds from the start of joining Ray, what env.json's `ray_timings` count in."""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from cublas_audit.errors import AuditError, ToolMissingError

INSTALL_HINT = "pip install 'cublas-audit[ray]'"
# How long an exit waits for a Ray instance still starting in the background, to stop it.
STARTING_S = 120.0
# How long an exit waits for Ray left in the background (release) to be stopped.
STOPPING_S = 60.0
# The interpreter's switch interval while Ray is joined in the background (connect_soon).
JOIN_SWITCH_S = 0.0002
# How long a worker's warm-up holds its GPU: the warm-ups of a cluster's GPUs run at once, each
# in a worker of its own (warm_workers).
WARM_HOLD_S = 0.5
# A local instance's logical CPUs beyond one a GPU (a shard's task, and a GPU's warm-up, ask one
# each: Ray's default for a task) (local_cpus).
SPARE_CPUS = 2
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # a folder an NVIDIA GPU of this machine


def installed() -> None:
    """Exit 3 with the install command where Ray is not installed, without importing it (the
    command line checks this before any work; connect_soon imports it in the background)."""
    if importlib.util.find_spec("ray") is None:
        raise ToolMissingError(f"--ray: Ray is not installed here; {INSTALL_HINT}")


def require_ray() -> ModuleType:
    """The ray module, or exit 3 with the install command (checked before any GPU work)."""
    try:
        ray = importlib.import_module("ray")  # typed the same with the ray extra or without
    except ImportError as exc:
        raise ToolMissingError(f"--ray: Ray is not installed here; {INSTALL_HINT}") from exc
    return ray


@dataclass
class _Joining:
    """Ray being joined in a background thread: when it began, and how it ended."""

    began: float
    ready: threading.Event
    # set by `connect` as the driver starts waiting for Ray (its plan made before Ray was up)
    waited: threading.Event = field(default_factory=threading.Event)
    took: float | None = None
    error: BaseException | None = None


_joining: _Joining | None = None
# the driver's clock of a run: when joining Ray began (epoch seconds), how long it took
_clock: dict[str, float] = {}
CLOCK_KEYS = ("connect_s", "connect_waited_s")
# The Ray this process joined (connect), which release leaves; empty: none, or a caller's own.
_ours: list[ModuleType] = []


def connect_soon(address: str) -> None:
    """Joins Ray (`connect`) in a background thread while this one goes on (the command line
    plans the run meanwhile); `connect` waits for it. The thread lives on once Ray is joined:
    Ray's processes of a local instance die with the thread that started them (Linux's
    parent-death signal belongs to a thread). An exit before it is done waits for it, then
    stops what it started."""
    global _joining
    if _joining is not None:
        return
    joining = _Joining(time.time(), threading.Event())

    previous = sys.getswitchinterval()

    def join() -> None:
        try:
            ray = require_ray()  # (importing Ray, ~0.6 s, is the thread's too)
            if not ray.is_initialized():
                _connect_now(ray, address)
                # Workers readied only while the driver still plans: one already waiting
                # submits the shards now, whose tasks then start their workers themselves; a
                # warm-up would hold each GPU from them (WARM_HOLD_S, after its worker's start;
                # on the H100 x4 host the driver had waited 6.7 s, and the shards started
                # 1.1-1.5 s after they were submitted).
                if not joining.waited.is_set():
                    warm_workers(ray)
        except BaseException as exc:  # (raised again where it is waited for)
            joining.error = exc
        finally:
            sys.setswitchinterval(previous)
        joining.took = time.time() - joining.began
        joining.ready.set()
        threading.Event().wait()  # (lives on with the process: see above)

    _joining = joining
    atexit.register(_stop_started, joining)
    # Joining Ray is many short steps, each waiting for the interpreter lock while this thread
    # plans (pure Python): at the default 5 ms a switch, ray.init took 19.8 s beside a full
    # map's planning on an H100 host (4.7 s alone), 18-19 s here; at 0.2 ms, 9-10 s here.
    sys.setswitchinterval(JOIN_SWITCH_S)
    threading.Thread(target=join, name="cublas-audit ray.init", daemon=True).start()


def connect(address: str) -> ModuleType:
    """Ray joined: `auto` is the cluster this machine is part of (`ray start`), else a new one
    on this machine; an address is that cluster's. Already joined (a caller's ray.init, or
    connect_soon's): kept."""
    global _joining
    ray = require_ray()
    joining, _joining = _joining, None
    _ours.clear()
    if joining is not None:
        waited = time.time()
        joining.waited.set()
        joining.ready.wait()
        _clock.update(began=joining.began, connect_s=joining.took or 0.0)
        _clock["connect_waited_s"] = time.time() - waited
        if joining.error is not None:
            raise joining.error
        _ours.append(ray)
    elif not ray.is_initialized():
        _clock.update(began=time.time())
        _connect_now(ray, address)
        _clock.update(connect_s=time.time() - _clock["began"], connect_waited_s=0.0)
        _ours.append(ray)
    else:
        _clock.clear()
        _clock.update(began=time.time(), connect_s=0.0, connect_waited_s=0.0)
    return ray


def release() -> None:
    """Ray left in a background thread, once the shards are back (the merge, judging and the
    report need it no more): stopping a local instance takes ~1.5 s, which then passes beside
    the merge instead of at the exit, and its workers' memory is freed. Only a Ray this process
    joined (`connect`), never a caller's own ray.init."""
    if not _ours:
        return
    ray = _ours.pop()
    leaving = threading.Thread(target=ray.shutdown, name="cublas-audit ray.shutdown", daemon=True)
    leaving.start()
    atexit.register(leaving.join, STOPPING_S)  # (an exit waits for it: nothing left running)


def warm_workers(ray: ModuleType) -> None:
    """A worker a GPU started and readied for its shard (ray_task.warm_up), not waited for: a
    shard's task then starts in a worker whose Python, Ray and the sweep's modules are loaded
    (measured here, 2 cores: in 0.03 s, against 0.5-2.4 s to start and 4.6-8.8 s to import)."""
    from cublas_audit.run import ray_task

    gpus = int(ray.cluster_resources().get("GPU", 0))
    warm = ray.remote(num_gpus=1, max_calls=0)(ray_task.warm_up)
    for _ in range(gpus):
        warm.remote(WARM_HOLD_S)


def local_cpus() -> int | None:
    """The logical CPUs of a Ray instance started here: one a GPU Ray will see (each shard's
    task asks one, Ray's default) and SPARE_CPUS, at most this machine's cores (fewer GPUs than
    that: the GPUs). Ray's own default is every core, and its raylet prestarts a Python worker
    per logical CPU as the driver joins (ray/_private/services.py passes
    --num_prestart_python_workers=num_cpus, as many starting at once): 64 workers importing Ray
    on the H100 x4 host while the driver plans and the GPUs' warm-ups start, then 64 to stop
    beside the judging. None where the GPUs cannot be counted here (Ray's default then)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # (what Ray counts too)
        gpus = len([item for item in visible.split(",") if item.strip()])
    else:
        try:
            gpus = len(os.listdir(NVIDIA_GPUS))
        except OSError:
            return None
    return max(gpus, min(os.cpu_count() or 1, gpus + SPARE_CPUS))


def _connect_now(ray: ModuleType, address: str) -> None:
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    try:
        if address != "auto":
            ray.init(address=address, **options)
            return
        try:  # (a new local instance, sized, unless one was started on this machine)
            ray.init(address=None, num_cpus=local_cpus(), **options)
        except ValueError as exc:
            if "existing cluster" not in str(exc):
                raise
            ray.init(address=None, **options)  # (`ray start`'s: it sized itself)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise AuditError(f"--ray {address}: no Ray cluster joined ({exc})") from exc


def _stop_started(joining: _Joining) -> None:
    """At exit: a Ray instance still starting is waited for, then stopped (Ray's own exit
    handler, registered by ray.init, is not run when ray.init ends after the exit began)."""
    joining.ready.wait(STARTING_S)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def since_start(epoch: float) -> float:
    """Seconds from the start of joining Ray (the run's clock) to `epoch`."""
    return round(epoch - _clock.get("began", epoch), 2)


def clock_record() -> dict[str, Any]:
    """Joining Ray: how long it took, and how long the driver waited for it (connect_soon)."""
    return {
        "clock": "seconds from the start of joining Ray, on the driver's clock (a task's steps "
        "on its node's)",
        **{key: round(_clock[key], 2) for key in CLOCK_KEYS if key in _clock},
    }


def cluster_gpus(ray: ModuleType, address: str) -> int:
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus < 1:
        raise ToolMissingError(f"--ray {address}: the Ray cluster has no GPU")
    return gpus
