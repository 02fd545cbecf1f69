"""Where cuBLAS's C header is, for the tests that compile a snippet or read the header.

cublasLt.h ships with cuBLAS, not with every CUDA toolkit install: a toolkit without the cuBLAS
component has nvcc but no header, while the `nvidia-cublas` wheel (a dependency of nvmath-python
and of PyTorch) carries it under nvidia/cu13/include. CUBLAS_INCLUDE_DIR names a folder holding it
where neither is installed (e.g. the wheel's include/ unzipped)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
)


def cublaslt_include() -> Path | None:
    """The first folder holding cublasLt.h: CUBLAS_INCLUDE_DIR, the toolkit's include folder
    beside nvcc (or CUDA_HOME's), then the nvidia-cublas wheel's."""
    candidates = [Path(os.environ[v]) for v in ("CUBLAS_INCLUDE_DIR",) if os.environ.get(v)]
    if NVCC:
        candidates.append(Path(NVCC).resolve().parent.parent / "include")
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "include")
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates += [Path(root) / "cu13" / "include", Path(root) / "cublas" / "include"]
    return next((path for path in candidates if (path / "cublasLt.h").is_file()), None)
