"""The `verify` job: a fix.json checked whole (before any GPU work), then each fix re-measured on
this GPU (run.verify), the verdicts printed one line each and written to verify.json.

Exit codes: 0 done; 1 only under --fail-on, when a fix does not hold here or computes a wrong
result; 2 a bad fix file, or a pin refused by the very cuBLAS and GPU it was proven on (the file
was edited); 3 no GPU. A fix proven on another GPU or cuBLAS is re-measured, not an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from cublas_audit.errors import AuditError
from cublas_audit.files import write_text_atomic
from cublas_audit.judge.candidates import DEFAULT_THRESHOLD
from cublas_audit.observe import environment
from cublas_audit.table.dispatch import json_ready
from cublas_audit.table.fix_file import FixSet, Stamp, read_fix_file

Echo = Callable[..., None]
VERIFY_FILE = "verify.json"
GATE_FAILED = 1


@dataclass(frozen=True)
class VerifyJob:
    fix_file: Path
    out: Path | None = None  # verify.json; default: beside the fix file
    fail_on: bool = False
    threshold: float = DEFAULT_THRESHOLD


def checked_input(path: Path) -> FixSet:
    """The fix file, every pin's attributes known to cuBLASLt's enums: a bad one is refused here,
    before any GPU work."""
    from cublas_audit.planning.lt_enums import SPECS, check_pin_names

    fixes = read_fix_file(path)
    for fix in fixes.pins():
        assert fix.pin is not None
        try:
            check_pin_names({column: getattr(fix.pin, column) for column in SPECS})
        except AuditError as exc:
            raise AuditError(f"{path}: fix {fix.id}: {exc}") from exc
    return fixes


def run(job: VerifyJob, echo: Echo) -> int:
    from cublas_audit.run import verify

    fixes = checked_input(job.fix_file)
    out = job.out or job.fix_file.parent / VERIFY_FILE
    env = environment.collect()
    environment.require_gpu(env)
    here = Stamp(
        gpu_name=env.gpu_name or "unknown",
        cc=env.cc or "unknown",
        cublas_version=env.cublas_version or "unknown",
        driver_version=env.driver_version or "unknown",
    )
    differs = verify.elsewhere(fixes.stamp, here)
    if differs:
        echo(f"verify: proven on {fixes.stamp.words()}; re-measured here: {differs}")
    found = verify.verify(fixes, threshold=job.threshold, progress=echo)
    data = {
        "fix_file": str(job.fix_file),
        "proven_on": asdict(fixes.stamp),
        "measured_on": asdict(here),
        "threshold": job.threshold,
        "fixes": [asdict(item) for item in found],
    }
    text = json.dumps(json_ready(data), indent=2, allow_nan=False) + "\n"  # inf: no result
    echo(f"verify: {write_text_atomic(out, text)}")
    refused = [item for item in found if item.status == verify.REFUSED]
    if refused and not differs:
        raise AuditError(
            f"{job.fix_file}: {len(refused)} pin(s) refused by the cuBLAS and GPU they were "
            f"proven on (first: {refused[0].fix_id}: {refused[0].reason})"
        )
    failed = [item for item in found if item.status in (verify.DOES_NOT_HOLD, verify.WRONG)]
    return GATE_FAILED if job.fail_on and failed else 0
