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
