"""What `report` and `diff` read: run directories and bare dispatch tables, one `Dataset` per GPU;
with no input, the real audits bundled with the tool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cublas_audit.errors import AuditError
from cublas_audit.planning.plan_file import plan_case_ids
from cublas_audit.resources import shipped
from cublas_audit.table.atlas_files import ATLAS_REPORT, check_whole, is_atlas, read_atlas
from cublas_audit.table.candidates_table import read_candidates
from cublas_audit.table.dispatch import TableSource, row_number
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.rundir import (
    CANDIDATES_FILE,
    PLAN_FILE,
    TABLE_COLUMNAR,
    TABLE_FILE,
    read_env,
    table_file,
)
from cublas_audit.table.trace_record import TraceRecord, read_trace_record
from cublas_audit.table.validation import check_against_plan, read_table


@dataclass
class Dataset:
    """One GPU's rows from one input, with the run's env.json when the input is a run directory."""

    title: str
    gpu_label: str
    path: Path
    frame: pd.DataFrame
    env: EnvRecord = field(default_factory=EnvRecord)
    # The run's cuBLASLt candidate audit (candidates.csv), when it has one.
    candidates: pd.DataFrame | None = None
    # A trace audit's record of the trace (trace.json: each problem's share of its GEMM time).
    trace: TraceRecord | None = None

    def __post_init__(self) -> None:
        # env.json's object given as it is (a library caller, a test) is read into its record
        if not isinstance(self.env, EnvRecord):
            self.env = EnvRecord.of(self.env)


# ----- inputs -----------------------------------------------------------------------------------


def bundled_runs(root: Path | None = None) -> list[Path]:
    """The embedded default input: each GPU's newest run of the default batched grid."""
    root = shipped("bundled") if root is None else root
    labels = sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    runs = [
        max(tables).parent for d in labels if (tables := list(d.glob("*-batched/" + TABLE_FILE)))
    ]
    if not runs:
        raise AuditError(f"no input given, and no bundled audits under {root}: name a run")
    return runs


def load_inputs(paths: Sequence[Path]) -> list[Dataset]:
    """Run directories give one GPU each; a table file gives one dataset per gpu_label it holds.
    The same table given twice (also as a run and its dispatch.csv) is refused: its findings
    would count twice."""
    check_distinct(paths)
    datasets = [dataset for path in paths for dataset in _load(Path(path))]
    titles = [d.title for d in datasets]
    for dataset in datasets:
        if titles.count(dataset.title) > 1:
            dataset.title = f"{dataset.title} ({dataset.path})"
    return datasets


def check_distinct(paths: Sequence[Path]) -> None:
    seen: dict[Path, Path] = {}
    for path in map(Path, paths):
        table = (table_file(path) if path.is_dir() else path).resolve()
        if table in seen:
            raise AuditError(f"{path}: the same table as {seen[table]}; give each input once")
        seen[table] = path


def load_one_gpu(path: Path) -> Dataset:
    """The input of one side of a diff: a table that mixes GPUs is refused. An atlas directory
    (<out>/<mode>/ of `atlas`) is its grid as a dispatch table, with its map's env.json."""
    path = Path(path)
    if is_atlas(path):
        frame, meta = read_atlas(path)
        return _dataset(path, frame, EnvRecord.of(meta.get("env") or {}, path / "atlas.json"))
    if path.is_dir():
        return load_run(path)
    frame = read_table(path)
    require_one_gpu(frame, path)
    return _dataset(path, frame, _measured_by(path))


def _measured_by(table: Path) -> EnvRecord:
    """What a run's dispatch.csv given as a file says of its measurement: the phase of the
    env.json beside it (a map's rows are judged with the map's floors), else nothing."""
    if table.name not in (TABLE_FILE, TABLE_COLUMNAR):
        return EnvRecord()
    try:
        phase = read_env(table.parent).get("phase")
        return EnvRecord.of({"phase": phase}) if phase else EnvRecord()
    except AuditError:  # a broken env.json beside it: the table alone is still a table
        return EnvRecord()


def load_run(run_dir: Path, frame: pd.DataFrame | None = None) -> Dataset:
    """A run directory: its table (one GPU, agreeing with plan.json) and its env.json. `frame`:
    its table as this process just wrote it (a merge's: 262,144 rows read back took 2 s), else
    read; checked alike."""
    frame = read_table(run_dir) if frame is None else frame
    source = TableSource(table_file(run_dir))
    env = EnvRecord.read(run_dir)
    if not env.allow_mixed:  # a run over GPUs of several models is one table per model
        require_one_gpu(frame, source.path)
    plan = run_dir / PLAN_FILE
    if plan.is_file():
        check_against_plan(frame, plan_case_ids(plan), source)
    if "sm_count" not in frame.columns and env.sm_count is not None:
        # tables written before the column existed: the GPU's SMs, as env.json recorded them
        frame = frame.assign(sm_count=pd.array([env.sm_count] * len(frame), dtype="Int64"))
    return _dataset(run_dir, frame, env)


def _load(path: Path) -> list[Dataset]:
    if is_atlas(path):
        check_whole(path)  # an atlas cut short is named as one
        raise AuditError(
            f"{path}: an atlas directory (what `cublas-audit atlas` wrote), not a run directory; "
            f"`report` reads run directories and dispatch tables: the atlas's report is "
            f"{path / ATLAS_REPORT}, and `diff` compares it with another atlas or a run"
        )
    if path.is_dir():
        run = load_run(path)
        if not run.env.allow_mixed:
            return [run]
        frame, env = run.frame, run.env
    else:
        frame, env = read_table(path), EnvRecord()
    labels = frame["gpu_label"].fillna("")
    if labels.nunique() == 1:  # one GPU: the table itself, not a filtered copy of every column
        return [_dataset(path, frame, env)]
    return [_dataset(path, frame[labels == label], env) for label in labels.unique()]


def _dataset(path: Path, frame: pd.DataFrame, env: EnvRecord) -> Dataset:
    label = str(frame["gpu_label"].iloc[0])
    name = env.gpu_name or first_value(frame, "gpu_name")
    title = f"{label}: {name}" if name and name != label else label
    found = path / CANDIDATES_FILE if path.is_dir() else None
    audited = read_candidates(found) if found and found.exists() else None
    trace = read_trace_record(path) if path.is_dir() else None
    return Dataset(title, label, path, frame, env, audited, trace)


def require_one_gpu(frame: pd.DataFrame, path: Path) -> None:
    """A table mixing gpu_label values is refused where one GPU is expected."""
    labels = frame["gpu_label"].fillna("")
    other = labels.index[labels != labels.iloc[0]]
    if len(other):
        raise TableSource(path).error(
            f"mixes GPUs ({labels[other[0]]!r} here, {labels.iloc[0]!r} in row 1); "
            "one GPU is expected",
            row_number(frame, other[0]),
            "gpu_label",
        )


def first_value(frame: pd.DataFrame, column: str) -> str:
    if column not in frame.columns:
        return ""
    values = frame[column].dropna()
    return str(values.iloc[0]) if len(values) else ""
