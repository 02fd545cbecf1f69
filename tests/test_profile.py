"""The ncu command line and how ncu's failures read."""

from __future__ import annotations

from pathlib import Path

import pytest

from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.observe import ncu_command
from cublas_audit.observe.ncu_export import FMA_PCT

from .conftest import FIXTURES

# What ncu prints when the driver restricts the counters to admin users (its documented text).
PERMISSION_DENIED = (
    "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
    "Performance Counters on the target device 0. For instructions on enabling permissions and "
    "to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n"
)


def test_ncu_profiles_only_the_probe_ranges_with_targeted_metrics(tmp_path: Path) -> None:
    argv = ncu_command.ncu_argv("ncu", tmp_path / "r.ncu-rep", tmp_path / "r.log", "none")
    assert argv[argv.index("--nvtx-include") + 1] == r"regex:^audit(-ref)?\..*/"
    metrics = argv[argv.index("--metrics") + 1].split(",")
    assert FMA_PCT in metrics and len(metrics) < 40
    assert "--set" not in argv and "--section" not in argv
    assert argv[argv.index("--clock-control") + 1] == "none"


def test_recorded_ncu_log_is_clean() -> None:
    ncu_command.check_ncu_log(FIXTURES / "h100-smoke" / "ncu" / "chunk-000.log", 0)


def test_permission_error_gives_the_fix(tmp_path: Path) -> None:
    log = tmp_path / "ncu.log"
    log.write_text(PERMISSION_DENIED)
    with pytest.raises(ToolMissingError, match="NVreg_RestrictProfilingToAdminUsers=0"):
        ncu_command.check_ncu_log(log, 1)


def test_other_ncu_errors_are_one_line(tmp_path: Path) -> None:
    log = tmp_path / "ncu.log"
    log.write_text("==PROF== Connected\n==ERROR== Failed to profile kernel\n==ERROR== second\n")
    with pytest.raises(AuditError, match=r"^ncu failed: Failed to profile kernel \(log: "):
        ncu_command.check_ncu_log(log, 1)
