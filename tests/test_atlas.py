"""`cublas-audit atlas`: a map run summarised small enough to bundle, checked against the real
recorded H100 maps of 3,000 random problems each, with their follow-up (FP32 and BF16,
reports/h100/maps/20261125-092546-*-random). Every expected figure comes from those runs'
dispatch.csv, read here with pandas alone, or from their committed report.md.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.jobs.atlas import AtlasJob
from cublas_audit.jobs.atlas import run as atlas
from cublas_audit.report import map_plots
from cublas_audit.report.map_plots import _nearest_k_slices
from cublas_audit.table import rundir
from cublas_audit.table.atlas_files import ATLAS_REPORT, GRID_FILE, KERNELS_FILE
from cublas_audit.table.inputs import load_one_gpu
from tests.conftest import (
    REPORTS,
    atlas_made_by_the_command,
    once_per_session,
    without_pictures,
)

MAPS = REPORTS / "h100" / "maps"
FP32 = MAPS / "20261125-092546-fp32-random"
BF16 = MAPS / "20261125-092546-bf16-random"
SWEEP = REPORTS / "h100" / "20261123-094558-batched"
runner = CliRunner()


@pytest.fixture(scope="module")
def fp32(fp32_atlas: Path) -> Path:
    return fp32_atlas  # made once for the session (tests/conftest.py)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BF16 map's atlas with its pictures, made by the command once for the session: under
    pytest-xdist the worker that makes it keeps it where it was made (its path, not the
    directory, is shared: atlas.md names the --out it was made with), the tests only read it."""

    def work() -> str:
        return str(atlas_made_by_the_command(BF16, tmp_path_factory.mktemp("atlas")))

    return Path(once_per_session("bf16_atlas", work))


def dispatched(run: Path) -> pd.DataFrame:
    """The run's dispatch.csv as recorded, with the GEMM kernel each problem ran: the `kernel`
    column where ncu named it, else the first kernel CUPTI traced (a split-K reduction follows
    it)."""
    raw = pd.read_csv(run / rundir.TABLE_FILE, dtype={"kernel": str})
    first_traced = raw["traced_kernels"].str.split(" + ", regex=False).str[0]
    return raw.assign(gemm=raw["kernel"].where(raw["kernel"].notna(), first_traced))


def grid_with_names(atlas_dir: Path) -> pd.DataFrame:
    """grid.csv.gz with each kernel id replaced by kernels.csv's name, read with pandas alone."""
    grid = pd.read_csv(atlas_dir / GRID_FILE)
    names = pd.read_csv(atlas_dir / KERNELS_FILE).set_index("id")["kernel"]
    return grid.assign(gemm=grid["kernel"].map(names))


@pytest.mark.parametrize(("mode", "run"), [("fp32", FP32), ("bf16", BF16)])
def test_kernel_ids_round_trip_to_the_names_in_dispatch_csv(
    request: pytest.FixtureRequest, mode: str, run: Path
) -> None:
    made = request.getfixturevalue(mode)
    recorded = dispatched(run)
    grid = grid_with_names(made)
    joined = recorded.merge(grid, on=["m", "n", "k"], suffixes=("", "_atlas"), validate="1:1")
    assert len(joined) == len(recorded) == 3000
    assert (joined["gemm"] == joined["gemm_atlas"]).all()
    # and through the reader `diff` uses: the same names, problem by problem
    read = load_one_gpu(made).frame
    back = recorded.merge(read, on=["m", "n", "k"], suffixes=("", "_read"), validate="1:1")
    assert (back["gemm"] == back["kernel_read"]).all()


@pytest.mark.parametrize(("mode", "run"), [("fp32", FP32), ("bf16", BF16)])
def test_problems_per_kernel_equal_a_groupby_on_dispatch_csv(
    request: pytest.FixtureRequest, mode: str, run: Path
) -> None:
    counted = dispatched(run).groupby("gemm").size().sort_index()
    kernels = pd.read_csv(request.getfixturevalue(mode) / KERNELS_FILE)
    assert kernels.set_index("kernel")["problems"].sort_index().to_dict() == counted.to_dict()
    assert kernels["share"].sum() == pytest.approx(1.0, abs=1e-3)
    # ids: 0 the kernel chosen most often
    assert list(kernels["problems"]) == sorted(kernels["problems"], reverse=True)
    assert len(kernels) == {"fp32": 18, "bf16": 174}[mode]


