"""An interrupted `atlas` leaves a directory that reads as cut short, never as a whole atlas
(issue 38, item 4): atlas.md and atlas.json are written last and an earlier atlas's are removed
first, and `diff` and `report` refuse an atlas without them in one line, exit 2. On the recorded
H100 FP32 map of 3,000 random problems."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.report import atlas_report, map_plots
from cublas_audit.table.atlas_files import ATLAS_JSON, ATLAS_REPORT, GRID_FILE, KERNELS_FILE
from tests.conftest import REPORTS, without_pictures

FP32 = REPORTS / "h100" / "maps" / "20261125-092546-fp32-random"
runner = CliRunner()


def interrupted(*_: object, **__: object) -> None:
    raise KeyboardInterrupt


@pytest.fixture(scope="module")
def whole(fp32_atlas: Path) -> Path:
    return fp32_atlas  # made once for the session (tests/conftest.py); copied before a change


def refused(path: Path) -> None:
    """diff (either side) and report of `path` are one line, exit 2, naming the atlas cut short."""
    for args in (
        ["diff", str(FP32), str(path)],
        ["diff", str(path), str(FP32)],
        ["report", str(path)],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.stdout == ""
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert f"error: {path}: an atlas cut short" in result.stderr
        assert "`atlas` was interrupted or failed there" in result.stderr


def atlas_stopped_at(monkeypatch: pytest.MonkeyPatch, where: str, out: Path) -> Path:
    with monkeypatch.context() as patch:
        # stopped after the pictures: none drawn (tests/test_atlas.py's bf16 atlas draws them)
        patch.setattr(map_plots, "draw", without_pictures)
        patch.setattr(*_STOPS[where], interrupted)
        result = runner.invoke(app, ["atlas", str(FP32), "--out", str(out)])
    assert result.exit_code == 130, result.output
    return out / "fp32"


_STOPS: dict[str, tuple[object, str]] = {
    "pictures": (map_plots, "draw"),  # the longest step: tables and findings.json written
    "atlas.json": (atlas_report, "write_atlas_json"),  # everything but the last file
}


@pytest.mark.parametrize("where", sorted(_STOPS))
def test_ctrl_c_leaves_an_atlas_that_diff_and_report_refuse(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    partial = atlas_stopped_at(monkeypatch, where, tmp_path)
    assert (partial / GRID_FILE).is_file() and (partial / KERNELS_FILE).is_file()
    assert not (partial / ATLAS_JSON).exists()
    refused(partial)


def test_an_atlas_made_again_and_interrupted_is_no_longer_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, whole: Path
) -> None:
    """The earlier atlas's atlas.md and atlas.json would otherwise stand beside the new tables."""
    out = tmp_path / "out"
    shutil.copytree(whole, out / "fp32")
    partial = atlas_stopped_at(monkeypatch, "pictures", out)
    assert not (partial / ATLAS_JSON).exists() and not (partial / ATLAS_REPORT).exists()
    refused(partial)


@pytest.mark.parametrize("lost", [ATLAS_REPORT, ATLAS_JSON, KERNELS_FILE])
def test_an_atlas_without_one_of_its_files_is_refused(
    tmp_path: Path, whole: Path, lost: str
) -> None:
    # atlas.json without atlas.md: what an atlas cut short in its pictures left before atlas.json
    # was written last
    partial = tmp_path / "fp32"
    shutil.copytree(whole, partial)
    (partial / lost).unlink()
    refused(partial)


def test_a_whole_atlas_is_still_diffed(whole: Path) -> None:
    result = runner.invoke(app, ["diff", str(FP32), str(whole)])
    assert result.exit_code == 0, result.output
    assert "3000 cases on both sides" in result.output
