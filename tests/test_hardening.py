"""Bad input never passes for a finding, a regression or a crash: the exit-code contract through the
CLI, impossible values refused, hostile text inert in every report, no input overwritten.

Every table here is a real recorded one (the H100's bundled batched audit), copied and then broken
the way a user's file can be: a value out of range, a row cut off, text in a label.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit import cli
from cublas_audit.cli import app
from cublas_audit.report.markdown import md_code, md_fence, md_text
from tests.conftest import REPORTS

runner = CliRunner()
H100_RUN = REPORTS / "h100" / "20261123-145452-batched"
H200_RUN = REPORTS / "h200" / "20261123-083048-batched"
CONTRACT = {0, 1, 2, 3, 4, 130}


def real_table(tmp_path: Path, name: str = "t.csv") -> tuple[pd.DataFrame, Path]:
    frame = pd.read_csv(H100_RUN / "dispatch.csv", dtype=str, keep_default_na=False)
    return frame, tmp_path / name


def write(frame: pd.DataFrame, path: Path) -> Path:
    frame.to_csv(path, index=False)
    return path


# ----- exit codes ----------------------------------------------------------------
def test_exit_0_report_and_1_only_for_a_real_regression(tmp_path: Path) -> None:
    assert runner.invoke(app, ["report", "--format", "md", str(H100_RUN)]).exit_code == 0
    frame, path = real_table(tmp_path)
    # Plant a real slowdown: the 8192^3 batch 16 cuBLAS call 30 % slower (recorded 336.4 ms).
    row = (frame["case_id"] == "cublas.fp32.8192x8192x8192.b16.nn") & (frame["role"] == "main")
    recorded = float(frame.loc[row, "time_ms"].iloc[0])
    frame.loc[frame["case_id"] == "cublas.fp32.8192x8192x8192.b16.nn", "time_ms"] = str(
        recorded * 1.3
    )
    slowed = write(frame, path)
    gate = runner.invoke(
        app, ["diff", str(H100_RUN / "dispatch.csv"), str(slowed), "--fail-on", "regression"]
    )
    assert gate.exit_code == 1, gate.output
    assert "8192" in gate.output
    same = runner.invoke(app, ["diff", str(H100_RUN), str(H100_RUN), "--fail-on", "regression"])
    assert same.exit_code == 0


def test_exit_2_bad_input_and_3_missing_gpu(tmp_path: Path) -> None:
    bad = runner.invoke(app, ["report", str(tmp_path / "absent.csv")])
    assert bad.exit_code == 2
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: ")
    if shutil.which("nvidia-smi") is None:
        missing = runner.invoke(app, ["sweep", "--sizes", "256", "--out", str(tmp_path / "run")])
        assert missing.exit_code == 3
        assert "no NVIDIA GPU" in missing.stderr
        assert not (tmp_path / "run").exists()  # a run that never started leaves nothing


def test_exit_4_internal_error_names_its_log(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr("cublas_audit.jobs.report.run", broken)
    result = runner.invoke(app, ["report", "--format", "md"])
    assert result.exit_code == cli.INTERNAL_ERROR == 4
    log = re.search(r"traceback: (\S+)\)", result.stderr)
    assert log, result.stderr
    assert "ZeroDivisionError" in Path(log.group(1)).read_text()
    Path(log.group(1)).unlink()


def test_exit_130_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("cublas_audit.jobs.report.run", interrupted)
    assert runner.invoke(app, ["report", "--format", "md"]).exit_code == 130


def test_gate_with_nothing_compared_is_bad_input() -> None:
    single = REPORTS / "h100" / "20261123-145452-single"
    result = runner.invoke(app, ["diff", str(H100_RUN), str(single), "--fail-on", "regression"])
    assert result.exit_code == 2
    assert "share no case" in result.stderr


# ----- impossible values -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("fma_pct", "140", "140.0 is out of range"),
        ("fma_pct", "-3", "-3.0 is out of range"),
        ("time_ms", "0", "0.0 is out of range"),
        ("time_ms", "inf", "inf is out of range"),
        ("ref_time_ms", "-1", "-1.0 is out of range"),
        ("m", "9999999999", "at most 2147483647"),
        ("m", "9.223372036854776e+18", "expected an integer"),  # past int64, found by the fuzz
        ("api", "cublasXt", "unknown api 'cublasXt'"),
    ],
)
def test_impossible_values_are_refused_with_file_row_and_column(
    tmp_path: Path, column: str, value: str, message: str
) -> None:
    frame, path = real_table(tmp_path)
    frame.loc[2, column] = value
    result = runner.invoke(app, ["report", "--format", "md", str(write(frame, path))])
    assert result.exit_code == 2
    assert f"t.csv, row 3, column {column!r}" in result.stderr
    assert message in result.stderr


@pytest.mark.parametrize("column", ["stall_wait", "fma_pct", "time_ms", "kernel"])
def test_an_all_empty_column_is_reported_not_crashed(tmp_path: Path, column: str) -> None:
    frame, path = real_table(tmp_path)
    frame[column] = ""
    result = runner.invoke(app, ["report", "--format", "md", str(write(frame, path))])
    assert result.exit_code == 0, result.output


def test_a_case_recorded_twice_is_refused(tmp_path: Path) -> None:
    frame, path = real_table(tmp_path)
    twice = pd.concat([frame, frame.iloc[[0]].assign(time_ms="0.5")], ignore_index=True)
    result = runner.invoke(app, ["diff", str(H100_RUN), str(write(twice, path))])
    assert result.exit_code == 2
    assert f"row {len(frame) + 1}: the case of row 1 appears again" in result.stderr


def test_a_table_cut_mid_row_is_refused(tmp_path: Path) -> None:
    text = (H100_RUN / "dispatch.csv").read_text()
    cut = tmp_path / "cut.csv"
    cut.write_text(text[: text.index("\n", len(text) // 2) - 40])  # inside a kernel name
    result = runner.invoke(app, ["diff", str(H100_RUN), str(cut), "--fail-on", "regression"])
    assert result.exit_code == 2
    assert "ends mid-row" in result.stderr


def test_a_run_whose_table_lost_cases_of_its_plan_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(H100_RUN, run)
    lines = (run / "dispatch.csv").read_text().splitlines(keepends=True)
    (run / "dispatch.csv").write_text("".join(lines[:-5]))  # whole rows, cleanly cut
    result = runner.invoke(app, ["diff", str(H100_RUN), str(run), "--fail-on", "regression"])
    assert result.exit_code == 2
    assert "of plan.json have no row" in result.stderr


@pytest.mark.parametrize("env_text", ["[]", "null", '{"probe_env": "x"}'])
def test_a_broken_env_json_is_bad_input(tmp_path: Path, env_text: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(H100_RUN, run)
    (run / "env.json").write_text(env_text)
    assert runner.invoke(app, ["report", "--format", "md", str(run)]).exit_code == 2
    resumed = runner.invoke(app, ["sweep", "--resume", str(run)])
    assert resumed.exit_code == 2, resumed.output


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1.5"])
def test_thresholds_that_would_disable_the_judge_are_refused(value: str) -> None:
    result = runner.invoke(app, ["report", "--threshold", f"low_util_fraction={value}"])
    assert result.exit_code == 2
    assert "must be a number from 0 to 1" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sizes", "٣"], "is not a positive integer"),
        (["--sizes", "99999999999"], "32-bit limit"),
        (["--sizes", ""], "--sizes and --shapes are both empty"),
        (["--layouts", "nx"], "--layouts: unknown value 'nx'"),
        (["--beta", "nan"], "--beta: 'nan' is not a finite number"),
        (["--bias", "--api", "cublas"], "cuBLASLt settings"),
        (["--broadcast", "c", "--batched"], "--broadcast"),
        (["--sizes", "1000000"], "no GPU holds it"),
        (["--probe-python", "/nonexistent/python"], "--probe-python"),
        (["--cublas-lib", "/nonexistent"], "--cublas-lib"),
    ],
)
def test_sweep_arguments_are_checked_before_the_gpu(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["sweep", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


# ----- data loss ----------------------------------------------------------------------------------
def test_report_never_overwrites_its_input(tmp_path: Path) -> None:
    frame, path = real_table(tmp_path)
    table = write(frame, path)
    before = table.read_bytes()
    result = runner.invoke(app, ["report", str(table), "--out", str(table)])
    assert result.exit_code == 2 and "would overwrite the input" in result.stderr
    run = tmp_path / "run"
    shutil.copytree(H100_RUN, run)
    result = runner.invoke(app, ["report", str(run), "--out", str(run / "dispatch.csv")])
    assert result.exit_code == 2
    assert table.read_bytes() == before
    assert (run / "dispatch.csv").read_bytes() == (H100_RUN / "dispatch.csv").read_bytes()


def test_report_json_out_writes_strict_json(tmp_path: Path) -> None:
    out = tmp_path / "findings.json"
    result = runner.invoke(app, ["report", "--format", "json", "--out", str(out), str(H100_RUN)])
    assert result.exit_code == 0
    findings = json.loads(out.read_text(), parse_constant=lambda name: pytest.fail(name))
    # Measured on this H100 (reports/README.md): cuBLASLt's default at FP32 256^3 batch 8.
    assert any(f["rule"] == "better-candidate" and f["batch"] == 8 for f in findings)


# ----- hostile text --------------------------------------------------------------
HOSTILE = (
    "x\n# injected heading\n| a | b |\n``` <script>alert(1)</script> &lt; \u202eevil\u2066 ~~s~~"
)


def test_escaping_keeps_hostile_text_on_one_inert_line() -> None:
    for rendered in (md_text(HOSTILE), md_code(HOSTILE), md_code(HOSTILE, in_table=False)):
        assert "\n" not in rendered
        assert "\u202e" not in rendered and "\u2066" not in rendered
    assert "<script>" not in md_text(HOSTILE)  # in a code span it is shown, not run
    assert r"\u202e" in md_text(HOSTILE) and r"\#" in md_text(HOSTILE)
    code = md_code("a```b")
    assert code.startswith("````") and code.endswith("````")
    fence = md_fence("echo ````\nrm", "sh")
    assert fence.startswith("`````sh\n") and fence.endswith("\n`````")


def test_hostile_fields_reach_report_and_diff_inert(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(H100_RUN, run)
    frame = pd.read_csv(run / "dispatch.csv", dtype=str, keep_default_na=False)
    for column in ("gpu_label", "kernel", "kernel_short", "gpu_name", "routine"):
        frame[column] = frame[column].where(frame[column] == "", frame[column] + HOSTILE)
    frame.to_csv(run / "dispatch.csv", index=False)
    env = json.loads((run / "env.json").read_text())
    env["command"] = ["cublas-audit", "sweep", "--gpu-label", HOSTILE]
    env["gpu_name"] = HOSTILE
    (run / "env.json").write_text(json.dumps(env))
    report = runner.invoke(app, ["report", "--format", "md", str(run)])
    diff = runner.invoke(app, ["diff", str(run), str(run)])
    for result in (report, diff):
        assert result.exit_code == 0, result.output
        assert "\u202e" not in result.stdout and "\u2066" not in result.stdout
        # What Markdown would render as markup: the text outside fences and code spans.
        prose = re.sub(r"(`{3,})[^\n]*\n[\s\S]*?\n\1", "", result.stdout)
        prose = re.sub(r"(`+).+?\1", "", prose)
        assert "<script>" not in prose
        assert not any(line.startswith("# injected") for line in prose.splitlines())
        for line in result.stdout.splitlines():  # no row split: each table row ends its row
            if line.startswith("|"):
                assert line.rstrip().endswith("|")


def test_a_candidates_value_never_becomes_repro_code() -> None:
    from cublas_audit.report.candidates_report import repro
    from cublas_audit.table.candidates_table import read_candidates

    rows = read_candidates(H100_RUN / "candidates.csv")
    row = rows.iloc[0].copy()
    row["tile"] = "64x64)\nimport os; os.system('echo owned')  #"
    script = repro(row)
    imported = {
        alias.name
        for node in ast.walk(ast.parse(script))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "os" not in imported and "TILE_ID," not in script
    assert "# TILE_ID: not set" in script
