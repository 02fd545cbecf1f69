"""Issue 38: large tables. A table read straight into its types (validation.typed_csv) is the table
reading every cell as text gives, its text columns holding one string per distinct value; a value
the typed reading cannot take is named as the text reading always named it; a Markdown report cut
to LISTED_MAX rows a table and findings a severity says what it cut, and the JSON stays whole.

On real tables: the H100 map follow-up's 155 problems (tests/fixtures/h100-map-10k-n192, 21
findings), the H100 batched run with its stall breakdown and reference timings
(reports/h100/20261123-145452-batched), and the recorded cuBLAS batched run.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from cublas_audit.errors import AuditError
from cublas_audit.report import candidates_report, render, terminal
from cublas_audit.table.dispatch import TableSource, validate
from cublas_audit.table.text import PER_ROW_TEXT
from cublas_audit.table.validation import read_table, typed_csv
from tests.conftest import FIXTURES, REPORTS, audited_run

MAP = FIXTURES / "h100-map-10k-n192" / "dispatch.csv"
BATCHED = REPORTS / "h100" / "20261123-145452-batched"
TABLES = [MAP, BATCHED / "dispatch.csv", FIXTURES / "h100-batched-cublas" / "dispatch.csv"]


def _as_text(path: Path) -> pd.DataFrame:
    """The table as reading every cell as text gives it (what read_table falls back on)."""
    raw = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    return validate(raw, TableSource(path))


def _edited(target: Path, column: str, value: str, row: int = 3) -> Path:
    """MAP copied to `target` with `column` of data row `row` (1 = the first) set to `value`."""
    with MAP.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[row - 1][column] = value
    with target.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return target


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.parent.name)
def test_the_typed_reading_gives_the_text_readings_table(path: Path) -> None:
    typed = typed_csv(path)
    assert typed is not None  # pyarrow is in the dev extras: this is the path a table takes
    pd.testing.assert_frame_equal(validate(typed, TableSource(path)), _as_text(path))


def test_text_columns_hold_one_string_per_distinct_value() -> None:
    frame = read_table(MAP)
    for column in ("gpu_label", "api", "mode", "routine", "traced_kernels", "gpu_name"):
        values = frame[column]
        assert values.dtype == pd.StringDtype("python"), column
        # every row of a value points to the same string: 8 bytes a row, whatever its length
        assert len({id(v) for v in values.dropna()}) == values.nunique(), column
    for column in PER_ROW_TEXT:  # a value a row: pyarrow's compact storage
        assert frame[column].dtype == pd.StringDtype()
    assert frame["m"].dtype == pd.Int64Dtype() and frame["time_ms"].dtype == pd.Float64Dtype()


def test_a_number_the_typed_reading_refuses_is_named_as_the_text_reading_names_it(
    tmp_path: Path,
) -> None:
    # NaN parses as a float, but is no number to the text reading
    with pytest.raises(AuditError, match=r"row 3, column 'beta': expected a number, got 'nan'"):
        read_table(_edited(tmp_path / "nan.csv", "beta", "nan"))


def test_a_whole_number_written_as_a_decimal_is_read_as_before(tmp_path: Path) -> None:
    # "64.0" is no int64 to pyarrow; the text reading takes it as 64
    frame = read_table(_edited(tmp_path / "decimal.csv", "m", f"{read_table(MAP).at[2, 'm']}.0"))
    pd.testing.assert_frame_equal(frame, read_table(MAP))


def _cut_to(monkeypatch: pytest.MonkeyPatch, most: int) -> None:
    monkeypatch.setattr(render, "LISTED_MAX", most)
    monkeypatch.setattr(candidates_report, "LISTED_MAX", most)


def test_a_large_tables_markdown_is_cut_and_says_what_was_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    audited = [audited_run(MAP)]
    rows = len(audited[0].rows)  # one call kind: one dispatch table
    medium = sum(f.severity == "medium" for f in audited[0].findings)
    assert medium > 5
    whole = render.render_report(audited)
    assert "more sizes" not in whole and "not shown" not in whole
    _cut_to(monkeypatch, 5)
    text = render.render_report(audited)
    dispatch = text.split("### Dispatch")[1].split("###")[1]
    assert len([line for line in dispatch.splitlines() if line.startswith("| ")]) == 1 + 5
    assert (
        f"... and {rows - 5} more sizes (the first 5 by size are shown; the dispatch table holds "
        "every row)." in dispatch
    )
    assert text.count("- **medium**") == 5
    cut = f"- ... and {medium - 5} more medium findings (`--format json` lists every finding)."
    assert cut in text
    assert f"{medium - 5} findings and {rows - 5} table rows are not shown" in text
    # the JSON is never cut
    assert sum(f["severity"] == "medium" for f in render.findings_json(audited)) == medium


def test_the_efficiency_and_candidates_tables_are_cut_too(monkeypatch: pytest.MonkeyPatch) -> None:
    audited = [audited_run(BATCHED)]
    timed = audited[0].rows.dropna(subset=["time_ms", "ref_time_ms"])
    assert audited[0].candidates is not None
    cases = len(audited[0].candidates.summary)
    _cut_to(monkeypatch, 1)
    text = render.render_report(audited)
    efficiency = text.split("### Efficiency (reference vs cuBLAS)")[1].split("###")[0]
    assert len([line for line in efficiency.splitlines() if line.startswith("| ")]) == 1 + 1
    assert (
        f"... and {len(timed) - 1} more rows (the first 1 by call and size are shown; the "
        "dispatch table holds every row)." in efficiency
    )
    assert f"... and {cases - 1} more cases (candidates.csv holds every case)." in text


def test_the_terminal_view_is_cut_too(monkeypatch: pytest.MonkeyPatch) -> None:
    audited = [audited_run(MAP)]
    rows, found = len(audited[0].rows), len(audited[0].findings)
    monkeypatch.setattr(terminal, "LISTED_MAX", 5)
    console = Console(record=True, width=200)
    terminal.show(audited, console)
    shown = console.export_text()
    assert shown.count("│ medium") == 5  # a findings table row each
    assert f"... and {found - 5} more findings (`--format json` lists every one)." in shown
    assert f"... and {rows - 5} more sizes (the dispatch" in shown  # a caption: wrapped
