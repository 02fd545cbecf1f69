"""candidates.csv version 2 on the CPU: the problem each row was timed on, the kernel-only times
and the timing basis a case is judged on, and version 1 (every bundled audit) read as before with
its layout unknown.

No measurement is made up. A version-2 case with kernel times is built from two real calls of one
problem that the H100 timed with events and traced with CUPTI in the same run (dispatch.csv of
reports/h100/checks/20261123-231126-batched-traced): fp32 256x256x256 batch 8 as one
cublasSgemmStridedBatched, as one cublasLtMatmul, and as a loop of 8 cublasSgemm calls. They
stand in for candidates of that problem; the same calls in another run of that H100
(reports/h100/checks/20261124-003639-batched-no-ncu) stand in for the confirmation round, and the
H100's recorded audit of that problem (reports/h100/20261123-012340-batched: its default,
candidate 0, and its best, candidate 5) gives them a cuBLASLt configuration each.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.judge import candidates
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.rules.better_candidate import rows_of_problem
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.report import candidates_report
from cublas_audit.table import candidates_table
from cublas_audit.table.dispatch import main_launches
from cublas_audit.table.rundir import CANDIDATES_FILE
from cublas_audit.table.validation import read_table
from tests.conftest import FIXTURES, REPORTS

TRACED = REPORTS / "h100" / "checks" / "20261123-231126-batched-traced"
AGAIN = REPORTS / "h100" / "checks" / "20261124-003639-batched-no-ncu"
OPS = REPORTS / "h100" / "traces" / "20261123-233621-ops"
BLOCK = REPORTS / "h100" / "traces" / "20261123-233621-block"
RECORDED = REPORTS / "h100" / "20261123-012340-batched"
PROBLEM = "cublasLt.fp32.256x256x256.b8.nn"
# The recorded calls of PROBLEM: a loop of cublasSgemm, cublasSgemmStridedBatched, cublasLtMatmul
LOOP, BATCHED, LT = (f"{api}.fp32.256x256x256.b8.nn" for api in ("loop", "cublas", "cublasLt"))
ALL_TABLES = sorted({*REPORTS.rglob(CANDIDATES_FILE), *FIXTURES.rglob(CANDIDATES_FILE)})
# every table recorded before schema 2 (its first data row starts with its schema version)
VERSION_1 = [p for p in ALL_TABLES if p.read_text().splitlines()[1].startswith("1,")]
VERSION_2 = [p for p in ALL_TABLES if p.read_text().splitlines()[1].startswith("2,")]


@functools.cache
def main_launches_of(run: Path) -> pd.DataFrame:
    return main_launches(read_table(run / "dispatch.csv"))


def main_row(run: Path, case_id: str) -> pd.Series:
    table = main_launches_of(run)
    rows = table[table["case_id"] == case_id]
    (index,) = rows.index
    return rows.loc[index]


@functools.cache
def configurations() -> pd.DataFrame:
    return candidates_table.read_candidates(RECORDED).set_index(["case_id", "candidate"])


def plan_case(run: Path, case_id: str) -> Case:
    return next(case for case in read_plan(run / "plan.json") if case.case_id == case_id)


CONFIGURATION = ["algo_id", "tile", "stages", "split_k", "reduction_scheme", "cta_swizzling"]
CONFIGURATION += ["cluster_shape", "custom_option", "inner_shape", "workspace_bytes"]


def candidate(call: str, index: int, is_default: bool, confirm: bool = False) -> dict[str, object]:
    """One candidates.csv row of PROBLEM from the recorded call `call` (its event time, kernel
    time and kernels), with the configuration of the recorded audit's candidate `index`;
    `confirm`: with the other run's times of the call as its confirmation."""
    row = main_row(TRACED, call)
    record: dict[str, object] = {
        "schema_version": candidates_table.SCHEMA_VERSION,
        "gpu_label": "h100",
        "case_id": PROBLEM,
        **{key: row[key] for key in ("mode", "m", "n", "k", "batch")},
        **candidates_table.problem_columns(plan_case(TRACED, PROBLEM), DEFAULT_WORKSPACE_BYTES),
        **configurations().loc[(PROBLEM, index), CONFIGURATION].to_dict(),
        "candidate": index,
        "is_default": int(is_default),
        "status": "ok",
        "time_ms": row["time_ms"],
        "kernel_ms": row["kernel_time_ms"],
        "kernels": row["traced_kernels"],
    }
    if confirm:
        again = main_row(AGAIN, call)
        record.update(confirm_time_ms=again["time_ms"], kernel_confirm_ms=again["kernel_time_ms"])
    return record


