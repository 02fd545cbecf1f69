"""table/candidates_table.py's pure parts pinned (issue 39 item 6): ranks and left_on_table on
the basis time (hand-checked), the problem a row poses, the journal, the GPU stamp, and the
ranges' edges. Tiny frames."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import Case
from cublas_audit.table import candidates_table
from cublas_audit.table.env_record import EnvRecord


def row(
    candidate: int, time_ms: float | None, kernel_ms: float | None = None, **extra: Any
) -> dict[str, Any]:
    return {"case_id": "c", "mode": "fp32", "m": 64, "n": 64, "k": 64, "batch": 1,
            "candidate": candidate, "is_default": int(candidate == 0), "status": "ok",
            "time_ms": time_ms, "kernel_ms": kernel_ms, **extra}  # fmt: skip


def test_ranks_and_left_on_table_on_the_kernel_basis() -> None:
    frame = candidates_table.from_records([row(0, 2.0, 1.5), row(1, 1.0, 0.5), row(2, 3.0, 0.5),
                             row(3, None, None, status="failed")])  # fmt: skip
    assert frame["timing_basis"].tolist()[:3] == ["kernel"] * 3
    assert frame["rank"].tolist() == [3, 1, 1, pd.NA]  # kernel times 1.5, 0.5, 0.5 (ties: min)
    assert frame["left_on_table"].tolist() == [3.0] * 4  # default 1.5 / best 0.5
    assert list(frame.columns[: len(candidates_table.COLUMNS)]) == list(candidates_table.COLUMNS)


def test_one_untraced_candidate_puts_the_case_on_call_times() -> None:
    frame = candidates_table.from_records([row(0, 2.0, 1.5), row(1, 1.0, None), row(2, 4.0, 0.5)])
    assert frame["timing_basis"].tolist() == ["call"] * 3
    assert frame["rank"].tolist() == [2, 1, 3] and frame["left_on_table"].tolist() == [2.0] * 3
    nothing = candidates_table.from_records([row(0, None, status="failed", is_default=1)])
    assert nothing["timing_basis"].isna().all() and nothing["left_on_table"].isna().all()
    assert candidates_table.basis_ms(frame).tolist() == [2.0, 1.0, 4.0]


def test_text_empty_is_missing() -> None:
    frame = candidates_table.from_records([row(0, 1.0, tile="", reason="x")])
    assert frame["tile"].isna().all() and frame["reason"].tolist() == ["x"]
    assert frame["m"].dtype == pd.Int64Dtype() and frame["time_ms"].dtype == pd.Float64Dtype()


def test_the_problem_a_row_poses() -> None:
    assert (
        candidates_table.problem_case({"mode": "fp32", "m": 8, "n": 8, "k": 8, "batch": 1}) is None
    )
    half_posed = {"mode": "fp32", "m": 8, "n": 8, "k": 8, "batch": 1, "transa": "t", "transb": None}
    assert candidates_table.problem_case(half_posed) is None
    posed = candidates_table.problem_case(pd.Series({
        "mode": "fp32", "m": 8, "n": 4, "k": 16, "batch": 2, "transa": "t", "transb": "n",
        "lda": None, "ldb": 24, "broadcast": None, "beta": None, "strided": 0, "bias": 1,
    }))  # fmt: skip
    assert posed == Case("cublasLt", "fp32", 8, 4, 16, 2, transa="t", transb="n", ldb=24, bias=True)
    assert posed is not None and posed.beta == 0.0 and posed.broadcast == "" and posed.lda == 0
    given = {"mode": "fp32", "m": 8, "n": 4, "k": 16, "batch": 2, "transa": "n", "transb": "n"}
    full = candidates_table.problem_case(
        {**given, "lda": 16, "broadcast": "a", "beta": 0.5, "strided": 1}
    )
    assert full is not None and (full.lda, full.broadcast, full.beta, full.strided) == (
        16,
        "a",
        0.5,
        True,
    )
    frame = pd.DataFrame({"transa": ["n", None, "t"], "transb": ["n", "n", None]})
    assert candidates_table.layout_known(frame).tolist() == [True, False, False]


def test_the_journal(tmp_path: Path) -> None:
    line = candidates_table.journal_line("c", [{"time_ms": np.float64(1.5), "reps": np.int64(3)}])
    assert json.loads(line) == {"case_id": "c", "rows": [{"time_ms": 1.5, "reps": 3}]}
    assert line.endswith("}\n")
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        candidates_table.journal_line("c", [{"x": object()}])
    path = tmp_path / "candidates.jsonl"
    path.write_text(
        line + '{"case_id": "d", "rows": []}\n{"case_id": 5, "rows": [1]}\n'
        '{"case_id": "e", "rows": {"a": 1}}\n{"case_id": "f", "rows": [{"x": 1}]}\n{"case_id": "g"'
    )
    assert candidates_table.read_journal(path) == {
        "c": [{"time_ms": 1.5, "reps": 3}],
        "f": [{"x": 1}],
    }


def test_measured_on_stamps_every_row() -> None:
    frame = candidates_table.from_records([row(0, 1.0), row(1, 2.0)])
    out = candidates_table.measured_on(
        frame, EnvRecord.of({"device_index": 3, "gpu_uuid": "GPU-x"})
    )
    assert out["device_index"].tolist() == [3, 3] and out["gpu_uuid"].tolist() == ["GPU-x"] * 2
    assert frame["device_index"].isna().all()  # the given table unchanged


def bad(column: str, *values: float) -> list[bool]:
    return list(candidates_table.RANGES[column].bad(pd.Series(values, dtype=float)))


def test_ranges_at_their_edges() -> None:
    assert (
        candidates_table.SCHEMA_VERSION == 2
        and candidates_table.DEFAULT_LIMIT == 32
        and candidates_table.DEFAULT_MIN_REPS == 5
    )
    assert bad("is_default", 0, 1, 2, -1) == [False, False, True, True]
    assert bad("beta", -1e300, 0.0, 2.5) == [False, False, False]
    assert bad("split_k", -1, 0, 2**31 - 1, -2, 2**31) == [False, False, False, True, True]
    assert bad("rel_err", 0.0, 0.5, math.inf, -0.1) == [False, False, False, True]
    assert bad("reps", 1, 0) == [False, True]
    assert bad("algo_id", 0, 2**31 - 1, 2**31) == [False, False, True]


RECORDED = Path(__file__).parent.parent / "reports" / "h100" / "20261123-145452-batched"


@pytest.fixture(scope="module")
def raw() -> pd.DataFrame:
    """The recorded audit's first three rows (one problem, 256^3 batch 4, k 256), as text."""
    text = pd.read_csv(RECORDED / "candidates.csv", dtype=str, keep_default_na=False)
    return text.head(3).replace("", pd.NA)


