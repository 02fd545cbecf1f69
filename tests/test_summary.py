"""The sweep's terminal summary of the recorded H100 run."""

from __future__ import annotations

import re

import pandas as pd

from cublas_audit.report import summary
from cublas_audit.table.validation import read_table

from .conftest import FIXTURES, REPORTS


def test_summary_shows_kernel_fma_and_throughput_per_size_and_batch() -> None:
    text = summary.summary(read_table(FIXTURES / "h100-batched-cublas"))
    block = text.split("\n\n")[0].splitlines()
    assert block[0].startswith("cublas cublasSgemmStridedBatched fp32")
    assert block[1].split() == ["size", "batch", "4", "batch", "8", "batch", "16"]
    row_1024 = next(line for line in block if line.startswith("1024x1024x1024"))
    assert "simt_256x128_8x4 79% 48.1" in row_1024
    assert "cublas sgemm-loop fp32" in text
    assert "skipped" in text.split("cublasLt cublasLtMatmul fp32")[1]


def test_the_documented_grid_is_the_summary_of_the_run_report_shows() -> None:
    """docs/gpu.md's H100 grid is cut from the summary of the bundled run `report` renders (the
    newest batched run), not retyped from an older one."""
    from .conftest import REPO, REPORTS

    run = REPORTS / "h100" / "20261123-145452-batched"
    assert max(p.parent for p in (REPORTS / "h100").glob("*-batched/dispatch.csv")) == run
    grid = summary.summary(read_table(run)).split("\n\n")[0]
    documented = (REPO / "docs" / "gpu.md").read_text()
    assert "\n".join("    " + line for line in grid.splitlines()) in documented


# The single-GEMM H100 run of every mode (tf32 and bf16x dispatch tensor-core kernels: tensorop
# s1688gemm, sm90 xmma with warp groups) and the torch-trace run of bf16/fp16 ops (nvjet).
SINGLE_RUN = REPORTS / "h100" / "20261123-012340-single"
OPS_RUN = REPORTS / "h100" / "traces" / "20261123-233621-ops"


def _blocks(text: str) -> dict[str, list[str]]:
    return {block.splitlines()[0]: block.splitlines() for block in text.split("\n\n")}


def test_a_tensor_core_kernel_shows_its_tensor_pipe_in_a_tensor_mode_sweep() -> None:
    """Each tf32/bf16x cell shows the kernel's tensor-pipe % as the CSV records it, under a
    'tensor %' heading; the FMA-pipe % (2-3 % for these kernels) appears nowhere."""
    recorded = pd.read_csv(SINGLE_RUN / "dispatch.csv")
    main = recorded[(recorded["role"] == "main") & recorded["mode"].isin(["tf32", "bf16x"])]
    assert len(main) == 24
    blocks = _blocks(summary.summary(read_table(SINGLE_RUN)))
    for _, row in main.iterrows():
        title = f"{row['api']} {row['routine']} {row['mode']}  (kernel, tensor %, TFLOP/s)"
        shape = f"{row['m']}x{row['n']}x{row['k']}"
        line = next(line for line in blocks[title] if line.startswith(shape + " "))
        assert line.split()[1:] == [
            row["kernel_short"],
            f"{row['tensor_pct']:.0f}%",
            f"{row['tflops']:.1f}",
        ]
        assert f" {row['fma_pct']:.0f}%" not in line
    fp32 = "cublas cublasSgemm fp32  (kernel, FMA %, TFLOP/s)"
    assert "xmma_32x32x8 12% 1.4" in blocks[fp32][3]  # FP32 kernels keep their FMA %


def test_nvjet_cells_show_tensor_percent_never_the_fma_pipes_zero() -> None:
    """The fp16/bf16 nvjet kernels of the ops run: their FMA-pipe % rounds to 0 or 1 %; each
    cell shows the tensor-pipe % the CSV records instead."""
    recorded = pd.read_csv(OPS_RUN / "dispatch.csv")
    main = recorded[recorded["role"] == "main"]
    # the summary shows a problem's first row (its other layouts are the report's)
    shown = main.drop_duplicates(["api", "routine", "mode", "m", "n", "k", "batch"])
    nvjet = shown[shown["family"] == "nvjet"]
    assert len(nvjet) >= 10 and (nvjet["fma_pct"] < 1.5).all()
    text = summary.summary(read_table(OPS_RUN))
    cells = {
        f"{r['kernel_short']} {r['tensor_pct']:.0f}% {r['tflops']:.1f}" for _, r in nvjet.iterrows()
    }
    assert {cell for cell in cells if cell not in text} == set()
    assert not re.search(r"nvjet_\S+ 0%", text)
    heading = "cublas cublasGemmEx fp16  (kernel, tensor %, TFLOP/s)"
    assert heading in text
    # a grid whose kernels compute on both pipes (dot_kernel on FMA, nvjet on the tensor cores)
    assert "cublas cublasGemmStridedBatchedEx fp16  (kernel, pipe %, TFLOP/s)" in text


def test_a_table_without_the_kernels_pipe_column_shows_no_percentage() -> None:
    """Without tensor_pct a tensor-core cell shows kernel and TFLOP/s only, never FMA %."""
    frame = read_table(SINGLE_RUN).drop(columns=["tensor_pct"])
    blocks = _blocks(summary.summary(frame))
    tf32 = blocks["cublas cublasGemmEx tf32  (kernel, tensor %, TFLOP/s)"]
    assert tf32[3].split() == ["256x256x256", "tensorop_s1688gemm_64x64_32x6", "1.8"]
    assert all("%" not in line for line in tf32[3:])


def test_an_older_tables_cut_names_show_the_inner_kernel() -> None:
    """The summary derives short names from the full names, as the judged table does: a stored
    `Kernel2` (tests/test_kernels.py builds that table from the recorded one) never shows."""
    import tempfile
    from pathlib import Path

    from .test_kernels import older_table_with_cut_names

    with tempfile.TemporaryDirectory() as tmp:
        table, _ = older_table_with_cut_names(Path(tmp) / "run")
    text = summary.summary(table)
    assert "Kernel2" not in text
    row_1024 = next(line for line in text.splitlines() if line.startswith("1024x1024x1024"))
    assert "simt_256x128_8x4 79% 48.1" in row_1024
