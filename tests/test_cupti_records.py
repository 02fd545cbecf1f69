"""device.cupti_records: CUPTI's kernel records taken in C (data/cupti_records.c), against a
stand-in for libcupti (tests/fake_cuda/fake_cupti.c) in a child process, so that this process
never loads it; the GPU test (tests/test_gpu_map_engine.py) holds the rows against
cupti-python's own records of the same kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cublas_audit.device import cupti_records
from cublas_audit.device.cupti_tracer import KernelLaunch
from tests.fake_libraries import against_the_fake, needs_cc

# fake_cupti.c's record, named as cupti-python names CUPTI's (fields at C's own offsets)
RECORD = np.dtype(
    {
        "names": ["kind", "registers_per_thread", "padding", "start", "end", "grid_x", "grid_y",
                  "grid_z", "block_x", "block_y", "block_z", "name"],
        "formats": ["<i4", "<u2", "<u2", "<u8", "<u8", "<i4", "<i4", "<i4", "<i4", "<i4", "<i4",
                    "<u8"],
        "offsets": [0, 4, 6, 8, 16, 24, 28, 32, 36, 40, 44, 48],
        "itemsize": 56,
    }
)  # fmt: skip


def test_the_fields_are_found_by_cupti_pythons_names_or_cuptis() -> None:
    offsets, widths = cupti_records.layout(RECORD)
    assert offsets == [0, 8, 16, 24, 28, 32, 36, 40, 44, 4, 48]  # FIELDS' order
    assert widths == [4, 8, 8, 4, 4, 4, 4, 4, 4, 2, 8]
    # CUPTI's own spelling of a field is found (gridX for grid_x); a missing one is named
    camel = np.dtype({"names": ["kind", "gridX", "start"], "formats": ["<i4", "<i4", "<u8"]})
    with pytest.raises(ValueError, match="no end, grid_y") as missing:
        cupti_records.layout(camel)
    assert "grid_x" not in str(missing.value)


CHILD = r"""
import ctypes, json, sys, threading, types
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[3])
from test_cupti_records import RECORD
from cublas_audit.device import cupti_records, native

fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(str(native.compiled(Path(sys.argv[2]))))
flushes = []
cupti = types.SimpleNamespace(
    activity_flush_all=flushes.append,
    activity_flush_period=lambda ms: flushes.append(f"every {ms} ms"),
    ActivityKind=types.SimpleNamespace(CONCURRENT_KERNEL=10),
    activity_kernel9_dtype=np.dtype("u1"),  # an older record type: not the one CUPTI writes
    activity_kernel11_dtype=RECORD,
)
records = cupti_records.start(lib, cupti, sys.argv[1])
fake.fake_cupti_deliver.restype = ctypes.c_int64
gemm, other = b"gemm_a", b"gemm_b"
same_text = bytes(bytearray(gemm))  # the same name at another address

def deliver(kinds, names, starts):
    n = len(kinds)
    return fake.fake_cupti_deliver(n, (ctypes.c_int32 * n)(*kinds), (ctypes.c_char_p * n)(*names),
                                   (ctypes.c_uint64 * n)(*starts))

sizes = [deliver([10, 1, 10], [gemm, b"memset", other], [100, 200, 300]),
         deliver([10, 10], [gemm, same_text], [400, 500])]
first = records.take()
again = records.take()
deliver([10], [other], [600])
tracer = types.SimpleNamespace(native=records.take, lock=threading.Lock(), records=[],
                               register=lambda: flushes.append("registered"), cupti=cupti)
