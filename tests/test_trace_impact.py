"""What a trace audit's findings are worth to the model (issue 37, item 4): each problem's share of
the trace's GEMM time (table.trace_record, trace.json), findings weighed by it (judge.impact),
fixes only for the calls the model makes, and the verdict a trace report opens with.

All on the H100's recordings: the ViT-B/16 fp16 and Mistral-shaped decode traces with their
cold-timed audits (reports/h100/traces/20261127-100356-*), the Llama and block traces with
theirs, the ops trace alone.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.jobs import measure
from cublas_audit.jobs.run_reports import with_trace
from cublas_audit.judge.audited import audit_dataset
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.observe.torch_trace import read_trace
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.report.torch_trace_report import verdict_markdown
from cublas_audit.table import rundir
from cublas_audit.table.inputs import load_run
from cublas_audit.table.trace_record import (
    TRACE_FILE,
    read_trace_record,
    run_record,
    write_trace_record,
)
from tests.conftest import FIXTURES, REPO, REPORTS, invoked

TRACES = FIXTURES / "torch_traces"
RUNS = REPORTS / "h100" / "traces"
VIT_RUN, DECODE_RUN = RUNS / "20261127-100356-vit", RUNS / "20261127-100356-decode"
VIT, DECODE = TRACES / "vit.json.gz", TRACES / "decode.json.gz"
# the ViT's MLP up-projection: addmm of the 12608 x 768 tokens by a 768 x 3072 weight, its bias
FC1 = "fp16.3072x12608x768.b1.tn.bias"
runner = CliRunner()


@functools.cache
def record_of(run: Path, trace: Path) -> Any:
    """The trace's record of a run, read once per process (a frozen record: five tests read the
    ViT's, and its trace takes 0.15 s to parse)."""
    return run_record(run, read_trace(trace))


def kernel_us_by_hand(trace: Path, dims: list[list[int]]) -> tuple[int, float, float]:
    """From the raw Chrome trace, without the tool: the calls of aten::addmm with these input
    dims and the duration of every kernel their launches (same thread, inside the op's span)
    are tied to by correlation id; and the same over every aten::addmm, the ViT's only GEMM op."""
    with gzip.open(trace) as raw:
        events = json.loads(raw.read())["traceEvents"]
    kernels: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel":
            kernels[e["args"]["correlation"]].append(e["dur"])
    launches = [
        e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    ]

    def kernel_us(ops: list[dict[str, Any]]) -> float:
        return sum(
            d
            for op in ops
            for launch in launches
            if launch["tid"] == op["tid"] and op["ts"] <= launch["ts"] <= op["ts"] + op["dur"]
            for d in kernels.get(launch["args"]["correlation"], [])
        )

    addmm = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    ops = [e for e in addmm if e["args"]["Input Dims"][:3] == dims]
    return len(ops), kernel_us(ops), kernel_us(addmm)


def test_the_fc1_share_is_the_traces_own_kernel_time() -> None:
    found = record_of(VIT_RUN, VIT)
    calls, fc1_us, all_us = kernel_us_by_hand(VIT, [[3072], [12608, 768], [768, 3072]])
    assert (calls, round(fc1_us, 3), round(all_us, 3)) == (12, 1129.306, 3232.819)
    fc1 = found.called(f"cublasLt.{FC1}")
    assert fc1 is not None and (fc1.calls, fc1.shape) == (12, "12608x3072x768")
    assert fc1.kernel_ms == pytest.approx(fc1_us / 1e3)
    assert fc1.share == pytest.approx(fc1_us / all_us, abs=1e-6)  # 34.9 %
    assert found.gemm_ms == pytest.approx(all_us / 1e3)
    assert fc1.ops == "aten::linear > aten::addmm" and fc1.cases == [f"cublasLt.{FC1}"]


@pytest.mark.parametrize(
    ("run", "trace"),
    [
        (VIT_RUN, VIT),
        (DECODE_RUN, DECODE),
        (RUNS / "20261125-093616-llama-v2", TRACES / "llama.json.gz"),
        (RUNS / "20261125-093616-block-v2", TRACES / "block.json.gz"),
    ],
)
def test_the_shares_add_up_to_the_traces_gemm_time(run: Path, trace: Path) -> None:
    found = record_of(run, trace)
    shares = sum(p.share for p in found.problems) + found.unaudited_ms / found.gemm_ms
    assert shares == pytest.approx(1.0, abs=1e-5)
    assert sum(p.kernel_ms for p in found.problems) == pytest.approx(found.gemm_ms, rel=1e-5)
    planned = {case.case_id for case in read_plan(run / rundir.PLAN_FILE)}
    posed = {case_id for p in found.problems for case_id in p.cases}
    # every planned case is the model's call or a variant the audit added, never both
    assert posed | {v.case_id for v in found.variants} == planned
    assert not posed & {v.case_id for v in found.variants}


