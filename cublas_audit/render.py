"""The Markdown report: inputs (run directories or tables) -> one section per GPU, plots beside it.

Pure table-to-text functions feed a jinja2 template (templates/report.md.j2); the only I/O is
reading the inputs and writing the report and its PNG plots. Every cell that holds user or kernel
text goes through `md_text` or `md_code`, so names with `<`, `>`, `|` and `::` render on GitHub.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from tabulate import tabulate

from cublas_audit import candidates
from cublas_audit.errors import AuditError
from cublas_audit.findings import SEVERITIES, Finding, audit, pipe_name, plain, prepare
from cublas_audit.table import TABLE_FILE, TableSource, read_table
from cublas_audit.thresholds import Thresholds

ENV_FILE = "env.json"
REPORT_FILE = "report.md"
# The real audits that ship in the repository (reports/README.md lists them).
BUNDLED = Path(__file__).resolve().parent.parent / "reports"
PLOTS_DIR = "plots"
SHORT_NAME_MAX = 40
STALLS_SHOWN = 8
# The routines the reproduce script can call through CuPy's cuBLAS bindings.
SCRIPTED_ROUTINES = frozenset(
    {"cublasSgemm", "cublasSgemmStridedBatched", "cublasGemmEx", "cublasGemmStridedBatchedEx"}
)
# mode -> (CuPy dtype of A/B/C, cudaDataType, cublasComputeType): library_types.h, cublas_api.h
MODE_TYPES = {
    "fp32": ("float32", 0, 68),
    "tf32": ("float32", 0, 77),
    "bf16x": ("float32", 0, 75),
    "fp16": ("float16", 2, 68),
    "bf16": ("uint16", 14, 68),
}
PIPE_METRIC = {
    "FMA-pipe": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor-pipe": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
}


@dataclass
class Dataset:
    """One GPU's rows from one input, with the run's env.json when the input is a run directory."""

    title: str
    gpu_label: str
    path: Path
    frame: pd.DataFrame
    env: dict[str, Any] = field(default_factory=dict)
    # The run's cuBLASLt candidate audit (candidates.csv), when it has one.
    candidates: pd.DataFrame | None = None


# ----- inputs -----------------------------------------------------------------------------------


def bundled_runs(root: Path = BUNDLED) -> list[Path]:
    """The embedded default input: each GPU's newest run of the default batched grid."""
    labels = sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    runs = [
        max(tables).parent for d in labels if (tables := list(d.glob("*-batched/" + TABLE_FILE)))
    ]
    if not runs:
        raise AuditError(f"no input given, and no bundled audits under {root}: name a run")
    return runs


def load_inputs(paths: Sequence[Path]) -> list[Dataset]:
    """Run directories give one GPU each; a table file gives one dataset per gpu_label it holds."""
    datasets = [dataset for path in paths for dataset in _load(Path(path))]
    titles = [d.title for d in datasets]
    for dataset in datasets:
        if titles.count(dataset.title) > 1:
            dataset.title = f"{dataset.title} ({dataset.path})"
    return datasets


def load_one_gpu(path: Path) -> Dataset:
    """The input of one side of a diff: a table that mixes GPUs is refused."""
    path = Path(path)
    frame = read_table(path)
    table_path = path / TABLE_FILE if path.is_dir() else path
    require_one_gpu(frame, table_path)
    return _dataset(path, frame, read_env(path))


def _load(path: Path) -> list[Dataset]:
    frame = read_table(path)
    if path.is_dir():
        require_one_gpu(frame, path / TABLE_FILE)
        return [_dataset(path, frame, read_env(path))]
    labels = frame["gpu_label"].fillna("").unique()
    return [_dataset(path, frame[frame["gpu_label"].fillna("") == label], {}) for label in labels]


def _dataset(path: Path, frame: pd.DataFrame, env: dict[str, Any]) -> Dataset:
    label = str(frame["gpu_label"].iloc[0])
    name = env.get("gpu_name") or _first(frame, "gpu_name")
    title = f"{label}: {name}" if name and name != label else label
    found = path / candidates.CANDIDATES_FILE if path.is_dir() else None
    audited = candidates.read_candidates(found) if found and found.exists() else None
    return Dataset(title, label, path, frame, env, audited)


