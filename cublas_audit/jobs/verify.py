"""The `verify` job: a fix.json checked whole (before any GPU work), then each fix re-measured on
this GPU (run.verify_rounds), the verdicts printed one line each and written to verify.json.

Exit codes: 0 done; 1 only under --fail-on, when a fix does not hold here or computes a wrong
result; 2 a bad fix file, or a pin refused by the very cuBLAS and GPU it was proven on (the file
was edited); 3 no GPU. A fix proven on another GPU or cuBLAS is re-measured, not an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cublas_audit.errors import AuditError
from cublas_audit.files import never_replacing, write_text_atomic
from cublas_audit.judge.candidates import DEFAULT_THRESHOLD
from cublas_audit.judge.framework import HOLDS
from cublas_audit.observe import environment
from cublas_audit.report.output import check_output
from cublas_audit.table.dispatch import json_ready
from cublas_audit.table.fix_file import FixSet, Stamp, read_fix_file
from cublas_audit.table.tunableop_file import TunableFile, read_tunableop

if TYPE_CHECKING:
    from cublas_audit.judge.framework import FrameworkChecked

Echo = Callable[..., None]
VERIFY_FILE = "verify.json"
GATE_FAILED = 1


@dataclass(frozen=True)
class VerifyJob:
    fix_file: Path
    out: Path | None = None  # verify.json; default: beside the fix file
    fail_on: bool = False
    threshold: float = DEFAULT_THRESHOLD
    torch: bool = False  # also through torch with the TunableOp file beside the fix file
    warm: bool = False  # operands left in L2 between timed calls (else flushed: device.l2)


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
    from cublas_audit.run import verify_rounds

    out = job.out or job.fix_file.parent / VERIFY_FILE
    inputs = [job.fix_file, *([tunable_path(job.fix_file)] if job.torch else [])]
    check_output(out, inputs)  # first: never the fix file (under any name), never a directory
    fixes = checked_input(job.fix_file)
    tunable = tunable_file(job.fix_file) if job.torch else None
    env = environment.collect()
    environment.require_gpu(env)
    here = Stamp(
        gpu_name=env.gpu_name or "unknown",
        cc=env.cc or "unknown",
        cublas_version=env.cublas_version or "unknown",
        driver_version=env.driver_version or "unknown",
    )
    differs = verify_rounds.elsewhere(fixes.stamp, here)
    if differs:
        echo(f"verify: proven on {fixes.stamp.words()}; re-measured here: {differs}")
    found = verify_rounds.verify(fixes, threshold=job.threshold, progress=echo, cold=not job.warm)
    data = {
        "fix_file": str(job.fix_file),
        "proven_on": asdict(fixes.stamp),
        "measured_on": asdict(here),
        "threshold": job.threshold,
        "operands": "warm" if job.warm else "cold",
        "fixes": [asdict(item) for item in found],
    }
    echo(f"verify: {_write(out, data, inputs)}")
    through_torch = _torch_check(job, fixes, tunable, echo) if tunable else []
    if through_torch:  # verify.json again, with the framework's verdicts beside the library's
        data["torch"] = [asdict(item) for item in through_torch]
        _write(out, data, inputs)
    refused = [item for item in found if item.status == verify_rounds.REFUSED]
    if refused and not differs:
        raise AuditError(
            f"{job.fix_file}: {len(refused)} pin(s) refused by the cuBLAS and GPU they were "
            f"proven on (first: {refused[0].fix_id}: {refused[0].reason})"
        )
    failed = [
        item.fix_id
        for item in found
        if item.status in (verify_rounds.DOES_NOT_HOLD, verify_rounds.WRONG)
    ]
    failed += [item.fix_id for item in through_torch if item.status != HOLDS]
    return GATE_FAILED if job.fail_on and failed else 0


def _write(out: Path, data: dict[str, Any], inputs: Sequence[Path]) -> Path:
    """verify.json (an infinite error, no result, is written as null), never over an input."""
    text = json.dumps(json_ready(data), indent=2, allow_nan=False) + "\n"
    with never_replacing(inputs):
        return write_text_atomic(out, text)


def tunable_path(fix_file: Path) -> Path:
    """Where `fix` wrote the TunableOp file: beside the fix file."""
    from cublas_audit.report.tunableop import DEVICE_FILE_NAME

    return fix_file.parent / DEVICE_FILE_NAME


def tunable_file(fix_file: Path) -> TunableFile:
    """The TunableOp file `fix` wrote beside the fix file, read whole (before any GPU work)."""
    from cublas_audit.report.tunableop import DEVICE_FILE_NAME

    path = tunable_path(fix_file)
    if not path.is_file():
        raise AuditError(
            f"--torch: no {DEVICE_FILE_NAME} beside {fix_file} (`fix --torch-version` writes it)"
        )
    tunable = read_tunableop(path)
    if tunable.validator("PT_VERSION") is None:
        raise AuditError(f"--torch: {path} has no PT_VERSION validator: TunableOp refuses it")
    return tunable


def _torch_check(
    job: VerifyJob, fixes: FixSet, tunable: TunableFile, echo: Echo
) -> list[FrameworkChecked]:
    """The pins through an unchanged torch call with and without the file; skipped, in one
    line, where this torch cannot read it."""
    from cublas_audit.report.tunableop import tunableop_export
    from cublas_audit.run import torch_check

    file_version = tunable.validator("PT_VERSION") or ""
    why_not = torch_check.skip_reason(torch_check.installed_torch(), file_version)
    if why_not:
        echo(f"verify --torch: skipped: {why_not}")
        return []
    export = tunableop_export(fixes, file_version)
    fix_file = job.fix_file
    environment = export.environment(fix_file.parent)
    checked = torch_check.check(fixes, fix_file, environment, job.threshold, cold=not job.warm)
    for item in checked:
        echo(f"{item.fix_id}: torch {item.status}: {item.line}")
    return checked
