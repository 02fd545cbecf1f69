"""table/atlas_files.py pinned (issue 39 item 6): a slice of the H100's recorded fp32 atlas
(reports/h100/atlas/fp32: its first 40 grid rows, its kernels.csv and atlas.json) read back as a
dispatch table, each fault of an atlas directory in one line, and the writing side's ids, kernel
table and bytes on tiny frames."""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table import atlas_files
from tests.conftest import REPORTS

ATLAS = REPORTS / "h100" / "atlas" / "fp32"
ROWS = 40


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded atlas, its grid cut to its first ROWS problems."""
    out = tmp_path_factory.mktemp("atlas")
    with gzip.open(ATLAS / "grid.csv.gz", "rt") as grid:
        head = "".join(itertools.islice(grid, ROWS + 1))
    (out / "grid.csv.gz").write_bytes(gzip.compress(head.encode()))
    for name in ("kernels.csv", "atlas.json", "atlas.md"):
        shutil.copy(ATLAS / name, out / name)
    return out


def copy_of(mini: Path, where: Path) -> Path:
    shutil.copytree(mini, where)
    return where


def test_a_recorded_atlas_slice_reads_as_a_dispatch_table(mini: Path) -> None:
    assert atlas_files.is_atlas(mini) and not atlas_files.is_atlas(mini / "atlas.json")
    frame, meta = atlas_files.read_atlas(mini)
    assert meta["format"] == 1 and meta["mode"] == "fp32" and len(frame) == ROWS
    kernels = pd.read_csv(ATLAS / "kernels.csv")
    # row 1 of grid.csv.gz: 64,64,64, kernel id 8, 0.003137 ms, ok
    first = frame.iloc[0]
    assert (first["m"], first["n"], first["k"]) == (64, 64, 64)
    assert first["kernel"] == kernels.loc[kernels["id"] == 8, "kernel"].item()
    assert first["kernel_time_ms"] == 0.003137 and first["status"] == "ok"
    assert (first["gpu_label"], first["routine"], first["beta"]) == ("h100", "cublasSgemm", 0.0)
    assert frame["time_ms"].isna().all() and frame["fma_pct"].isna().all()


def test_a_constant_of_none_is_a_missing_cell(mini: Path, tmp_path: Path) -> None:
    atlas = copy_of(mini, tmp_path / "a")
    meta = json.loads((atlas / "atlas.json").read_text())
    meta["constant"]["beta"] = None
    (atlas / "atlas.json").write_text(json.dumps(meta))
    kernels = (atlas / "kernels.csv").read_text().splitlines()
    cells = kernels[9].split(",")  # id 8: the first row's kernel
    assert cells[0] == "8"
    kernels[9] = ",".join([cells[0], "None", *cells[2:]])  # only an empty cell is missing
    (atlas / "kernels.csv").write_text("\n".join(kernels) + "\n")
    frame, _ = atlas_files.read_atlas(atlas)
    assert frame["beta"].isna().all() and frame["kernel"].iloc[0] == "None"


def test_an_unknown_kernel_id_names_its_row(mini: Path, tmp_path: Path) -> None:
    atlas = copy_of(mini, tmp_path / "a")
    with gzip.open(atlas / "grid.csv.gz", "rt") as grid:
        lines = grid.read().splitlines()
    lines[3] = "64,64,192,99,0.005504,ok"  # data row 3
    (atlas / "grid.csv.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    with pytest.raises(AuditError) as caught:
        atlas_files.read_atlas(atlas)
    assert (
        str(caught.value) == f"{atlas / 'grid.csv.gz'}, row 3: kernel id 99 is not in kernels.csv"
    )


def test_atlas_json_faults(mini: Path, tmp_path: Path) -> None:
    atlas = copy_of(mini, tmp_path / "a")
    meta = json.loads((atlas / "atlas.json").read_text())
    path = atlas / "atlas.json"
    for broken, words in (
        ({**meta, "format": 2}, "not an atlas of format 1"),
        ([meta], "not an atlas of format 1"),
        ({k: v for k, v in meta.items() if k != "constant"}, "no 'constant' object"),
        ({**meta, "constant": []}, "no 'constant' object"),
    ):
        path.write_text(json.dumps(broken))
        with pytest.raises(AuditError, match=words):
            atlas_files.read_atlas(atlas)
    path.write_text("{")
    with pytest.raises(AuditError, match="not readable JSON"):
        atlas_files.read_atlas(atlas)
    (atlas / "kernels.csv").write_bytes(b"")
    path.write_text(json.dumps(meta))
    with pytest.raises(AuditError, match=r"kernels\.csv: cannot be read as a table"):
        atlas_files.read_atlas(atlas)


def test_an_atlas_cut_short_names_what_it_lacks(tmp_path: Path) -> None:
    assert not atlas_files.is_atlas(tmp_path)
    (tmp_path / "grid.csv.gz").write_bytes(b"")
    assert atlas_files.is_atlas(tmp_path)
    with pytest.raises(
        AuditError, match=r": an atlas cut short \(no kernels\.csv, atlas\.md, atlas\.json;"
    ):
        atlas_files.check_whole(tmp_path)
    for name in ("kernels.csv", "atlas.md", "atlas.json"):
        (tmp_path / name).write_text("")
    atlas_files.check_whole(tmp_path)


def test_start_atlas_removes_the_last_files_first(tmp_path: Path) -> None:
    for name in ("atlas.json", "atlas.md", "grid.csv.gz"):
        (tmp_path / name).write_text("x")
    atlas_files.start_atlas(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.csv.gz"]
    atlas_files.start_atlas(tmp_path)  # nothing to remove
    assert atlas_files.atlas_bytes(tmp_path) == 1


def test_kernel_ids_most_chosen_first_ties_by_name() -> None:
    ids, ordered = atlas_files.kernel_ids(pd.Series(["b", "a", "a", None, "c", "b", "a", "d"]))
    # a 3 times, b 2, then c and d once each (by name)
    assert ordered == ["a", "b", "c", "d"]
    assert ids.tolist() == [1, 0, 0, pd.NA, 2, 1, 0, 3] and str(ids.dtype) == "Int32"


def rows(**columns: list[object]) -> pd.DataFrame:
    base: dict[str, list[object]] = {
        "gpu_label": ["h100"] * 3, "api": ["cublas"] * 3, "m": [64, 128, 64], "n": [64] * 3,
        "k": [64, 64, 128], "kernel_name": ["x", "y", "x"], "kernel_time_ms": [0.5, 1.0, 0.25],
        "status": ["ok"] * 3,
    }  # fmt: skip
    return pd.DataFrame({**base, **columns})


def test_the_grid_keeps_varying_series_columns_and_one_value_of_the_others() -> None:
    grid = atlas_files.grid_of(rows())
    assert grid.varying == [] and grid.constant == {"gpu_label": "h100", "api": "cublas"}
    assert grid.kernels == ["x", "y"]
    assert list(grid.frame.columns) == ["m", "n", "k", "kernel", "kernel_time_ms", "status"]
    mixed = atlas_files.grid_of(
        rows(api=["cublas", None, "cublas"], batch=[1, 2, 3])
    )  # NA is a value
    assert mixed.varying == ["api", "batch"] and mixed.constant == {"gpu_label": "h100"}
    two = atlas_files.grid_of(rows(api=["cublas", "cublasLt", "cublas"]))
    assert two.varying == ["api"]
    assert list(two.in_file_order()["api"]) == ["cublas", "cublas", "cublasLt"]
    assert list(two.in_file_order().index) == [0, 1, 2]
    assert list(two.in_file_order()["k"]) == [64, 128, 64]  # by api, then m, n, k
    one = atlas_files.grid_of(rows().iloc[:1])
    assert one.constant == {"gpu_label": "h100", "api": "cublas"}
    untimed = atlas_files.grid_of(rows().drop(columns=["kernel_time_ms"]))
    assert untimed.frame["kernel_time_ms"].isna().all()


def test_the_kernel_table() -> None:
    grid = atlas_files.grid_of(rows(kernel_name=["y", "x", "x"]))  # x: id 0 (twice), y: id 1
    unchosen = grid.frame.iloc[:1].copy()
    unchosen["kernel"] = pd.NA  # a 4th row: no kernel
    grid_frame = pd.concat([grid.frame, unchosen])
    rate = pd.Series([10.0, 20.0, 40.0, 5.0])
    table = atlas_files.kernel_table(grid_frame, grid.kernels, {"x": "X"}, rate)
    assert list(table.columns) == atlas_files.KERNEL_COLUMNS and list(table.index) == [0, 1]
    x, y = table.iloc[0], table.iloc[1]
    assert (x["id"], x["kernel"], x["short"], x["problems"], x["share"]) == (0, "x", "X", 2, 0.5)
    assert (y["id"], y["kernel"], y["short"], y["problems"], y["share"]) == (1, "y", "", 1, 0.25)
    # x's rates 20 and 40: median 30, p10 20 + 0.1 * 20 = 22, p90 20 + 0.9 * 20 = 38
    assert (x["tflops_median"], x["tflops_p10"], x["tflops_p90"]) == (30.0, 22.0, 38.0)
    assert (x["m_min"], x["m_max"], x["k_min"], x["k_max"]) == (64, 128, 64, 128)


def test_the_files_are_the_same_bytes_on_every_run(tmp_path: Path) -> None:
    grid = atlas_files.grid_of(rows(kernel_time_ms=[0.123456, 1.0, 0.25]))
    kernels = atlas_files.kernel_table(grid.frame, grid.kernels, {}, pd.Series([1.0, 2.0, 3.0]))
    written = atlas_files.write_atlas_tables(tmp_path, grid, kernels)
    assert written == [tmp_path / "grid.csv.gz", tmp_path / "kernels.csv"]
    raw = (tmp_path / "grid.csv.gz").read_bytes()
    assert raw[4:8] == b"\0\0\0\0" and raw[8] == 2  # no time; XFL 2: level 9
    assert gzip.decompress(raw).decode() == (
        "m,n,k,kernel,kernel_time_ms,status\n64,64,64,0,0.1235,ok\n64,64,128,0,0.25,ok\n"
        "128,64,64,1,1,ok\n"
    )  # 4 significant digits, in file order, no index
    assert (tmp_path / "kernels.csv").read_text().splitlines()[1].startswith("0,x,,2,0.6667,2,")
    path = atlas_files.write_atlas_json(tmp_path, grid, {"mode": "fp32", "nan": float("nan")})
    assert path == tmp_path / "atlas.json"
    assert path.read_text() == (
        '{\n "format": 1,\n "mode": "fp32",\n "nan": null,\n "constant": {\n'
        '  "gpu_label": "h100",\n  "api": "cublas"\n }\n}\n'
    )
