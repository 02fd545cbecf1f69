"""An NVTX push/pop range as a context manager: ncu's filter finds a case's kernels by its range
(observe.ncu_export names them: the call's, the reference's)."""

from __future__ import annotations


class Range:
    def __init__(self, name: str) -> None:
        import cupy

        self.nvtx = cupy.cuda.nvtx
        self.name = name

    def __enter__(self) -> None:
        self.nvtx.RangePush(self.name)

    def __exit__(self, *exc: object) -> None:
        self.nvtx.RangePop()
