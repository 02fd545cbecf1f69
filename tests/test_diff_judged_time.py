"""A diff row shows the time its verdict judged and says which (issue 38, item 5): cuBLAS 13.10
against 13.1 on the H100 (reports/h100/versions, the bundled reports/diffs/
h100-cublas-13.1-vs-13.10-single.md) judged SGEMM 1024^3 an improvement on its kernels' time
(-5.1 %) while its call's time went up (0.0685 -> 0.0716 ms), and the row showed only the call's.
Expected times are read from the runs' dispatch.csv with pandas alone."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.judge import diff
from cublas_audit.table.inputs import load_one_gpu

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ROOT / "reports" / "h100" / "versions"
OLD = VERSIONS / "20261123-224222-cublas-13.1-single"
NEW = VERSIONS / "20261123-224222-cublas-13.10-single"
RERUN = ROOT / "tests" / "fixtures" / "h100-map-rerun"
KERNEL_B = ROOT / "reports" / "h100" / "noise" / "kernel-b" / "run-00"
runner = CliRunner()


def section(text: str, title: str) -> list[dict[str, str]]:
    """The rows of the Markdown table under `## title`, by header."""
    lines = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0].strip().splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines if "|" in line]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[2:]]


def recorded(run: Path, routine: str, size: int) -> pd.Series:
    table = pd.read_csv(run / "dispatch.csv")
    at = (table["routine"] == routine) & (table["m"] == size) & (table["n"] == size)
    (row,) = table[at & (table["k"] == size) & (table["batch"] == 1)].to_dict("records")
    return pd.Series(row)


@functools.cache
def diffed(a: Path, b: Path) -> str:
    """`cublas-audit diff A B` as the terminal shows it, once per process for the tests that
    read the same pair."""
    result = runner.invoke(app, ["diff", str(a), str(b)])
    assert result.exit_code == 0, result.output
    return result.output


def shown(ms: float) -> str:
    """A time as the table shows it: 4 decimals (evidence values), then 4 significant digits."""
    return f"{round(ms, 4):.4g}"


def test_an_improvement_on_kernel_time_shows_the_kernel_times() -> None:
    rows = section(diffed(OLD, NEW), "Improvements")
    row = next(r for r in rows if r["routine"] == "cublasSgemm" and r["shape"] == "1024")
    old, new = recorded(OLD, "cublasSgemm", 1024), recorded(NEW, "cublasSgemm", 1024)
    assert new["time_ms"] > old["time_ms"]  # the call went up: 0.0685 -> 0.0716 ms
    assert new["kernel_time_ms"] < old["kernel_time_ms"]  # the kernels went down
    assert row["judged on"] == "kernels"
    assert (row["ms A"], row["ms B"]) == (
        shown(old["kernel_time_ms"]),
        shown(new["kernel_time_ms"]),
    )
    assert row["time change (how sure)"].startswith("kernels -5.1 %")


def test_every_verdict_row_moves_the_way_its_section_says() -> None:
    """Regressions show B slower than A, improvements faster, on the time shown, in every recorded
    pair with such rows (the versions' single and batched runs)."""
    seen = 0
    for kind in ("single", "batched"):
        old, new = (VERSIONS / f"20261123-224222-cublas-{v}-{kind}" for v in ("13.1", "13.10"))
        text = diffed(old, new)
        for title, slower in (("Regressions", True), ("Improvements", False)):
            rows = section(text, title) if f"## {title}\n" in text else []
            for row in rows:
                assert (float(row["ms B"]) > float(row["ms A"])) is slower, row
                assert row["time change (how sure)"].startswith(row["judged on"] + " "), row
                seen += 1
    assert seen == 3  # 1 regression and 2 improvements, all judged on kernels


def test_unsure_map_rows_show_their_kernel_times() -> None:
    """Two runs of one FP32 map: the 12 unsure problems are judged on their kernels' time, and
    6 of their calls moved the other way."""
    first, second = (pd.read_csv(RERUN / f"{n}.csv") for n in ("first", "second"))
    result = diff.compare(load_one_gpu(RERUN / "first.csv"), load_one_gpu(RERUN / "second.csv"))
    unsure = result.rows("unsure")
    assert len(unsure) == 12 and set(unsure["judged_on"]) == {"kernel"}
    key = ["m", "n", "k"]
    expected = first.merge(second, on=key, suffixes=("_a", "_b")).set_index(key)
    for row in unsure.to_dict("records"):
        sides = expected.loc[(row["m"], row["n"], row["k"])]
        assert row["judged_ms_a"] == sides["kernel_time_ms_a"]
        assert row["judged_ms_b"] == sides["kernel_time_ms_b"]
    text = runner.invoke(app, ["diff", str(RERUN / "first.csv"), str(RERUN / "second.csv")])
    rows = section(text.output, "Unsure: changes the noise floor cannot tell from noise")
    assert len(rows) == 12 and {r["judged on"] for r in rows} == {"kernels"}


def test_json_names_the_judged_time() -> None:
    result = runner.invoke(app, ["diff", str(OLD), str(NEW), "--format", "json"])
    (row,) = [
        r
        for r in json.loads(result.output)["improvements"]
        if r["routine"] == "cublasSgemm" and r["shape"] == "1024"
    ]
    old = recorded(OLD, "cublasSgemm", 1024)
    assert row["judged_on"] == "kernel"
    assert row["judged_ms_a"] == round(old["kernel_time_ms"], 4)  # 0.057249
    assert row["time_ms_a"] == round(old["time_ms"], 4)


def test_the_host_section_shows_the_call_times(tmp_path: Path) -> None:
    """A call 50 % slower over its unchanged kernels (run-00's 1024^3 batch 8, its call's times
    scaled): the row is there for its call, and shows the call's times."""
    run = load_one_gpu(KERNEL_B)
    frame = run.frame.copy()
    case = frame["case_id"] == "cublas.fp32.1024x1024x1024.b8.nn"
    columns = [c for c in frame.columns if c.startswith("time") and c.endswith("_ms")]
    frame.loc[case, columns] = frame.loc[case, columns].astype(float) * 1.5
    slowed = tmp_path / "slowed.csv"
    frame.to_csv(slowed, index=False)
    text = runner.invoke(app, ["diff", str(KERNEL_B / "dispatch.csv"), str(slowed)]).output
    (row,) = section(
        text, "Call slower, kernels not: the host's share (informational unless --fail-on host)"
    )
    call = float(frame.loc[case, "time_ms"].iloc[0])
    assert row["judged on"] == "call" and row["ms B"] == shown(call)