def with_confirmation(frame: pd.DataFrame) -> pd.DataFrame:
    """confirm_left_on_table as the audit sets it: default / best of the confirmation round, on
    the case's basis."""
    column = candidates_table.CONFIRM_COLUMNS[str(frame["timing_basis"].iloc[0])]
    default = frame.loc[frame["is_default"] == 1, column].iloc[0]
    best = frame.loc[frame["rank"] == 1, column].iloc[0]
    return candidates_table.from_records(
        frame.assign(confirm_left_on_table=default / best).to_dict("records")
    )


def recorded(call: str, run: Path = TRACED, column: str = "kernel_time_ms") -> float:
    return float(main_row(run, call)[column])


@pytest.fixture(scope="module")
def loop_against_batched() -> pd.DataFrame:
    """The loop of cublasSgemm as the default, the batched call as the other candidate."""
    rows = [
        candidate(LOOP, 0, True, confirm=True),
        candidate(BATCHED, 5, False, confirm=True),
    ]
    return with_confirmation(candidates_table.from_records(rows))


@pytest.mark.parametrize("path", VERSION_2, ids=lambda p: str(p.parent.relative_to(p.parents[3])))
def test_version_2_tables_recorded_on_the_h100_say_their_problem_and_judge_on_kernels(
    path: Path,
) -> None:
    """The random maps' follow-ups (CUPTI on the H100): every row names its problem, and every
    ranked case was judged on kernel time with the kernels each candidate launched."""
    frame = candidates_table.read_candidates(path)
    assert candidates_table.layout_known(frame).all()
    timed = frame[(frame["status"] == "ok") & frame["kernel_ms"].notna()]
    assert len(timed) and (timed["timing_basis"] == "kernel").all()
    assert timed["kernels"].str.len().gt(0).all()


# ----- version 1: every bundled audit reads, judges and renders as before -----------------------
@pytest.mark.parametrize("path", VERSION_1, ids=lambda p: str(p.parent.relative_to(p.parents[3])))
def test_version_1_tables_read_with_their_layout_unknown(path: Path) -> None:
    frame = candidates_table.read_candidates(path)
    assert not candidates_table.layout_known(frame).any()
    raw = pd.read_csv(path)
    assert (raw["schema_version"] == 1).all()
    timed = frame["time_ms"].notna() & (frame["status"] == "ok")
    assert (frame.loc[timed, "timing_basis"] == "call").all()
    # left_on_table derived on reading is the one the audit recorded: call time, as before
    recorded = raw["left_on_table"].astype(float)
    derived = frame["left_on_table"].astype(float)
    pd.testing.assert_series_equal(derived, recorded, check_names=False, rtol=1e-5)
    summary = candidates.case_summary(frame)
    assert (summary["layout"] == candidates.LAYOUT_UNKNOWN).all()


def test_version_1_findings_say_call_time_and_carry_no_layout() -> None:
    (finding,) = candidates.find_better_candidates(candidates_table.read_candidates(RECORDED), 0.10)
    # the claim is the pairwise round's 1.17x; the screen's 1.12x beside it
    assert "takes 1.17x the call time of" in finding.message
    assert "the screen of every candidate measured 1.12x" in finding.message
    default, best = finding.evidence
    assert default["timing_basis"] == "call" and default["kernel_ms"] is None
    assert default["transa"] is None and best["workspace_limit_bytes"] is None


def test_the_version_1_report_says_its_layout_is_unknown() -> None:
    text = candidates_report.render_markdown(
        candidates.judge_candidates(candidates_table.read_candidates(RECORDED))
    )
    assert candidates_report.VERSION_1_NOTE in text
    assert candidates_report.BASIS_NOTE not in text and "| basis" not in text
    assert "kernel ms" not in text