def require_one_gpu(frame: pd.DataFrame, path: Path) -> None:
    labels = frame["gpu_label"].fillna("")
    other = labels.index[labels != labels.iloc[0]]
    if len(other):
        row = list(frame.index).index(other[0]) + 1
        raise TableSource(path).error(
            f"mixes GPUs ({labels[other[0]]!r} here, {labels.iloc[0]!r} in row 1); "
            "one GPU is expected",
            row,
            "gpu_label",
        )


def read_env(path: Path) -> dict[str, Any]:
    """env.json of a run directory, {} for a bare table; a broken env.json is a one-line error."""
    env_path = path / ENV_FILE
    if not env_path.is_file():
        return {}
    try:
        data = json.loads(env_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AuditError(f"{env_path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise AuditError(f"{env_path}: expected a JSON object")
    return data


def _first(frame: pd.DataFrame, column: str) -> str:
    if column not in frame.columns:
        return ""
    values = frame[column].dropna()
    return str(values.iloc[0]) if len(values) else ""


# ----- Markdown helpers -------------------------------------------------------------------------

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|])")


def md_text(value: object) -> str:
    """Plain text for GitHub Markdown: emphasis, HTML, link and table characters escaped; `::`
    escaped too so `cutlass::gemm::` never reads as an emoji shortcode."""
    text = str(value)
    if not _MD_SPECIAL.search(text) and "::" not in text:
        return text  # most cells are plain numbers and names: skip the substitution
    return _MD_SPECIAL.sub(r"\\\1", text).replace("::", r"\:\:")


def md_code(value: object, in_table: bool = True) -> str:
    """A code span; inside a table a `|` must still be escaped (GitHub splits cells first)."""
    text = str(value)
    fence = "``" if "`" in text else "`"
    if in_table:
        text = text.replace("|", r"\|")
    return f"{fence}{text}{fence}" if fence == "`" else f"{fence} {text} {fence}"


def shorten(name: str, limit: int = SHORT_NAME_MAX) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    return tabulate(list(rows), headers=list(headers), tablefmt="github", disable_numparse=True)


def _number(value: Any, digits: int) -> str:
    value = plain(value)
    return "—" if value is None else f"{value:.{digits}f}"


# ----- report -----------------------------------------------------------------------------------


def findings_of(datasets: Sequence[Dataset], thresholds: Thresholds) -> list[list[Finding]]:
    return [audit(d.frame, thresholds, d.candidates) for d in datasets]


def findings_json(datasets: Sequence[Dataset], thresholds: Thresholds) -> list[dict[str, Any]]:
    return [f.to_json() for found in findings_of(datasets, thresholds) for f in found]


def render_report(
    datasets: Sequence[Dataset], thresholds: Thresholds, plots: Path | None = None
) -> str:
    """The whole report; with `plots` (a directory), one PNG per GPU is written there and linked."""
    all_findings = findings_of(datasets, thresholds)
    sections = [
        _section(dataset, found, thresholds, plots)
        for dataset, found in zip(datasets, all_findings, strict=True)
    ]
    counts = {s: sum(f.severity == s for found in all_findings for f in found) for s in SEVERITIES}
    return _template("report.md.j2").render(
        inputs=[md_code(_shown(path), in_table=False) for path in _unique_paths(datasets)],
        counts=counts,
        side_by_side=side_by_side(datasets) if len(datasets) > 1 else [],
        sections=sections,
        kernel_names=_kernel_names(datasets),
    )


