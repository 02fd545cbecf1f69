"""The environment: GPU, clocks, driver, CUDA, cuBLAS and ncu versions, counter permission.

Everything is read through list-argv subprocesses (nvidia-smi, ncu) or lazy CuPy imports, so
`collect()` works, and says what is missing, on a machine with no GPU and no CUDA.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cublas_audit.errors import ToolMissingError

NCU_FALLBACKS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")
NVIDIA_PARAMS = Path("/proc/driver/nvidia/params")
PERMISSION_FIX = (
    "ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM): run as root, or "
    "load the driver with NVreg_RestrictProfilingToAdminUsers=0 "
    "(https://developer.nvidia.com/ERR_NVGPUCTRPERM)"
)
_SMI_FIELDS = (
    "name",
    "driver_version",
    "compute_cap",
    "clocks.sm",
    "clocks.max.sm",
    "memory.total",
    "uuid",
)


@dataclass
class Environment:
    gpu_name: str | None = None
    cc: str | None = None
    sm_count: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    memory_gb: float | None = None
    driver_version: str | None = None
    cuda_runtime: str | None = None
    cublas_version: str | None = None
    ncu_path: str | None = None
    ncu_version: str | None = None
    counters_permitted: bool | None = None
    # which GPU of the host (nvidia-smi's index and UUID): a sharded run names each shard's
    gpu_uuid: str | None = None
    device_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def has_gpu(self) -> bool:
        return self.gpu_name is not None


def collect(ncu: str | None = None, device: int | None = None) -> Environment:
    """What this machine has; with `device`, that GPU's (nvidia-smi's index), else GPU 0's."""
    env = Environment(device_index=device)
    _read_nvidia_smi(env)
    if env.has_gpu:
        _read_cuda(env)
    env.ncu_path = find_ncu(ncu)
    if env.ncu_path:
        env.ncu_version = _ncu_version(env.ncu_path)
    # counters are a GPU's: with none, the question has no answer (not 'yes' for root)
    env.counters_permitted = counters_permitted() if env.has_gpu else None
    return env


def find_ncu(explicit: str | None = None) -> str | None:
    """The ncu binary: the one given, else PATH, else CUDA's usual install places."""
    if explicit:
        path = shutil.which(explicit)
        return str(Path(path).resolve()) if path else None
    found = shutil.which("ncu")
    if found:
        return found
    return next((p for p in NCU_FALLBACKS if os.access(p, os.X_OK)), None)


def counters_permitted(params: Path = NVIDIA_PARAMS) -> bool | None:
    """Root may always profile; others only when the driver does not restrict counters to admins."""
    if os.geteuid() == 0:
        return True
    try:
        text = params.read_text()
    except OSError:
        return None
    match = re.search(r"RmProfilingAdminOnly:\s*(\d+)", text)
    return None if match is None else match.group(1) == "0"


def require_gpu(env: Environment) -> None:
    if not env.has_gpu:
        raise ToolMissingError("no NVIDIA GPU found here (nvidia-smi sees none)")


def require_profiler(env: Environment) -> str:
    if env.ncu_path is None:
        raise ToolMissingError(
            "ncu (Nsight Compute) not found: install it or pass --ncu PATH "
            "(or --no-profile to only time the calls)"
        )
    if env.counters_permitted is False:
        raise ToolMissingError(PERMISSION_FIX)
    return env.ncu_path


def describe(env: Environment) -> str:
    if not env.has_gpu:
        lines = ["GPU:        none found (nvidia-smi sees no NVIDIA GPU)"]
    else:
        lines = [
            f"GPU:        {env.gpu_name} (cc {env.cc}, {env.sm_count or '?'} SMs, "
            f"{env.memory_gb or '?'} GB)",
            f"SM clock:   {env.sm_clock_mhz} MHz now, {env.sm_clock_max_mhz} MHz max",
            f"driver:     {env.driver_version}",
            f"CUDA:       runtime {env.cuda_runtime or 'unknown (CuPy not importable)'}",
            f"cuBLAS:     {env.cublas_version or 'unknown (CuPy not importable)'}",
        ]
    lines.append(
        f"ncu:        {env.ncu_version} at {env.ncu_path}"
        if env.ncu_path
        else "ncu:        not found"
    )
    lines.append(f"counters:   {counter_permission(env)}")
    return "\n".join(lines)


def counter_permission(env: Environment) -> str:
    """Whether ncu may read counters here: only a question where a GPU and ncu are."""
    if not env.has_gpu:
        return "not applicable: no GPU"
    if env.ncu_path is None:
        return "not applicable: no ncu"
    return {True: "yes", None: "unknown (no /proc/driver/nvidia/params)"}.get(
        env.counters_permitted, f"no: {PERMISSION_FIX}"
    )


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _read_nvidia_smi(env: Environment) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return
    index = str(env.device_index or 0)
    out = _run(
        [smi, f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader,nounits", "-i", index]
    )
    if not out or not out.strip():
        return
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")]
    if len(values) != len(_SMI_FIELDS):
        return
    name, driver, cc, clock, clock_max, memory, uuid = values
    env.gpu_name, env.driver_version, env.cc, env.gpu_uuid = name, driver, cc, uuid
    env.sm_clock_mhz, env.sm_clock_max_mhz = _int_or_none(clock), _int_or_none(clock_max)
    mib = _int_or_none(memory)
    env.memory_gb = round(mib / 1024, 1) if mib else None


def _read_cuda(env: Environment) -> None:
    """Runtime, cuBLAS and SM count through CuPy, when it is installed."""
    try:
        import cupy
        from cupy_backends.cuda.libs import cublas
    except ImportError:
        return
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    env.cuda_runtime = f"{runtime // 1000}.{runtime % 1000 // 10}"
    # CUDA's device numbering follows nvidia-smi's unless CUDA_VISIBLE_DEVICES reorders it
    device = env.device_index or 0
    if device >= cupy.cuda.runtime.getDeviceCount():
        device = 0
    env.sm_count = int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])
    env.cublas_version = format_cublas_version(
        cublas.getVersion(cupy.cuda.device.get_cublas_handle())
    )


@dataclass(frozen=True)
class Gpu:
    """One GPU of this host, as nvidia-smi lists it."""

    index: int
    uuid: str
    name: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def list_gpus() -> list[Gpu]:
    """Every GPU of this host (nvidia-smi), in index order; [] without nvidia-smi or a GPU."""
    smi = shutil.which("nvidia-smi")
    out = _run([smi, "--query-gpu=index,uuid,name", "--format=csv,noheader"]) if smi else None
    found = []
    for line in (out or "").strip().splitlines():
        parts = [part.strip() for part in line.split(",", 2)]
        if len(parts) == 3 and parts[0].isdigit():
            found.append(Gpu(int(parts[0]), parts[1], parts[2]))
    return found


def format_cublas_version(version: int) -> str:
    """130100 -> '13.1.0' (cuBLAS encodes major*10000 + minor*100 + patch)."""
    return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"


def cublas_version_number(text: str) -> int:
    """'13.1.0' -> 130100, format_cublas_version's inverse (what cublasLtGetVersion returns); a
    ValueError for text that is not MAJOR.MINOR.PATCH."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text.strip())
    if not match or int(match[2]) > 99 or int(match[3]) > 99:
        raise ValueError(f"cuBLAS version {text!r} is not MAJOR.MINOR.PATCH")
    return int(match[1]) * 10000 + int(match[2]) * 100 + int(match[3])


def _ncu_version(path: str) -> str | None:
    out = _run([path, "--version"])
    match = re.search(r"Version\s+([\d.]+)", out or "")
    return match.group(1) if match else None


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None