def test_a_kernels_throughput_checked_by_hand(bf16: Path) -> None:
    """nvjet_tst_128x160_64x5_1x4 ran one problem of the BF16 map: 640x3776x3008 in 0.021664 ms
    of kernel time, so 2 * 640 * 3776 * 3008 = 14,538,506,240 flop / 21.664 us = 671.1 TFLOP/s."""
    recorded = dispatched(BF16)
    row = recorded[(recorded["m"] == 640) & (recorded["n"] == 3776) & (recorded["k"] == 3008)]
    m, n, k, ms = (row[c].item() for c in ("m", "n", "k", "kernel_time_ms"))
    by_hand = 2 * m * n * k / (ms * 1e-3) / 1e12
    assert round(by_hand, 1) == 671.1
    kernels = pd.read_csv(bf16 / KERNELS_FILE).set_index("kernel")
    kernel = kernels.loc[row["gemm"].item()]
    assert kernel["short"] == "nvjet_tst_128x160_64x5_1x4" and kernel["problems"] == 1
    for figure in ("tflops_median", "tflops_p10", "tflops_p90"):
        assert kernel[figure] == pytest.approx(by_hand, rel=5e-4)  # 4 significant digits
    grid = pd.read_csv(bf16 / GRID_FILE)
    kept = grid[(grid["m"] == 640) & (grid["n"] == 3776) & (grid["k"] == 3008)]
    assert kept["kernel_time_ms"].item() == 0.02166  # 0.021664 to 4 significant digits


