"""Property: whatever a table holds, `report` and `diff` answer with an exit code of the contract,
never an internal error, and never 1 unless the gate was asked and a regression is reported.

Tables start as real recorded rows (the H100's bundled batched audit) and are then corrupted at
random the way files get corrupted: cells replaced by any text or number, columns dropped, rows
repeated or lost, the file cut at any byte, times scaled.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cublas_audit.cli import app
from tests.conftest import REPORTS

runner = CliRunner()
BASE = REPORTS / "h100" / "20261123-145452-batched" / "dispatch.csv"
ROWS = 12  # enough for every rule's grouping, small enough for many examples
REAL = pd.read_csv(BASE, dtype=str, keep_default_na=False).head(ROWS)
REAL_CSV = REAL.to_csv(index=False)

cells = st.one_of(
    st.text(max_size=12),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.sampled_from(["", " ", "nan", "inf", "-inf", "1e400", "0", "-0.0", "NA", "None"]),
)


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    frame = REAL.copy()
    for _ in range(draw(st.integers(0, 4))):
        action = draw(st.sampled_from(["cell", "drop", "repeat", "lose", "scale"]))
        row = draw(st.integers(0, len(frame) - 1)) if len(frame) else 0
        column = draw(st.sampled_from(list(frame.columns)))
        if action == "cell" and len(frame):
            frame.iloc[row, frame.columns.get_loc(column)] = draw(cells)
        elif action == "drop" and len(frame.columns) > 1:
            frame = frame.drop(columns=[column])
        elif action == "repeat" and len(frame):
            frame = pd.concat([frame, frame.iloc[[row]]], ignore_index=True)
        elif action == "lose" and len(frame):
            frame = frame.drop(index=frame.index[row]).reset_index(drop=True)
        elif action == "scale" and "time_ms" in frame.columns and len(frame):
            factor = draw(st.floats(0.5, 2.0))
            value = pd.to_numeric(frame.at[row, "time_ms"], errors="coerce")
            if not math.isnan(value):
                frame.at[row, "time_ms"] = repr(float(value) * factor)
    text = frame.to_csv(index=False).encode()
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return text


@settings(  # as many examples as the profile says (tests/conftest.py): each runs the CLI twice
    derandomize=True,  # the same examples on every run: CI never fails by the luck of a draw
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(table=corrupted())
def test_report_and_diff_keep_the_exit_code_contract(tmp_path: Path, table: bytes) -> None:
    baseline = tmp_path / "baseline.csv"
    baseline.write_text(REAL_CSV)
    path = tmp_path / "fuzzed.csv"
    path.write_bytes(table)

    report = runner.invoke(app, ["report", "--format", "md", str(path)])
    assert report.exit_code in (0, 2), _why(report)

    gate = runner.invoke(app, ["diff", str(baseline), str(path), "--fail-on", "regression"])
    assert gate.exit_code in (0, 1, 2), _why(gate)  # plain diff shares the path, minus the gate
    if gate.exit_code == 1:  # a 1 is a regression the diff itself reports, with its case
        assert "## Regressions" in gate.stdout, gate.stdout
    if gate.exit_code == 2 or report.exit_code == 2:
        errors = (gate.stderr or report.stderr).strip().splitlines()
        assert len(errors) == 1 and errors[0].startswith("error: ")


def _why(result: object) -> str:
    out = io.StringIO()
    out.write(getattr(result, "output", ""))
    exception = getattr(result, "exception", None)
    if exception is not None:
        out.write(f"\n{type(exception).__name__}: {exception}")
    return out.getvalue()