def write_report(
    datasets: Sequence[Dataset], out: Path, thresholds: Thresholds | None = None
) -> Path:
    """Writes the report to `out` and its plots to plots/ beside it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(datasets, thresholds or Thresholds(), out.parent / PLOTS_DIR)
    out.write_text(text)
    return out


def write_run_report(run_dir: Path) -> Path:
    """What the sweep calls when it finishes: run_dir/report.md and run_dir/plots/."""
    return write_report(load_inputs([Path(run_dir)]), Path(run_dir) / REPORT_FILE)


def _unique_paths(datasets: Sequence[Dataset]) -> list[Path]:
    return list(dict.fromkeys(d.path for d in datasets))


def _shown(path: Path) -> Path:
    """A path as the reader would type it: relative to the working directory when under it."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def _template(name: str) -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cublas_audit", "templates"),
        autoescape=False,  # Markdown, escaped cell by cell with md_text / md_code
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["md"] = md_text
    env.filters["code"] = lambda v: md_code(v, in_table=False)
    return env.get_template(name)


def _section(
    dataset: Dataset, found: list[Finding], thresholds: Thresholds, plots: Path | None
) -> dict[str, Any]:
    rows = prepare(dataset.frame)
    flags = _flags(found)
    return {
        "title": md_text(dataset.title),
        "env": md_table(["", ""], _env_rows(dataset)),
        "findings": {s: [_finding_view(f) for f in found if f.severity == s] for s in SEVERITIES},
        "dispatch": _dispatch_tables(rows, flags),
        "efficiency": _efficiency_table(rows),
        "stalls": _stall_tables(rows, found),
        "command": _command(dataset.env),
        "scripts": [_script(f) for f in found if f.severity == "high"],
        "candidates": _candidates_section(dataset, thresholds),
        "plot": _plot(dataset, rows, plots) if plots is not None else None,
    }


def _finding_view(finding: Finding) -> dict[str, str]:
    where = (
        " ".join(part for part in (finding.api, finding.routine, finding.mode) if part)
        + f", batch {finding.batch}"
    )
    return {
        "rule": finding.rule,
        "where": md_text(where),
        "message": md_text(finding.message),
        "workaround": md_text(finding.workaround),
    }


def _flags(found: Sequence[Finding]) -> dict[int, list[str]]:
    flags: dict[int, list[str]] = {}
    for finding in found:
        for row in finding.rows:
            flags.setdefault(row, []).append(finding.rule)
    return flags


# ----- environment header -----------------------------------------------------------------------

_ENV_ROWS = (
    ("GPU", ("gpu_name", "cc", "sm_count", "memory_gb"), "{} (cc {}, {} SMs, {} GB)"),
    ("SM clock", ("sm_clock_mhz", "sm_clock_max_mhz"), "{} MHz (max {} MHz)"),
    ("driver", ("driver_version",), "{}"),
    ("CUDA runtime", ("cuda_runtime",), "{}"),
    ("cuBLAS", ("cublas_version",), "{}"),
    ("ncu", ("ncu_version", "ncu_clock_control"), "{} (clock control {})"),
    ("probe environment", ("probe_env",), "{}"),
    ("run", ("started", "finished"), "{} to {}"),
    ("tool", ("tool_version",), "cublas-audit {}"),
)


def _env_rows(dataset: Dataset) -> list[tuple[str, str]]:
    """Header rows from env.json; a bare table falls back on its own provenance columns."""
    env = dataset.env or {
        key: _first(dataset.frame, key)
        for key in ("gpu_name", "cc", "driver_version", "cublas_version")
    }
    rows = [("GPU label", md_text(dataset.gpu_label))]
    for title, keys, pattern in _ENV_ROWS:
        values = [env.get(key) for key in keys]
        if values[0] in (None, ""):
            continue
        complete = all(v not in (None, "") for v in values)
        # The details in the pattern only when all are known: a bare table has the name alone.
        text = pattern.format(*map(_env_value, values)) if complete else _env_value(values[0])
        rows.append((title, md_text(text)))
    if not dataset.env:
        rows.append(("source", md_text("a bare table: no env.json, environment not recorded")))
    return rows


