"""What the reference-tuning tools share: the device record, variants of the strategy table's pick,
and cuBLAS with those variants as launchers on one set of operands, checked before use.

Everything GPU-related goes through the package: operands and their check (device.operands), the
cuBLAS call (device.launchers), the reference build (device.reference.build).
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from cublas_audit.device import launchers, operands
from cublas_audit.device.reference.bench import TOLERANCE
from cublas_audit.device.reference.build import build_all, device_cc, prepare
from cublas_audit.device.reference.config import Config, strategy_for
from cublas_audit.observe import environment
from cublas_audit.planning.cases import Case

CUBLAS = "cublas"  # the contender name of the classic cuBLAS call


def device_info() -> dict[str, Any]:
    """The GPU and the versions a measurement depends on (observe.environment), dated."""
    import cupy

    return {
        **environment.collect().to_json(),
        "cupy": cupy.__version__,
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def problem(text: str) -> tuple[int, int]:
    """'8192,8' -> (8192, 8): a square size and a batch count."""
    size, batch = (int(x) for x in text.split(","))
    return size, batch


def overrides(text: str) -> dict[str, Any]:
    """'order=1,acc_layout=blocks' -> {'order': 1, 'acc_layout': 'blocks'}"""
    pairs = (item.split("=", 1) for item in text.split(",") if item)
    return {key: int(value) if value.lstrip("-").isdigit() else value for key, value in pairs}


def variants(size: int, batch: int, texts: list[str]) -> dict[str, Config]:
    """The strategy table's pick for size^3 batch `batch` with each text's fields overridden; a
    variant that is no usable tile is reported and left out."""
    base = strategy_for(device_cc(), size, size, size, batch)
    found = {text: replace(base, **overrides(text)) for text in texts}
    for text, config in list(found.items()):
        if config.problems():
            print(f"  {text}: skipped, {'; '.join(config.problems())}", flush=True)
            del found[text]
    return found


def contenders(
    size: int, batch: int, configs: dict[str, Config], ops: operands.Operands
) -> dict[str, Callable[[], None]]:
    """cuBLAS (CUBLAS) and every variant on the same operands, the variants compiled in parallel
    first."""
    build_all((config, size, size, size) for config in configs.values())
    case = Case("cublas", "fp32", size, size, size, batch)
    found = {CUBLAS: launchers.classic(case, ops)}
    for text, config in configs.items():
        found[text] = prepare(size, size, size, batch, ops.a, ops.b, ops.c, config)
    return found


def checked(found: dict[str, Callable[[], None]], ops: operands.Operands) -> dict[str, float]:
    """Each contender's error against float64 (device.operands.checked); a wrong one is reported
    and removed from `found`. Each contender has run once when this returns."""
    errors = {}
    for name, launch in list(found.items()):
        errors[name] = operands.checked(launch, ops)
        if not errors[name] <= TOLERANCE:
            print(f"  {name}: WRONG, relative error {errors[name]:.3g}", flush=True)
            del found[name]
    return errors
