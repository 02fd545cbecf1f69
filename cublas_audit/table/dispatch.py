"""The dispatch table: its schema, the checks of each column's values, typing, and writing
(reading, with every check of table.validation, is validation.read_table).

One row per kernel launch of a (case, provider). The required columns are the contract every
importer honours (docs/schema.md); every other column is optional and downstream code copes when
a table read from elsewhere lacks it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.files import write_csv_atomic
from cublas_audit.observe.ncu_export import STALL_REASONS
from cublas_audit.planning.modes import MODE_NAMES as MODES
from cublas_audit.table.distribution import DISTRIBUTION, distribution_columns
from cublas_audit.table.text import PER_ROW_TEXT, blank_cells, shared_text

if TYPE_CHECKING:
    from cublas_audit.planning.cases import Case

# 2: the timed distributions and the GPU's clocks and power; 3: kernel-only times (CUPTI) beside
# the call times, and the traced launch geometry (older tables stay readable: every added column
# is optional).
SCHEMA_VERSION = 3

REQUIRED_COLUMNS: dict[str, str] = {
    "gpu_label": "str",
    "api": "str",
    "mode": "str",
    "m": "int",
    "n": "int",
    "k": "int",
    "batch": "int",
    "kernel": "str",
    "fma_pct": "float",
    "time_ms": "float",
}

OPTIONAL_COLUMNS: dict[str, str] = {
    "schema_version": "int",
    "case_id": "str",
    "routine": "str",
    "transa": "str",
    "transb": "str",
    "launch": "int",
    "role": "str",
    "kernel_short": "str",
    "family": "str",
    "tile": "str",
    "fma_inst_pct": "float",
    "tensor_pct": "float",
    "ipc": "float",
    "cycles_active": "float",
    "issue_active_pct": "float",
    "warps_active_pct": "float",
    "dram_pct": "float",
    "registers": "int",
    "smem_bytes": "int",
    "grid": "str",
    "block": "str",
    "duration_us": "float",
    "tflops": "float",
    "ref_time_ms": "float",
    "ref_fma_pct": "float",
    "ref_kernel": "str",
    "max_rel_err": "float",
    "status": "str",
    "status_detail": "str",
    "driver_version": "str",
    "cublas_version": "str",
    "gpu_name": "str",
    "cc": "str",
    "sm_count": "int",
    "device_index": "int",
    "gpu_uuid": "str",
    **{f"stall_{reason}": "float" for reason in STALL_REASONS},
}

# A timed quantity's distribution beside its median (`time_ms`, `ref_time_ms`): the evidence a
# timing verdict is judged on (cublas_audit.judge.verdicts).
# time: the call, CUDA events; kernel_time: the kernels it dispatched, CUPTI activity records.
# batched_*: the batched call re-measured interleaved inside its loop companion's case (the
# sweep's recheck of an unsure batched-slower-than-loop).
TIMED = (
    "time",
    "ref_time",
    "kernel_time",
    "ref_kernel_time",
    "batched_time",
    "batched_kernel_time",
)


OPTIONAL_COLUMNS.update(
    {
        column: DISTRIBUTION[column.removeprefix(prefix + "_")]
        for prefix in TIMED
        for column in distribution_columns(prefix)
    }
)
# The GPU's state around the timed calls (NVML): SM clock before and after, board power after,
# and the clock event reasons (throttling) seen during the measurement, as NVML's bitmask.
OPTIONAL_COLUMNS.update(
    {
        "sm_clock_before_mhz": "float",
        "sm_clock_mhz": "float",
        "power_w": "float",
        "clock_reasons": "int",
    }
)
OPTIONAL_COLUMNS.update(
    {
        "lda": "int",
        "ldb": "int",
        "broadcast": "str",
        "beta": "float",
        "strided": "int",
        "bias": "int",
        "workspace_mib": "int",
    }
)
# What CUPTI saw of the timed call: whether it traced (or why not), the distinct kernels of one call
# in launch order, how many launches, and the grid size, block and registers of the longest one.
OPTIONAL_COLUMNS.update(
    {
        "kernel_time_ms": "float",
        "ref_kernel_time_ms": "float",
        "batched_time_ms": "float",
        "batched_kernel_time_ms": "float",
        "kernel_time_status": "str",
        "traced_kernels": "str",
        "traced_launches": "int",
        "traced_ctas": "int",
        "traced_block": "str",
        "traced_registers": "int",
    }
)
ALL_COLUMNS: dict[str, str] = {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}
# How a problem is posed beyond its size (cases.Case), with the value a table without the column
# means: every table before schema 3 posed packed, untransposed problems with beta 0.
LAYOUT_DEFAULTS: dict[str, Any] = {
    "transa": "n",
    "transb": "n",
    "lda": 0,
    "ldb": 0,
    "broadcast": "",
    "beta": 0.0,
    "strided": 0,
    "bias": 0,
    "workspace_mib": -1,
}
CASE_KEY = ("api", "routine", "mode", "m", "n", "k", "batch", *LAYOUT_DEFAULTS)

_NUMERIC_DTYPES: dict[str, pd.Int64Dtype | pd.Float64Dtype] = {
    "int": pd.Int64Dtype(),
    "float": pd.Float64Dtype(),
}


@dataclass(frozen=True)
class TableSource:
    """Where a table came from, for error messages that name the file."""

    path: Path

    def error(self, message: str, row: int | None = None, column: str | None = None) -> AuditError:
        where = [str(self.path)]
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        return AuditError(f"{', '.join(where)}: {message}")


# From pandas 3 every frame is copy-on-write: a column is copied only when written through one of
# the frames that share it.
_COPY_ON_WRITE = int(pd.__version__.split(".", 1)[0]) >= 3


def unshared(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of `frame` its holder may change without changing `frame`: copy-on-write makes a
    shallow copy one, which costs no memory (a deep copy of a 1,000,000-row table is 0.7 GB);
    an earlier pandas needs a deep one."""
    return frame.copy(deep=not _COPY_ON_WRITE)


