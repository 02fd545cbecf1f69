from cublas_audit.cli import app

app(prog_name="cublas-audit")
