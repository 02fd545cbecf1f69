"""The run directory read back, and its table and finish written: what the probe loaded, which
cases a probe run left unfinished, the ncu launches of its chunks, the dispatch table of what it
holds now, and the times of the finished run (every part of a resumed one) in env.json."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.observe import ncu_export
from cublas_audit.observe.environment import format_cublas_version
from cublas_audit.planning.cases import Case
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.table import assemble, rundir
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.rundir import NCU_DIR, PLAN_FILE, PROFILE_RESULTS, TIME_RESULTS


def probe_versions(run_dir: Path) -> dict[str, Any]:
    """The last `probe` record: what the child really loaded (cuBLAS version and paths)."""
    versions: dict[str, Any] = {}
    for name in (PROFILE_RESULTS, TIME_RESULTS):
        for record in rundir.records(run_dir / name):
            if record.get("event") == "probe":
                versions = record
    return versions


def unfinished_cases(path: Path, done: Mapping[str, Any]) -> list[str]:
    """The cases the last probe run started and never finished, in the order it started them:
    one where it runs a case at a time, up to MAX_PENDING + 1 chunks' worth in the map
    (device.map_engine reads a chunk back once later ones are queued)."""
    started: list[str] = []
    for record in rundir.records(path):
        if record.get("event") == "probe":  # a new probe run: what came before was settled
            started = []
        elif record.get("event") == "start" and record.get("case_id"):
            started.append(str(record["case_id"]))
    return [case_id for case_id in dict.fromkeys(started) if case_id not in done]


def collect_launches(run_dir: Path) -> list[ncu_export.Launch]:
    launches: list[ncu_export.Launch] = []
    for csv_path in sorted((run_dir / NCU_DIR).glob("chunk-*.csv")):
        launches.extend(ncu_export.parse_csv_file(csv_path))
    return launches


def write_run_table(
    run_dir: Path, cases: Sequence[Case] | None = None, label: str = ""
) -> pd.DataFrame:
    env = EnvRecord.read(run_dir)
    versions = probe_versions(run_dir)
    cublas = versions.get("cublas_version_int")
    context = {
        "gpu_label": label or env.gpu_label,
        "gpu_name": env.gpu_name,
        "cc": env.cc,
        "sm_count": env.sm_count,
        "device_index": env.device_index,
        "gpu_uuid": env.gpu_uuid,
        "driver_version": env.driver_version,
        "cublas_version": format_cublas_version(cublas) if cublas else env.cublas_version,
    }
    frame = assemble.build_table(
        list(cases) if cases is not None else read_plan(run_dir / PLAN_FILE),
        collect_launches(run_dir),
        rundir.read_results(run_dir / PROFILE_RESULTS),
        rundir.read_results(run_dir / TIME_RESULTS),
        context,
    )
    rundir.write_run_table(frame, run_dir)
    return frame


def record_finish(run_dir: Path, seconds: float, phases: Mapping[str, float]) -> None:
    env = rundir.read_env(run_dir)
    versions = probe_versions(run_dir)
    if versions.get("cublas_version_int"):
        env["cublas_version"] = format_cublas_version(versions["cublas_version_int"])
    env = rundir.with_earlier_parts(env, seconds, phases)
    rundir.write_env(run_dir, {**env, "finished": _now(), "probe": versions})


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="seconds")
