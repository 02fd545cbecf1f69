"""The `atlas` job: map runs -> each mode's atlas (<out>/<mode>/: atlas.md, grid.csv.gz,
kernels.csv, atlas.json, findings.json, plots/), small enough to bundle where the map's own
tables are not.

Each map is judged once: its findings as its run recorded them (findings.json; judged here only
for a map written before that file existed), its follow-up's verdicts by judge.map_audit. Every
input is read and checked before anything is written, and no output replaces an input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cublas_audit.errors import AuditError
from cublas_audit.files import never_replacing
from cublas_audit.judge.map_audit import MapAudit, audit_map, recorded_findings
from cublas_audit.report.atlas_report import Atlas, atlas_of, write_atlas
from cublas_audit.report.output import input_files
from cublas_audit.table import rundir
from cublas_audit.table.atlas_files import ATLAS_REPORT, atlas_bytes
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.inputs import load_run
from cublas_audit.vocabulary import Phase

Echo = Callable[..., None]


@dataclass(frozen=True)
class AtlasJob:
    runs: Sequence[Path]  # map run directories
    out: Path  # each mode's atlas goes to out/<mode>/

    def command(self) -> list[str]:
        """The command line that makes this atlas (atlas.md names it)."""
        return ["cublas-audit", "atlas", *map(str, self.runs), "--out", str(self.out)]


def run(job: AtlasJob, echo: Echo) -> list[Path]:
    """Every mode's atlas of every map; returns the atlas directories."""
    if not job.runs:
        raise AuditError("atlas: name at least one map run directory")
    atlases = _by_mode([atlas for path in job.runs for atlas in _atlases(Path(path), job)])
    for mode in atlases:
        _check_target(job.out / mode, job.runs)
    written = []
    with never_replacing(_read_files(job.runs)):
        for mode, atlas in atlases.items():
            target = job.out / mode
            write_atlas(atlas, target)
            echo(
                f"atlas: {target / ATLAS_REPORT} ({len(atlas.rows)} problems, "
                f"{len(atlas.grid.kernels)} kernels, {atlas_bytes(target)} bytes)"
            )
            written.append(target)
    return written


def _read_files(runs: Sequence[Path]) -> list[Path]:
    """What the atlas reads of its maps, which no file it writes may replace."""
    deep = [Path(run) / rundir.FOLLOW_UP_DIR for run in runs]
    return input_files([*runs, *deep]) + [rundir.findings_file(run) for run in runs]


def _check_target(target: Path, runs: Sequence[Path]) -> None:
    """An atlas directory is never a map's own run directory (its plots/ and findings.json)."""
    for run in runs:
        if target.resolve() in (Path(run).resolve(), (Path(run) / rundir.FOLLOW_UP_DIR).resolve()):
            raise AuditError(f"--out: {target} would be the map run {run} itself; name another")


def _atlases(path: Path, job: AtlasJob) -> list[Atlas]:
    """One atlas a mode of the map run at `path`."""
    judged = judged_map(path)
    rows = judged.rows
    return [
        atlas_of(judged, rows[rows["mode"] == mode], job.command())
        for mode in sorted(rows["mode"].dropna().unique())
    ]


def _by_mode(atlases: list[Atlas]) -> dict[str, Atlas]:
    """Each mode once: two maps of one mode would write the same directory."""
    chosen: dict[str, Atlas] = {}
    for atlas in atlases:
        mode = str(atlas.rows["mode"].iloc[0])
        if mode in chosen:
            first, again = chosen[mode].judged.dataset.path, atlas.judged.dataset.path
            raise AuditError(
                f"atlas: {first} and {again} both map {mode}; give one map a mode (an atlas of "
                "another GPU goes to its own --out)"
            )
        chosen[mode] = atlas
    return chosen


def judged_map(path: Path) -> MapAudit:
    """A map run loaded and judged once (its recorded findings, its follow-up's verdicts)."""
    check_map_run(path)
    deep = path / rundir.FOLLOW_UP_DIR
    follow_up = load_run(deep) if rundir.has_table(deep) else None
    return audit_map(load_run(path), found=recorded_findings(path), follow_up=follow_up)


def check_map_run(path: Path) -> None:
    """A directory `cublas-audit map` wrote, else a one-line error saying what it is."""
    if not path.exists():
        raise AuditError(f"{path}: no such directory")
    if not path.is_dir():
        raise AuditError(f"{path}: not a directory; name a map's run directory")
    if rundir.is_candidates_run(path):
        raise AuditError(f"{path}: a candidate audit, not a map; the atlas reads map runs")
    if not rundir.has_table(path):
        raise AuditError(
            f"{path}: not a run directory (no {rundir.TABLE_FILE}); the atlas reads the run "
            "directory of a `cublas-audit map`"
        )
    phase = EnvRecord.read(path).phase
    if phase is not Phase.map:
        made = "a candidate audit" if phase is Phase.candidates else "a sweep"
        raise AuditError(
            f"{path}: the run directory of {made}, not of a map (env.json phase "
            f"{str(phase)!r}); the atlas reads the run directory of a `cublas-audit map`"
        )
