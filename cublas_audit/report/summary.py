"""The terminal summary a sweep prints at the end: size x batch -> kernel, pipe %, TFLOP/s.

A cell's utilization is of the pipe the dispatched kernel computes on, whatever the mode asked
for: tensor % for a tensor-core kernel (tensorop, nvjet, a tensor-core xmma), FMA % for an FFMA
kernel (simt, an FFMA xmma); the mode's pipe only where the name does not say. A cell whose
table lacks that pipe's column shows no percentage, never the other pipe's near-zero one.
"""

from __future__ import annotations

import pandas as pd
from tabulate import tabulate

from cublas_audit.observe.kernels import normalize
from cublas_audit.planning.modes import pipe_name
from cublas_audit.table.dispatch import main_launches, plain

PIPE_COLUMNS = {"tensor": "tensor_pct", "fma": "fma_pct"}
PIPE_HEADINGS = {"tensor": "tensor %", "fma": "FMA %"}


def kernel_pipe(name: object, mode: object) -> str:
    """'tensor' or 'fma': the pipe of the kernel `name` (normalize's pipe), or the mode's where
    the name does not say or there is none."""
    text = plain(name)
    pipe = normalize(str(text)).pipe if text else None
    if pipe is not None:
        return pipe
    return "tensor" if pipe_name(str(mode)) == "tensor-pipe" else "fma"


def pipe_util(row: pd.Series, pipe: str) -> float | None:
    """The row's utilization of `pipe`, None where its table lacks or left empty that column."""
    value = plain(row.get(PIPE_COLUMNS[pipe]))
    return float(value) if value is not None else None


def pipe_heading(pipes: set[str]) -> str:
    """'tensor %' or 'FMA %' for a grid of one pipe, 'pipe %' for a grid that mixes both."""
    return PIPE_HEADINGS[next(iter(pipes))] if len(pipes) == 1 else "pipe %"


def kernel_names(rows: pd.DataFrame) -> pd.Series:
    """Each row's full kernel name: its `kernel`, else the first kernel CUPTI traced for it."""
    names = rows["kernel"] if "kernel" in rows.columns else pd.Series(pd.NA, index=rows.index)
    names = names.astype("string")
    names = names.where(names != "")
    if "traced_kernels" in rows.columns:
        traced = rows["traced_kernels"].astype("string").str.split(" + ", regex=False).str[0]
        names = names.fillna(traced.where(traced != ""))
    return names


def summary(frame: pd.DataFrame) -> str:
    """One block per (api, routine, mode); a cell reads `simt_256x128_8x4 79% 52.1`."""
    rows = main_launches(frame)
    names = kernel_names(rows)
    # The short name from the full one wherever there is one: an older table's stored
    # kernel_short may be a wrapper's (`Kernel2`) where ncu cut the name.
    stored = (
        rows["kernel_short"].astype("string")
        if "kernel_short" in rows.columns
        else pd.Series(pd.NA, index=rows.index, dtype="string")
    )
    derived = names.map(lambda n: normalize(str(n)).short, na_action="ignore").astype("string")
    rows = rows.assign(kernel_name=names, kernel_short=derived.fillna(stored))
    blocks = []
    for (api, routine, mode), group in rows.groupby(["api", "routine", "mode"], sort=True):
        pipes = pd.Series([_pipe(row, mode) for _, row in group.iterrows()], index=group.index)
        cells = group.assign(
            shape=group["m"].astype(str)
            + "x"
            + group["n"].astype(str)
            + "x"
            + group["k"].astype(str),
            cell=[_cell(row, pipe) for (_, row), pipe in zip(group.iterrows(), pipes, strict=True)],
        )
        grid = cells.pivot_table(
            index=["m", "shape"], columns="batch", values="cell", aggfunc="first"
        )
        grid = grid.reset_index(level="m", drop=True)
        headers = ["size"] + [f"batch {b}" for b in grid.columns]
        with_kernel = set(pipes[group["kernel_short"].notna()])
        heading = pipe_heading(with_kernel or {kernel_pipe(None, mode)})
        title = f"{api} {routine} {mode}  (kernel, {heading}, TFLOP/s)"
        lines = [
            [shape, *values]
            for shape, values in zip(grid.index, grid.fillna("").values.tolist(), strict=True)
        ]
        blocks.append(f"{title}\n{tabulate(lines, headers=headers, tablefmt='simple')}")
    return "\n\n".join(blocks)


def _pipe(row: pd.Series, mode: object) -> str:
    name = row["kernel_name"] if plain(row["kernel_name"]) else row["kernel_short"]
    return kernel_pipe(name, mode)


def _cell(row: pd.Series, pipe: str) -> str:
    if row.get("status", "ok") not in ("ok", None) and not pd.isna(row.get("status")):
        return str(row["status"])
    has_kernel = not pd.isna(row["kernel_short"])
    parts = [str(row["kernel_short"])] if has_kernel else []
    util = pipe_util(row, pipe)
    if util is not None:
        parts.append(f"{util:.0f}%")
    if "tflops" in row and not pd.isna(row["tflops"]):
        parts.append(f"{row['tflops']:.1f}")
    return " ".join(parts)