# ----- the timing basis ---------------------------------------------------------------------------
def test_a_case_traced_whole_is_judged_on_kernel_time(loop_against_batched: pd.DataFrame) -> None:
    frame = loop_against_batched
    assert (frame["timing_basis"] == "kernel").all()
    # kernels 0.0514 / 0.0129 ms: 3.99x; the calls' 0.172 / 0.0252 ms would say 6.86x
    kernels = recorded(LOOP) / recorded(BATCHED)
    assert frame["left_on_table"].iloc[0] == pytest.approx(kernels, rel=1e-9)
    assert round(kernels, 2) == 3.99
    again = recorded(LOOP, AGAIN) / recorded(BATCHED, AGAIN)
    assert frame["confirm_left_on_table"].iloc[0] == pytest.approx(again, rel=1e-9)
    summary = candidates.case_summary(frame).iloc[0]
    assert (summary["default_ms"], summary["best_ms"]) == (recorded(LOOP), recorded(BATCHED))
    assert summary["timing_basis"] == "kernel" and summary["layout"] == "nn"


def test_one_candidate_without_kernel_time_puts_the_case_on_call_time(
    loop_against_batched: pd.DataFrame,
) -> None:
    frame = loop_against_batched.copy()
    frame.loc[frame["candidate"] == 5, "kernel_ms"] = pd.NA
    judged = candidates_table.add_ranks(frame)
    assert (judged["timing_basis"] == "call").all()
    calls = recorded(LOOP, column="time_ms") / recorded(BATCHED, column="time_ms")
    assert judged["left_on_table"].iloc[0] == pytest.approx(calls, rel=1e-9)
    assert round(calls, 2) == 6.86
    # an untimed candidate (wrong, unsupported) needs no kernel time
    frame = loop_against_batched.copy()
    frame.loc[frame["candidate"] == 5, ["status", "time_ms", "kernel_ms"]] = ["wrong", pd.NA, pd.NA]
    assert (candidates_table.add_ranks(frame)["timing_basis"] == "kernel").all()


def test_kernel_time_ranks_away_a_gap_that_only_launch_overhead_made() -> None:
    # cuBLASLt's call took 1.47x the classic call's by events, running the same kernel in
    # 0.0127 against 0.0129 ms: on kernel time the default is the best.
    rows = [candidate(LT, 0, True), candidate(BATCHED, 5, False)]
    frame = candidates_table.from_records(rows).set_index("candidate")
    assert recorded(LT) < recorded(BATCHED)
    assert (frame.loc[0, "rank"], frame.loc[5, "rank"]) == (1, 2)
    assert frame.loc[0, "left_on_table"] == 1.0
    on_calls = candidates_table.from_records([{**row, "kernel_ms": None} for row in rows])
    calls = recorded(LT, column="time_ms") / recorded(BATCHED, column="time_ms")
    assert on_calls["left_on_table"].iloc[0] == pytest.approx(calls, rel=1e-9)
    assert round(calls, 2) == 1.47
    assert on_calls.set_index("candidate").loc[0, "rank"] == 2


def test_a_kernel_time_finding_says_so_and_carries_the_kernels(
    loop_against_batched: pd.DataFrame,
) -> None:
    (finding,) = candidates.find_better_candidates(loop_against_batched, 0.10)
    assert "takes 3.99x the kernel time of its heuristic's candidate #5" in finding.message
    assert "takes 3.99x the kernel time" in finding.message
    assert "when the two run alone, interleaved" in finding.message
    default, best = finding.evidence
    assert default["timing_basis"] == "kernel" and default["kernel_ms"] == recorded(LOOP)
    assert best["kernel_confirm_ms"] == recorded(BATCHED, AGAIN)
    assert best["confirm_time_ms"] == recorded(BATCHED, AGAIN, "time_ms")
    assert "split_k_kernel" in default["kernels"] and " + " in default["kernels"]
    assert (best["transa"], best["transb"], best["lda"], best["bias"]) == ("n", "n", 0, 0)
    assert best["workspace_limit_bytes"] == DEFAULT_WORKSPACE_BYTES
    json.dumps(finding.to_json())


def test_the_kernel_time_report_shows_layout_basis_and_kernel_times(
    loop_against_batched: pd.DataFrame,
) -> None:
    text = candidates_report.render_markdown(candidates.judge_candidates(loop_against_batched))
    assert candidates_report.BASIS_NOTE in text
    assert candidates_report.VERSION_1_NOTE not in text
    assert "| fp32 256x256x256 b8 nn |" in text.replace("  ", "")
    summary_line = next(line for line in text.splitlines() if "fp32 256x256x256 b8 nn" in line)
    assert "| kernel " in summary_line
    assert f"| {recorded(LOOP):.4g} " in summary_line  # the default's kernel time, not its call's
    assert "| kernel ms " in text and f"| {recorded(BATCHED):.4g} " in text


