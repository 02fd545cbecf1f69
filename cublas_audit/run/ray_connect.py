"""Ray joined for a `--ray` run (run.ray_fleet): Ray imported only here and only when asked
(an optional extra: its absence is a ToolMissingError naming the install command), the cluster
joined, possibly in a background thread while the command line plans the run (`connect_soon`;
`auto` where this machine is part of no cluster: a local head started in a process of its own,
run.ray_head, ~5 s of Ray's own start-up beside the planning), and the run's clock: seconds from
the start of joining Ray, what env.json's `ray_timings` count in."""

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
from cublas_audit.run import ray_head

INSTALL_HINT = "pip install 'cublas-audit[ray]'"
# How long an exit waits for Ray still being joined in the background, to stop it.
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
    """Ray being joined in a background thread: when it began, the local head started for it
    (None: a cluster joined as it is), and how it ended."""

    began: float
    ready: threading.Event
    head: ray_head.Head | None = None
    # set by `connect` as the driver starts waiting for Ray (its plan made before Ray was up)
    waited: threading.Event = field(default_factory=threading.Event)
    took: float | None = None
    error: BaseException | None = None
    joined: bool = False  # Ray joined by this thread (not a caller's own ray.init)
    # The exit and the thread's ray.init, one at a time: an exit before the head is joined
    # stops it at once (the thread then ends with it), after that it waits for the join.
    turn: threading.Lock = field(default_factory=threading.Lock)
    leaving: bool = False
    connecting: bool = False


_joining: _Joining | None = None
# the driver's clock of a run: when joining Ray began (epoch seconds), how long it took
_clock: dict[str, float] = {}
CLOCK_KEYS = ("connect_s", "connect_waited_s", "head_ready_s")
# The Ray this process joined (connect) and the head it started, which release leaves; empty:
# none, or a caller's own.
_ours: list[tuple[ModuleType, ray_head.Head | None]] = []


def connect_soon(address: str) -> None:
    """Joins Ray (`connect`) in a background thread while this one goes on (the command line
    plans the run meanwhile); `connect` waits for it. For `auto` on a machine part of no
    cluster, the local head's process is started from this thread (it must outlive the head:
    its parent-death signal is this thread's) and the background one waits for it, then joins
    it. An exit before it is done stops the head, or waits for the join, then stops what it
    started."""
    global _joining
    if _joining is not None:
        return
    joining = _Joining(time.time(), threading.Event(), _local_head(address))

    previous = sys.getswitchinterval()

    def join() -> None:
        try:
            ray = require_ray()  # (importing Ray, ~0.6 s, is the thread's too)
            if not ray.is_initialized():
                _join(ray, address, joining)
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
        # (lives on with the process: where Ray was imported before, ray.init starts a local
        # instance itself, whose processes die with the thread that started them)
        threading.Event().wait()

    _joining = joining
    atexit.register(_stop_started, joining)
    # Joining Ray is many short steps, each waiting for the interpreter lock while this thread
    # plans (pure Python): at the default 5 ms a switch, ray.init took 19.8 s beside a full
    # map's planning on an H100 host (4.7 s alone), 18-19 s here; at 0.2 ms, 9-10 s here.
    sys.setswitchinterval(JOIN_SWITCH_S)
    threading.Thread(target=join, name="cublas-audit ray.init", daemon=True).start()


def connect(address: str) -> ModuleType:
    """Ray joined: `auto` is the cluster this machine is part of (`ray start`), else a new one
    on this machine (a head of its own); an address is that cluster's. Already joined (a
    caller's ray.init, or connect_soon's): kept. Not under way: joined now (connect_soon, then
    waited for at once)."""
    global _joining
    present = sys.modules.get("ray")
    _ours.clear()
    if _joining is None and present is not None and present.is_initialized():
        _clock.clear()
        _clock.update(began=time.time(), connect_s=0.0, connect_waited_s=0.0)
        return present  # (a caller's own)
    if _joining is None:
        connect_soon(address)
    joining, _joining = _joining, None
    assert joining is not None
    waited = time.time()
    joining.waited.set()
    joining.ready.wait()
    _clock.clear()
    _clock.update(began=joining.began, connect_s=joining.took or 0.0)
    _clock["connect_waited_s"] = time.time() - waited
    head = joining.head
    if head is not None and head.ready_at is not None:
        _clock["head_ready_s"] = head.ready_at - joining.began
    if joining.error is not None:
        raise joining.error
    ray = require_ray()
    if joining.joined:
        _ours.append((ray, head))
    return ray


def release() -> None:
    """Ray left in a background thread, once the shards are back (the merge, judging and the
    report need it no more): this process disconnects, then its local head, if it started one,
    is stopped (~2 s here), which passes beside the merge instead of at the exit, and its
    workers' memory is freed. Only a Ray this process joined (`connect`), never a caller's own
    ray.init."""
    if not _ours:
        return
    ray, head = _ours.pop()

    def leave() -> None:
        try:
            ray.shutdown()
        finally:
            if head is not None:
                head.stop()

    leaving = threading.Thread(target=leave, name="cublas-audit ray.shutdown", daemon=True)
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


def _local_head(address: str) -> ray_head.Head | None:
    """The head started for `auto` where ray.init would start a local instance: no cluster on
    this machine (ray_head.existing_cluster), and Ray not yet imported here (where it was, its
    token authentication was read as it was imported: ray.init starts the instance itself, in
    the joining thread, as before)."""
    if address != "auto" or "ray" in sys.modules or ray_head.existing_cluster():
        return None
    return ray_head.start(local_cpus())


def _join(ray: ModuleType, address: str, joining: _Joining) -> None:
    """ray.init at `address`, or at the head's once it is up (never once the exit began)."""
    if joining.head is not None:
        address = joining.head.address_when_ready()
    with joining.turn:
        if joining.leaving:
            raise AuditError("--ray: the command ended before Ray was joined")
        joining.connecting = True
    _connect_now(ray, address)
    joining.joined = True


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
    """At exit (Ctrl-C and errors too): a head not yet joined is stopped at once; Ray being
    joined is waited for, then left (Ray's own exit handler, registered by ray.init, is not run
    when ray.init ends after the exit began), then the head stopped. Each only once: release
    may have done it."""
    with joining.turn:
        joining.leaving = True
        connecting = joining.connecting
    if joining.head is not None and not connecting:
        joining.head.stop()
    joining.ready.wait(STARTING_S)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    if joining.head is not None:
        joining.head.stop()


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
