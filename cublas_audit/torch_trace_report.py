"""Markdown for the GEMMs of a PyTorch trace (`cublas-audit shapes`): every text through
cublas_audit.markdown's escaping."""

from __future__ import annotations

import pandas as pd

from cublas_audit.markdown import md_code, md_number, md_table, md_text
from cublas_audit.torch_trace import Trace


def problems_markdown(trace: Trace, table: pd.DataFrame) -> str:
    total = float(table["total_gpu_ms"].sum()) if len(table) else 0.0
    head = [
        "# GEMMs of a PyTorch trace",
        "",
        f"Trace: {md_code(str(trace.path), in_table=False)}"
        + (f" ({md_text(trace.gpu_name)})" if trace.gpu_name else ""),
        "",
        f"{len(table)} distinct problems, {int(table['calls'].sum()) if len(table) else 0} calls, "
        f"{md_number(total, 3)} ms of GEMM kernels. Shapes in PyTorch's row-major terms "
        "(C = A @ B, M x K by K x N) and as cuBLAS runs them (column-major m x n x k, layout "
        "transa transb, leading dimensions).",
        "",
    ]
    rows = [
        [
            md_text(r["op"]),
            md_text(r["mode"]),
            md_text(f"{r['M']}x{r['N']}x{r['K']}"),
            md_text(r["batch"]),
            md_text(
                f"{r['cublas_m']}x{r['cublas_n']}x{r['cublas_k']} "
                f"{r['cublas_transa']}{r['cublas_transb']} lda {r['cublas_lda']} "
                f"ldb {r['cublas_ldb']}"
                + (f" bcast-{r['cublas_broadcast']}" if r["cublas_broadcast"] else "")
                + (" bias" if r["bias"] else "")
            ),
            md_text(r["calls"]),
            md_number(r["total_gpu_ms"], 4),
            md_number(r["mean_gpu_ms"], 4),
            md_text(f"{100 * r['share']:.1f} %"),
            md_code(r["kernel_short"]),
        ]
        for r in table.to_dict("records")
    ]
    headers = [
        "op", "mode", "MxNxK", "batch", "cuBLAS call", "calls", "GPU ms", "ms per call",
        "share", "kernels",
    ]  # fmt: skip
    return "\n".join(head) + "\n" + md_table(headers, rows) + "\n"
