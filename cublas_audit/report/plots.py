"""The report's pictures: TFLOP/s and pipe utilization against size per call kind, a PNG a GPU."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.files import write_file
from cublas_audit.judge.rules.frame import CALL_KIND
from cublas_audit.table.rundir import PLOTS_DIR


def plot(title: str, rows: pd.DataFrame, plots: Path) -> str | None:
    """TFLOP/s and pipe % against size per call kind, cuBLAS solid and reference dashed."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CPU machines and CI
    from matplotlib import pyplot as plt

    rows = rows[[c for c in PLOTTED if c in rows.columns]].sort_values("size")  # not every column
    if rows["tflops_shown"].isna().all() and rows["util"].isna().all():
        return None
    figure, (speed, util) = plt.subplots(1, 2, figsize=(11, 4))
    for key, group in rows.groupby(CALL_KIND, sort=True):
        if group[["tflops_shown", "util"]].isna().all(axis=None):
            continue  # skipped or failed calls: nothing to draw
        label = " ".join(str(p) for p in key[1:3]) + f" b{key[3]}"
        (line,) = speed.plot(group["size"], group["tflops_shown"], marker="o", label=label)
        util.plot(group["size"], group["util"], marker="o", color=line.get_color(), label=label)
        _reference_lines(group, speed, util, line.get_color())
    for axis, axis_title in ((speed, "TFLOP/s"), (util, "pipe utilization %")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("linear size (m·n·k)^(1/3)")
        axis.set_title(axis_title)
        axis.grid(alpha=0.3)
    for axis, column in ((speed, "tflops_shown"), (util, "util")):
        if rows[column].isna().all():
            axis.text(0.5, 0.5, "not measured", transform=axis.transAxes, ha="center")
    speed.legend(fontsize="small")
    figure.suptitle(f"{title} (dashed: reference kernel)")
    return save_figure(figure, title, plots, dpi=90, tight=True)


# The columns the pictures are drawn from.
PLOTTED = (*CALL_KIND, "size", "tflops_shown", "util", "m", "n", "k", "ref_time_ms", "ref_fma_pct")


def picture_name(title: str) -> str:
    """A picture's file name under plots/: its title, every run of other characters a dash."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", title).strip("-") + ".png"


def save_figure(figure: Any, title: str, plots: Path, dpi: int, tight: bool = False) -> str:
    """The one way a picture is written: plots/<title as a file name>.png (through
    files.write_file), returned as the report's relative link. A label with characters the font
    lacks (a GPU named in CJK) is drawn with boxes for them, without matplotlib's glyph warnings
    on stderr."""
    from matplotlib import pyplot as plt

    name = picture_name(title)
    options = {} if tight else {"bbox_inches": "tight"}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
            if tight:
                figure.tight_layout()
            # through the one writer: a temporary file and a rename, never over an input
            write_file(
                plots / name, lambda png: figure.savefig(png, format="png", dpi=dpi, **options)
            )
    finally:
        plt.close(figure)
    return f"{PLOTS_DIR}/{name}"


def _reference_lines(group: pd.DataFrame, speed: Any, util: Any, color: str) -> None:
    if "ref_time_ms" not in group.columns or group["ref_time_ms"].isna().all():
        return
    flops = 2.0 * group["m"] * group["n"] * group["k"] * group["batch"]
    speed.plot(group["size"], flops / group["ref_time_ms"] / 1e9, ls="--", color=color)
    if "ref_fma_pct" in group.columns:
        util.plot(group["size"], group["ref_fma_pct"], ls="--", color=color)
