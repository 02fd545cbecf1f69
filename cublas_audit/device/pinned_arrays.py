"""The arrays a pinned GEMM's call takes, per framework: PyTorch CUDA tensors and CuPy arrays.

Each framework gives the call an array's pointer once the array is checked against its
ArraySpec, the handle of its current stream, and an empty output. The check's fast path is one
comparison of dtype, device, shape and strides; anything else takes the slow path, which still
accepts strides that differ only on size-1 dimensions and otherwise says in one line
(OperandMismatch) everything that differs. torch is never imported here: a caller that holds a
tensor has loaded it, so its class is found in sys.modules.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from cublas_audit.device.row_major import ArraySpec, Strided
from cublas_audit.errors import AuditError, OperandMismatch
from cublas_audit.planning.modes import mode as mode_of

# Each mode's storage (planning.modes) as the frameworks name it: CuPy keeps bf16 as its bits.
_TORCH_DTYPES = {"float32": "float32", "float16": "float16", "uint16": "bfloat16"}
_MODES = {
    "torch.float32": "fp32",
    "torch.float16": "fp16",
    "torch.bfloat16": "bf16",
    "float32": "fp32",
    "float16": "fp16",
    "uint16": "bf16",
}


class FrameworkArrays(Protocol):
    def pointer(self, x: Any, spec: ArraySpec) -> int: ...

    def stream(self) -> int: ...

    def empty(self, spec: ArraySpec) -> Any: ...


def arrays_for(a: Any, mode: str, device: int, where: str) -> FrameworkArrays:
    """The framework of the call's first argument, for every array of that call."""
    torch = _torch_of(a)
    if torch is not None:
        return TorchArrays(torch, mode, device, where)
    if _is_cupy(a):
        import cupy

        return CupyArrays(cupy, mode, device, where)
    raise OperandMismatch(
        f"{where}: the first argument is a {_type_name(a)}; PinnedGemm takes PyTorch CUDA "
        "tensors or CuPy arrays"
    )


def mode_of_array(x: Any) -> str:
    """fp32, fp16 or bf16, from a tensor's or a CuPy array's dtype."""
    dtype = str(getattr(x, "dtype", type(x).__name__))
    if dtype not in _MODES:
        raise AuditError(f"dtype {dtype}: PinnedGemm runs float32, float16 and bfloat16 data")
    return _MODES[dtype]