def test_the_gzip_is_byte_identical_on_rerun(
    fp32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(map_plots, "draw", without_pictures)  # the tables alone are compared
    atlas(AtlasJob([FP32], tmp_path), lambda *_: None)
    for name in (GRID_FILE, KERNELS_FILE, rundir.FINDINGS_FILE):
        assert (tmp_path / "fp32" / name).read_bytes() == (fp32 / name).read_bytes()
    header = (tmp_path / "fp32" / GRID_FILE).read_bytes()[:10]
    assert header[:2] == b"\x1f\x8b" and header[4:8] == b"\0\0\0\0"  # gzip, mtime 0


def test_the_findings_are_the_maps_with_its_follow_up_verdicts(fp32: Path) -> None:
    recorded = json.loads((FP32 / rundir.FINDINGS_FILE).read_text())
    kept = json.loads((fp32 / rundir.FINDINGS_FILE).read_text())
    assert [f["message"] for f in kept] == [f["message"] for f in recorded]  # largest first
    held = sum(f["follow_up"] == "holds on the full-length measurement" for f in kept)
    report = (FP32 / rundir.REPORT_FILE).read_text()
    assert held == report.count(", holds on the full-length measurement") == 12
    text = (fp32 / ATLAS_REPORT).read_text()
    assert "52 findings: 40 size-inversion, 12 dispatch-cliff." in text
    assert "12 hold, 0 not confirmed" in text


def test_atlas_md_names_the_gpu_what_is_left_out_and_how_to_regenerate(bf16: Path) -> None:
    text = (bf16 / ATLAS_REPORT).read_text()
    assert "| cuBLAS            | 13.1.0" in text
    assert "NVIDIA H100 80GB HBM3" in text and "| kernels dispatched | 174" in text
    assert "dispatch.csv (1." in text  # its size
    map_command = " ".join(json.loads((BF16 / rundir.ENV_FILE).read_text())["command"])
    assert map_command in text
    assert f"cublas-audit atlas {BF16} --out {bf16.parent}" in text
    pictures = re.findall(r"\]\((plots/[^)]+)\)", text)
    assert pictures and all((bf16 / picture).is_file() for picture in pictures)


def test_a_kernel_name_with_a_pipe_is_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The BF16 map's most chosen kernel renamed with a `|` (as a foreign name could hold one):
    the short name keeps it, so it reaches atlas.md's kernel table, escaped inside its code span;
    every row of that table keeps its cells."""
    real = "nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN"
    hostile = real.replace("_", "|", 1)
    run = tmp_path / "map"
    run.mkdir()
    for name in (rundir.ENV_FILE, rundir.PLAN_FILE, rundir.FINDINGS_FILE):
        shutil.copy(BF16 / name, run / name)
    text = (BF16 / rundir.TABLE_FILE).read_text()
    (run / rundir.TABLE_FILE).write_text(text.replace(real, hostile))
    monkeypatch.setattr(map_plots, "draw", without_pictures)  # atlas.md's tables are checked
    atlas(AtlasJob([run], tmp_path / "out"), lambda *_: None)
    written = (tmp_path / "out" / "bf16" / ATLAS_REPORT).read_text()
    assert "| 0    | `nvjet\\|sm90_tst_192x192_64x3_2x1_v_bz_co…`" in written
    table = written.split("## Kernels and where each was chosen")[1].split("\n\n")[1]
    cells = {len(re.split(r"(?<!\\)\|", line)) for line in table.splitlines()}
    assert cells == {11}  # 9 columns between 10 bars, on every line
    kernels = pd.read_csv(tmp_path / "out" / "bf16" / KERNELS_FILE)
    assert kernels.loc[0, "kernel"] == hostile


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (lambda tmp: tmp, "not a run directory (no dispatch.csv)"),
        (lambda tmp: tmp / "missing", "no such directory"),
        (lambda tmp: FP32 / rundir.TABLE_FILE, "not a directory"),
        (lambda tmp: SWEEP, "the run directory of a sweep, not of a map"),
    ],
)
def test_a_bad_input_exits_2_with_one_line(tmp_path: Path, given: object, said: str) -> None:
    path = given(tmp_path)  # type: ignore[operator]
    out = tmp_path / "out"
    result = runner.invoke(app, ["atlas", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and said in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_two_maps_of_one_mode_exit_2_before_anything_is_written(tmp_path: Path) -> None:
    other = MAPS / "20261124-003639-fp32-64-8192"
    result = runner.invoke(app, ["atlas", str(FP32), str(other), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "both map fp32" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_diff_takes_an_atlas(fp32: Path) -> None:
    """The map against its own atlas: every case matched, no kernel changed."""
    result = runner.invoke(app, ["diff", str(FP32), str(fp32)])
    assert result.exit_code == 0, result.output
    assert "3000 cases on both sides: 0 regressions, 0 improvements" in result.output
    assert "0 kernel changes" in result.output


def test_plane_panels_at_the_nearest_k_present() -> None:
    """The BF16 map sampled K at random: each K asked for stands at the nearest one it has."""
    k = dispatched(BF16)["k"]
    titles = [title for title, _ in _nearest_k_slices(k, (64, 512, 2048, 4096))]
    present = sorted(k.unique())
    for title, wanted in zip(titles, (64, 512, 2048, 4096), strict=True):
        near = int(title.split()[2])
        assert near in present
        assert abs(near - wanted) == min(abs(v - wanted) for v in present)


def test_an_atlas_is_never_written_into_its_own_map_run(tmp_path: Path) -> None:
    """A map run directory named after its mode, with --out its parent: the atlas would land
    on the run's own plots/ and findings.json."""
    run = tmp_path / "fp32"
    shutil.copytree(FP32, run, ignore=shutil.ignore_patterns("follow-up", "ncu"))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    result = runner.invoke(app, ["atlas", str(run), "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "would be the map run" in result.output
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_a_kernel_id_missing_from_kernels_csv_is_one_line(fp32: Path, tmp_path: Path) -> None:
    broken = tmp_path / "fp32"
    shutil.copytree(fp32, broken)
    lines = (broken / KERNELS_FILE).read_text().splitlines(keepends=True)
    (broken / KERNELS_FILE).write_text("".join(lines[:-1]))  # id 17, chosen for one problem
    result = runner.invoke(app, ["diff", str(FP32), str(broken)])
    assert result.exit_code == 2, result.output
    assert f"{broken / GRID_FILE}, row " in result.output
    assert "kernel id 17 is not in kernels.csv" in result.output
    assert len(result.output.strip().splitlines()) == 1