# ----- the problem each row was timed on ---------------------------------------------------------
@pytest.fixture(scope="module")
def posed() -> pd.DataFrame:
    """The block trace's F.linear with bias (bf16 1536x1024x512, cuBLAS tn) as a version-2 case:
    its recorded candidates, which the version-1 audit timed as packed nn, given the problem
    columns of the run's cuBLASLt case. Only the columns are tested here, not what the times
    mean."""
    case = plan_case(BLOCK, "cublasLt.bf16.1536x1024x512.b1.tn.bias")
    v1 = candidates_table.read_candidates(BLOCK)
    rows = v1[v1["case_id"] == "cublasLt.bf16.1536x1024x512.b1.nn"]
    upgraded = rows.assign(
        schema_version=candidates_table.SCHEMA_VERSION,
        case_id=case.case_id,
        **candidates_table.problem_columns(case, DEFAULT_WORKSPACE_BYTES),
    )
    return candidates_table.from_records(upgraded.to_dict("records"))


def test_version_2_round_trips(posed: pd.DataFrame, tmp_path: Path) -> None:
    candidates_table.write_candidates(posed, tmp_path / CANDIDATES_FILE)
    back = candidates_table.read_candidates(tmp_path)
    pd.testing.assert_frame_equal(posed.reset_index(drop=True), back, rtol=1e-5)
    assert candidates_table.layout_known(back).all()
    case = plan_case(BLOCK, "cublasLt.bf16.1536x1024x512.b1.tn.bias")
    assert candidates_table.problem_case(back.iloc[0]) == case
    summary = candidates.case_summary(back).iloc[0]
    assert summary["layout"] == "tn bias"
    assert candidates.problem_name(back.iloc[0]) == "bf16 1536x1024x512 batch 1 tn bias"


def test_the_traced_round_trips_with_its_kernels(
    loop_against_batched: pd.DataFrame, tmp_path: Path
) -> None:
    candidates_table.write_candidates(loop_against_batched, tmp_path / CANDIDATES_FILE)
    back = candidates_table.read_candidates(tmp_path)
    pd.testing.assert_frame_equal(loop_against_batched, back, rtol=1e-5)
    assert list(back.columns) == list(candidates_table.COLUMNS)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("transa", "x", "column 'transa': unknown transa 'x'"),
        ("broadcast", "c", "column 'broadcast': unknown broadcast 'c'"),
        ("timing_basis", "fast", "column 'timing_basis': unknown timing_basis 'fast'"),
        ("lda", "100", "lda 100 is smaller than the 512 rows of the stored operand"),
    ],
)
def test_a_problem_no_cuBLAS_call_poses_is_a_one_line_error(
    posed: pd.DataFrame, tmp_path: Path, column: str, value: str, message: str
) -> None:
    frame = posed.astype(object)
    frame.loc[frame.index[1], column] = value
    frame.to_csv(tmp_path / CANDIDATES_FILE, index=False)
    with pytest.raises(AuditError, match="row 2[,:] .*" + message):
        candidates_table.read_candidates(tmp_path)


def test_a_finding_is_placed_on_its_own_problems_row() -> None:
    """The trace's five cuBLASLt calls of fp32 384x512x256 (nn, tn, nt, nn + bias, tn + bias):
    an audit that says its problem names only that call's row; one that predates layouts, every
    cuBLASLt row of the shape, as before."""
    rows = prepare(read_table(OPS / "dispatch.csv"))
    problem = "cublasLt.fp32.384x512x256.b1.tn.bias"
    evidence = {"case_id": problem, "m": 384, "n": 512, "k": 256, "batch": 1, "transa": "t"}
    placed = rows_of_problem(rows, "fp32", evidence)
    assert placed["case_id"].tolist() == [problem]
    unknown = rows_of_problem(rows, "fp32", {**evidence, "transa": None})
    assert len(unknown) == 5 and set(unknown["api"]) == {"cublasLt"}


