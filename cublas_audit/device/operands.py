"""The one operand maker and the one correctness check, for every launcher and every mode.

Layout, everywhere in the tool: column-major C (m x n) = op(A) (m x k) @ op(B) (k x n) (+ beta C,
+ a bias per row), `batch` times, as the case describes it (cases.Case.operand). Each operand is a
C-ordered CuPy array (stored entries, cols, ld): column j of a stored matrix is row j of its
entry, its first `rows` values. The packed, untransposed default is A (batch, k, m), B
(batch, n, k) and C (batch, n, m): lda = m, ldb = k, ldc = m and batch strides m*k, k*n, m*n
elements; a broadcast operand holds one entry. Values are N(0, 1) rounded to the mode's storage
(bf16 kept as its 16 bits in uint16); C starts as NaN, so that a kernel that writes nothing
fails the check instead of passing on stale data, except where beta != 0: then C starts random
and a copy of it is kept for the check.

The metric (docs/schema.md, `max_rel_err`): for each batch entry the normwise relative error
||C_i - R_i||_F / ||R_i||_F against a float64 product R of the same stored inputs, over every
column of C_i up to CHECK_FULL outputs and over CHECK_COLUMNS random columns beyond; the largest
over the batch is the case's error, infinite if any output is not finite. Each mode's tolerance is
in cublas_audit.planning.modes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cublas_audit.device import quick_check
from cublas_audit.planning.cases import Case, OperandLayout
from cublas_audit.planning.modes import mode as mode_of

CHECK_COLUMNS = 64  # output columns per batch entry compared with float64 beyond CHECK_FULL
CHECK_FULL = 2048 * 2048  # outputs per batch entry up to which every column is compared
# The map's quick check: this many random columns of the first and last batch entries. It still
# catches a kernel that writes nothing, ignores a transpose or reads the wrong entry, at a small
# fraction of the full check's float64 work (device.quick_check computes it).
QUICK_COLUMNS = quick_check.MAX_COLUMNS


@dataclass
class Operands:
    case: Case  # the layout the arrays follow (any case of the same key shares them)
    a: Any
    b: Any
    c: Any
    c0: Any = None  # C's starting values where beta != 0
    bias: Any = None  # the BIAS epilogue's vector of m values

    @property
    def mode(self) -> str:
        return self.case.mode

    @property
    def key(self) -> tuple[Any, ...]:
        return key_of(self.case)


def key_of(case: Case) -> tuple[Any, ...]:
    """What decides a case's operands: consecutive cases with the same key share them."""
    layouts = tuple(case.operand(name) for name in "abc")
    return (case.mode, *layouts, case.beta != 0, case.bias)


def tolerance(mode: str) -> float:
    return mode_of(mode).tolerance


def make(mode: str, m: int, n: int, k: int, batch: int, seed: int | None = None) -> Operands:
    """Packed, untransposed operands of one problem (the reference kernel's layout)."""
    return make_for(Case("cublas", mode, m, n, k, batch), seed)


def make_for(case: Case, seed: int | None = None) -> Operands:
    """Fresh random A and B in the case's layout and a NaN-poisoned C (a random C and its copy
    where beta != 0, a random bias where the case has one); CuPy's OutOfMemoryError passes
    through."""
    import cupy

    rng = cupy.random.default_rng(seed)
    a, b = (_random(rng, case.operand(name), case.mode) for name in "ab")
    c = cupy.empty((case.batch, case.n, case.m), dtype=mode_of(case.mode).storage)
    ops = Operands(case, a, b, c)
    if case.beta:
        ops.c = _random(rng, case.operand("c"), case.mode)
        ops.c0 = ops.c.copy()
    else:
        poison(c, case.mode)
    if case.bias:
        ops.bias = stored(rng.standard_normal((case.m,), dtype=cupy.float32), case.mode)
    return ops


def _random(rng: Any, layout: OperandLayout, mode: str) -> Any:
    import cupy

    shape = (layout.stored, layout.cols, layout.ld)
    return stored(rng.standard_normal(shape, dtype=cupy.float32), mode)


def reset(ops: Operands, out: Any | None = None) -> None:
    """Before a checked call: C (or `out`) poisoned, or back to its starting values (beta)."""
    target = ops.c if out is None else out
    if ops.c0 is not None:
        target[...] = ops.c0
    else:
        poison(target, ops.mode)


def poison(c: Any, mode: str) -> None:
    """Fills C (contiguous) with NaN, queued on the current stream: every byte 0xFF is a NaN in
    float32, float16 and bf16 alike (a memset: no kernel to compile, nothing to wait for)."""
    import cupy

    del mode  # the same bytes are a NaN in every storage
    stream = cupy.cuda.get_current_stream()
    cupy.cuda.runtime.memsetAsync(c.data.ptr, 0xFF, c.nbytes, stream.ptr)


