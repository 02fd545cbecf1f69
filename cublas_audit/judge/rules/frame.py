"""The prepared table every rule reads (`prepare`), what a rule is given (`RuleContext`), and the
groupings of its rows that several rules share.

Main launches only, so a split-K reduction is never judged as the GEMM, with the derived columns
the rules share: short kernel name and family, utilization of the pipe that matters for the mode,
linear size, shape label, TFLOP/s.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.judge.candidates import CandidateVerdicts
from cublas_audit.judge.finding import Finding
from cublas_audit.judge.noise import NoiseModel
from cublas_audit.judge.roofline import Machine
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.observe.kernels import normalize
from cublas_audit.planning.cases import LOOP_ROUTINE, Case
from cublas_audit.planning.modes import pipe_name
from cublas_audit.table.dispatch import (
    LAYOUT_DEFAULTS,
    main_launches,
    unshared,
    with_layout_defaults,
)
from cublas_audit.table.dispatch import plain as table_plain

# One dispatcher decision: the sizes of a series are what the heuristic chooses a kernel over.
SERIES = ["gpu_label", "api", "routine", "mode", "batch"]
# One kind of call: a report's tables and plots have one per GPU.
CALL_KIND = ["api", "routine", "mode", "batch"]


@dataclass(frozen=True)
class RuleContext:
    """What a rule reads: the prepared table, the thresholds, the run's cuBLASLt candidate audit
    as judged (judge.candidates.judge_candidates)."""

    rows: pd.DataFrame
    thresholds: Thresholds
    candidates: CandidateVerdicts | None = None
    # the GPU's roofline figures (judge.roofline), where known: rows then carry the bound columns
    machine: Machine | None = None
    # the noise model two timed cases are judged with (None: the shipped one; a map's rows:
    # NoiseModel.for_maps, as judge.map_audit passes it)
    model: NoiseModel | None = None


Rule = Callable[[RuleContext], list[Finding]]


def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """Main launches with kernel_name (the full name, or the first traced kernel's), kernel_short,
    family, util, size, shape and is_loop filled in. The short name and family are derived from
    the full name wherever there is one: a table's own kernel_short column, possibly stale, is
    used only for rows without a name."""
    rows = with_layout_defaults(main_launches(frame))
    named = _named_kernels(rows)
    for column in ("kernel_short", "family"):
        known = rows[column] if column in rows.columns else pd.Series(pd.NA, index=rows.index)
        rows[column] = named[column].fillna(known.astype("string"))
    rows["kernel_name"] = named["kernel_name"]
    if "routine" not in rows.columns:
        rows["routine"] = pd.Series("", index=rows.index, dtype="string")
    rows["routine"] = rows["routine"].fillna("")
    rows["util"] = _utilization(rows)
    volume = (rows["m"] * rows["n"] * rows["k"]).astype(float)
    rows["size"] = np.round(np.cbrt(volume.to_numpy(dtype=float)), 3)
    rows["shape"] = _shape_labels(rows)
    rows["is_loop"] = rows["routine"] == LOOP_ROUTINE
    rows["tflops_shown"] = _tflops(rows)
    return rows


def _named_kernels(rows: pd.DataFrame) -> dict[str, pd.Series]:
    """Each row's kernel_name (the full name, or the first traced kernel's), kernel_short and
    family (NA where it names none), worked out once per distinct pair of its `kernel` and
    `traced_kernels` cells (a dense map repeats a few dozen over 1,000,000 rows) and held as
    table.text.shared_text holds text: a row of each points to its pair's strings."""
    kernel_codes, kernels = pd.factorize(rows["kernel"])  # a missing cell's code: -1
    traced_codes, traced = np.full(len(rows), -1, dtype=np.intp), pd.Index([])
    if "traced_kernels" in rows.columns:
        traced_codes, traced = pd.factorize(rows["traced_kernels"])
    width = len(traced) + 1
    pair_codes, pairs = pd.factorize((kernel_codes + 1) * width + traced_codes + 1)
    names = [
        _name_of(kernels, traced, int(pair) // width - 1, int(pair) % width - 1) for pair in pairs
    ]
    infos = {name: normalize(name) for name in set(names) if name}

    def column(values: list[Any]) -> pd.Series:
        shared = np.array(values, dtype=object)[pair_codes]
        return pd.Series(pd.array(shared, dtype=pd.StringDtype("python")), index=rows.index)

    return {
        "kernel_name": column([name or pd.NA for name in names]),
        "kernel_short": column([infos[name].short if name else pd.NA for name in names]),
        "family": column([infos[name].family if name else pd.NA for name in names]),
    }


def _name_of(kernels: Any, traced: Any, kernel: int, listed: int) -> str:
    """The kernel a row names ('' where none): its full name, else (no ncu: --no-profile, no
    counter permission) the first kernel CUPTI traced its call launching, its GEMM (a split-K
    reduction comes after it). Codes of -1: the cell is missing."""
    name = "" if kernel < 0 else str(kernels[kernel])
    if name == "" and listed >= 0:
        name = str(traced[listed]).split(" + ", 1)[0]
    return name


def _tflops(rows: pd.DataFrame) -> pd.Series:
    """The table's TFLOP/s, or the one its time gives where it has none (a foreign table)."""
    flops = 2.0 * rows["m"] * rows["n"] * rows["k"] * rows["batch"]
    computed = (flops / rows["time_ms"] / 1e9).astype("Float64")
    if "tflops" in rows.columns:
        return rows["tflops"].astype("Float64").fillna(computed)
    return computed


def _utilization(rows: pd.DataFrame) -> pd.Series:
    """FMA-pipe % for FP32 compute, tensor-pipe % for the tensor modes (NA if not measured)."""
    fma = rows["fma_pct"].astype("Float64")
    on_fma = rows["mode"].map(pipe_name).eq("FMA-pipe")
    if "tensor_pct" not in rows.columns:
        return fma.where(on_fma)
    return fma.where(on_fma, rows["tensor_pct"].astype("Float64"))


def _shape_labels(rows: pd.DataFrame) -> pd.Series:
    """'4096', '4096x1024x512', and how the problem is posed where not packed nn: '256 tn lda7'."""
    m, n, k = (rows[c].astype(str) for c in ("m", "n", "k"))
    square = (rows["m"] == rows["n"]) & (rows["n"] == rows["k"])
    shape = m.where(square, m + "x" + n + "x" + k)
    # Only the rows posed otherwise are read one by one: a dense map has 262,144 packed nn ones.
    posed = np.flatnonzero(~_packed_nn(rows).to_numpy())
    variants = np.full(len(rows), "", dtype=object)
    records = rows[list(LAYOUT_DEFAULTS)].iloc[posed].to_dict("records")
    variants[posed] = [_variant(record) for record in records]
    suffix = pd.Series(variants, index=rows.index, dtype="string")
    return shape.where(suffix == "", shape + " " + suffix)


def _packed_nn(rows: pd.DataFrame) -> pd.Series:
    """Rows whose every layout column holds its default (NA: not known to, read one by one)."""
    packed = pd.Series(True, index=rows.index)
    for c, default in LAYOUT_DEFAULTS.items():
        packed &= (rows[c] == default).fillna(False).astype(bool)
    return packed


def _variant(record: Mapping[Hashable, Any]) -> str:
    """Case.variant of a row's layout columns."""
    return Case("cublasLt", "fp32", 1, 1, 1, 1, **layout_fields(record)).variant


def call_of(row: pd.Series) -> Case | None:
    """The row's call as a Case, for what Case knows of it (its operands' leading dimensions
    and batch strides); None where the row's columns make no call (a leading dimension below
    the stored rows: a table from elsewhere)."""
    m, n, k, batch = (int(row[name]) for name in ("m", "n", "k", "batch"))
    try:
        return Case("cublasLt", str(row["mode"]), m, n, k, batch, **layout_fields(row.to_dict()))
    except AuditError:
        return None


def layout_fields(record: Mapping[Hashable, Any] | pd.Series) -> dict[str, Any]:
    """A prepared row's layout columns (LAYOUT_DEFAULTS) as Case's fields. The Case is a
    cuBLASLt one whatever the row's api: only cuBLASLt takes every setting (the bias epilogue),
    and no field read differs."""
    fields = {str(c): table_plain(record[c]) for c in LAYOUT_DEFAULTS}
    for flag in ("strided", "bias"):
        fields[flag] = bool(fields[flag])
    return fields


# Columns no rule reads (the stall breakdown, the other counters, provenance): the report shows
# them, the rules would only copy them through every filter and group of a table.
_UNJUDGED = (
    "schema_version", "status_detail", "driver_version", "cublas_version", "gpu_name",
    "fma_inst_pct", "ipc", "cycles_active", "issue_active_pct", "warps_active_pct", "dram_pct",
    "registers", "smem_bytes", "ref_kernel",
)  # fmt: skip


def judged_columns(rows: pd.DataFrame) -> pd.DataFrame:
    """The prepared table without the columns no rule reads."""
    unjudged = [c for c in rows.columns if c in _UNJUDGED or str(c).startswith("stall_")]
    return rows.drop(columns=unjudged)


def measured(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows whose time in `column` is a measurement: a zero or negative time (a kernel a
    trace recorded with no duration) measured nothing, so no rule divides by it."""
    return kept(rows, rows[column].astype(float).to_numpy() > 0)


def dispatched(rows: pd.DataFrame) -> pd.DataFrame:
    """Profiled cuBLAS calls: rows with a kernel, loops excluded (they only carry a time)."""
    return kept(rows, ~rows["is_loop"] & rows["kernel_short"].notna())


def kept(rows: pd.DataFrame, mask: pd.Series | np.ndarray) -> pd.DataFrame:
    """rows[mask], without a copy of every column where the mask keeps every row (a dense map's
    rules filter 1,000,000 rows several times, and mostly keep them all)."""
    keep = np.asarray(mask, dtype=bool)
    return unshared(rows) if keep.all() else rows[keep]


def one_series(rows: pd.DataFrame, by: list[str]) -> Iterator[pd.DataFrame]:
    """The groups of rows.groupby(by, dropna=False, sort=False): the rows themselves where they
    are one group (a map's problems mostly are; a group is a copy of every column)."""
    if len(rows) and all(rows[c].nunique(dropna=False) == 1 for c in by):
        yield unshared(rows)
        return
    for _, group in rows.groupby(by, dropna=False, sort=False):
        yield group


def by_kernel(rows: pd.DataFrame) -> Iterator[pd.DataFrame]:
    """Groups of one series and one kernel, sizes ascending."""
    # dropna=False: a table from elsewhere may carry times but no kernel names.
    for _, group in rows.groupby([*SERIES, "kernel_short"], sort=True, dropna=False):
        yield group.sort_values("size")


def kernel_runs(rows: pd.DataFrame, min_range: float = 1.0) -> Iterator[pd.DataFrame]:
    """Per series, the maximal runs of consecutive sizes that dispatch the same kernel, spanning
    at least `min_range` in linear size (a dense map has thousands of one-size runs)."""
    # The runs are found on the columns they are made of, and only the wide ones are taken
    # whole (rows at their positions): a series sorted whole was a copy of every column.
    narrow = rows[[*SERIES, "size", "kernel_short"]].assign(_at=np.arange(len(rows)))
    for _, series in narrow.groupby(SERIES, sort=True):
        series = series.sort_values("size")
        kernels = series["kernel_short"].astype(object)
        run_id = (kernels != kernels.shift()).cumsum()
        sizes = series["size"].groupby(run_id)
        wide = sizes.transform("max") / sizes.transform("min") >= min_range
        for _, run in series[wide].groupby(run_id[wide], sort=False):
            yield rows.iloc[run["_at"].to_numpy()]
