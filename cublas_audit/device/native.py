"""The map's C parts (data/*.c), compiled once per source text with the system's C compiler into
the user's cache, and loaded into this process with cuBLAS's and the driver's entry points found
in the libraries CuPy has already loaded (no CUDA header or toolkit is needed): the heuristic
warmer (device.heuristic_warm), the chunk queue (device.native_queue) and CUPTI's records
(device.cupti_records).

Without a compiler, on a system without /proc, or where a library is missing, `library` raises
OSError with the reason, and the map goes on without them (only slower).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from cublas_audit.device.loaded import loaded_library

DATA = Path(__file__).resolve().parent.parent / "data"
SOURCES = ("native.c", "heuristic_warm.c", "map_queue.c", "cupti_records.c")
HEADERS = ("native.h",)


def compiled(cache: Path | None = None) -> Path:
    """The shared library, compiled from SOURCES into the cache once per source text; OSError
    where no C compiler is found or it fails."""
    digest = hashlib.sha256()
    for name in (*HEADERS, *SOURCES):
        digest.update((DATA / name).read_bytes())
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    target = cache / "cublas-audit" / f"native-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    compiler = shutil.which(str(sysconfig.get_config_var("CC") or "cc").split()[0])
    compiler = compiler or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc) found")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    sources = [str(DATA / name) for name in SOURCES]
    flags = ["-O2", "-shared", "-fPIC", "-o", str(partial), *sources, "-ldl", "-lpthread"]
    done = subprocess.run([compiler, *flags], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"{Path(compiler).name} failed: {done.stderr.strip().splitlines()[-1:]}")
    partial.replace(target)  # atomic: a concurrent shard finds a whole library or none
    return target


def loaded_cublas(maps: Path = Path("/proc/self/maps")) -> str:
    """The path of the libcublas this process has loaded (CuPy's), read from its memory map."""
    return loaded_library("libcublas.so", maps)  # (not libcublasLt)


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The compiled library with its entry points found in CuPy's libcublas and the driver;
    OSError (or CuPy's error without a GPU) where it cannot be."""
    built = compiled()
    import cupy

    cupy.cuda.device.get_cublas_handle()  # CuPy loads its libcublas
    loaded = ctypes.CDLL(str(built))
    loaded.native_resolve.argtypes = [ctypes.c_char_p]
    status = loaded.native_resolve(loaded_cublas().encode())
    if status != 0:
        raise OSError(f"the driver's or cuBLAS's entry points were not found ({status})")
    return loaded
