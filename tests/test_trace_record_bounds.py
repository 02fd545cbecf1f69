"""table/trace_record.py pinned (issue 39 item 6): the recorded decode trace's record rebuilt
exactly (reports/h100/traces/20261127-100356-decode/trace.json from
tests/fixtures/torch_traces/decode.json.gz and its plan.json), then that trace's own GEMM calls
rearranged where it has no example (an op whose dims were not read, a mode this tool does not
run, a problem beyond 32 bits, kernels of no time or below a nanosecond), the problem-table form
(`table_record`), the why of each variant, and each check of a hand-edited trace.json at and
either side of its limits. One trace read per module; each test a few pure calls."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.observe.torch_trace import Trace, gemms, problems, read_trace
from cublas_audit.observe.torch_trace.attribution import GemmAccount, UnreadGemm
from cublas_audit.planning.cases import Case, with_cause_removed_companions
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.table import trace_record
from cublas_audit.table.trace_record import TracedProblem, TraceRecord, Variant
from tests.conftest import FIXTURES, REPORTS

DECODE_RUN = REPORTS / "h100" / "traces" / "20261127-100356-decode"
OPS_RUN = REPORTS / "h100" / "traces" / "20261123-233621-ops"
BLOCK_RUN = REPORTS / "h100" / "traces" / "20261123-233621-block"
RECORDED: dict[str, Any] = json.loads((DECODE_RUN / "trace.json").read_text())
LM_HEAD = "bf16.32000x8x4096.b1.tn"  # the decode trace's one call of 96.130 us


@pytest.fixture(scope="module")
def decode() -> Trace:
    return read_trace(FIXTURES / "torch_traces" / "decode.json.gz")


@pytest.fixture(scope="module")
def plan() -> list[Case]:
    return read_plan(DECODE_RUN / "plan.json")


def with_account(monkeypatch: pytest.MonkeyPatch, account: GemmAccount) -> None:
    monkeypatch.setattr(trace_record, "gemms", lambda trace: account)


def test_the_recorded_decode_record_is_rebuilt_exactly(decode: Trace, plan: list[Case]) -> None:
    found = trace_record.trace_record(decode, plan)
    assert trace_record.to_json(dataclasses.replace(found, trace=RECORDED["trace"])) == RECORDED
    assert trace_record.run_record(DECODE_RUN, decode) == found
    # most expensive first; 8 calls of 0.339081 ms: 42.385125 us each; 806.261 us over 1 step
    assert [p.kernel_ms for p in found.problems] == sorted(
        (p.kernel_ms for p in found.problems), reverse=True
    )
    assert found.problems[0].mean_us == pytest.approx(42.385125, abs=1e-9)
    assert found.gemm_us_per_step == pytest.approx(806.261, abs=1e-9)


def test_a_run_without_a_plan_has_nothing_to_weigh(decode: Trace, tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="has none"):
        trace_record.run_record(tmp_path, decode)


def test_the_record_is_written_and_read_back(
    decode: Trace, plan: list[Case], tmp_path: Path
) -> None:
    assert trace_record.read_trace_record(tmp_path) is None
    found = dataclasses.replace(trace_record.trace_record(decode, plan), trace=RECORDED["trace"])
    written = trace_record.write_trace_record(found, tmp_path)
    assert written == tmp_path / "trace.json"
    assert written.read_text() == (DECODE_RUN / "trace.json").read_text()  # indent 1, a newline
    assert trace_record.read_trace_record(tmp_path) == found


def test_gemm_time_no_planned_case_poses_is_unaudited(
    decode: Trace, plan: list[Case], monkeypatch: pytest.MonkeyPatch
) -> None:
    account = gemms(decode)
    *calls, head = account.calls
    assert trace_record._key(head.problem) == LM_HEAD
    odd = [
        dataclasses.replace(calls[0], problem=dataclasses.replace(calls[0].problem, mode="fp64")),
        dataclasses.replace(calls[1], problem=dataclasses.replace(calls[1].problem, k=2**31)),
    ]
    # the LM head's op unread, two 1024x8x4096 calls (9.12 + 8.545 us) posed by no case this
    # tool runs, and the 1024x8x4096 problem's cases left out of the plan
    unread = [UnreadGemm(head.op, head.kernels)]
    with_account(monkeypatch, GemmAccount(calls=[*odd, *calls[2:]], unread=unread))
    found = trace_record.trace_record(decode, [c for c in plan if "1024x8x4096" not in c.case_id])
    assert found.gemm_ms == 0.806261  # every GEMM op's kernels still
    assert LM_HEAD not in [p.problem for p in found.problems]
    small = found.called("cublas.bf16.1024x8x4096.b1.tn")
    assert small is not None and small.calls == 6 and small.cases == []
    # 62.916 - 9.12 - 8.545 = 45.251 us; shares of all 806.261 us: 45.251 / 806.261 = 0.0561245
    assert (small.kernel_ms, small.share) == (0.045251, 0.056125)
    assert found.problems[0].share == 0.42056  # as recorded: the same whole
    # unaudited: 96.13 (unread) + 17.665 (unposed) + 45.251 (unplanned) = 159.046 us
    assert found.unaudited_ms == 0.159046


def test_kernel_times_below_a_nanosecond_and_of_no_time(
    decode: Trace, monkeypatch: pytest.MonkeyPatch
) -> None:
    call = gemms(decode).calls[0]
    tiny = call.kernels[0]._replace(duration_us=0.5004)
    with_account(
        monkeypatch, GemmAccount(calls=[dataclasses.replace(call, kernels=(tiny,))], unread=[])
    )
    (one,) = trace_record.trace_record(decode, []).problems
    # 0.5004 us = 0.0005004 ms, kept to the nanosecond: 0.0005; its share of itself: 1
    assert (one.kernel_ms, one.share, one.calls, one.batch) == (0.0005, 1.0, 1, 1)
    found = trace_record.trace_record(decode, [])
    assert (found.gemm_ms, found.unaudited_ms) == (0.0005, 0.0005)
    with_account(monkeypatch, GemmAccount(calls=[dataclasses.replace(call, kernels=())], unread=[]))
    (none,) = trace_record.trace_record(decode, []).problems
    assert (none.kernel_ms, none.share) == (0.0, 0.0)  # no GEMM time: no share, no division


def test_mean_time_of_no_call_is_zero() -> None:
    assert TracedProblem("p", "op", "1x1x1", 1, 0, 1.0, 0.5).mean_us == 0.0
    assert TracedProblem("p", "op", "1x1x1", 1, 4, 0.002, 0.5).mean_us == pytest.approx(0.5)
    record = TraceRecord("t", "g", steps=2, gemm_ms=1.5, unaudited_ms=0.0, problems=())
    assert record.gemm_us_per_step == 750.0  # 1.5 ms over 2 steps


def test_problem_ids() -> None:
    assert trace_record.problem_id("cublasLt.fp16.8x8x8.b1.tn.bias") == "fp16.8x8x8.b1.tn.bias"
    assert trace_record.problem_id("cublas.fp16.8x8x8.b1.tn.bias") == "fp16.8x8x8.b1.tn.bias"
    assert trace_record.problem_id("loop.fp32.8x8x8.b4.nn") is None
    assert trace_record.problem_id("cublas") is None


def test_table_record_of_the_whole_problem_table(decode: Trace, plan: list[Case]) -> None:
    table = problems(decode)
    ids = [f"cublas.{p['problem']}" for p in RECORDED["problems"]]  # the table's order
    found = trace_record.table_record(decode, table, ids)
    assert [p.problem for p in found.problems] == [p["problem"] for p in RECORDED["problems"]]
    first = found.problems[0]
    assert first.ops == "aten::mm (in aten::linear > aten::matmul)"
    assert (first.shape, first.batch, first.calls, first.cases) == ("8x14336x4096", 1, 8, ids[:1])
    assert first.kernel_ms == pytest.approx(0.339081, abs=1e-12)
    assert found.gemm_ms == pytest.approx(0.806261, abs=1e-12) and found.unaudited_ms == 0.0
    assert found.steps == 1 and found.variants == ()
    with pytest.raises(ValueError):
        trace_record.table_record(decode, table, ids[:-1])  # one case id a row


def test_table_record_without_rows_of_the_unread(decode: Trace) -> None:
    table = problems(decode)
    part = table.iloc[:-1]  # the 1024x8x4096 row (0.062916 ms, share 0.078034) as if unread
    found = trace_record.table_record(decode, part, ["a.x"] * 4)
    # 0.743345 ms of a 0.921966 share: 0.806261 ms in all, 0.062916 of it unaudited
    assert found.gemm_ms == pytest.approx(0.806261, abs=1e-9)
    assert found.unaudited_ms == 0.062916
    one = part.iloc[:1].assign(total_gpu_ms=0.0010004, share=0.5, via="")
    odd = trace_record.table_record(decode, one, ["a.x"])
    # 0.0010004 / 0.5 = 0.0020008: 0.0010004 unaudited, kept to the nanosecond
    assert (odd.gemm_ms, odd.unaudited_ms) == (0.0020008, 0.001)
    assert odd.problems[0].ops == "aten::mm"
    empty = trace_record.table_record(decode, table.iloc[:0], [])
    assert (empty.gemm_ms, empty.unaudited_ms, empty.problems) == (0.0, 0.0, ())
    idle = trace_record.table_record(decode, one.assign(total_gpu_ms=0.0, share=0.0), ["a.x"])
    assert (idle.gemm_ms, idle.unaudited_ms) == (0.0, 0.0)


def test_why_a_planned_case_is_no_call_of_the_model() -> None:
    trace = read_trace(FIXTURES / "torch_traces" / "block.json.gz")
    found = trace_record.trace_record(trace, read_plan(BLOCK_RUN / "plan.json"))
    bias_free = "cublas.bf16.512x1024x2048.b1.tn"
    assert found.why_not(bias_free).startswith(
        "the bias-free form of aten::linear > aten::addmm 1024x512x2048, which the model calls"
    )
    # the same problem on the other API: the planned variant's why
    assert found.why_not("cublasLt.bf16.512x1024x2048.b1.tn") == found.why_not(bias_free)
    assert found.why_not("cublasLt.bf16.512x1024x2048.b1.tn.bias") == ""
    assert found.why_not("loop.bf16.256x256x64.b32.nn") == "not a call of the trace's model"
    assert found.why_not("cublas.fp32.7x7x7.b1.nn") == "not a call of the trace's model"
    assert found.called("cublas.fp32.7x7x7.b1.nn") is None


def test_companions_and_loops_are_named_as_such() -> None:
    trace = read_trace(FIXTURES / "torch_traces" / "ops.json.gz")
    cases = read_plan(OPS_RUN / "plan.json")
    called = next(c for c in cases if c.case_id == "cublas.bf16.100x7x20000.b1.nt")
    (padded,) = with_cause_removed_companions([called])[1:]
    loop = Case("loop", "fp32", 192, 128, 256, 4, loop=True)
    found = trace_record.trace_record(trace, [*cases, padded, loop])
    whys = {v.case_id: v.why for v in found.variants}
    assert whys[padded.case_id] == (
        "added by the audit: cublas.bf16.100x7x20000.b1.nt with a cause removed (padded, or "
        "another layout), measured beside it"
    )
    assert whys[loop.case_id].startswith("a loop companion:")
    assert sum(why == "not a problem of the trace" for why in whys.values()) == 6
    assert found.why_not("cublas.fp32.1x1x131072.b1.nn.strided") == "not a problem of the trace"


# ----- a hand-edited trace.json ------------------------------------------------------------------


def fault(**changes: Any) -> str:
    data = copy.deepcopy(RECORDED)
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        target: Any = data
        for part in path:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    with pytest.raises(ValueError) as caught:
        trace_record.from_json(data)
    return str(caught.value)


def read(**changes: Any) -> TraceRecord:
    data = copy.deepcopy(RECORDED)
    data.update(changes)
    return trace_record.from_json(data)


def test_schema_and_version() -> None:
    assert trace_record.from_json(RECORDED).problems[0].problem == "bf16.14336x8x4096.b1.tn"
    assert fault(schema="other") == "'schema' is not 'cublas-audit-trace'"
    assert fault(schema_version=2) == "schema_version 2 is not 1"
    with pytest.raises(ValueError, match="'schema' is not"):
        trace_record.from_json([])


def test_steps_are_a_count_of_at_least_one() -> None:
    assert read(steps=1).steps == 1 and read(steps=3).steps == 3
    for steps in (0, "1", True, 1.0):
        assert fault(steps=steps) == f"steps: {steps!r} is not a count of at least 1"


def test_times_are_zero_or_more_and_finite() -> None:
    assert read(unaudited_ms=0.0, gemm_ms=0.5).gemm_ms == 0.5
    for value in (-0.001, float("inf"), float("nan")):
        assert fault(gemm_ms=value) == f"gemm_ms: {value!r} is not a time of 0 ms or more"
    assert fault(**{"problems.0.kernel_ms": -1.0}).startswith("problems[0].kernel_ms: -1.0")


def test_problem_calls_and_share() -> None:
    where = "problems.0"
    assert fault(**{f"{where}.calls": 0}) == "problems[0].calls: 0 is not a count of at least 1"
    for share in (0.0, 1.0):
        data = copy.deepcopy(RECORDED)
        data["problems"][0]["share"] = share
        assert trace_record.from_json(data).problems[0].share == share
    data = copy.deepcopy(RECORDED)
    data["problems"][0]["calls"] = 1
    assert trace_record.from_json(data).problems[0].calls == 1
    for share in (-0.1, 1.5, 2.5):
        assert fault(**{f"{where}.share": share}) == (
            f"problems[0].share: {share!r} is not a fraction from 0 to 1"
        )
    assert fault(**{f"{where}.cases": [1]}) == "problems[0].cases[0]: 1 is not text"


def test_a_broken_file_is_one_audit_error(tmp_path: Path) -> None:
    (tmp_path / "trace.json").write_text('{"schema": Infinity}')
    with pytest.raises(AuditError, match="Infinity is not a number JSON allows"):
        trace_record.read_trace_record(tmp_path)
    (tmp_path / "trace.json").write_text(json.dumps({**RECORDED, "steps": 0}))
    with pytest.raises(AuditError, match="not a valid trace record: steps: 0"):
        trace_record.read_trace_record(tmp_path)


def test_variants_are_kept() -> None:
    got = read(variants=[{"case_id": "cublas.x", "why": "because"}])
    assert got.variants == (Variant("cublas.x", "because"),)
    assert trace_record.to_json(got)["variants"] == [{"case_id": "cublas.x", "why": "because"}]
    assert list(trace_record.to_json(got))[-1] == "variants"
