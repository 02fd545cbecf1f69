"""The dispatch map's pictures, one PNG per series (api, routine, mode, batch, layout):

- along the size axis (square problems): the kernel chosen at each size, coloured by kernel, and
  the throughput below it, every kernel switch a dotted line through both panels;
- over the (M, N) plane (other problems): the kernel chosen at each (M, N), one panel per K (or K
  band, or each of the K values asked for: the atlas's), and the throughput on the same plane
  beneath.

Throughput is from the kernels' own time (CUPTI) where the map traced them, else the call's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cublas_audit.forked import Forks
from cublas_audit.judge.rules.maps import MAP_SERIES
from cublas_audit.report.markdown import shorten
from cublas_audit.report.plots import save_figure

KERNELS_NAMED = 12  # kernels with their own colour and legend entry; the rest are "other"
K_PANELS = 4  # K slices (or bands of K) of a plane picture
OTHER = "other"
# A map of this many rows draws each picture in a child of its own, all at once (forked.Forks):
# a full map's plane picture alone is seconds of matplotlib; below this a fork saves nothing.
FORK_ROWS = 20_000


@dataclass(frozen=True)
class Picture:
    caption: str
    path: str  # relative to the report


def draw(
    rows: pd.DataFrame,
    plots: Path,
    flagged: Collection[Any] = (),
    k_values: Sequence[int] | None = None,
) -> list[Picture]:
    """Every picture of a prepared map table (rules.prepare), written under `plots`; the rows
    of `flagged` (index labels: the findings' cases) ringed in red; with `k_values`, the plane
    pictures' panels at those K (the nearest present) instead of bands of K."""
    return drawing(rows, plots, flagged, k_values).results()


def drawing(
    rows: pd.DataFrame,
    plots: Path,
    flagged: Collection[Any] = (),
    k_values: Sequence[int] | None = None,
) -> Forks[Picture]:
    """`draw`'s pictures started (each in a fork of its own where the map is large): their rows
    made here first, so that a caller can start its other forks after them (what this process
    touches once a fork shares its memory is copied page by page)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CPU machines and CI
    rows = rows[~rows["is_loop"]].assign(rate=throughput(rows)).dropna(subset=["rate"])
    pictures: list[Callable[[], Picture]] = []
    for key, series in rows.groupby(MAP_SERIES, dropna=False, sort=True):
        name = series_name(key)
        squares = (series["m"] == series["n"]) & (series["n"] == series["k"])
        if squares.sum() >= 2:
            pictures.append(functools.partial(_size_axis, series[squares], name, plots, flagged))
        if (~squares).sum() >= 2:
            pictures.append(functools.partial(_plane, series[~squares], name, plots, k_values))
    return Forks(pictures, enabled=len(rows) >= FORK_ROWS)


def throughput(rows: pd.DataFrame) -> pd.Series:
    """TFLOP/s of each row from its kernels' time where traced, else from the call's."""
    flops = 2.0 * (rows["m"] * rows["n"] * rows["k"] * rows["batch"]).astype(float)
    time = rows["time_ms"].astype(float)
    if "kernel_time_ms" in rows.columns:
        time = rows["kernel_time_ms"].astype(float).fillna(time)
    return flops / time / 1e9


def series_name(key: Sequence[Any]) -> str:
    """'cublas cublasSgemm fp32 b1 nn' (+ broadcast and beta where set)."""
    _label, api, routine, mode, batch, transa, transb, broadcast, beta = key
    parts = [api, routine, mode, f"b{batch}", f"{transa}{transb}"]
    parts += [f"bcast-{broadcast}"] if isinstance(broadcast, str) and broadcast else []
    parts += [f"beta{beta:g}"] if isinstance(beta, float) and beta and not np.isnan(beta) else []
    return " ".join(str(p) for p in parts)


def switches(series: pd.DataFrame) -> pd.DataFrame:
    """The consecutive sizes of a square series where the kernel changes: before, after."""
    ordered = series.sort_values("m")
    kernels = ordered["kernel_short"].fillna("").astype(str)
    changed = kernels.ne(kernels.shift()) & kernels.shift().notna()
    after = ordered[changed.to_numpy()]
    before = ordered.shift()[changed.to_numpy()]
    return pd.DataFrame(
        {
            "from_size": before["m"].astype(int).to_numpy(),
            "to_size": after["m"].astype(int).to_numpy(),
            "from_kernel": before["kernel_short"].to_numpy(),
            "to_kernel": after["kernel_short"].to_numpy(),
        }
    )


def _palette(kernels: pd.Series) -> dict[str, Any]:
    """A colour per kernel: the KERNELS_NAMED most frequent ones their own, the rest grey."""
    from matplotlib import colormaps

    counts = kernels.value_counts()
    named = list(counts.index[:KERNELS_NAMED])
    colours = [colormaps["tab20"](i) for i in range(20)]
    palette: dict[str, Any] = {k: colours[i % len(colours)] for i, k in enumerate(named)}
    palette[OTHER] = (0.6, 0.6, 0.6)
    return palette


def _labels(rows: pd.DataFrame, palette: dict[str, Any]) -> pd.Series:
    kernels = rows["kernel_short"].fillna("(none)").astype(str)
    return kernels.where(kernels.isin(list(palette)), OTHER)


def _size_axis(series: pd.DataFrame, name: str, plots: Path, flagged: Collection[Any]) -> Picture:
    from matplotlib import pyplot as plt

    series = series.sort_values("m")
    palette = _palette(series["kernel_short"].fillna("(none)").astype(str))
    labels = _labels(series, palette)
    order = list(dict.fromkeys(labels))
    figure, (chosen, speed) = plt.subplots(
        2, 1, figsize=(12, 3 + 0.25 * len(order)), sharex=True,
        gridspec_kw={"height_ratios": [max(1, len(order)), 3]},
    )  # fmt: skip
    for kernel in order:
        picked = series[labels == kernel]
        y = np.full(len(picked), order.index(kernel))
        colour = palette[kernel]
        chosen.scatter(picked["m"], y, s=14, color=colour)
        speed.scatter(picked["m"], picked["rate"], s=14, color=colour, label=shorten(kernel))
    speed.plot(series["m"], series["rate"], color="0.75", lw=0.8, zorder=0)
    ringed = series[series.index.isin(list(flagged))]
    if len(ringed):
        speed.scatter(ringed["m"], ringed["rate"], s=70, facecolors="none", edgecolors="red",
                      label="finding")  # fmt: skip
    for size in switches(series)["to_size"]:
        for axis in (chosen, speed):
            axis.axvline(size, color="0.4", ls=":", lw=0.8)
    chosen.set_yticks(range(len(order)), [shorten(k) for k in order], fontsize="small")
    chosen.invert_yaxis()
    chosen.set_title(f"{name}: kernel chosen (dotted: every kernel switch)")
    speed.set_xlabel("M = N = K")
    speed.set_ylabel("TFLOP/s")
    speed.grid(alpha=0.3)
    speed.legend(fontsize="x-small", ncol=2)
    return _save(figure, f"{name} size axis", plots)


def _plane(
    rows: pd.DataFrame, name: str, plots: Path, k_values: Sequence[int] | None = None
) -> Picture:
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D

    palette = _palette(rows["kernel_short"].fillna("(none)").astype(str))
    labels = _labels(rows, palette)
    slices = _k_slices(rows["k"]) if k_values is None else _nearest_k_slices(rows["k"], k_values)
    figure, axes = plt.subplots(
        2, len(slices), figsize=(4.2 * len(slices) + 1, 8), squeeze=False, sharex=True, sharey=True
    )
    low, high = float(rows["rate"].min()), float(rows["rate"].max())
    shown = None
    for column, (title, inside) in enumerate(slices):
        part, part_labels = rows[inside.to_numpy()], labels[inside.to_numpy()]
        kernel_axis, speed_axis = axes[0][column], axes[1][column]
        drawn = list(dict.fromkeys(part_labels))
        top = _on_top(part, part_labels, drawn)
        for kernel in drawn:
            picked = part.loc[top.index[top == kernel]]
            kernel_axis.scatter(picked["m"], picked["n"], s=10, color=palette[kernel], marker="s")
        part = part.drop_duplicates(["m", "n"], keep="last")  # the speed panel's top markers
        shown = speed_axis.scatter(
            part["m"], part["n"], c=part["rate"], s=10, marker="s", cmap="viridis",
            vmin=low, vmax=high,
        )  # fmt: skip
        kernel_axis.set_title(title, fontsize="small")
        speed_axis.set_xlabel("M")
    for axis in axes[:, 0]:
        axis.set_ylabel("N")
    handles = [
        Line2D([], [], marker="s", ls="", color=colour, label=shorten(kernel))
        for kernel, colour in palette.items()
        if (labels == kernel).any()
    ]
    figure.legend(handles=handles, loc="upper right", fontsize="x-small")
    if shown is not None:
        figure.colorbar(shown, ax=list(axes[1]), label="TFLOP/s")
    figure.suptitle(f"{name}: kernel chosen over (M, N) (top), TFLOP/s (bottom)")
    return _save(figure, f"{name} plane", plots)


def _on_top(part: pd.DataFrame, labels: pd.Series, drawn: list[str]) -> pd.Series:
    """The kernel of the marker seen at each (M, N) of a panel, on the rows that draw them:
    squares of one size at one place hide those drawn before them, and a band of K put ~16 at
    each place (a full map's plane drew 4 million markers). The panel draws each kernel of
    `drawn` in turn, each in row order: the last row of the last kernel drawn there is seen."""
    rank = labels.map({kernel: i for i, kernel in enumerate(drawn)})
    ordered = part[["m", "n"]].assign(rank=rank).sort_values("rank", kind="stable")
    return labels.loc[ordered.drop_duplicates(["m", "n"], keep="last").index]


def _k_slices(k: pd.Series) -> list[tuple[str, pd.Series]]:
    """One panel per K where there are few, else K_PANELS bands of about equal count."""
    values = sorted(k.unique())
    if len(values) <= K_PANELS:
        return [(f"K = {v}", k == v) for v in values]
    edges = np.quantile(np.array(values, dtype=float), np.linspace(0, 1, K_PANELS + 1))
    slices = []
    for i in range(K_PANELS):
        lo, hi = edges[i], edges[i + 1]
        inside = (k >= lo) & ((k <= hi) if i == K_PANELS - 1 else (k < hi))
        if inside.any():
            slices.append((f"K in [{int(k[inside].min())}, {int(k[inside].max())}]", inside))
    return slices


def _nearest_k_slices(k: pd.Series, wanted: Sequence[int]) -> list[tuple[str, pd.Series]]:
    """One panel per wanted K: the nearest K present (the smaller of two as near), each once."""
    present = np.array(sorted(k.unique()), dtype=np.int64)
    chosen: dict[int, int] = {}  # K present -> the first K asked for that it stands for
    for value in wanted:
        chosen.setdefault(int(present[np.argmin(np.abs(present - value))]), int(value))
    return [
        (f"K = {near}" + ("" if near == asked else f" (nearest to {asked})"), k == near)
        for near, asked in chosen.items()
    ]


def _save(figure: Any, title: str, plots: Path) -> Picture:
    return Picture(title, save_figure(figure, title, plots, dpi=80))
