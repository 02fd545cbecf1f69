"""The map engine's operands (device.map_engine): per mode, one random A and B and bias, sized to
the largest pooled problem of the plan and filled once, and one region for the outputs of a chunk
side by side (planning.chunks.output_offsets); a problem's A and B are views of their first
elements, laid out as device.operands describes (each view made once per layout), its C a view
at its offset in the region."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cublas_audit.device import operands
from cublas_audit.device.operands import Operands
from cublas_audit.planning.cases import Case
from cublas_audit.planning.chunks import REGION_BYTES, pooled, region_limit
from cublas_audit.planning.modes import mode as mode_of

# a chunk's outputs take at most this share of the GPU's free memory (REGION_BYTES at most)
REGION_SHARE = 0.25


def region_here() -> int:
    """The bytes a chunk's outputs may take on the current GPU: REGION_SHARE of its free memory,
    REGION_BYTES at most (REGION_BYTES where none can be asked: the chunks are planned alike)."""
    try:
        import cupy

        free, _total = cupy.cuda.runtime.memGetInfo()
    except Exception:  # no GPU, no CuPy: nothing is allocated here either
        return REGION_BYTES
    return min(REGION_BYTES, int(free * REGION_SHARE))


class OperandPool:
    """One mode's operands at a time, sized to the largest pooled case of that mode."""

    def __init__(self, cases: Sequence[Case], region: int = REGION_BYTES) -> None:
        self.sizes: dict[str, dict[str, int]] = {}
        in_pool = [case for case in cases if pooled(case)]
        self.largest_m = max((case.m for case in in_pool), default=0)
        for mode in dict.fromkeys(case.mode for case in in_pool):
            same = [case for case in in_pool if case.mode == mode]
            # (each operand's largest in one pass of max: no layout made, see Case.elements)
            wanted = {name: max(case.elements(name) for case in same) for name in "abc"}
            wanted["bias"] = max(case.m if case.bias else 0 for case in same)
            # C: a region for a chunk's outputs side by side (as large as any chunk may need)
            item = mode_of(mode).element_bytes
            wanted["c"] = region_limit(wanted["c"] * item, region) // item
            self.sizes[mode] = wanted
        self.mode: str | None = None
        self.buffers: dict[str, Any] = {}
        self.views: dict[tuple[str, Any], Any] = {}  # one view per operand layout, made once

    def operands(self, case: Case, c_offset: int = 0) -> Operands:
        """Views of the pool in the case's layout, C `c_offset` bytes into its region (C is not
        poisoned here)."""
        self.load(case.mode)
        a, b = (self.view(name, case.operand(name)) for name in "ab")
        layout = case.operand("c")
        start = c_offset // mode_of(case.mode).element_bytes
        c = self.buffers["c"][start : start + layout.elements]
        ops = Operands(case, a, b, c.reshape((layout.stored, layout.cols, layout.ld)))
        if case.bias:
            ops.bias = self.buffers["bias"][: case.m]
        return ops

    def addresses(self) -> dict[str, tuple[int, int, int]]:
        """{the loaded mode: the device addresses of A, B and C's region}, where every pooled
        problem of that mode has its operands (empty while none is loaded)."""
        if self.mode is None:
            return {}
        a, b, c = (self.buffers[name].data.ptr for name in "abc")
        return {self.mode: (a, b, c)}

    def view(self, name: str, layout: Any) -> Any:
        key = (name, layout)
        view = self.views.get(key)
        if view is None:
            shape = (layout.stored, layout.cols, layout.ld)
            view = self.buffers[name][: layout.elements].reshape(shape)
            self.views[key] = view
        return view

    def load(self, mode: str) -> None:
        """The pool holds `mode`'s operands (made now if it held another mode's)."""
        if mode != self.mode:
            self._fill(mode)

    def _fill(self, mode: str) -> None:
        import cupy

        self.buffers, self.views = {}, {}  # the last mode's arrays go before the new ones
        self.mode = None  # until they are all made: out of memory leaves no half pool
        sizes = self.sizes[mode]
        rng = cupy.random.default_rng(0)
        storage = mode_of(mode).storage
        for name in ("a", "b", "bias"):
            count = max(sizes[name], 1)
            values = rng.standard_normal((count,), dtype=cupy.float32)
            self.buffers[name] = operands.stored(values, mode)
        self.buffers["c"] = cupy.empty((max(sizes["c"], 1),), dtype=storage)
        self.mode = mode