def test_the_audits_variants_say_why_the_model_never_calls_them() -> None:
    vit, decode = record_of(VIT_RUN, VIT), record_of(DECODE_RUN, DECODE)
    # ViT: every linear has its bias, so each cuBLAS case is the bias-free form the audit added
    assert sorted(v.case_id.split(".")[0] for v in vit.variants) == ["cublas"] * 5
    why = vit.why_not("cublas.fp16.3072x12608x768.b1.tn")
    assert why.startswith("the bias-free form of aten::linear > aten::addmm 12608x3072x768")
    # the candidate audit's cuBLASLt form of that cuBLAS case is the same problem
    assert vit.why_not("cublasLt.fp16.3072x12608x768.b1.tn") == why
    # decode: its mm's have no bias, so the model's call is posed on both APIs
    assert not decode.variants
    assert all(len(p.cases) == 2 for p in decode.problems)


def test_the_record_round_trips_and_a_broken_one_is_one_line(tmp_path: Path) -> None:
    found = record_of(VIT_RUN, VIT)
    write_trace_record(found, tmp_path)
    assert read_trace_record(tmp_path) == found
    data = json.loads((tmp_path / TRACE_FILE).read_text())
    data["problems"][0]["share"] = 2.0
    (tmp_path / TRACE_FILE).write_text(json.dumps(data))
    with pytest.raises(AuditError, match=r"trace.json: .*problems\[0\].share: 2.0"):
        read_trace_record(tmp_path)
    (tmp_path / TRACE_FILE).write_text('{"schema": "cublas-audit-trace", "gemm_ms": NaN}')
    with pytest.raises(AuditError, match="NaN is not a number JSON allows"):
        read_trace_record(tmp_path)


def test_the_recorded_runs_keep_what_their_traces_give() -> None:
    for run, trace in ((VIT_RUN, VIT), (DECODE_RUN, DECODE)):
        kept = read_trace_record(run)
        assert kept is not None and kept.trace == str(trace.relative_to(REPO))
        assert kept == replace(record_of(run, trace), trace=kept.trace)


def test_without_a_trace_the_gain_per_call_sits_beside_the_ratio() -> None:
    audited = audit_dataset(replace(load_run(VIT_RUN), trace=None))  # the run without trace.json
    candidates = pd.read_csv(VIT_RUN / rundir.CANDIDATES_FILE)
    found = {f.evidence[0]["case_id"]: f for f in audited.findings}
    finding = found["cublasLt.fp16.2304x12608x768.b1.tn"]
    rows = candidates[candidates["case_id"] == "cublasLt.fp16.2304x12608x768.b1.tn"]
    default = rows[rows["is_default"] == 1].iloc[0]
    best = rows[rows["candidate"] == finding.evidence[1]["candidate"]].iloc[0]
    # the pairwise round's times: the default's and the best's, each alone, interleaved
    saved_us = 1e3 * (default["kernel_confirm_ms"] - best["kernel_confirm_ms"])
    assert finding.severity == "medium"
    assert finding.impact["saved_us_per_call"] == pytest.approx(saved_us, abs=0.002)
    assert finding.message.endswith(f"Gain: 1.12x, {saved_us:.3g} us a call.")


def test_a_variant_the_model_never_calls_is_info_and_the_verdict_is_healthy() -> None:
    (dataset,) = with_trace([load_run(VIT_RUN)], VIT)
    audited = audit_dataset(dataset)
    assert [f.severity for f in audited.findings] == ["info", "info"]  # medium without the trace
    for finding in audited.findings:
        assert finding.impact["called"] is False and finding.impact["rule_severity"] == "medium"
        assert "Not a call the traced model makes (the bias-free form of" in finding.message
    verdict = audited.trace
    assert verdict is not None and verdict.healthy
    assert (verdict.problems, round(verdict.gemm_us, 3), verdict.gain_us) == (5, 3232.819, 0)
    # four problems' defaults within noise of their best: all but fc1, 1.08x (under the bar)
    assert verdict.within_noise == pytest.approx(1 - 1129.306 / 3232.819, abs=1e-5)
    assert [(p.problem, p.gap) for p in verdict.under_bar] == [(FC1, 1.08203)]
    words = verdict_markdown(verdict)
    assert words.startswith("**Verdict: healthy.** 5 problems, 3,233 us of GEMM kernels")
    assert "65.1 % of that time runs a default within noise of its best cuBLASLt candidate" in words
    assert "12608x3072x768: 1.08x on 34.9 %" in words


