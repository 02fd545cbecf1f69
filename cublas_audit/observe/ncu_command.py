"""ncu around the probe: its command line (a list argv, never a shell), its failures as one-line
errors, and the report exported as ncu's own raw-page CSV.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.files import write_text_atomic
from cublas_audit.observe.environment import PERMISSION_FIX
from cublas_audit.observe.ncu_export import METRICS, NVTX_INCLUDE

CLOCK_CONTROLS = ("none", "base")


def ncu_argv(ncu: str, report: Path, log: Path, clock_control: str) -> list[str]:
    """ncu's options: only the probe's NVTX ranges, only the metrics the table needs."""
    return [
        ncu,
        "--nvtx",
        "--nvtx-include",
        NVTX_INCLUDE,
        "--metrics",
        ",".join(METRICS),
        "--clock-control",
        clock_control,
        "--target-processes",
        "all",
        "--force-overwrite",
        "--export",
        str(report),
        "--log-file",
        str(log),
    ]


def check_ncu_log(log: Path, returncode: int) -> None:
    """Raises the clear error for what ncu reported, if anything went wrong."""
    text = log.read_text(errors="replace") if log.exists() else ""
    if "ERR_NVGPUCTRPERM" in text:
        raise ToolMissingError(PERMISSION_FIX)
    errors = [line for line in text.splitlines() if line.startswith("==ERROR==")]
    if returncode != 0 and errors:
        raise AuditError(f"ncu failed: {errors[0].removeprefix('==ERROR==').strip()} (log: {log})")


def export_csv(ncu: str, report: Path, csv_path: Path) -> Path:
    """`ncu --import REPORT --csv --page raw`: ncu's own export, written atomically."""
    argv = [ncu, "--import", str(report), "--csv", "--page", "raw"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        first = (done.stderr or done.stdout).strip().splitlines()[:1]
        raise AuditError(f"ncu could not export {report}: {first[0] if first else 'no output'}")
    return write_text_atomic(csv_path, done.stdout)
