"""ncu exports -> one record per kernel launch, attributed to its case by NVTX range.

Input is what `ncu --import REPORT --csv --page raw` prints: a header row, a units row, then one
row per profiled launch. The NVTX push/pop stack of each launch is in the column whose name starts
with `thread Domain:Push/Pop_Range`; the innermost range is the case id the probe opened.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cublas_audit.errors import AuditError

# The warp-stall reasons ncu reports on gh100 (smsp__average_warps_issue_stalled_<reason>_...).
STALL_REASONS = (
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "gmma",
    "imc_miss",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
)

# The NVTX range the probe opens around each profiled call: `audit.<case_id>` for the cuBLAS /
# cuBLASLt call, `audit-ref.<case_id>` for the bundled reference kernel on the same problem.
CALL_RANGE_PREFIX = "audit."
REFERENCE_RANGE_PREFIX = "audit-ref."
NVTX_INCLUDE = r"regex:^audit(-ref)?\..*/"

FMA_PCT = "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
TENSOR_PCT = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

# Table column <- ncu metric, for the plain numeric ones.
METRIC_COLUMNS: dict[str, str] = {
    "fma_pct": FMA_PCT,
    "fma_inst_pct": "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "tensor_pct": TENSOR_PCT,
    "ipc": "sm__inst_executed.avg.per_cycle_active",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "warps_active_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "cycles_active": "sm__cycles_active.avg",
    "registers": "launch__registers_per_thread",
}
DURATION = "gpu__time_duration.sum"
SHARED_MEMORY = "launch__shared_mem_per_block"
EXTRA_METRICS = ("launch__grid_size", "launch__block_size")

METRICS: tuple[str, ...] = (
    *METRIC_COLUMNS.values(),
    DURATION,
    SHARED_MEMORY,
    *EXTRA_METRICS,
    *(STALL_METRIC.format(reason) for reason in STALL_REASONS),
)

_TIME_TO_US = {
    "ns": 1e-3,
    "nsecond": 1e-3,
    "us": 1.0,
    "usecond": 1.0,
    "ms": 1e3,
    "msecond": 1e3,
    "s": 1e6,
    "second": 1e6,
}
_BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6}
_RANGE = re.compile(r'"<?[^:"]*>?:(?P<name>[^:"]+):')


@dataclass
class Launch:
    """One profiled kernel launch."""

    ncu_id: int
    case_id: str
    is_reference: bool
    kernel: str
    grid: str
    block: str
    duration_us: float | None
    smem_bytes: int | None
    metrics: dict[str, float | None] = field(default_factory=dict)

    def stall_pct(self) -> dict[str, float | None]:
        """Warps stalled per issue-active cycle, x100: the percentages stall tables publish."""
        out: dict[str, float | None] = {}
        for reason in STALL_REASONS:
            ratio = self.metrics.get(STALL_METRIC.format(reason))
            out[f"stall_{reason}"] = None if ratio is None else ratio * 100.0
        return out


def parse_csv_text(text: str, source: str = "<ncu csv>") -> list[Launch]:
    return list(_parse_rows(csv.reader(io.StringIO(text)), source))


def parse_csv_file(path: Path) -> list[Launch]:
    with path.open(newline="") as handle:
        return list(_parse_rows(csv.reader(handle), str(path)))


def _parse_rows(rows: Iterable[list[str]], source: str) -> Iterator[Launch]:
    iterator = iter(rows)
    header = next(iterator, None)
    units = next(iterator, None)
    if header is None or units is None or "Kernel Name" not in header:
        raise AuditError(f"{source}: not an ncu raw-page CSV export (no 'Kernel Name' header)")
    columns = {name: i for i, name in enumerate(header)}
    nvtx_column = next(
        (i for name, i in columns.items() if name.startswith("thread Domain:Push/Pop")), None
    )
    if nvtx_column is None:
        raise AuditError(f"{source}: ncu export has no NVTX column (profile with --nvtx)")
    for row in iterator:
        if len(row) != len(header):
            continue
        launch = _launch(row, columns, units, nvtx_column)
        if launch is not None:
            yield launch


def _launch(
    row: list[str], columns: dict[str, int], units: list[str], nvtx_column: int
) -> Launch | None:
    case_range = innermost_audit_range(row[nvtx_column])
    if case_range is None:
        return None
    is_reference = case_range.startswith(REFERENCE_RANGE_PREFIX)
    prefix = REFERENCE_RANGE_PREFIX if is_reference else CALL_RANGE_PREFIX

    def metric(name: str) -> float | None:
        index = columns.get(name)
        return None if index is None else parse_number(row[index])

    duration = metric(DURATION)
    smem = metric(SHARED_MEMORY)
    duration_index, smem_index = columns.get(DURATION), columns.get(SHARED_MEMORY)
    return Launch(
        ncu_id=int(row[columns["ID"]]),
        case_id=case_range[len(prefix) :],
        is_reference=is_reference,
        kernel=row[columns["Kernel Name"]],
        grid=_dims(row, columns, "Grid Size"),
        block=_dims(row, columns, "Block Size"),
        duration_us=None
        if duration is None or duration_index is None
        else duration * _TIME_TO_US.get(units[duration_index], 1.0),
        smem_bytes=None
        if smem is None or smem_index is None
        else round(smem * _BYTES.get(units[smem_index].split("/")[0], 1)),
        metrics={name: metric(name) for name in METRICS},
    )


def innermost_audit_range(cell: str) -> str | None:
    """The innermost push/pop range that the probe opened, from ncu's NVTX stack cell."""
    names = [m["name"] for m in _RANGE.finditer(cell)]
    audit = [n for n in names if n.startswith((CALL_RANGE_PREFIX, REFERENCE_RANGE_PREFIX))]
    return audit[-1] if audit else None


def parse_number(text: str) -> float | None:
    """'1,980,000' -> 1980000.0; '' and 'n/a' -> None."""
    cleaned = text.replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def _dims(row: list[str], columns: dict[str, int], name: str) -> str:
    """'(64, 1, 1)' -> '64x1x1'."""
    index = columns.get(name)
    if index is None:
        return ""
    return "x".join(part.strip() for part in row[index].strip("() ").split(","))