def test_a_finding_on_the_models_own_call_carries_its_share_and_gain() -> None:
    """At a 5 % candidate bar the fc1 GEMM's 1.08x (confirmed pairwise) is a finding: worth
    1129.306 us x (1 - 1/1.08203) = 85.6 us of the trace's 3232.8 us of GEMM kernels."""
    (dataset,) = with_trace([load_run(VIT_RUN)], VIT)
    audited = audit_dataset(dataset, Thresholds(candidate_gap_pct=5.0))
    (finding,) = [f for f in audited.findings if f.severity != "info"]
    saved = 1129.306 * (1 - 1 / 1.08203)  # the finding's effect is rounded to 4 decimals
    impact = finding.impact
    assert (impact["called"], impact["calls_per_step"], impact["share"]) == (True, 12, 0.349325)
    assert impact["saved_us_per_step"] == pytest.approx(saved, abs=0.05)
    assert impact["worth"] == pytest.approx(saved / 3232.819, abs=1e-5)  # 2.65 %: medium
    assert impact["saved_us_per_call"] == pytest.approx(saved / 12, abs=0.01)
    assert finding.message.endswith(
        "12 calls in the trace, 1,129 us (34.9 % of its GEMM time); the gain: 1.08x, 7.13 us a "
        "call, 85.6 us in the trace (2.65 % of it)."
    )
    verdict = audited.trace
    assert verdict is not None and not verdict.healthy and verdict.under_bar == ()
    assert verdict.gain_us == pytest.approx(saved, abs=0.05)
    words = verdict_markdown(verdict)
    assert words.startswith("**Verdict: 1 finding worth 1 % or more of the GEMM time.**")
    assert words.endswith("To gain: 85.6 us in the trace, 2.65 % of it.")


