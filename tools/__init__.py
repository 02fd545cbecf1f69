"""The lab: experiments behind the reference SGEMM's tuning, and device self-checks (README.md).

Not shipped: pyproject.toml packages `cublas_audit` alone. Run a tool from the repository root as
`python -m tools.<name>`, with the project installed.
"""
