"""Runs the probe under ncu: builds the command line (a list argv, never a shell), runs it, turns
ncu's failures into clear errors, and exports the report as ncu's own raw-page CSV.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cublas_audit.environment import PERMISSION_FIX
from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.ncu_parse import METRICS, NVTX_INCLUDE

PROBE = Path(__file__).resolve().parent.parent / "probes" / "gemm_probe.py"
CLOCK_CONTROLS = ("none", "base")


@dataclass(frozen=True)
class ProbeCommand:
    """How to start the probe: interpreter, environment additions, and its arguments."""

    python: str = sys.executable
    env: Mapping[str, str] = field(default_factory=dict)

    def argv(self, args: Sequence[str]) -> list[str]:
        return [self.python, str(PROBE), *args]


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


def run_streaming(argv: list[str], env: Mapping[str, str], on_line: Callable[[str], None]) -> int:
    """Runs a child, handing each stdout line to `on_line`; Ctrl-C stops the child too."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env), bufsize=1
    ) as child:
        assert child.stdout is not None
        try:
            for line in child.stdout:
                on_line(line.rstrip("\n"))
        except BaseException:
            child.kill()
            raise
        return child.wait()


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
    tmp = csv_path.with_name(csv_path.name + ".tmp")
    tmp.write_text(done.stdout)
    tmp.replace(csv_path)
    return csv_path
