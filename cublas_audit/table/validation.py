"""One validation layer for what `report`, `diff` and `--resume` read: every value in its physical
range, every case once, a run directory's table in agreement with its own plan.

A bad table is a one-line AuditError naming the file, the row and the column, never a finding: a
percentage above 100, a zero or infinite time, an unknown API, a case recorded twice with
different times, or a table cut off mid-row would otherwise come out as "regressions" and "kernel
changes" that never happened.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.observe.ncu_export import STALL_REASONS
from cublas_audit.planning.cases import APIS
from cublas_audit.table.dispatch import (
    ALL_COLUMNS,
    CASE_KEY,
    SCHEMA_VERSION,
    TIMED,
    TableSource,
    check_values,
    plain,
    row_number,
    unshared,
    validate,
)
from cublas_audit.table.distribution import distribution_columns
from cublas_audit.table.rundir import table_file
from cublas_audit.table.text import PER_ROW_TEXT

# cuBLAS takes m, n, k and the batch count as 32-bit ints.
MAX_DIMENSION = 2**31 - 1
ROLES = ("main", "aux")
STATUSES = ("ok", "skipped", "error", "wrong", "not-run")


@dataclass(frozen=True)
class Range:
    low: float
    high: float = math.inf
    low_open: bool = False  # low itself is out of range (a time of 0)
    infinite_ok: bool = False  # an infinite value is meaningful (an output that is not finite)
    message: str = ""  # what the error says instead of the range

    def bad(self, values: pd.Series) -> np.ndarray:
        """True where a present value is out of range (missing values are not judged here)."""
        numbers = pd.to_numeric(values, errors="coerce").astype(float).to_numpy()
        below = numbers <= self.low if self.low_open else numbers < self.low
        outside = np.isnan(numbers) | below | (numbers > self.high)
        if not self.infinite_ok:
            outside |= np.isinf(numbers)
        return values.notna().to_numpy() & outside

    def describe(self, value: object) -> str:
        if self.message:
            return self.message
        low = f"{'above' if self.low_open else 'at least'} {self.low:g}"
        high = "" if self.high == math.inf else f" and at most {self.high:g}"
        return f"{plain(value)} is out of range: expected a finite number {low}{high}"


PERCENT = Range(0.0, 100.0)
TIME = Range(0.0, low_open=True)
NON_NEGATIVE = Range(0.0)
DIMENSION = Range(
    1, MAX_DIMENSION, message=f"size must be a positive integer, at most {MAX_DIMENSION} (int32)"
)
RANGES: dict[str, Range] = {
    "m": DIMENSION,
    "n": DIMENSION,
    "k": DIMENSION,
    "batch": DIMENSION,
    "fma_pct": PERCENT,
    "fma_inst_pct": PERCENT,
    "tensor_pct": PERCENT,
    "issue_active_pct": PERCENT,
    "warps_active_pct": PERCENT,
    "dram_pct": PERCENT,
    "ref_fma_pct": PERCENT,
    "time_ms": TIME,
    "ref_time_ms": TIME,
    "duration_us": TIME,
    "tflops": TIME,
    "ipc": NON_NEGATIVE,
    "cycles_active": NON_NEGATIVE,
    "registers": Range(0, 255),
    "smem_bytes": NON_NEGATIVE,
    "launch": NON_NEGATIVE,
    "max_rel_err": Range(0.0, infinite_ok=True),
    **{
        column: Range(1) if column.endswith("_n") else TIME
        for prefix in TIMED
        for column in distribution_columns(prefix)
    },
    "sm_clock_before_mhz": TIME,
    "sm_clock_mhz": TIME,
    "power_w": NON_NEGATIVE,
    "clock_reasons": NON_NEGATIVE,
    # Warps per issue-active cycle x 100: several warps can wait on one reason, so >100 is real.
    **{f"stall_{reason}": NON_NEGATIVE for reason in STALL_REASONS},
}
CHOICES: dict[str, tuple[str, ...]] = {"api": APIS, "role": ROLES, "status": STATUSES}


def check_frame(frame: pd.DataFrame, source: TableSource) -> None:
    """Ranges, known values and uniqueness of a typed dispatch table."""
    check_schema_version(frame, source, SCHEMA_VERSION)
    check_ranges(frame, RANGES, source)
    for column, choices in CHOICES.items():
        if column in frame.columns:
            # the column alone: a filtered copy of every column cost 0.7 GB of a 1,000,000-row table
            present = frame.loc[frame[column].notna(), [column]]
            check_values(present, column, choices, source)
    check_unique(frame, source)


def check_ranges(frame: pd.DataFrame, ranges: Mapping[str, Range], source: TableSource) -> None:
    """Each present value of each column in `ranges` within its range: one line naming the
    first that is not (its row and column)."""
    for column, allowed in ranges.items():
        if column in frame.columns:
            bad = frame.index[allowed.bad(frame[column])]
            if len(bad):
                raise source.error(
                    allowed.describe(frame.at[bad[0], column]),
                    row_number(frame, bad[0]),
                    column,
                )


def check_schema_version(frame: pd.DataFrame, source: TableSource, latest: int) -> None:
    """A schema version this cublas-audit reads (1..latest): a newer one may have changed what a
    column means, so its table is refused rather than read as if it had not."""
    if "schema_version" not in frame.columns:
        return
    versions = pd.to_numeric(frame["schema_version"], errors="coerce")
    bad = frame.index[frame["schema_version"].notna() & ~versions.between(1, latest)]
    if len(bad):
        raise source.error(
            f"schema version {plain(frame.at[bad[0], 'schema_version'])} is not one this "
            f"cublas-audit reads (1..{latest}; written by a newer cublas-audit?)",
            row_number(frame, bad[0]),
            "schema_version",
        )


def check_unique(frame: pd.DataFrame, source: TableSource) -> None:
    """Each launch of each case once: a case recorded twice (two GPUs in one table are two
    cases) is refused, since which of its times is true cannot be known."""
    key = [c for c in ("gpu_label", *CASE_KEY, "launch") if c in frame.columns]
    cells = frame[key]
    if "launch" not in frame.columns and "role" in frame.columns:
        cells = cells[frame["role"].fillna("main") == "main"]
    # Hashed a column at a time (NA equal to NA, as None is to None below); only the rows of a
    # repeated key are read as Python values: a tuple per row of a 1,000,000-row table took
    # 1 GB and 13 s.
    cells = cells[cells.duplicated(keep=False).to_numpy()]
    cells = cells.astype(object).where(cells.notna(), None)
    first_row: dict[tuple[object, ...], object] = {}
    for index, values in zip(cells.index, cells.itertuples(index=False, name=None), strict=True):
        if values in first_row:
            shown = ", ".join(f"{c}={v}" for c, v in zip(key, values, strict=True))
            raise source.error(
                f"the case of row {row_number(frame, first_row[values])} appears again ({shown})",
                row_number(frame, index),
            )
        first_row[values] = index


def check_complete_file(path: Path) -> None:
    """A CSV must end with a line break: one that does not was cut off mid-row."""
    if path.suffix == ".parquet" or not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb") as raw:
        raw.seek(-1, 2)
        if raw.read(1) != b"\n":
            raise TableSource(path).error("the file ends mid-row (cut off while being written?)")


def check_against_plan(frame: pd.DataFrame, plan_ids: list[str], source: TableSource) -> None:
    """A run directory's table holds exactly its plan's cases (every case gets a row, even one
    that never ran): a case missing from the table means the table is incomplete."""
    if "case_id" not in frame.columns:
        raise source.error("a run directory's table needs the case_id column")
    # as Python objects: a string column's isin against 262,144 ids took 2 s, these take 0.2 s
    case_ids = frame["case_id"].astype(object)
    in_table = set(case_ids.dropna())
    missing = [case_id for case_id in plan_ids if case_id not in in_table]
    if missing:
        raise source.error(
            f"{len(missing)} case(s) of plan.json have no row (first: {missing[0]}); "
            "the table is incomplete: rebuild it with cublas-audit sweep --resume"
        )
    if len(in_table) == len(set(plan_ids)) and not case_ids.isna().any():
        return  # every row's case is planned (a full map's 262,144 looked up again: ~0.2 s)
    extra = frame.index[~case_ids.isin(plan_ids)]
    if len(extra):
        raise source.error(
            f"case {frame.at[extra[0], 'case_id']!r} is not in plan.json",
            row_number(frame, extra[0]),
            "case_id",
        )


def read_table(path: Path) -> pd.DataFrame:
    """Reads a dispatch table from a CSV or Parquet file, or from a run directory (once per
    process while the file is unchanged: read_once)."""
    path = Path(path)
    if path.is_dir():
        path = table_file(path)
    if not path.exists():
        raise AuditError(f"{path}: no such file")
    return read_once(path, _parsed)


def read_once(path: Path, parse: Callable[[Path], pd.DataFrame]) -> pd.DataFrame:
    """parse(path), unless the same parser read the same bytes before: a table is parsed and
    checked once per process (a sweep's report, its --fix and a second report read dispatch.csv
    once; a multi-GPU candidates run read each shard's candidates.csv three times; a run
    directory copied or gathered elsewhere is the same table). A small file is known by its
    content (a parse depends on nothing else but its suffix); a large one by its path, size and
    modification time, which costs no read of its bytes."""
    stat = path.stat()
    key: tuple[object, ...]
    if stat.st_size <= _HASHED_BYTES:
        key = (parse, path.suffix, hashlib.blake2b(path.read_bytes(), digest_size=16).digest())
    else:
        key = (parse, str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _READ:
        if len(_READ) >= _READ_KEPT:
            _READ.pop(next(iter(_READ)))  # the oldest: a long session reads many runs once
        _READ[key] = parse(path)
    return unshared(_READ[key])  # callers may change their frame; the cached one stays as read


_READ: dict[tuple[object, ...], pd.DataFrame] = {}
_READ_KEPT = 32
# Hashing 4 MB takes ~2 ms; parsing it ~100 ms.
_HASHED_BYTES = 4 << 20


def _parsed(path: Path) -> pd.DataFrame:
    source = TableSource(path)
    raw = None if path.suffix == ".parquet" else typed_csv(path)
    if raw is None:
        try:
            if path.suffix == ".parquet":
                raw = pd.read_parquet(path)
            else:
                raw = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
        except (ValueError, OSError, ImportError, pd.errors.ParserError) as exc:
            raise source.error(f"cannot be read as a table ({str(exc).splitlines()[0]})") from exc
    check_complete_file(path)
    check_header(raw, source)
    frame = validate(raw, source)
    check_frame(frame, source)
    return frame


def typed_csv(path: Path) -> pd.DataFrame | None:
    """A CSV table parsed straight into its columns' schema types by pyarrow (the `parquet`
    extra), the checks of `validate` still to come; None where pyarrow is missing or the file
    does not parse so (a value that is no number or no whole one, a row of another length, a
    line break inside a value, a float that is not finite): reading every cell as text then
    finds and names what is wrong, as it always did. Reading every cell as text took 15 bytes of
    memory per byte of a 1,000,000-row table (issue 38); this takes about 2."""
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.compute as pc  # type: ignore[import-untyped]
        from pyarrow import csv as pa_csv
    except ImportError:
        return None
    with path.open(newline="", encoding="utf-8", errors="replace") as text:
        header = next(csv.reader(text), [])
    if not header or len(set(header)) < len(header):
        return None  # the text reading's messages say what is wrong with it
    # A known text column arrives dictionary-encoded: its distinct values once, a code a row.
    text = pa.dictionary(pa.int32(), pa.string())
    kinds = {"int": pa.int64(), "float": pa.float64(), "str": text}
    types = {name: kinds[ALL_COLUMNS[name]] for name in header if name in ALL_COLUMNS}
    types.update({name: pa.string() for name in header if name in PER_ROW_TEXT})
    # only an empty cell is missing, as in the text reading (keep_default_na=False)
    options = pa_csv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=True)
    try:
        table = pa_csv.read_csv(path, convert_options=options)
    except (pa.ArrowException, OSError, ValueError):
        return None
    if table.column_names != header:
        return None
    for column in table.columns:
        # NaN is no number to the text reading, and an infinity may not be one here
        if pa.types.is_floating(column.type) and pc.any(pc.invert(pc.is_finite(column))).as_py():
            return None
    numbers = {pa.int64(): pd.Int64Dtype(), pa.float64(): pd.Float64Dtype()}
    columns = {}
    for name in header:  # each column's buffers freed once it is converted
        column = table.column(name)
        table = table.drop_columns([name])
        columns[name] = (
            _shared_strings(column)
            if pa.types.is_dictionary(column.type)
            else column.to_pandas(types_mapper=numbers.get)  # other text: pandas' "str" dtype
        )
    frame = pd.DataFrame(columns, copy=False)
    pa.default_memory_pool().release_unused()  # the parsed table's pages, back to the system
    return frame


def _shared_strings(column: Any) -> pd.Series:
    """A dictionary-encoded text column (a pyarrow ChunkedArray) as text.shared_text holds
    text, its rows' characters never written out one by one."""
    import pyarrow as pa

    column = column.unify_dictionaries()  # one dictionary for every chunk
    distinct = column.chunk(0).dictionary.to_pylist() if column.num_chunks else []
    indices = pa.chunked_array([chunk.indices for chunk in column.chunks], type=pa.int32())
    codes = indices.fill_null(-1).to_numpy()
    objects = np.array([*distinct, pd.NA], dtype=object)  # a missing value's code, -1: the last
    return pd.Series(pd.array(objects[codes], dtype=pd.StringDtype("python")))


def check_header(raw: pd.DataFrame, source: TableSource) -> None:
    """Each column once: pandas renames a second `kernel` to `kernel.1` and would use the first
    silently, whichever of the two is true."""
    if source.path.suffix == ".parquet":
        return
    with source.path.open(newline="") as text:
        header = next(csv.reader(text), [])
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise source.error(f"column(s) {', '.join(twice)} appear more than once")
