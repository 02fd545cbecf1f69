"""The terminal summary a sweep prints at the end: size x batch -> kernel, FMA %, TFLOP/s."""

from __future__ import annotations

import pandas as pd
from tabulate import tabulate

from cublas_audit.table.dispatch import main_launches


def summary(frame: pd.DataFrame) -> str:
    """One block per (api, routine, mode); a cell reads `simt_256x128_8x4 79% 52.1`."""
    rows = main_launches(frame)
    blocks = []
    for (api, routine, mode), group in rows.groupby(["api", "routine", "mode"], sort=True):
        cells = group.assign(
            shape=group["m"].astype(str)
            + "x"
            + group["n"].astype(str)
            + "x"
            + group["k"].astype(str),
            cell=group.apply(_cell, axis=1),
        )
        grid = cells.pivot_table(
            index=["m", "shape"], columns="batch", values="cell", aggfunc="first"
        )
        grid = grid.reset_index(level="m", drop=True)
        headers = ["size"] + [f"batch {b}" for b in grid.columns]
        title = f"{api} {routine} {mode}  (kernel, FMA %, TFLOP/s)"
        lines = [
            [shape, *values]
            for shape, values in zip(grid.index, grid.fillna("").values.tolist(), strict=True)
        ]
        blocks.append(f"{title}\n{tabulate(lines, headers=headers, tablefmt='simple')}")
    return "\n\n".join(blocks)


def _cell(row: pd.Series) -> str:
    if row.get("status", "ok") not in ("ok", None) and not pd.isna(row.get("status")):
        return str(row["status"])
    has_kernel = "kernel_short" in row and not pd.isna(row["kernel_short"])
    parts = [str(row["kernel_short"])] if has_kernel else []
    if not pd.isna(row.get("fma_pct")):
        parts.append(f"{row['fma_pct']:.0f}%")
    if "tflops" in row and not pd.isna(row["tflops"]):
        parts.append(f"{row['tflops']:.1f}")
    return " ".join(parts)