def test_a_mapped_case_finds_the_audit_of_its_own_problem(posed: pd.DataFrame) -> None:
    """The block trace's F.linear (cuBLAS tn) and its cuBLASLt call with bias: each finds the
    audit of its own problem; an audit that predates layouts answers for every case of its
    shape, as before."""
    from cublas_audit.report.map_report import audit_of

    rows = prepare(read_table(BLOCK / "dispatch.csv")).set_index("case_id", drop=False)
    linear, with_bias = (
        rows.loc[f"{api}.bf16.1536x1024x512.b1.tn{tail}"]
        for api, tail in (("cublas", ""), ("cublasLt", ".bias"))
    )
    judged = candidates.judge_candidates(posed).summary
    offered = {str(row["case_id"]): row for _, row in judged.iterrows()}
    assert audit_of(with_bias, offered) is not None
    assert audit_of(linear, offered) is None  # tn without bias: a problem this audit did not time
    unknown = candidates.judge_candidates(candidates_table.read_candidates(BLOCK)).summary
    offered = {str(row["case_id"]): row for _, row in unknown.iterrows()}
    for row in (linear, with_bias):
        found = audit_of(row, offered)
        assert found is not None and found["case_id"] == "cublasLt.bf16.1536x1024x512.b1.nn"


def test_the_progress_line_names_layout_and_basis(loop_against_batched: pd.DataFrame) -> None:
    line = candidates.ScreenJudge().progress_line(PROBLEM, loop_against_batched)
    assert line.startswith(f"{PROBLEM} (nn): 2 candidates, 2 correct, default rank 2,")
    assert line.endswith("left on table 3.992 on kernel time")
    v1 = candidates_table.read_candidates(RECORDED)
    line = candidates.ScreenJudge().progress_line(PROBLEM, v1[v1["case_id"] == PROBLEM])
    assert "(layout unknown)" in line and line.endswith("on call time")


# ----- the repro poses the problem the audit timed -----------------------------------------------
def test_the_repro_poses_a_transposed_problem_with_bias(posed: pd.DataFrame) -> None:
    from cublas_audit.report.lt_repro import repro

    code = repro(posed.iloc[0])
    compile(code, "repro.py", "exec")
    assert "# column-major, tn bias" in code
    # A stored k x m (512 rows of 1536 columns), B packed k x n: (entries, columns, ld)
    assert "a, b = rand((1, 1536, 512)), rand((1, 1024, 512))" in code
    assert "la, lb, lc = layout(512, 1536, 512, 786432), layout(512, 1024, 512, 524288)" in code
    assert "set_desc(lt.MatmulDescAttribute.TRANSA, 1)" in code
    assert "TRANSB" not in code and "BATCH_COUNT" not in code  # one call, no batch
    assert "set_desc(lt.MatmulDescAttribute.BIAS_POINTER, bias.data.ptr)" in code
    assert "ws = cp.empty(33554432, cp.uint8)" in code


def test_the_repro_of_a_version_1_row_is_the_packed_problem() -> None:
    from cublas_audit.report.lt_repro import repro

    v1 = candidates_table.read_candidates(RECORDED)
    code = repro(v1[v1["case_id"] == PROBLEM].iloc[5])
    assert "# column-major, no transposes, strided batch" in code
    assert "set_desc" not in code and "MIN_ALIGNMENT" not in code


def test_the_repro_gives_cuBLASLt_the_alignment_a_batch_stride_allows(posed: pd.DataFrame) -> None:
    """The trace's fp32 100x7x20000 nt as a batch of 4: B's entries lie 7 x 20000 floats apart
    (560,000 bytes: 128-byte aligned), C's 700 floats (2,800 bytes: 16)."""
    from cublas_audit.report.lt_repro import repro

    case = Case("cublasLt", "fp32", 100, 7, 20000, 4, "n", "t")
    row = posed.iloc[0].copy()
    for column, value in {"mode": "fp32", "m": 100, "n": 7, "k": 20000, "batch": 4}.items():
        row[column] = value
    for column, value in candidates_table.problem_columns(case, 4 * 2**20).items():
        row[column] = value
    code = repro(row)
    compile(code, "repro.py", "exec")
    assert "(('A', 256), ('B', 128), ('C', 16), ('D', 16))" in code
    assert "layout(100, 20000, 100, 2000000), layout(7, 20000, 7, 140000)" in code
    assert "set_(lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, stride)" in code
    assert "set_desc(lt.MatmulDescAttribute.TRANSB, 1)" in code
    assert "ws = cp.empty(4194304, cp.uint8)" in code