def test_a_small_worth_is_info_on_a_call_the_model_makes() -> None:
    """ops.json.gz alone, layout-penalty lowered to 1.05x: x @ w.t() in fp32 (cuBLAS tn, 8.672
    us) against the nt layout (7.872 us) is 1.10x on 4.78 % of the GEMM time, so worth 0.8 us
    of 181 us: 0.44 %, info; the rule's medium is kept."""
    result = runner.invoke(
        app,
        ["report", "--torch-trace", str(TRACES / "ops.json.gz"), "--format", "json",
         "--threshold", "layout_penalty_ratio=1.05"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    first = next(f for f in data["findings"] if "1.10x the time of layout nt" in f["message"])
    assert (first["severity"], first["impact"]["rule_severity"]) == ("info", "medium")
    assert first["impact"]["saved_us_per_step"] == pytest.approx(8.672 - 7.872, abs=1e-3)
    assert first["impact"]["worth"] == pytest.approx(0.8 / 181.252, abs=1e-5)
    assert data["verdict"]["problems"] == 33 and data["verdict"]["worth"] == 0


def test_the_trace_report_opens_with_its_verdict() -> None:
    result = invoked("report", "--torch-trace", str(TRACES / "llama.json.gz"))  # shared
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # the LM head's gemv (legacy-kernel) takes 26.4 % of the GEMM time: worth the bar
    assert lines[4].startswith("**Verdict: 1 finding worth 1 % or more of the GEMM time.** 6 ")
    assert "No cuBLASLt candidate audit" in lines[4]


def test_report_weighs_runs_by_a_trace_given_or_kept() -> None:
    given = runner.invoke(app, ["report", str(DECODE_RUN), "--torch-trace", str(DECODE)])
    assert given.exit_code == 0, given.output
    verdict = next(line for line in given.output.splitlines() if line.startswith("**Verdict"))
    assert verdict.startswith("**Verdict: healthy.** 5 problems, 806 us of GEMM kernels")
    # the LM head's 1.09x (8 x 32000 x 4096) is a screen under the bar: 88.1 % within noise
    assert "88.1 % of that time runs a default within noise" in verdict
    kept = runner.invoke(app, ["report", str(DECODE_RUN), "--format", "md"])  # its trace.json
    assert verdict in kept.output.splitlines()
    table = runner.invoke(app, ["report", str(DECODE_RUN / "dispatch.csv"), "--torch-trace",
                                str(DECODE)])  # fmt: skip
    assert table.exit_code == 2 and "its plan.json" in table.output


def test_fixes_are_only_for_calls_the_model_makes(tmp_path: Path) -> None:
    out = tmp_path / "fix"
    result = runner.invoke(
        app, ["fix", str(VIT_RUN), "--torch-trace", str(VIT), "--out", str(out),
              "--threshold", "candidate_gap_pct=5"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    fixes = json.loads((out / "fix.json").read_text())["fixes"]
    assert [(f["id"], f["torch"]) for f in fixes] == [
        (FC1, {"op": "aten::linear > aten::addmm", "shape": "12608x3072x768", "batch": 1,
               "share": 0.349325}),
    ]  # fmt: skip
    report = (out / "fix.md").read_text()
    listed = report.split("Not carried: measured faster, but not a call the traced model")[1]
    for shape in ("2304x12608x768", "3072x12608x768"):
        assert f"| fp16.{shape}.b1.tn " in listed  # the bias-free forms
    assert "is the bias-free form of aten\\:\\:linear" in listed
    assert "2 measured fixes not proposed" in result.output
    # a run that kept its trace.json needs no --torch-trace
    kept = runner.invoke(app, ["fix", str(VIT_RUN), "--out", str(tmp_path / "kept")])
    assert kept.exit_code == 0, kept.output
    assert json.loads((tmp_path / "kept" / "fix.json").read_text())["fixes"] == []
    assert "2 measured fixes not proposed" in kept.output


def test_steps_divide_the_gemm_time(tmp_path: Path) -> None:
    """A trace recorded with a schedule marks each step (ProfilerStep#N): the vit trace's events
    under two such marks are two steps, so its GEMM time a step is half."""
    with gzip.open(VIT) as raw:
        data = json.loads(raw.read())
    start = min(e["ts"] for e in data["traceEvents"] if "ts" in e)
    for n in (1, 2):
        mark = {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": start}
        data["traceEvents"].append({**mark, "pid": 1, "tid": 1, "dur": 1})
    two = tmp_path / "two-steps.json"
    two.write_text(json.dumps(data))
    found = run_record(VIT_RUN, read_trace(two))
    assert found.steps == 2
    assert found.gemm_us_per_step == pytest.approx(3232.819 / 2)


def test_a_trace_sweep_writes_its_record_at_plan_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sweep --torch-trace` (the fake probe replaying the ViT run's timings) keeps trace.json
    in its run directory: the trace's record of exactly the cases it planned."""
    from tests.fakeprobe import deadline, fake_probe
    from tests.test_resume import stand_in_machine

    stand_in_machine(monkeypatch)
    monkeypatch.setattr(measure, "write_run_report", lambda run_dir: run_dir / rundir.REPORT_FILE)
    probe, _ = fake_probe(tmp_path, replay=VIT_RUN)
    out = tmp_path / "run"
    with deadline(60):
        result = runner.invoke(
            app,
            ["sweep", "--torch-trace", str(VIT), "--observer", "cupti", "--no-reference",
             "--probe-python", probe.python, "--gpu-label", "h100", "--out", str(out)],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    kept = read_trace_record(out)
    assert kept is not None
    assert kept == replace(run_record(out, read_trace(VIT)), trace=kept.trace)
    assert kept.trace == str(VIT)


def test_a_merged_trace_audit_keeps_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--shard I/N` parts of the ViT audit, each with the whole plan's trace.json (what the sweep
    writes into every part), merge into one run that keeps it."""
    from cublas_audit.jobs import merge
    from tests.test_merge import split

    shards = split(VIT_RUN, 2, tmp_path)
    for shard in shards:
        (shard / TRACE_FILE).write_bytes((VIT_RUN / TRACE_FILE).read_bytes())
    monkeypatch.setattr(merge, "write_run_report", lambda out: out / rundir.REPORT_FILE)
    out = tmp_path / "merged"
    merge.run(merge.MergeJob(shards, out, command=["merge"]))
    assert read_trace_record(out) == read_trace_record(VIT_RUN)