def column_order(columns: Iterable[str]) -> list[str]:
    """Schema columns first in schema order, then any extra columns in their own order."""
    present = list(columns)
    known = [c for c in ALL_COLUMNS if c in present]
    return known + [c for c in present if c not in ALL_COLUMNS]


def from_records(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Builds a typed table from row dicts (the sweep's output)."""
    frame = pd.DataFrame(list(records))
    for column in REQUIRED_COLUMNS:
        if column not in frame.columns:
            frame[column] = pd.NA
    return coerce(frame[column_order(frame.columns)])


def coerce(frame: pd.DataFrame, parsed: Mapping[str, pd.Series] | None = None) -> pd.DataFrame:
    """Casts known columns to their nullable pandas dtypes; unknown columns are left alone.
    `parsed`: numeric columns already parsed (check_numeric_columns' answer), not parsed again."""
    out = unshared(frame)
    parsed = parsed or {}
    for column, kind in ALL_COLUMNS.items():
        if column not in out.columns:
            continue
        if kind == "str":
            text = out[column]
            out[column] = text.astype("string") if column in PER_ROW_TEXT else shared_text(text)
        else:
            numbers = parsed[column] if column in parsed else pd.to_numeric(out[column])
            out[column] = numbers.astype(_NUMERIC_DTYPES[kind])
    return out


def validate(frame: pd.DataFrame, source: TableSource) -> pd.DataFrame:
    """Checks a raw table against the schema and returns it typed, or raises a one-line error."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise source.error(f"missing required column(s) {', '.join(missing)}")
    if frame.empty:
        raise source.error("the table has no rows")
    frame = blank_as_missing(frame)
    for column in IDENTIFYING_COLUMNS:
        blank = frame.index[frame[column].isna()]
        if len(blank):
            raise source.error("must not be empty", row_number(frame, blank[0]), column)
    parsed = check_numeric_columns(frame, ALL_COLUMNS, source)
    check_values(frame, "mode", MODES, source)
    return coerce(frame, parsed)


# What names a case: a row without one of these cannot be matched, judged or reported.
IDENTIFYING_COLUMNS = ("gpu_label", "api", "mode", "m", "n", "k", "batch")


def with_layout_defaults(frame: pd.DataFrame) -> pd.DataFrame:
    """The layout columns filled in where a table lacks them or leaves them blank, so that
    tables of any schema match case for case."""
    out = unshared(frame)
    for column, default in LAYOUT_DEFAULTS.items():
        if column not in out.columns:
            out[column] = default
        else:
            out[column] = out[column].fillna(default)
    return out


def blank_as_missing(frame: pd.DataFrame) -> pd.DataFrame:
    """Text cells holding only white space are missing values, as empty ones are."""
    out = unshared(frame)
    for column in out.columns:
        blank = blank_cells(out[column])
        if blank.any():
            out[column] = out[column].mask(blank)
    return out


def check_numeric_columns(
    frame: pd.DataFrame, kinds: Mapping[str, str], source: TableSource
) -> dict[str, pd.Series]:
    """Every present column of kind int or float holds numbers (ints: whole ones) or nothing;
    returns them parsed (column -> floats), for the typing that follows."""
    return {
        column: _check_numeric(frame, column, kind, source)
        for column, kind in kinds.items()
        if column in frame.columns and kind in ("int", "float")
    }


def check_values(
    frame: pd.DataFrame,
    column: str,
    allowed: Iterable[str],
    source: TableSource,
    missing_ok: bool = False,
) -> None:
    """Every value of `column` is one of `allowed` (or missing, where `missing_ok`)."""
    known = list(allowed)
    fine = frame[column].isin(known) | (frame[column].isna() if missing_ok else False)
    bad = frame.index[~fine]
    if len(bad):
        raise source.error(
            f"unknown {column} {frame.at[bad[0], column]!r} (known: {', '.join(known)})",
            row_number(frame, bad[0]),
            column,
        )


def _check_numeric(frame: pd.DataFrame, column: str, kind: str, source: TableSource) -> pd.Series:
    values = frame[column]
    # a column read as numbers (validation.typed_csv) is one: parsing it again copied it
    numeric = pd.api.types.is_numeric_dtype(values)
    parsed = values if numeric else pd.to_numeric(values, errors="coerce")
    # Blank cells are missing by now (blank_as_missing): anything else that does not parse is bad.
    bad = frame.index[parsed.isna() & values.notna()]
    if kind == "int":  # whole, and within int64 (the nullable integer column holds it)
        outside = parsed.notna() & ((parsed % 1 != 0) | (parsed.abs() >= 2.0**63))
        bad = bad.union(frame.index[outside])
    if len(bad):
        row = bad[0]
        raise source.error(
            f"expected {'an integer' if kind == 'int' else 'a number'}, got {values[row]!r}",
            row_number(frame, row),
            column,
        )
    return parsed


def row_number(frame: pd.DataFrame, index: Any) -> int:
    """1-based data row number as a user sees it in the file (header is row 0)."""
    return list(frame.index).index(index) + 1


def write_table(frame: pd.DataFrame, path: Path) -> Path:
    """Writes a table (CSV, or Parquet for a .parquet path) atomically, schema columns first."""
    return write_csv_atomic(frame[column_order(frame.columns)], path)


def plain(value: Any, digits: int | None = None) -> Any:
    """A table cell as a JSON-ready Python value: NA / NaN -> None, numpy scalars -> int / float,
    floats rounded to `digits` decimals when given."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.generic):
        value = value.item()
        if isinstance(value, float) and math.isnan(value):
            return None
    return round(value, digits) if digits is not None and isinstance(value, float) else value


def main_launches(frame: pd.DataFrame) -> pd.DataFrame:
    """The row of each case that carries its GEMM: tables without a role column are all main."""
    if "role" not in frame.columns:
        return frame
    return frame[frame["role"].fillna("main") == "main"]


_AS_IS = frozenset({str, int, bool})  # exactly these types: JSON-ready as they are


def json_ready(data: Any) -> Any:
    """Nested data with every cell `plain`: NA, NaN and infinities become None (strict JSON)."""
    if data is None or type(data) in _AS_IS:  # (a full map's 86,000 findings: 9 s, now 2)
        return data
    if type(data) is float:
        return data if math.isfinite(data) else None
    if isinstance(data, dict):  # (a plain leaf taken here, without a call)
        return {str(k): v if type(v) in _AS_IS else json_ready(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [v if type(v) in _AS_IS else json_ready(v) for v in data]
    value = plain(data)
    if isinstance(value, float) and math.isinf(value):
        return None
    return value


def cell_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as dicts, read a column at a time: to_dict("records") boxes cell by cell, about
    3 s per 100,000 rows of a judged table. Cells as `tolist` gives them (an object column's
    numpy scalars stay): pass them through `plain` for JSON."""
    names = [str(c) for c in frame.columns]
    columns = [frame.iloc[:, i].tolist() for i in range(frame.shape[1])]
    if not columns:
        return [{} for _ in range(len(frame))]
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def frame_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A table as JSON-ready row dicts."""
    return [json_ready(record) for record in frame.to_dict("records")]


def layout_columns(case: Case) -> dict[str, Any]:
    """How `case` poses its problem beyond mode and shape, as the tables' columns hold it
    (transposes, leading dimensions, broadcast, beta, strided, bias): one writer for the
    dispatch table's rows and the candidates table's."""
    return {
        "transa": case.transa,
        "transb": case.transb,
        "lda": case.lda,
        "ldb": case.ldb,
        "broadcast": case.broadcast,
        "beta": case.beta,
        "strided": int(case.strided),
        "bias": int(case.bias),
    }