def _env_value(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "none"
    return str(value)


def _command(env: Mapping[str, Any]) -> str:
    command = env.get("command")
    if isinstance(command, list) and command:
        return shlex.join(str(arg) for arg in command)
    return ""


# ----- tables -----------------------------------------------------------------------------------

_TABLE_KEY = ["api", "routine", "mode", "batch"]


def _tflops(rows: pd.DataFrame) -> pd.Series:
    flops = 2.0 * rows["m"] * rows["n"] * rows["k"] * rows["batch"]
    computed = (flops / rows["time_ms"] / 1e9).astype("Float64")
    if "tflops" in rows.columns:
        return rows["tflops"].astype("Float64").fillna(computed)
    return computed


def _heading(key: Sequence[Any]) -> str:
    api, routine, mode, batch = key
    return md_text(" · ".join(str(p) for p in (api, routine, mode, f"batch {batch}") if p))


# The columns table cells are made of: converting only these to records keeps 10,000-row
# tables fast (a run's table has 60 columns).
_CELL_COLUMNS = (
    "shape",
    "status",
    "kernel_short",
    "util",
    "tflops_shown",
    "time_ms",
    "ref_time_ms",
)


def _records(rows: pd.DataFrame) -> list[dict[Hashable, Any]]:
    return rows[[c for c in _CELL_COLUMNS if c in rows.columns]].to_dict("records")


def _pipe_header(mode: str) -> str:
    return pipe_name(mode).replace("-pipe", " %")


def _kernel_cell(row: Mapping[Hashable, Any]) -> str:
    status = plain(row.get("status"))
    if status not in (None, "ok"):
        return md_text(status)
    kernel = plain(row.get("kernel_short"))
    return "—" if kernel is None else md_code(shorten(str(kernel)))


def _dispatch_tables(rows: pd.DataFrame, flags: Mapping[int, list[str]]) -> list[dict[str, str]]:
    rows = rows.assign(tflops_shown=_tflops(rows))
    tables = []
    for key, group in rows.groupby(_TABLE_KEY, sort=True):
        group = group.sort_values(["size", "shape"])
        pipe = _pipe_header(str(key[2]))
        body = [
            (
                record["shape"],
                _kernel_cell(record),
                _number(record["util"], 0),
                _number(record["tflops_shown"], 1),
                ", ".join(flags.get(int(index), [])),
            )
            for index, record in zip(group.index, _records(group), strict=True)
        ]
        table = md_table(["size", "kernel", pipe, "TFLOP/s", "findings"], body)
        tables.append({"heading": _heading(key), "table": table})
    return tables


def _efficiency_table(rows: pd.DataFrame) -> str:
    if "ref_time_ms" not in rows.columns:
        return ""
    timed = rows.dropna(subset=["time_ms", "ref_time_ms"]).sort_values([*_TABLE_KEY, "size"])
    if timed.empty:
        return ""
    ref_fma = timed["ref_fma_pct"] if "ref_fma_pct" in timed.columns else [None] * len(timed)
    body = [
        (
            _heading(key),
            record["shape"],
            _kernel_cell(record),
            _number(record["time_ms"], 3),
            _number(record["ref_time_ms"], 3),
            f"{record['time_ms'] / record['ref_time_ms']:.0%}",
            _number(record["util"], 0),
            _number(ref, 0),
        )
        for key, record, ref in zip(
            timed[_TABLE_KEY].itertuples(index=False, name=None),
            _records(timed),
            ref_fma,
            strict=True,
        )
    ]
    headers = ["call", "size", "cuBLAS kernel", "cuBLAS ms", "reference ms", "reference eff"]
    return md_table([*headers, "cuBLAS FMA %", "reference FMA %"], body)


def side_by_side(datasets: Sequence[Dataset]) -> list[dict[str, str]]:
    """Per call kind present on two or more GPUs: size | A kernel | A % | B kernel | B % ..."""
    prepared = [prepare(d.frame) for d in datasets]
    prepared = [rows[~rows["is_loop"]] for rows in prepared]
    # Column names as short as the article's ("5090 kernel"): the label, unless two share it.
    labels = [d.gpu_label for d in datasets]
    names = [d.gpu_label if labels.count(d.gpu_label) == 1 else d.title for d in datasets]
    shared = Counter(
        key for rows in prepared for key in set(rows[_TABLE_KEY].itertuples(index=False, name=None))
    )
    tables = []
    for key in sorted(k for k, count in shared.items() if count > 1):
        columns = [_gpu_column(rows, key) for rows in prepared]
        present = [(name, c) for name, c in zip(names, columns, strict=True) if c is not None]
        merged = pd.concat([c for _, c in present], axis=1).sort_index()
        headers = ["size"]
        for name, _ in present:
            headers += [f"{md_text(name)} kernel", _pipe_header(str(key[2]))]
        body = [
            [shape, *values]
            for (_, shape), values in zip(
                merged.index, merged.fillna("").values.tolist(), strict=True
            )
        ]
        tables.append({"heading": _heading(key), "table": md_table(headers, body)})
    return tables


def _gpu_column(rows: pd.DataFrame, key: tuple[Any, ...]) -> pd.DataFrame | None:
    mask = pd.Series(True, index=rows.index)
    for column, value in zip(_TABLE_KEY, key, strict=True):
        mask &= rows[column] == value
    group = rows[mask]
    if group.empty:
        return None
    cells = pd.DataFrame(
        {
            "kernel": [_kernel_cell(r) for r in _records(group)],
            "util": [_number(u, 0) for u in group["util"]],
        },
        index=pd.MultiIndex.from_arrays([group["size"], group["shape"]]),
    )
    return cells[~cells.index.duplicated()]


def _candidates_section(dataset: Dataset, thresholds: Thresholds) -> str:
    """The candidate audit's summary, flagged cases and repros, under the GPU's section."""
    if dataset.candidates is None:
        return ""
    gap = thresholds.candidate_gap_pct / 100
    return candidates.render_markdown(dataset.candidates, gap, level=3).rstrip()


# ----- stall breakdown --------------------------------------------------------------------------


def _stall_tables(rows: pd.DataFrame, found: Sequence[Finding]) -> list[dict[str, str]]:
    """Each flagged case (its largest size) beside the best-utilized unflagged case of its mode."""
    stalls = [c for c in rows.columns if c.startswith("stall_")]
    if not stalls:
        return []
    measured = rows.dropna(subset=[*stalls[:1], "util"])
    flagged_rows = {row for f in found for row in f.rows}
    healthy_pool = measured[~measured.index.isin(list(flagged_rows))]
    tables = []
    for finding in found:
        flagged = measured[measured.index.isin(finding.rows)]
        healthy = healthy_pool[healthy_pool["mode"] == finding.mode]
        if flagged.empty or healthy.empty:
            continue
        case = flagged.sort_values("size").iloc[-1]
        good = healthy.sort_values("util", kind="stable").iloc[-1]
        tables.append(
            {
                "heading": md_text(f"{finding.rule}: {_case_name(case)}"),
                "table": _stall_table(case, good, stalls),
            }
        )
    return tables


def _case_name(row: pd.Series) -> str:
    return f"{row['kernel_short']} at {row['shape']}, batch {row['batch']}"


def _stall_table(flagged: pd.Series, healthy: pd.Series, stalls: Sequence[str]) -> str:
    pair = pd.DataFrame({"flagged": flagged[list(stalls)], "healthy": healthy[list(stalls)]})
    pair = pair.astype(float).fillna(0.0)
    top = pair.loc[pair.max(axis=1).sort_values(ascending=False).index[:STALLS_SHOWN]]
    body = [
        (md_text(str(reason).removeprefix("stall_")), f"{flagged_pct:.1f}", f"{healthy_pct:.1f}")
        for reason, flagged_pct, healthy_pct in top.itertuples(name=None)
    ]
    body.insert(0, ("pipe utilization %", _number(flagged["util"], 0), _number(healthy["util"], 0)))
    headers = [
        "stall reason (% of issue-active cycles)",
        f"flagged: {md_text(_case_name(flagged))}",
        f"healthy: {md_text(_case_name(healthy))}",
    ]
    return md_table(headers, body)


# ----- reproduce --------------------------------------------------------------------------------


def _script(finding: Finding) -> dict[str, str]:
    """A standalone CuPy script of the finding's largest case, run under ncu without this tool."""
    case = finding.evidence[-1]
    title = md_text(
        f"{finding.rule}: {finding.gpu_label} {finding.routine or finding.api} {finding.mode} "
        f"{case['m']}x{case['n']}x{case['k']}, batch {case['batch']}"
    )
    sweep = [
        "cublas-audit",
        "sweep",
        "--batched" if finding.batch > 1 else "--single",
        "--sizes" if case["m"] == case["n"] == case["k"] else "--shapes",
        str(case["m"])
        if case["m"] == case["n"] == case["k"]
        else f"{case['m']}x{case['n']}x{case['k']}",
        "--modes",
        finding.mode,
        "--api",
        finding.api,
    ]
    if finding.batch > 1:
        sweep += ["--batches", str(finding.batch)]
    script = ""
    if finding.routine in SCRIPTED_ROUTINES:
        dtype, data_type, compute = MODE_TYPES[finding.mode]
        script = _template("repro_script.md.j2").render(
            rule=finding.rule,
            routine=finding.routine,
            kernel=finding.kernel,
            metric=PIPE_METRIC[pipe_name(finding.mode)],
            dtype=dtype,
            data_type=data_type,
            compute=compute,
            **case,
        )
    return {"title": title, "sweep": shlex.join(sweep), "script": script}


# ----- kernel names and plots -------------------------------------------------------------------


def _kernel_names(datasets: Sequence[Dataset]) -> str:
    """Each full kernel name once, next to the short name the tables use."""
    pairs: dict[str, str] = {}
    for dataset in datasets:
        rows = prepare(dataset.frame).dropna(subset=["kernel"])
        for short, full in zip(rows["kernel_short"], rows["kernel"], strict=True):
            if str(full) != str(short):
                pairs.setdefault(str(full), str(short))
    if not pairs:
        return ""
    body = sorted((md_code(shorten(short)), md_code(full)) for full, short in pairs.items())
    return md_table(["short", "full name as ncu prints it"], body)


def _plot(dataset: Dataset, rows: pd.DataFrame, plots: Path) -> str | None:
    """TFLOP/s and pipe % against size per call kind, cuBLAS solid and reference dashed."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on CPU machines and CI
    from matplotlib import pyplot as plt

    rows = rows.assign(tflops_shown=_tflops(rows)).sort_values("size")
    if rows["tflops_shown"].isna().all() and rows["util"].isna().all():
        return None
    figure, (speed, util) = plt.subplots(1, 2, figsize=(11, 4))
    for key, group in rows.groupby(_TABLE_KEY, sort=True):
        if group[["tflops_shown", "util"]].isna().all(axis=None):
            continue  # skipped or failed calls: nothing to draw
        label = " ".join(str(p) for p in key[1:3]) + f" b{key[3]}"
        (line,) = speed.plot(group["size"], group["tflops_shown"], marker="o", label=label)
        util.plot(group["size"], group["util"], marker="o", color=line.get_color(), label=label)
        _plot_reference(group, speed, util, line.get_color())
    for axis, title in ((speed, "TFLOP/s"), (util, "pipe utilization %")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("linear size (m·n·k)^(1/3)")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    for axis, column in ((speed, "tflops_shown"), (util, "util")):
        if rows[column].isna().all():
            axis.text(0.5, 0.5, "not measured", transform=axis.transAxes, ha="center")
    speed.legend(fontsize="small")
    figure.suptitle(f"{dataset.title} (dashed: reference kernel)")
    figure.tight_layout()
    plots.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", dataset.title).strip("-") + ".png"
    figure.savefig(plots / name, dpi=90)
    plt.close(figure)
    return f"{PLOTS_DIR}/{name}"


def _plot_reference(group: pd.DataFrame, speed: Any, util: Any, color: str) -> None:
    if "ref_time_ms" not in group.columns or group["ref_time_ms"].isna().all():
        return
    flops = 2.0 * group["m"] * group["n"] * group["k"] * group["batch"]
    speed.plot(group["size"], flops / group["ref_time_ms"] / 1e9, ls="--", color=color)
    if "ref_fma_pct" in group.columns:
        util.plot(group["size"], group["ref_fma_pct"], ls="--", color=color)
