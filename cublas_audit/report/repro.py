"""A high finding's reproduce recipe: the `cublas-audit sweep` command of its largest case, and a
standalone CuPy script that makes the same cuBLAS call for ncu without this tool
(templates/repro_script.py.j2, fenced by markdown.md_fence).
"""

from __future__ import annotations

import shlex

from cublas_audit.judge.finding import Finding
from cublas_audit.planning.modes import PIPE_METRICS
from cublas_audit.planning.modes import mode as mode_of
from cublas_audit.report.markdown import md_fence, md_text, template

# The routines the script can call through CuPy's cuBLAS bindings.
SCRIPTED_ROUTINES = frozenset(
    {"cublasSgemm", "cublasSgemmStridedBatched", "cublasGemmEx", "cublasGemmStridedBatchedEx"}
)


def script(finding: Finding) -> dict[str, str]:
    """A standalone CuPy script of the finding's largest case, run under ncu without this tool."""
    case = finding.evidence[-1]
    title = md_text(
        f"{finding.rule}: {finding.gpu_label} {finding.routine or finding.api} {finding.mode} "
        f"{case['m']}x{case['n']}x{case['k']}, batch {case['batch']}"
    )
    sweep = [
        "cublas-audit",
        "sweep",
        "--batched" if finding.batch > 1 else "--single",
        "--sizes" if case["m"] == case["n"] == case["k"] else "--shapes",
        str(case["m"])
        if case["m"] == case["n"] == case["k"]
        else f"{case['m']}x{case['n']}x{case['k']}",
        "--modes",
        finding.mode,
        "--api",
        finding.api,
    ]
    if finding.batch > 1:
        sweep += ["--batches", str(finding.batch)]
    script = ""
    if finding.routine in SCRIPTED_ROUTINES:
        mode = mode_of(finding.mode)
        script = md_fence(
            template("repro_script.py.j2").render(
                rule=finding.rule,
                routine=finding.routine,
                kernel=finding.kernel,
                metric=PIPE_METRICS[mode.pipe],
                dtype=mode.storage,
                data_type=mode.data_type,
                compute=mode.compute_type,
                **case,
            ),
            "python",
        )
    return {"title": title, "sweep": shlex.join(sweep), "script": script}
