"""Shared test setup: GPU tests carry the `gpu` marker and skip on machines without a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
REPORTS = REPO / "reports"


def _gpu_available() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (cupy + a CUDA device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
