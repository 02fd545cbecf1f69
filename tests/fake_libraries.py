"""The C parts of the map (data/*.c) against stand-ins for CUDA's libraries (tests/fake_cuda:
fake_cuda.c for libcuda and libcublas, fake_cupti.c for libcupti), in a child process, so that
this process never loads a stand-in."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FAKES = Path(__file__).resolve().parent / "fake_cuda"
# the C parts need a C compiler, as the map does to warm anything (it maps without, slower)
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) here")


def against_the_fake(
    tmp_path: Path,
    script: str,
    *more: str,
    source: str = "fake_cuda.c",
    name: str = "libcuda.so.1",
    cache: Path | None = None,
) -> dict[str, Any]:
    """What `script` prints (JSON), run in a child with the stand-in compiled from
    tests/fake_cuda/`source` as the library `name` (argv[1]), argv[2] a cache for the compiled
    data/*.c library (`cache`, else one under tmp_path), and `more` after them."""
    fake = tmp_path / name
    flags = ["-O1", "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(fake), str(FAKES / source)]
    subprocess.run(["cc", *flags, "-lpthread"], check=True)
    done = subprocess.run(
        [sys.executable, "-c", script, str(fake), str(cache or tmp_path / "cache"), *more],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(done.stdout)
    return found
