"""Fixes built from one recorded run, for the tests of what `fix` writes (the TunableOp file, the
fix report): the H100 map follow-up reports/h100/maps/20261124-003639-fp32-64-8192/follow-up,
whose report.md confirms two better cuBLASLt candidates (fp32 1856^3 and 2112^3, batch 8) and
finds cuBLAS's 1856^3 batch 8 slower than 1920^3. Every number comes from its candidates.csv,
dispatch.csv and env.json."""

from __future__ import annotations

import csv
import json
from functools import cache

from cublas_audit.planning.cases import Case
from cublas_audit.table.fix_file import Fix, FixSet, Pin, Problem, Stamp, Timed
from tests.conftest import REPORTS

RUN = REPORTS / "h100" / "maps" / "20261124-003639-fp32-64-8192" / "follow-up"


@cache
def _rows(name: str) -> tuple[dict[str, str], ...]:
    with (RUN / name).open() as handle:
        return tuple(csv.DictReader(handle))


def stamp() -> Stamp:
    env = json.loads((RUN / "env.json").read_text())
    return Stamp(
        env["gpu_name"], env["cc"], env["cublas_version"], env["driver_version"], env["gpu_label"]
    )


def candidate_row(case_id: str, candidate: int) -> dict[str, str]:
    (row,) = [
        r for r in _rows("candidates.csv")
        if r["case_id"] == case_id and r["candidate"] == str(candidate)
    ]  # fmt: skip
    return row


def pin_of(row: dict[str, str]) -> Pin:
    return Pin(
        algo_id=int(row["algo_id"]),
        tile=row["tile"],
        stages=row["stages"],
        split_k=int(row["split_k"]),
        reduction_scheme=row["reduction_scheme"],
        cta_swizzling=int(row["cta_swizzling"]),
        custom_option=int(row["custom_option"]),
        inner_shape=int(row["inner_shape"]),
        cluster_shape=row["cluster_shape"],
        workspace_bytes=int(row["workspace_bytes"]),
    )


def _timed(row: dict[str, str]) -> Timed:
    words = f"cuBLASLt algo {row['algo_id']}, tile {row['tile']}, stages {row['stages']}"
    confirm = float(row["confirm_time_ms"]) if row["confirm_time_ms"] else None
    return Timed(words, float(row["time_ms"]), confirm)


def _problem(row: dict[str, str]) -> Problem:
    case = Case("cublasLt", row["mode"], int(row["m"]), int(row["n"]), int(row["k"]),
                int(row["batch"]))  # fmt: skip
    return Problem.of_case(case)


def candidate_fix(case_id: str, candidate: int, fix_id: str) -> Fix:
    """The heuristic's default against one of its candidates, pinned."""
    default, chosen = candidate_row(case_id, 0), candidate_row(case_id, candidate)
    assert default["is_default"] == "1"
    return Fix(
        id=fix_id,
        kind="pin",
        problem=_problem(chosen),
        default=_timed(default),
        fixed=_timed(chosen),
        timing="call",  # candidates.csv times calls with CUDA events (docs/schema.md)
        verdict="slower",
        change=f"pin candidate #{candidate}",
        pin=pin_of(chosen),
        source={"run": str(RUN.relative_to(REPORTS.parent)), "case_id": case_id,
                "rule": "better-candidate"},
    )  # fmt: skip


def pad_fix() -> Fix:
    """cuBLAS's 1856^3 batch 8 against the same call padded to 1920^3 (kernel times)."""
    rows = {r["case_id"]: r for r in _rows("dispatch.csv") if r["role"] == "main"}
    slow, padded = (rows[f"cublas.fp32.{s}x{s}x{s}.b8.nn"] for s in (1856, 1920))
    return Fix(
        id="pad-1856",
        kind="pad",
        problem=Problem.of_case(Case("cublasLt", "fp32", 1856, 1856, 1856, 8)),
        default=Timed(slow["kernel"], float(slow["kernel_time_ms"])),
        fixed=Timed(padded["kernel"], float(padded["kernel_time_ms"])),
        timing="kernel",
        verdict="slower",
        change="pad to 1920x1920x1920 with zeros",
        instead=Problem.of_case(Case("cublasLt", "fp32", 1920, 1920, 1920, 8)),
        source={"run": str(RUN.relative_to(REPORTS.parent)), "case_id": slow["case_id"],
                "rule": "size-inversion"},
    )  # fmt: skip


def fix_set() -> FixSet:
    return FixSet(
        stamp(),
        (
            candidate_fix("cublasLt.fp32.1856x1856x1856.b8.nn", 2, "pin-1856"),
            candidate_fix("cublasLt.fp32.2112x2112x2112.b8.nn", 1, "pin-2112"),
            pad_fix(),
        ),
        (str(RUN.relative_to(REPORTS.parent)),),
    )
