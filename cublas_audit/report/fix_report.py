"""A FixSet in Markdown (templates/fix_report.md.j2): the fixes with their measured times and
verdicts, the TunableOp file with the exact environment that applies it and the fixes it cannot
carry, and each pin as a standalone C function (report.lt_snippet).

Rendering only: the FixSet already holds every verdict, and report.tunableop decided what the
file carries. Every text reaches Markdown through report.markdown's escaping.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cublas_audit.judge.impact import NotProposed
from cublas_audit.report.lt_snippet import c_snippet
from cublas_audit.report.markdown import md_code, md_fence, md_table, md_text, template
from cublas_audit.report.tunableop import (
    DEVICE_FILE_NAME,
    TORCH_DEFAULT_LT_WORKSPACE_KIB,
    TunableOpExport,
)
from cublas_audit.table.fix_file import Fix, FixSet, Timed

FIX_COLUMNS = (
    "fix", "problem", "PyTorch", "kind", "default", "ms", "fixed", "ms", "speedup", "timing",
    "verdict", "change",
)  # fmt: skip


@dataclass(frozen=True)
class Snippet:
    title: str
    code: str


def render_fix_report(
    fixes: FixSet,
    tunable: TunableOpExport | None,
    directory: Path,
    no_tunable: str = "",
    left_out: Sequence[NotProposed] = (),
) -> str:
    """The Markdown section. `tunable`: the file written into `directory` (None: none was
    written, for the reason `no_tunable`, e.g. no torch version known); `left_out`: measured
    fixes of calls a traced model never makes (judge.impact.model_fixes), not proposed."""
    return template("fix_report.md.j2").render(
        stamp=_stamp_words(fixes),
        sources=", ".join(md_code(source, in_table=False) for source in fixes.sources),
        fixes=fixes.fixes,
        table=md_table(FIX_COLUMNS, [fix_row(fix) for fix in fixes.fixes]),
        tunable=tunable,
        no_tunable=no_tunable or "none was written",
        **(_tunable_context(fixes, tunable, directory) if tunable else {}),
        snippets=[_snippet(fix, fixes) for fix in fixes.pins()],
        left_out=md_table(
            ("fix", "problem", "why"),
            [[md_text(cell) for cell in (n.fix_id, n.problem, n.why)] for n in left_out],
        )
        if left_out
        else "",
    )


def _snippet(fix: Fix, fixes: FixSet) -> Snippet:
    return Snippet(
        md_text(f"{fix.id}: {fix.problem.name}"), md_fence(c_snippet(fix, fixes.stamp), "c")
    )


def _claimed_ms(side: Timed) -> float:
    """The time behind the claim: the confirmation round's where there was one (Fix.claimed)."""
    return side.confirm_ms if side.confirm_ms is not None else side.ms


def fix_row(fix: Fix) -> list[str]:
    confirm = fix.confirm_speedup
    # the claim first: the pairwise round where there was one, then the screening round's ratio
    speedup = f"{fix.claimed:.2f}x" + (f" (screen {fix.speedup:.2f}x)" if confirm else "")
    return [
        md_text(fix.id),
        md_text(fix.problem.name),
        md_text(torch_words(fix)),
        md_text(fix.kind),
        md_code(fix.default.kernel) if fix.default.kernel else "—",
        f"{_claimed_ms(fix.default):.4g}",
        md_code(fix.fixed.kernel) if fix.fixed.kernel else "—",
        f"{_claimed_ms(fix.fixed):.4g}",
        speedup,
        md_text(fix.timing),
        md_text(fix.verdict),
        md_text(fix.change),
    ]


def torch_words(fix: Fix) -> str:
    """'aten::mm 2048x5632x2048, 28.5 % of GEMM time' where the trace is known, else '—'."""
    if fix.torch is None:
        return "—"
    torch = fix.torch
    batch = f" batch {torch.batch}" if torch.batch > 1 else ""
    return f"{torch.op} {torch.shape}{batch}, {torch.share:.1%} of GEMM time"


def environment_lines(environment: dict[str, str]) -> str:
    """`export KEY=VALUE` lines, each value quoted for a POSIX shell."""
    return "\n".join(f"export {key}={shlex.quote(value)}" for key, value in environment.items())


def _tunable_context(fixes: FixSet, tunable: TunableOpExport, directory: Path) -> dict[str, object]:
    environment = tunable.environment(directory)
    carried = [fix for fix in fixes.fixes if fix.id in tunable.carried]
    return {
        "file_name": str(Path(directory) / DEVICE_FILE_NAME),
        "filename": environment["PYTORCH_TUNABLEOP_FILENAME"],
        "carried": len(tunable.carried),
        "carries": carries_words(len(tunable.carried), len(fixes.fixes)),
        "lt_version": tunable.file.validator("CUBLASLT_VERSION") or "",
        "device": tunable.file.validator("CUDA_DEVICE") or "",
        "environment": md_fence(environment_lines(environment), "sh"),
        "workspace_bytes": max((f.pin.workspace_bytes for f in carried if f.pin), default=0),
        "default_kib": TORCH_DEFAULT_LT_WORKSPACE_KIB,
        "not_carried": md_table(
            ("fix", "problem", "why"),
            [
                [md_text(cell) for cell in (n.fix_id, n.problem, n.reason)]
                for n in tunable.not_carried
            ],
        ),
    }


def carries_words(carried: int, total: int) -> str:
    """What the TunableOp file carries of the fixes, in words."""
    if not total:
        return "carries nothing: there is no fix"
    if not carried:
        if total == 1:
            return "carries no fix: TunableOp cannot apply the one there is (below, why not)"
        return f"carries none of the {total} fixes: TunableOp can apply none of them (below, why)"
    if carried < total:
        return f"carries {carried} of the {total} fixes"
    return {1: "carries the one fix", 2: "carries both fixes"}.get(
        total, f"carries all {total} fixes"
    )


def _stamp_words(fixes: FixSet) -> str:
    label = f" (label {fixes.stamp.gpu_label})" if fixes.stamp.gpu_label else ""
    return fixes.stamp.words() + label
