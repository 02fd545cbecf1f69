"""The one operand maker and the one correctness check, for every launcher and every mode.

Layout, everywhere in the tool: column-major C (m x n) = A (m x k) @ B (k x n), `batch` times, held
in C-ordered CuPy arrays A (batch, k, m), B (batch, n, k) and C (batch, n, m), i.e. lda = m,
ldb = k, ldc = m and batch strides m*k, k*n, m*n elements. Values are N(0, 1) rounded to the mode's
storage (bf16 kept as its 16 bits in uint16); C starts as NaN, so that a kernel that writes
nothing fails the check instead of passing on stale data.

The metric (docs/schema.md, `max_rel_err`): for each batch entry the normwise relative error
||C_i - R_i||_F / ||R_i||_F against a float64 product R of the same stored inputs, over every
column of C_i up to CHECK_FULL outputs and over CHECK_COLUMNS random columns beyond; the largest
over the batch is the case's error, infinite if any output is not finite. Each mode's tolerance is
in cublas_audit.modes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cublas_audit.modes import mode as mode_of

CHECK_COLUMNS = 64  # output columns per batch entry compared with float64 beyond CHECK_FULL
CHECK_FULL = 2048 * 2048  # outputs per batch entry up to which every column is compared
BF16_NAN = 0x7FC0


@dataclass
class Operands:
    mode: str
    a: Any
    b: Any
    c: Any

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(m, n, k, batch)."""
        batch, k, m = self.a.shape
        return m, self.b.shape[1], k, batch


def tolerance(mode: str) -> float:
    return mode_of(mode).tolerance


def make(mode: str, m: int, n: int, k: int, batch: int, seed: int | None = None) -> Operands:
    """Fresh random A and B and a NaN-poisoned C; CuPy's OutOfMemoryError passes through."""
    import cupy

    rng = cupy.random.default_rng(seed)
    a = _stored(rng.standard_normal((batch, k, m), dtype=cupy.float32), mode)
    b = _stored(rng.standard_normal((batch, n, k), dtype=cupy.float32), mode)
    c = cupy.empty((batch, n, m), dtype=mode_of(mode).storage)
    poison(c, mode)
    return Operands(mode, a, b, c)


def poison(c: Any, mode: str) -> None:
    """Fills C with NaN (the bf16 NaN bit pattern for bf16 storage)."""
    import cupy

    c.fill(BF16_NAN if mode_of(mode).is_bf16_bits else cupy.nan)


def widen(values: Any, dtype: str = "float64") -> Any:
    """Stored values as floats; uint16 holds bf16 bits, every other dtype is numeric."""
    import cupy

    if values.dtype == cupy.uint16:
        values = (values.astype(cupy.uint32) << 16).view(cupy.float32)
    return values.astype(dtype)


def checked(launch: Callable[[], None], ops: Operands, out: Any | None = None) -> float:
    """Poisons the output (C, or `out`), runs the launcher once and returns its error."""
    import cupy

    target = ops.c if out is None else out
    poison(target, ops.mode)
    launch()
    cupy.cuda.get_current_stream().synchronize()
    return error_vs_exact(ops, target)


def error_vs_exact(ops: Operands, out: Any | None = None, seed: int = 0) -> float:
    """The metric above for C (or `out`, an array shaped like C) against float64."""
    import cupy
    import numpy

    got_all = ops.c if out is None else out
    batch, n, m = got_all.shape
    rng = numpy.random.default_rng(seed)
    worst = 0.0
    for i in range(batch):
        picked = numpy.arange(n) if m * n <= CHECK_FULL else rng.permutation(n)[:CHECK_COLUMNS]
        cols = cupy.asarray(picked)
        got = widen(got_all[i][cols])
        if not bool(cupy.isfinite(got).all()):
            return math.inf
        # Rows of b[i] are columns of B, rows of c[i] columns of C: C[:, cols]^T = B[:, cols]^T A^T.
        exact = widen(ops.b[i][cols]) @ widen(ops.a[i])
        worst = max(worst, _normwise(got, exact))
    return worst


def relative_error(got: Any, want: Any) -> float:
    """The same metric between two outputs (a candidate against the default), every column,
    one batch entry at a time in float32 so that no full-size float64 temporary is made."""
    import cupy

    worst = 0.0
    for got_i, want_i in zip(got, want, strict=True):
        g = widen(got_i, "float32")
        if not bool(cupy.isfinite(g).all()):
            return math.inf
        worst = max(worst, _normwise(g, widen(want_i, "float32")))
    return worst


def _normwise(got: Any, want: Any) -> float:
    import cupy

    scale = float(cupy.linalg.norm(want))
    diff = float(cupy.linalg.norm(got - want))
    return diff / scale if scale > 0 else diff


def _stored(values: Any, mode: str) -> Any:
    import cupy

    storage = mode_of(mode).storage
    if storage == "uint16":  # round to nearest even into the upper 16 bits
        bits = values.view(cupy.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(cupy.uint16)
    return values.astype(storage, copy=False)  # fp32: no second copy of a 4 GB operand
