"""cublas-audit: catch cuBLAS dispatching the wrong GEMM kernel."""

__version__ = "0.1.0"