def strided(x: Any) -> Strided:
    """A tensor's or a CuPy array's shape and strides in elements."""
    if _torch_of(x) is not None:
        return Strided(tuple(x.shape), tuple(x.stride()))
    if not _is_cupy(x):
        raise AuditError(f"a {_type_name(x)}: PinnedGemm takes PyTorch tensors or CuPy arrays")
    if any(stride % x.itemsize for stride in x.strides):
        raise AuditError(f"strides {x.strides} (bytes) are not whole elements")
    return Strided(tuple(x.shape), tuple(stride // x.itemsize for stride in x.strides))


@dataclass(frozen=True)
class _Seen:
    """What an argument turned out to be, for the one-line refusal."""

    kind: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: int
    ptr: int


class TorchArrays:
    kind = "torch.Tensor"

    def __init__(self, torch: ModuleType, mode: str, device: int, where: str) -> None:
        self.torch = torch
        self.dtype = getattr(torch, _TORCH_DTYPES[mode_of(mode).storage])
        self.device = device
        self.where = where
        # The current stream's raw handle without building a Stream object per call (what
        # torch's own compiled code calls); the public API where this torch lacks it.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.stream: Callable[[], int] = (
            functools.partial(raw, device) if raw is not None else self._public_stream
        )

    def pointer(self, x: Any, spec: ArraySpec) -> int:
        try:
            same = (
                x.dtype is self.dtype
                and x.get_device() == self.device
                and x.shape == spec.shape
                and x.stride() == spec.strides
            )
            if same:
                ptr: int = x.data_ptr()
                if not ptr % spec.alignment:
                    return ptr
        except (AttributeError, TypeError):
            pass
        return self._pointer_slowly(x, spec)

    def _pointer_slowly(self, x: Any, spec: ArraySpec) -> int:
        try:
            seen = _Seen(
                self.kind,
                tuple(x.shape),
                tuple(x.stride()),
                str(x.dtype),
                int(x.get_device()),
                int(x.data_ptr()),
            )
        except (AttributeError, TypeError):
            raise OperandMismatch(_foreign(self.where, spec, x, self.kind)) from None
        return _accepted(self.where, seen, spec, str(self.dtype), self.device)

    def _public_stream(self) -> int:
        return int(self.torch.cuda.current_stream(self.device).cuda_stream)

    def empty(self, spec: ArraySpec) -> Any:
        device = self.torch.device("cuda", self.device)
        return self.torch.empty(spec.shape, dtype=self.dtype, device=device)


class CupyArrays:
    kind = "cupy.ndarray"

    def __init__(self, cupy: ModuleType, mode: str, device: int, where: str) -> None:
        import numpy

        self.cupy = cupy
        self.dtype = numpy.dtype(mode_of(mode).storage)
        self.device = device
        self.where = where
        self._byte_strides: dict[str, tuple[int, ...]] = {}

    def pointer(self, x: Any, spec: ArraySpec) -> int:
        strides = self._byte_strides.get(spec.name) or self._bytes(spec)
        try:
            same = (
                x.dtype == self.dtype
                and x.shape == spec.shape
                and x.strides == strides
                and x.data.device_id == self.device
            )
            if same:
                ptr: int = x.data.ptr
                if not ptr % spec.alignment:
                    return ptr
        except AttributeError:
            pass
        return self._pointer_slowly(x, spec)

    def _bytes(self, spec: ArraySpec) -> tuple[int, ...]:
        strides = tuple(stride * self.dtype.itemsize for stride in spec.strides)
        self._byte_strides[spec.name] = strides
        return strides

    def _pointer_slowly(self, x: Any, spec: ArraySpec) -> int:
        if not _is_cupy(x):
            raise OperandMismatch(_foreign(self.where, spec, x, self.kind))
        item = x.itemsize
        strides = tuple(s // item if s % item == 0 else -1 for s in x.strides)
        seen = _Seen(self.kind, tuple(x.shape), strides, str(x.dtype), x.data.device_id, x.data.ptr)
        return _accepted(self.where, seen, spec, str(self.dtype), self.device)

    def stream(self) -> int:
        return int(self.cupy.cuda.get_current_stream().ptr)

    def empty(self, spec: ArraySpec) -> Any:
        with self.cupy.cuda.Device(self.device):
            return self.cupy.empty(spec.shape, dtype=self.dtype)


def _accepted(where: str, seen: _Seen, spec: ArraySpec, dtype: str, device: int) -> int:
    """The pointer, where the argument differs from the spec only in what does not matter;
    else OperandMismatch saying everything that differs."""
    problems = []
    if seen.dtype != dtype:
        problems.append(f"dtype {seen.dtype}, not {dtype}")
    if seen.device != device:
        problems.append(f"on {_device_words(seen.device)}, not cuda:{device}")
    if not spec.accepts(seen.shape, seen.strides):
        problems.append(
            f"shape {list(seen.shape)}, strides {list(seen.strides)}, not {spec.words()}"
        )
    if seen.ptr % spec.alignment:
        problems.append(
            f"address {seen.ptr:#x} is not {spec.alignment}-byte aligned (cuBLASLt was told it is)"
        )
    if problems:
        raise OperandMismatch(f"{where}: {spec.name}: {'; '.join(problems)}")
    return seen.ptr


def _foreign(where: str, spec: ArraySpec, x: Any, kind: str) -> str:
    return f"{where}: {spec.name} is a {_type_name(x)}, the first argument a {kind}"


def _device_words(device: int) -> str:
    return "cpu" if device < 0 else f"cuda:{device}"


def _torch_of(x: Any) -> ModuleType | None:
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(x, torch.Tensor) else None


def _is_cupy(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "cupy" and hasattr(x, "__cuda_array_interface__")


def _type_name(x: Any) -> str:
    kind = type(x)
    return f"{kind.__module__}.{kind.__qualname__}"
