"""table/inputs.py pinned (issue 39 item 6): which inputs give which datasets, titled how, with
which env, on the H100 smoke run (tests/fixtures/h100-smoke) and the bundled audits. Its table is
read once per module; the tests that only need a table's labels hand `inputs` a stand-in reader
(reading and checking a table is table.validation's, pinned in test_validation_bounds)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table import inputs
from cublas_audit.table.env_record import EnvRecord
from cublas_audit.table.validation import read_table
from tests.conftest import FIXTURES, REPORTS

SMOKE = FIXTURES / "h100-smoke"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def smoke() -> pd.DataFrame:
    return read_table(SMOKE)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """The smoke run's env.json and plan.json (its table is handed in as `frame`)."""
    for name in ("env.json", "plan.json"):
        shutil.copy(SMOKE / name, tmp_path / name)
    return tmp_path


def edit_env(run: Path, **changes: Any) -> None:
    env = json.loads((run / "env.json").read_text())
    (run / "env.json").write_text(json.dumps({**env, **changes}))


def labels(*pairs: tuple[str, str | None]) -> pd.DataFrame:
    return pd.DataFrame({"gpu_label": [p[0] for p in pairs], "gpu_name": [p[1] for p in pairs]})


def test_a_dataset_takes_env_json_as_it_is_or_its_record(smoke: pd.DataFrame) -> None:
    given = inputs.Dataset("t", "h100", SMOKE, smoke, {"gpu_name": "x"})  # type: ignore[arg-type]
    assert isinstance(given.env, EnvRecord) and given.env.gpu_name == "x"
    record = EnvRecord.of({"gpu_name": "y"})
    assert inputs.Dataset("t", "h100", SMOKE, smoke, record).env is record


def test_the_bundled_runs_are_each_gpus_newest_batched_run(tmp_path: Path) -> None:
    bundled = inputs.bundled_runs()  # (reports/, under the package's name for it)
    assert [f"{p.parent.name}/{p.name}" for p in bundled] == [
        "h100/20261123-145452-batched",
        "h200/20261123-083048-batched",
    ]
    assert bundled[0].samefile(REPORTS / "h100" / "20261123-145452-batched")
    for name in ("20260101-000000-batched", "20260202-000000-batched", "20270101-000000-single"):
        (tmp_path / "g" / name).mkdir(parents=True)
        (tmp_path / "g" / name / "dispatch.csv").write_text("x\n")
    (tmp_path / "notes.txt").write_text("")
    assert inputs.bundled_runs(tmp_path) == [tmp_path / "g" / "20260202-000000-batched"]
    with pytest.raises(AuditError, match="no bundled audits under"):
        inputs.bundled_runs(tmp_path / "g")


def test_a_run_directory_is_its_table_and_env(smoke: pd.DataFrame, run: Path) -> None:
    got = inputs.load_run(run, smoke.assign(extra=1))  # as this process wrote it: not re-read
    assert got.title == f"h100: {H100}" and got.gpu_label == "h100"
    assert got.frame["extra"].tolist() == [1] * 11
    assert got.env.sm_count == 132 and got.candidates is None and got.trace is None
    # a table from before the sm_count column: env.json's count, as Int64
    assert "sm_count" not in smoke.columns
    assert got.frame["sm_count"].tolist() == [132] * 11
    assert str(got.frame["sm_count"].dtype) == "Int64"
    edit_env(run, sm_count=None)
    assert "sm_count" not in inputs.load_run(run, smoke).frame.columns
    kept = inputs.load_run(run, smoke.assign(sm_count=7)).frame["sm_count"].tolist()
    assert kept == [7] * 11


def test_a_run_table_must_hold_its_plan(smoke: pd.DataFrame, run: Path) -> None:
    with pytest.raises(AuditError, match=r"case\(s\) of plan\.json have no row"):
        inputs.load_run(run, smoke.iloc[:-1])
    (run / "plan.json").unlink()  # no plan: nothing to hold
    assert len(inputs.load_run(run, smoke.iloc[:-1]).frame) == 10


