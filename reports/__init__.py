"""The bundled real audits, shipped as `cublas_audit.bundled` (pyproject.toml maps this folder
into the package): `cublas-audit report` with no input renders them (reports/README.md)."""