cupti_records.hand_back(tracer)
print(json.dumps({
    "sizes": sizes, "flushes": flushes, "skipped": records.skipped, "again": len(again),
    "first": [[k.name, k.start_ns, k.end_ns, list(k.grid), list(k.block), k.registers]
              for k in first],
    "handed_back": [k.name for k in tracer.records], "native_after": tracer.native is None,
}))
"""


def run_child(tmp_path: Path) -> dict[str, Any]:
    tests = str(Path(__file__).resolve().parent)
    return against_the_fake(tmp_path, CHILD, tests, source="fake_cupti.c", name="libcupti.so.13")


@needs_cc
def test_cuptis_buffers_become_kernel_records_in_c(tmp_path: Path) -> None:
    found = run_child(tmp_path)
    # every buffer out handed back before the switch; CUPTI's worker flushing every 1 ms
    assert found["flushes"][:2] == [1, "every 1 ms"]
    assert found["sizes"] == [cupti_records.BUFFER_BYTES] * 2  # the buffers the C side gave
    # the memset-kind record is skipped; the fields of each kernel record as the fake wrote them
    # (registers 32 + i, end = start + 100 + i, grid (i + 1, 2, 3), block (128 + i, 1, 1))
    assert found["first"] == [
        ["gemm_a", 100, 200, [1, 2, 3], [128, 1, 1], 32],
        ["gemm_b", 300, 402, [3, 2, 3], [130, 1, 1], 34],
        ["gemm_a", 400, 500, [1, 2, 3], [128, 1, 1], 32],
        ["gemm_a", 500, 601, [2, 2, 3], [129, 1, 1], 33],
    ]
    assert found["skipped"] == 1
    assert found["again"] == 0  # taken rows are gone
    # handing back: the rows left are the tracer's, its own callbacks registered again
    assert found["handed_back"] == ["gemm_b"]
    assert found["native_after"] and found["flushes"][2:] == ["every 0 ms", "registered"]


class RowsLibrary:
    """data/cupti_records.c's take, counts and name calls over rows made here."""

    def __init__(self, rows: np.ndarray[Any, Any]) -> None:
        self.rows = rows

    def cupti_records_counts(self, waiting: Any, not_kept: Any) -> None:
        waiting._obj.value, not_kept._obj.value = len(self.rows), 0

    def cupti_records_take(self, out: int, most: int) -> int:
        import ctypes

        ctypes.memmove(out, self.rows.ctypes.data, self.rows[:most].nbytes)
        return min(most, len(self.rows))

    def cupti_records_name(self, number: int) -> bytes:
        return f"kernel_{number}".encode()


def test_rows_become_records_with_launch_dimensions_at_cudas_limits() -> None:
    rows = np.zeros(3, cupti_records.ROW)
    rows["start"], rows["end"] = [10, 20, 30], [15, 26, 37]
    rows["grid"] = [[2**31 - 1, 65535, 65535], [1, 1, 1], [2**31 - 1, 65535, 65535]]
    rows["block"] = [[1024, 1, 1], [32, 32, 1], [1, 1, 64]]  # (x, y up to 1024; z up to 64)
    rows["registers"], rows["name"] = [255, 16, 40], [1, 0, 1]
    found = cupti_records.NativeRecords(RowsLibrary(rows)).take()  # type: ignore[arg-type]
    assert found == [
        KernelLaunch("kernel_1", 10, 15, (2**31 - 1, 65535, 65535), (1024, 1, 1), 255),
        KernelLaunch("kernel_0", 20, 26, (1, 1, 1), (32, 32, 1), 16),
        KernelLaunch("kernel_1", 30, 37, (2**31 - 1, 65535, 65535), (1, 1, 64), 40),
    ]
    assert found[0].grid is found[2].grid  # one tuple a launch shape
    assert found[0].ctas == (2**31 - 1) * 65535 * 65535


def test_records_taken_in_c_arrive_without_asking_cupti_for_a_flush() -> None:
    # each flush cost the map's one Python thread ~5 ms on the H100: where CUPTI's worker hands
    # the buffers to C by itself, the reader takes what has come and asks for none
    import threading
    from types import SimpleNamespace

    from cublas_audit.device.cupti_tracer import Tracer

    before, in_c = (KernelLaunch(name, 1, 2, (1, 1, 1), (1, 1, 1), 8) for name in ("py", "c"))
    flushes: list[int] = []
    tracer = object.__new__(Tracer)
    tracer.cupti = SimpleNamespace(activity_flush_all=flushes.append)
    tracer.lock, tracer.records, tracer.native = threading.Lock(), [before], None
    assert tracer.arrived() == [before] and flushes == [0]  # through cupti-python: a flush
    tracer.records, tracer.native = [before], lambda: [in_c]
    assert tracer.arrived() == [before, in_c] and flushes == [0]  # in C: none asked for
