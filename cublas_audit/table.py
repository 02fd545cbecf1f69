"""The dispatch table: its schema, validation, and CSV / Parquet read and write.

One row per kernel launch of a (case, provider). The required columns are the contract every
importer honours (docs/schema.md); every other column is optional and downstream code copes when
a table read from elsewhere lacks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError

SCHEMA_VERSION = 1
TABLE_FILE = "dispatch.csv"

MODES = ("fp32", "tf32", "bf16x", "fp16", "bf16")
APIS = ("cublas", "cublasLt")

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
    **{f"stall_{reason}": "float" for reason in STALL_REASONS},
}

ALL_COLUMNS: dict[str, str] = {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}
CASE_KEY = ("api", "routine", "mode", "m", "n", "k", "batch")

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


def coerce(frame: pd.DataFrame) -> pd.DataFrame:
    """Casts known columns to their nullable pandas dtypes; unknown columns are left alone."""
    out = frame.copy()
    for column, kind in ALL_COLUMNS.items():
        if column not in out.columns:
            continue
        if kind == "str":
            out[column] = out[column].astype("string")
        else:
            out[column] = pd.to_numeric(out[column]).astype(_NUMERIC_DTYPES[kind])
    return out


def validate(frame: pd.DataFrame, source: TableSource) -> pd.DataFrame:
    """Checks a raw table against the schema and returns it typed, or raises a one-line error."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise source.error(f"missing required column(s) {', '.join(missing)}")
    if frame.empty:
        raise source.error("the table has no rows")
    for column, kind in ALL_COLUMNS.items():
        if column in frame.columns and kind in ("int", "float"):
            _check_numeric(frame, column, kind, source)
    for column in ("m", "n", "k", "batch"):
        bad = frame.index[pd.to_numeric(frame[column]) <= 0]
        if len(bad):
            raise source.error(
                "size must be a positive integer", _row_number(frame, bad[0]), column
            )
    unknown_modes = frame.index[~frame["mode"].isin(MODES)]
    if len(unknown_modes):
        row = unknown_modes[0]
        raise source.error(
            f"unknown mode {frame.at[row, 'mode']!r} (known: {', '.join(MODES)})",
            _row_number(frame, row),
            "mode",
        )
    return coerce(frame)


def _check_numeric(frame: pd.DataFrame, column: str, kind: str, source: TableSource) -> None:
    values = frame[column]
    parsed = pd.to_numeric(values, errors="coerce")
    bad = frame.index[parsed.isna() & values.notna() & (values.astype(str).str.strip() != "")]
    if kind == "int":
        bad = bad.union(frame.index[parsed.notna() & (parsed % 1 != 0)])
    if len(bad):
        row = bad[0]
        raise source.error(
            f"expected {'an integer' if kind == 'int' else 'a number'}, got {values[row]!r}",
            _row_number(frame, row),
            column,
        )


def _row_number(frame: pd.DataFrame, index: Any) -> int:
    """1-based data row number as a user sees it in the file (header is row 0)."""
    return list(frame.index).index(index) + 1


def read_table(path: Path) -> pd.DataFrame:
    """Reads a dispatch table from a CSV or Parquet file, or from a run directory."""
    path = Path(path)
    if path.is_dir():
        path = path / TABLE_FILE
    source = TableSource(path)
    if not path.exists():
        raise AuditError(f"{path}: no such file")
    try:
        if path.suffix == ".parquet":
            raw = pd.read_parquet(path)
        else:
            raw = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except (ValueError, OSError, ImportError, pd.errors.ParserError) as exc:
        raise source.error(f"cannot be read as a table ({str(exc).splitlines()[0]})") from exc
    return validate(raw, source)


def write_table(frame: pd.DataFrame, path: Path) -> Path:
    """Writes a table atomically (a crash never leaves half a file behind)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    ordered = frame[column_order(frame.columns)]
    if path.suffix == ".parquet":
        ordered.to_parquet(tmp, index=False)
    else:
        ordered.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(path)
    return path


def main_launches(frame: pd.DataFrame) -> pd.DataFrame:
    """The row of each case that carries its GEMM: tables without a role column are all main."""
    if "role" not in frame.columns:
        return frame
    return frame[frame["role"].fillna("main") == "main"]
