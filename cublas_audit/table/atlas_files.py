"""The atlas's tables: a dispatch map's problems in a few MB instead of its full dispatch table,
written so that a rerun gives the same bytes, and read back as a dispatch table (what `diff`
takes: table.inputs.load_one_gpu).

    <out>/<mode>/
      atlas.md       the summary (report.atlas_report), plots/ beside it
      atlas.json     the GPU and versions, the series columns' one value where it does not vary,
                     the counts, the map's command and the atlas's
      grid.csv.gz    one row a problem: m, n, k, the series columns that vary (api, routine,
                     batch, layout), kernel (an id of kernels.csv), kernel_time_ms (4 significant
                     digits), status
      kernels.csv    one row a kernel: id, full name, short name, problems, share of problems,
                     TFLOP/s median, p10 and p90, and its region (min and max of m, n and k)
      findings.json  the map's findings, compact, largest effect first

atlas.md, then atlas.json, are written last, and both are removed before anything else is
written: a directory without them is an atlas cut short (Ctrl-C, a full disk), which `diff` and
`report` refuse (check_whole), never an older atlas's record beside newer tables.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.files import check_target, os_error, write_file, write_text_atomic
from cublas_audit.table.dispatch import LAYOUT_DEFAULTS, TableSource, json_ready, validate
from cublas_audit.table.validation import check_frame

GRID_FILE = "grid.csv.gz"
KERNELS_FILE = "kernels.csv"
ATLAS_JSON = "atlas.json"
ATLAS_REPORT = "atlas.md"
# Every file an atlas has, in the order written: atlas.md and atlas.json last, so that a
# directory holding them all is a whole atlas.
ATLAS_FILES = (GRID_FILE, KERNELS_FILE, ATLAS_REPORT, ATLAS_JSON)
ATLAS_FORMAT = 1  # atlas.json's "format": a reader of another refuses it in one line
# A column of these is in grid.csv.gz only where its value varies, else once in atlas.json.
SERIES_COLUMNS = ("gpu_label", "api", "routine", "mode", "batch", *LAYOUT_DEFAULTS)
FLOAT_FORMAT = "%.4g"  # 4 significant digits: a map's kernel times vary ~1 % call to call
KERNEL_COLUMNS = [
    "id", "kernel", "short", "problems", "share", "tflops_median", "tflops_p10", "tflops_p90",
    "m_min", "m_max", "n_min", "n_max", "k_min", "k_max",
]  # fmt: skip


@dataclass(frozen=True)
class Grid:
    """A map's problems as grid.csv.gz holds them (`frame`: in the prepared table's order, with
    its index), the kernel names its ids stand for (id = position), the series columns that vary
    and the one value of each that does not."""

    frame: pd.DataFrame
    kernels: list[str]
    varying: list[str]
    constant: dict[str, Any]

    def in_file_order(self) -> pd.DataFrame:
        """The rows as written: by the varying series columns, then m, n, k."""
        order = [*self.varying, "m", "n", "k"]
        return self.frame.sort_values(order, kind="stable", ignore_index=True)


def grid_of(rows: pd.DataFrame) -> Grid:
    """The grid of a prepared map table (rules.prepare: one row a problem, kernel_name filled
    in)."""
    series = [c for c in SERIES_COLUMNS if c in rows.columns]
    varying = [c for c in series if rows[c].nunique(dropna=False) > 1]
    constant = {c: json_ready(rows[c].iloc[0]) for c in series if c not in varying}
    ids, kernels = kernel_ids(rows["kernel_name"])
    # an events-only map traced no kernel: its grid has no kernel time
    traced = "kernel_time_ms" in rows.columns
    times = rows["kernel_time_ms"] if traced else pd.Series(pd.NA, index=rows.index)
    frame = pd.DataFrame(
        {
            **{c: rows[c] for c in ("m", "n", "k", *varying)},
            "kernel": ids,
            "kernel_time_ms": times.astype("Float64"),
            "status": rows["status"],
        }
    )
    return Grid(frame, kernels, varying, constant)


def kernel_ids(names: pd.Series) -> tuple[pd.Series, list[str]]:
    """Each row's kernel as an id (NA where it has none): 0 the kernel chosen most often, ties by
    name, so the ids of a map are the same on every rerun."""
    counts = names.dropna().astype(str).value_counts()
    ordered = sorted(counts.index, key=lambda name: (-int(counts[name]), name))
    ids = names.map({name: i for i, name in enumerate(ordered)}).astype("Int32")
    return ids, ordered


def kernel_table(
    grid: pd.DataFrame, kernels: Sequence[str], shorts: Mapping[str, str], rate: pd.Series
) -> pd.DataFrame:
    """kernels.csv: each kernel of the grid with its problems, share of the grid's problems,
    TFLOP/s (`rate`, a value per grid row, from the unrounded times) at its median, p10 and p90,
    and where it was chosen."""
    chosen = grid.assign(rate=rate.to_numpy(dtype=float)).dropna(subset=["kernel"])
    groups = chosen.groupby("kernel", sort=True)
    rates = groups["rate"]
    table = pd.DataFrame(
        {
            "problems": groups.size(),
            "share": groups.size() / len(grid),
            "tflops_median": rates.median(),
            "tflops_p10": rates.quantile(0.1),
            "tflops_p90": rates.quantile(0.9),
            **{f"{dim}_{side}": groups[dim].agg(side) for dim in "mnk" for side in ("min", "max")},
        }
    )
    ids = table.index.astype(int)
    names = [kernels[i] for i in ids]
    table.insert(0, "short", [shorts.get(name, "") for name in names])
    table.insert(0, "kernel", names)
    table.insert(0, "id", ids)
    return table[KERNEL_COLUMNS].reset_index(drop=True)


def write_csv_gz(frame: pd.DataFrame, path: Path) -> Path:
    """A table as gzipped CSV with no time or name in its header (mtime 0): the same table gives
    the same bytes on every run."""
    text = frame.to_csv(index=False, float_format=FLOAT_FORMAT, lineterminator="\n")
    return write_file(path, gzip.compress(text.encode(), compresslevel=9, mtime=0))


def start_atlas(target: Path) -> None:
    """Before anything is written into `target`: an earlier atlas's atlas.md and atlas.json there
    go first, so that until the new ones are written last the directory reads as cut short."""
    for name in (ATLAS_JSON, ATLAS_REPORT):
        path = Path(target) / name
        if path.is_file():
            check_target(path)  # never an input of the command
            try:
                path.unlink()
            except OSError as exc:
                raise os_error(path, exc) from exc


def write_atlas_tables(target: Path, grid: Grid, kernels: pd.DataFrame) -> list[Path]:
    """grid.csv.gz and kernels.csv into `target`."""
    text = kernels.to_csv(index=False, float_format=FLOAT_FORMAT, lineterminator="\n")
    return [
        write_csv_gz(grid.in_file_order(), target / GRID_FILE),
        write_file(target / KERNELS_FILE, text),
    ]


def write_atlas_json(target: Path, grid: Grid, meta: Mapping[str, Any]) -> Path:
    """atlas.json (with the grid's constant columns): the last file, which makes the atlas whole."""
    described = {"format": ATLAS_FORMAT, **meta, "constant": grid.constant}
    return write_text_atomic(
        target / ATLAS_JSON, json.dumps(json_ready(described), indent=1) + "\n"
    )


# ----- reading back -----------------------------------------------------------------------------


def is_atlas(path: Path) -> bool:
    """A directory the atlas wrote for one mode, whole or cut short (any file of ATLAS_FILES)."""
    path = Path(path)
    return path.is_dir() and any((path / name).is_file() for name in ATLAS_FILES)


def check_whole(path: Path) -> None:
    """An atlas directory holding every file of ATLAS_FILES, else a one-line error: one without
    its last files is an `atlas` that was interrupted or failed, not an atlas to read."""
    missing = [name for name in ATLAS_FILES if not (Path(path) / name).is_file()]
    if missing:
        raise AuditError(
            f"{path}: an atlas cut short (no {', '.join(missing)}; {ATLAS_REPORT} and "
            f"{ATLAS_JSON} are written last): `atlas` was interrupted or failed there; make "
            "it again with `cublas-audit atlas MAP_RUN --out DIR`"
        )


def read_atlas(path: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """An atlas directory as a dispatch table, checked as a table file is (table.validation):
    the grid's rows with the constant series columns, each kernel id as its full name (`kernel`;
    rules.prepare derives the short one), no call time (`time_ms` empty: the atlas keeps the
    kernels' time). And its atlas.json."""
    path = Path(path)
    check_whole(path)
    meta = _read_meta(path / ATLAS_JSON)
    source = TableSource(path / GRID_FILE)
    grid = _read_csv(path / GRID_FILE)
    kernels = _read_csv(path / KERNELS_FILE)
    names = dict(zip(kernels["id"], kernels["kernel"], strict=True))
    ids = grid.pop("kernel")
    unknown = ids.index[ids.notna() & ~ids.isin(list(names))]
    if len(unknown):
        raise source.error(f"kernel id {ids[unknown[0]]} is not in {KERNELS_FILE}", unknown[0] + 1)
    raw = grid.assign(kernel=ids.map(names))
    for column, value in meta["constant"].items():
        raw[column] = "" if value is None else str(value)  # blank: missing, as in a table file
    for column in ("time_ms", "fma_pct"):
        raw[column] = ""
    frame = validate(raw, source)
    check_frame(frame, source)
    return frame, meta


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except (ValueError, OSError, EOFError, pd.errors.ParserError) as exc:
        raise AuditError(f"{path}: cannot be read as a table ({str(exc).splitlines()[0]})") from exc


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AuditError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != ATLAS_FORMAT:
        raise AuditError(f"{path}: not an atlas of format {ATLAS_FORMAT}")
    if not isinstance(meta.get("constant"), dict):
        raise AuditError(f"{path}: no 'constant' object (the series columns that do not vary)")
    return meta


def atlas_bytes(path: Path) -> int:
    """The size of an atlas directory's files, its pictures included."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
