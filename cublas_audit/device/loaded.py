"""What this process really loaded (cuBLAS's version and paths, the CUDA runtime, CuPy): the
probe records it first, and the sweep checks --cublas-lib against it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def versions(cupy: Any) -> dict[str, Any]:
    """What this process really loaded: the sweep records it and checks --cublas-lib against it."""
    from cupy_backends.cuda.libs import cublas

    return {
        "cublas_version_int": cublas.getVersion(cupy.cuda.device.get_cublas_handle()),
        "cublas_paths": loaded_libraries("libcublas"),
        "cuda_runtime_int": cupy.cuda.runtime.runtimeGetVersion(),
        "cupy": cupy.__version__,
        "python": sys.version.split()[0],
    }


def loaded_libraries(prefix: str, maps: Path = Path("/proc/self/maps")) -> list[str]:
    """Paths of the shared objects mapped into this process (`maps`: its memory map) whose file
    name starts with prefix."""
    if not maps.exists():
        return []
    paths = {line.split()[-1] for line in maps.read_text().splitlines() if "/" in line}
    return sorted(p for p in paths if Path(p).name.startswith(prefix))


def loaded_library(prefix: str, maps: Path = Path("/proc/self/maps")) -> str:
    """The path of the shared object this process has loaded whose file name starts with prefix
    (the first, sorted); OSError where there is none."""
    found = loaded_libraries(prefix, maps)
    if not found:
        raise OSError(f"{prefix} is not loaded")
    return found[0]
