"""The sweep's terminal summary of the recorded H100 run."""

from __future__ import annotations

from cublas_audit.report import summary
from cublas_audit.table.validation import read_table

from .conftest import FIXTURES


def test_summary_shows_kernel_fma_and_throughput_per_size_and_batch() -> None:
    text = summary.summary(read_table(FIXTURES / "h100-batched-cublas"))
    block = text.split("\n\n")[0].splitlines()
    assert block[0].startswith("cublas cublasSgemmStridedBatched fp32")
    assert block[1].split() == ["size", "batch", "4", "batch", "8", "batch", "16"]
    row_1024 = next(line for line in block if line.startswith("1024x1024x1024"))
    assert "simt_256x128_8x4 79% 48.1" in row_1024
    assert "cublas sgemm-loop fp32" in text
    assert "skipped" in text.split("cublasLt cublasLtMatmul fp32")[1]


def test_the_readme_grid_is_the_summary_of_the_run_report_shows() -> None:
    """README's H100 grid is cut from the summary of the bundled run `report` renders (the
    newest batched run), not retyped from an older one."""
    from .conftest import REPO, REPORTS

    run = REPORTS / "h100" / "20261123-145452-batched"
    assert max(p.parent for p in (REPORTS / "h100").glob("*-batched/dispatch.csv")) == run
    grid = summary.summary(read_table(run)).split("\n\n")[0]
    readme = (REPO / "README.md").read_text()
    assert "\n".join("    " + line for line in grid.splitlines()) in readme