def widen(values: Any, dtype: str = "float64") -> Any:
    """Stored values as floats; uint16 holds bf16 bits, every other dtype is numeric."""
    import cupy

    if values.dtype == cupy.uint16:
        values = (values.astype(cupy.uint32) << 16).view(cupy.float32)
    return values.astype(dtype)


def checked(
    launch: Callable[[], None], ops: Operands, out: Any | None = None, *, quick: bool = False
) -> float:
    """Resets the output (C, or `out`), runs the launcher once and returns its error (`quick`:
    on QUICK_COLUMNS columns of the first and last batch entries)."""
    import cupy

    target = ops.c if out is None else out
    reset(ops, target)
    launch()
    cupy.cuda.get_current_stream().synchronize()
    return error_vs_exact(ops, target, quick=quick)


def error_vs_exact(
    ops: Operands, out: Any | None = None, seed: int = 0, *, quick: bool = False
) -> float:
    """The metric above for C (or `out`, an array shaped like C) against float64; `quick`
    through device.quick_check's kernels (the same metric on its columns, one readback)."""
    import cupy
    import numpy

    got_all = ops.c if out is None else out
    if quick:
        return quick_check.error_now(ops, got_all)
    case = ops.case
    batch, n, m = got_all.shape
    rng = numpy.random.default_rng(seed)
    worst = 0.0
    for i in range(batch):
        every = m * n <= CHECK_FULL
        picked = numpy.arange(n) if every else rng.permutation(n)[:CHECK_COLUMNS]
        cols = cupy.asarray(picked)
        got = widen(got_all[i][cols, :m])
        # In C order the rows of an entry are the columns of its matrix, so the picked columns
        # of C, transposed, are op(B)[:, cols]^T @ op(A)^T (+ beta C0 + bias in every row).
        exact = widen(_op_b_rows(ops, i, cols)) @ widen(_op_a_transposed(ops, i))
        if ops.c0 is not None:
            exact += case.beta * widen(ops.c0[i][cols, :m])
        if ops.bias is not None:
            exact += widen(ops.bias)[None, :]
        worst = max(worst, _normwise(got, exact))
        if worst == math.inf:
            return worst
    return worst


def _entry(array: Any, i: int) -> Any:
    return array[i if array.shape[0] > 1 else 0]


def _op_a_transposed(ops: Operands, i: int) -> Any:
    """op(A)^T of entry i (k x m)."""
    entry, case = _entry(ops.a, i), ops.case
    return entry[:, : case.m] if case.transa == "n" else entry[:, : case.k].T


def _op_b_rows(ops: Operands, i: int, cols: Any) -> Any:
    """op(B)[:, cols]^T of entry i (len(cols) x k)."""
    entry, case = _entry(ops.b, i), ops.case
    return entry[cols, : case.k] if case.transb == "n" else entry[:, cols].T[:, : case.k]


def relative_error(got: Any, want: Any) -> float:
    """The same metric between two outputs (a candidate against the default), every column,
    one batch entry at a time in float32 so that no full-size float64 temporary is made."""
    worst = 0.0
    for got_i, want_i in zip(got, want, strict=True):
        worst = max(worst, _normwise(widen(got_i, "float32"), widen(want_i, "float32")))
        if worst == math.inf:
            return worst
    return worst


def _normwise(got: Any, want: Any) -> float:
    """||got - want||_F / ||want||_F (the difference's norm where want is 0), infinite where it
    is not finite: a NaN or an infinity in got makes the difference's norm so, so no separate
    finiteness pass is made (`isfinite(...).all()` is a CUB reduction that NVRTC took 4.4 s to
    compile on a cold kernel cache, on the H100; the norms' sums are CuPy's precompiled ones)."""
    import cupy

    scale = float(cupy.linalg.norm(want))
    diff = float(cupy.linalg.norm(got - want))
    error = diff / scale if scale > 0 else diff
    return error if math.isfinite(error) else math.inf


def stored(values: Any, mode: str) -> Any:
    """float32 values in the mode's storage. CuPy's own ufuncs, not Python's operators: an array
    and a Python number go through NumPy's dispatch to CuPy's __array_ufunc__, which imports
    cupyx and with it SciPy (~0.5 s of the map's first chunk on the H100 host, the GPU idle)."""
    import cupy

    storage = mode_of(mode).storage
    if storage == "uint16":  # round to nearest even into the upper 16 bits
        bits = values.view(cupy.uint32)
        odd = cupy.bitwise_and(cupy.right_shift(bits, 16), 1)
        rounded = cupy.add(cupy.add(bits, cupy.uint32(0x7FFF)), odd)
        return cupy.right_shift(rounded, 16).astype(cupy.uint16)
    return values.astype(storage, copy=False)  # fp32: no second copy of a 4 GB operand
