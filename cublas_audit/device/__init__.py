"""The part of cublas-audit that needs a GPU: operands and their check, timing, the launchers of
classic cuBLAS, cuBLASLt and the reference kernel, the candidate audit, and the probe's runner.

Nothing here imports CuPy, nvmath-python or cuda-bindings at module level: they load inside the
functions that use them, so `cublas_audit` imports (and its CPU half runs) without CUDA.
"""