def test_a_hand_edited_audit_is_named_by_row(raw: pd.DataFrame) -> None:
    where = Path("c.csv")
    with pytest.raises(AuditError, match=r"^c\.csv: missing required column\(s\) status$"):
        candidates_table.validate(raw.drop(columns=["status"]), where)
    with pytest.raises(AuditError, match=r"^c\.csv, row 2, column 'tile': "):
        candidates_table.validate(raw.assign(tile=["32x32", "7x7", "7x7"]), where)
    # a missing transpose is allowed (a version-1 row); split-K up to k = 256 itself
    edited = candidates_table.validate(
        raw.assign(transa=pd.Series(["n", None, "t"], dtype=object), split_k=["1", "256", "1"]),
        where,
    )
    assert edited["transa"].isna().sum() == 1 and edited["split_k"].tolist()[1] == 256
    with pytest.raises(AuditError, match=r"^c\.csv, row 2, column 'split_k': split_k 257 is not"):
        candidates_table.validate(raw.assign(split_k=["1", "257", "258"]), where)


def test_a_run_directory_s_audit_and_text_that_looks_missing(
    raw: pd.DataFrame, tmp_path: Path
) -> None:
    raw.assign(reason=pd.Series(["None", "NA", None], dtype=object)).to_csv(
        tmp_path / "candidates.csv", index=False
    )
    (tmp_path / "run").mkdir()  # a run directory without an audit
    frame = candidates_table.read_candidates(tmp_path)  # a run directory: its candidates.csv
    assert frame["reason"].tolist()[:2] == ["None", "NA"] and len(frame) == 3
    with pytest.raises(AuditError, match=r"candidates\.csv: no such file"):
        candidates_table.read_candidates((tmp_path / "run").resolve())


def test_rows_of_unknown_status_or_default_are_not_ranked_or_defaults() -> None:
    frame = candidates_table.from_records(
        [row(0, 2.0, is_default=None), row(1, 1.0, status=None), row(2, 4.0)]
    )
    assert frame["rank"].tolist() == [1, pd.NA, 2]
    assert frame["left_on_table"].isna().all()  # no default among the timed
    untimed = candidates_table.from_records([row(0, 1.0, 0.5, status="failed")])
    assert untimed["timing_basis"].isna().all() and candidates_table.basis_ms(untimed).tolist() == [
        1.0
    ]
