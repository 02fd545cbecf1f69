"""Shipped with cublas-audit as `cublas_audit.reference_kernels`: pyproject.toml maps this folder
into the package (cublas_audit/resources.py says why)."""