def test_a_run_over_two_models_is_one_dataset_each_where_allowed(
    smoke: pd.DataFrame, run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mixed = smoke.assign(gpu_label=["h100"] * 6 + ["h200"] * 5)
    with pytest.raises(
        AuditError, match=r"row 7, column 'gpu_label': mixes GPUs \('h200' here, 'h100' in row 1\)"
    ):
        inputs.load_run(run, mixed)
    edit_env(run, allow_mixed=True)
    assert len(inputs.load_run(run, mixed).frame) == 11
    monkeypatch.setattr(inputs, "read_table", lambda path: mixed)
    got = inputs.load_inputs([run])
    assert [(d.gpu_label, len(d.frame)) for d in got] == [("h100", 6), ("h200", 5)]
    edit_env(run, allow_mixed=False)
    monkeypatch.setattr(inputs, "read_table", lambda path: smoke)
    (one,) = inputs.load_inputs([run])
    assert one.frame is not smoke or len(one.frame) == 11


def test_a_table_file_gives_a_dataset_per_label(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    frame = labels(("h100", H100), ("a", None), ("h100", H100), ("a", "A"))
    monkeypatch.setattr(inputs, "read_table", lambda path: frame)
    got = inputs.load_inputs([tmp_path / "t.csv"])
    assert [(d.title, list(d.frame.index)) for d in got] == [
        (f"h100: {H100}", [0, 2]),
        ("a: A", [1, 3]),
    ]
    same = labels(("h100", None), ("h100", "h100"))
    monkeypatch.setattr(inputs, "read_table", lambda path: same)
    (one,) = inputs.load_inputs([tmp_path / "t.csv"])
    assert one.frame is same and one.title == "h100"  # a name that is the label: said once


def test_one_title_twice_names_each_input(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(inputs, "read_table", lambda path: labels(("h100", H100)))
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    got = inputs.load_inputs([first, second])
    assert [d.title for d in got] == [f"h100: {H100} ({first})", f"h100: {H100} ({second})"]
    monkeypatch.setattr(inputs, "read_table", lambda path: labels((path.stem, None)))
    assert [d.title for d in inputs.load_inputs([first, second])] == ["a", "b"]
    with pytest.raises(AuditError, match="the same table as"):
        inputs.load_inputs([first, tmp_path / "." / "a.csv"])


def test_one_gpu_for_a_diff(
    smoke: pd.DataFrame, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(inputs, "read_table", lambda path: smoke)
    got = inputs.load_one_gpu(SMOKE / "dispatch.csv")
    assert got.title == f"h100: {H100}"
    assert str(got.env.phase) == "time"  # the smoke run's env.json names none: a sweep's
    table = tmp_path / "run" / "dispatch.csv"
    table.parent.mkdir()
    (table.parent / "env.json").write_text(json.dumps({"phase": "map"}))
    assert str(inputs.load_one_gpu(table).env.phase) == "map"
    (table.parent / "env.json").write_text("{")  # broken: the table alone is still a table
    assert str(inputs.load_one_gpu(table).env.phase) == "time"
    other = tmp_path / "run" / "other.csv"
    (table.parent / "env.json").write_text(json.dumps({"phase": "map"}))
    assert str(inputs.load_one_gpu(other).env.phase) == "time"  # not the run's own table
    monkeypatch.setattr(inputs, "read_table", lambda path: labels(("a", None), ("b", None)))
    with pytest.raises(AuditError, match="mixes GPUs"):
        inputs.load_one_gpu(other)


def test_an_atlas_for_a_diff_has_its_maps_env(
    smoke: pd.DataFrame, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(inputs, "is_atlas", lambda path: True)
    monkeypatch.setattr(inputs, "read_atlas", lambda path: (smoke, {"env": {"gpu_name": "G"}}))
    assert inputs.load_one_gpu(tmp_path).title == "h100: G"
    monkeypatch.setattr(inputs, "read_atlas", lambda path: (smoke, {}))
    assert inputs.load_one_gpu(tmp_path).title == f"h100: {H100}"  # from the table's column


def test_an_atlas_is_no_report_input(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "atlas.md").write_text("")
    with pytest.raises(AuditError, match="an atlas cut short"):
        inputs.load_inputs([tmp_path])
    for name in ("grid.csv.gz", "kernels.csv", "atlas.json"):
        (tmp_path / name).write_text("")
    with pytest.raises(AuditError, match=r"an atlas directory .* the atlas's report is"):
        inputs.load_inputs([tmp_path])


def test_a_run_with_candidates_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inputs, "read_candidates", lambda path: pd.DataFrame({"from": [path.name]}))
    frame = labels(("h100", None))
    assert inputs._dataset(tmp_path, frame, EnvRecord()).candidates is None
    (tmp_path / "candidates.csv").write_text("")
    got = inputs._dataset(tmp_path, frame, EnvRecord())
    assert got.candidates is not None and got.candidates["from"].tolist() == ["candidates.csv"]
    assert inputs._dataset(tmp_path / "candidates.csv", frame, EnvRecord()).candidates is None


def test_first_value() -> None:
    frame = pd.DataFrame({"g": [None, "x", "y"]})
    assert inputs.first_value(frame, "g") == "x"
    assert inputs.first_value(frame.iloc[:1], "g") == ""
    assert inputs.first_value(frame, "missing") == ""


def test_the_first_row_names_the_gpu_a_mixed_table_is_measured_against() -> None:
    frame = labels(("a", None), ("b", None), ("b", None))
    with pytest.raises(AuditError) as caught:
        inputs.require_one_gpu(frame, Path("t.csv"))
    assert str(caught.value) == (
        "t.csv, row 2, column 'gpu_label': mixes GPUs ('b' here, 'a' in row 1); one GPU is expected"
    )
    inputs.require_one_gpu(labels(("a", None), ("a", "x")), Path("t.csv"))
