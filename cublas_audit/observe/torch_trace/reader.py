"""Reading a PyTorch profiler trace: the CPU ops, launches and GPU activities the GEMM table needs.

No torch and no GPU: a trace from `torch.profiler.profile(record_shapes=True)`, exported as a
Chrome trace (plain or gzipped), already says everything. Each `aten::mm/addmm/bmm/...` call is a
CPU-op event with "Input Dims", "Input Strides", "Input type" and "Concrete Inputs" (scalars such
as beta); each CUDA launch is a runtime or driver event with a `correlation` id; each kernel carries
the same id, its duration, grid and block.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from cublas_audit.errors import AuditError

# The ops that describe a GEMM (their inputs are the operands cuBLAS gets), and the containers
# that call them.
LEAF_OPS = frozenset(
    {"aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::bmm", "aten::baddbmm"}
)
CONTAINER_OPS = frozenset({"aten::matmul", "aten::linear"})
GEMM_OPS = LEAF_OPS | CONTAINER_OPS
GZIP_MAGIC = b"\x1f\x8b"
# Event categories, lower-cased (older PyTorch wrote "Operator", "Runtime", "Kernel", "Memcpy").
_CATEGORIES = {
    "cpu_op": "op", "operator": "op",
    "cuda_runtime": "launch", "cuda_driver": "launch", "runtime": "launch", "driver": "launch",
    "kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset",
}  # fmt: skip
_CHUNK_CHARS = 1 << 23
_STEP = "ProfilerStep#"


class CpuOp(NamedTuple):
    """A CPU op: times in integer nanoseconds (exact containment tests); `args` kept for GEMM
    ops only, the rest only nest."""

    name: str
    thread: tuple[Any, Any]
    start: int
    end: int
    args: dict[str, Any] | None


class Launch(NamedTuple):
    """A CUDA runtime or driver call that carries a correlation id (a launch, a memcpy...)."""

    thread: tuple[Any, Any]
    start: int
    correlation: int


class GpuActivity(NamedTuple):
    """A kernel, memcpy or memset on the GPU, tied to its launch by the correlation id."""

    kind: str  # kernel, memcpy or memset
    name: str
    correlation: int
    duration_us: float
    grid: tuple[int, ...]
    block: tuple[int, ...]
    registers: int


@dataclass
class Trace:
    """What a trace holds that this module reads: CPU ops, launches, GPU activities by
    correlation id, and the top-level metadata (deviceProperties...)."""

    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    ops: list[CpuOp] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    activities: dict[int, list[GpuActivity]] = field(default_factory=dict)
    event_count: int = 0
    # torch.profiler's step markers (ProfilerStep#N, with a schedule): what "per step" divides by
    steps: set[str] = field(default_factory=set)

    @property
    def sm_count(self) -> int | None:
        device = self._device()
        count = device.get("numSms")
        return int(count) if isinstance(count, int) and count > 0 else None

    @property
    def gpu_name(self) -> str:
        return str(self._device().get("name") or "")

    def _device(self) -> dict[str, Any]:
        devices = self.meta.get("deviceProperties")
        first = devices[0] if isinstance(devices, list) and devices else None
        return first if isinstance(first, dict) else {}


# ---------------------------------------------------------------------------------------------
# Reading: a streaming parse, so a trace of hundreds of MB never sits in memory as JSON objects.


def read_trace(path: Path | str) -> Trace:
    """A Chrome trace from torch.profiler, plain or gzipped (told apart by its magic bytes, not
    its suffix). Events are decoded one at a time and only what the GEMM table needs is kept, so
    memory follows the kept records, not the file. A missing, unreadable, truncated or non-trace
    file is an AuditError naming it."""
    path = Path(path)
    trace = Trace(path)
    try:
        _parse_file(path, trace)
    except FileNotFoundError:
        raise AuditError(f"{path}: no such trace file") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise AuditError(f"{path}: cannot read the trace ({_one_line(exc)})") from None
    except UnicodeDecodeError as exc:
        raise AuditError(f"{path}: not a JSON trace (not UTF-8 text: {_one_line(exc)})") from None
    except _NotJson as exc:
        raise AuditError(f"{path}: not a JSON trace ({exc})") from None
    except RecursionError:  # json's decoder, on arrays or objects nested thousands deep
        raise AuditError(f"{path}: not a JSON trace (nested too deeply)") from None
    except _BadEvent as exc:
        raise AuditError(f"{path}: {exc}") from None
    except _NotATrace as exc:
        raise AuditError(f"{path}: not a PyTorch profiler trace ({exc})") from None
    return trace


class _NotATrace(Exception):
    """Valid JSON so far, but not a Chrome trace object with a traceEvents list."""


class _NotJson(Exception):
    """Text that is not JSON (or ends early), with where."""


class _BadEvent(Exception):
    """A trace event whose time cannot be a measurement (negative, infinite, NaN)."""


def _parse_file(path: Path, trace: Trace) -> None:
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        binary = gzip.GzipFile(fileobj=raw) if gzipped else raw
        with io.TextIOWrapper(binary, encoding="utf-8-sig") as text:
            _parse(_Cursor(text), _Collector(trace))


def _one_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0]


_SPACE = re.compile(r"[ \t\n\r]*")
_SPACE_OR_COMMA = re.compile(r"[ \t\n\r,]*")


class _Cursor:
    """The decompressed text, read in chunks, with a position: JSON values are decoded at the
    position one by one (json's own C decoder), reading on when a value runs past the chunk."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.buf = ""
        self.pos = 0
        self.offset = 0  # characters of the text before buf
        self.decoder = json.JSONDecoder()

    def _more(self) -> bool:
        data = self.stream.read(_CHUNK_CHARS)
        if not data:
            return False
        self.offset += self.pos
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def peek(self, skip: re.Pattern[str] = _SPACE) -> str:
        """The next character after what `skip` matches ('' at the end of the text)."""
        while True:
            match = skip.match(self.buf, self.pos)
            self.pos = match.end() if match else self.pos
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def take(self, char: str) -> None:
        if self.peek() != char:
            found = self.buf[self.pos : self.pos + 20] or "the end of the file"
            raise _NotATrace(f"expected {char!r}, found {found!r}")
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value; one cut by the chunk's end (or a number that might go on) is
        decoded again with more text."""
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._more():
                    continue
                raise _NotJson(f"{exc.msg} at character {self.offset + exc.pos}") from None
            if end == len(self.buf) and self._more():
                continue
            self.pos = end
            return value


def _parse(cursor: _Cursor, collector: _Collector) -> None:
    """The top-level object: every key but traceEvents is metadata; traceEvents is streamed."""
    if cursor.peek() != "{":
        raise _NotATrace("not a JSON object")
    cursor.take("{")
    found = False
    while (char := cursor.peek(_SPACE_OR_COMMA)) != "}":
        if char != '"':
            raise _NotATrace(f"expected a key, found {char or 'the end of the file'!r}")
        key = cursor.value()
        cursor.take(":")
        if key == "traceEvents":
            cursor.take("[")
            while (char := cursor.peek(_SPACE_OR_COMMA)) != "]":
                if not char:
                    raise _NotATrace("the traceEvents list ends early (a truncated file?)")
                collector.add(cursor.value())
            cursor.take("]")
            found = True
        else:
            collector.trace.meta[key] = cursor.value()
    if not found:
        raise _NotATrace("no traceEvents list")


class _Collector:
    """Turns each event into the compact record this module needs, or drops it. Names repeat
    (kernel names run to kilobytes), so they are interned."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.activities: dict[int, list[GpuActivity]] = defaultdict(list)
        trace.activities = self.activities

    def add(self, event: Any) -> None:
        self.trace.event_count += 1
        if not isinstance(event, dict):
            return
        category = event.get("cat")
        kind = _CATEGORIES.get(category.lower()) if isinstance(category, str) else None
        name = event.get("name")
        if isinstance(name, str) and name.startswith(_STEP) and category != "gpu_user_annotation":
            self.trace.steps.add(name)
        start = event.get("ts")
        if kind is None or not isinstance(start, int | float):
            return
        if not math.isfinite(start):
            raise _BadEvent(f"{event.get('name')!r}: its start time (ts) is {start!r}")
        if kind == "op":
            self._op(event, start)
            return
        args = event.get("args")
        correlation = args.get("correlation") if isinstance(args, dict) else None
        if not isinstance(correlation, int) or correlation <= 0:
            return
        if kind == "launch":
            thread = (event.get("pid"), event.get("tid"))
            self.trace.launches.append(Launch(thread, _ns(start), correlation))
        else:
            assert isinstance(args, dict)
            self.activities[correlation].append(_activity(kind, event, args, correlation))

    def _op(self, event: dict[str, Any], start: float) -> None:
        name, duration = event.get("name"), event.get("dur")
        if not isinstance(name, str) or not isinstance(duration, int | float):
            return
        if not (math.isfinite(duration) and duration >= 0):
            raise _BadEvent(f"CPU op {name!r} at ts {start}: its duration (dur) is {duration!r}")
        args = event.get("args") if name in GEMM_OPS else None
        begin = _ns(start)
        self.trace.ops.append(
            CpuOp(
                sys.intern(name),
                (event.get("pid"), event.get("tid")),
                begin,
                begin + _ns(duration),
                args if isinstance(args, dict) else None,
            )
        )


def _activity(kind: str, event: dict[str, Any], args: dict[str, Any], corr: int) -> GpuActivity:
    """The GPU activity of an event; one whose duration is there but is no time (negative,
    infinite, NaN, not a number) is refused, naming it and its correlation id. One without a
    duration reads as 0: not measured."""
    name = str(event.get("name", ""))
    duration = event.get("dur", 0.0)
    if not isinstance(duration, int | float) or not (math.isfinite(duration) and duration >= 0):
        shown = name if len(name) <= 100 else name[:100] + "..."
        raise _BadEvent(
            f"{kind} {shown!r} (correlation {corr}): its duration (dur) is {duration!r}, not a "
            "time of 0 us or more"
        )
    registers = args.get("registers per thread")
    return GpuActivity(
        kind,
        sys.intern(name),
        corr,
        float(duration),
        _ints(args.get("grid")),
        _ints(args.get("block")),
        registers if isinstance(registers, int) else 0,
    )


def _ns(microseconds: float) -> int:
    """Trace times are microseconds with three decimals: integer nanoseconds compare exactly."""
    return round(microseconds * 1000)


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(int(v) for v in value if isinstance(v, int | float))
