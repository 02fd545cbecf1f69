"""cublas-audit: catch cuBLAS dispatching the wrong GEMM kernel.

The Python API; the `cublas-audit` command is a thin layer over it.

    import cublas_audit as ca

    runs = ca.load(["reports/h100/20261123-145452-batched"])   # or ca.load() for the bundled
    for finding in ca.audit(runs[0]):                           # rules -> Finding records
        print(finding.severity, finding.rule, finding.message)
    result = ca.compare(runs[0], ca.load_one("reports/h200/20261123-083048-batched"))
    print(result.has_regression, len(result.kernel_changes))
    markdown = ca.render_markdown(runs)                         # the report, as Markdown text
    # On a GPU: ca.run_sweep(ca.SweepOptions(cases=ca.plan(sizes=[1024], batches=[8])))

The names avoid the submodules' (render, sweep, report): importing one sets a package attribute.
Nothing here imports CuPy: the GPU part (cublas_audit.device) loads only inside a sweep's probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cublas_audit.version import __version__ as __version__

if TYPE_CHECKING:
    from cublas_audit.jobs.measure import SweepResult
    from cublas_audit.judge.diff import Diff
    from cublas_audit.judge.finding import Finding
    from cublas_audit.judge.thresholds import Thresholds
    from cublas_audit.planning.cases import Case
    from cublas_audit.run.sweep_options import SweepOptions
    from cublas_audit.table.inputs import Dataset

__all__ = [
    "SweepOptions",
    "audit",
    "compare",
    "load",
    "load_one",
    "plan",
    "render_markdown",
    "run_sweep",
]


def load(paths: Sequence[str | Path] | None = None) -> list[Dataset]:
    """Run directories or dispatch tables (CSV / Parquet), one Dataset per GPU; none: the bundled
    audits (each GPU's newest batched run)."""
    from cublas_audit.table.inputs import bundled_runs, load_inputs

    return load_inputs([Path(p) for p in paths] if paths else bundled_runs())


def load_one(path: str | Path) -> Dataset:
    """One side of a comparison: a run directory or a table of one GPU."""
    from cublas_audit.table.inputs import load_one_gpu

    return load_one_gpu(Path(path))


def audit(dataset: Dataset, thresholds: Thresholds | None = None) -> list[Finding]:
    """The findings of one GPU's table (and its candidate audit, where the run has one)."""
    from cublas_audit.judge.audited import audit_dataset

    return audit_dataset(dataset, thresholds).findings


def compare(a: Dataset, b: Dataset, thresholds: Thresholds | None = None) -> Diff:
    """Kernel changes, deltas and regressions of B against A."""
    from cublas_audit.judge.diff import compare as diff

    return diff(a, b, thresholds)


def render_markdown(datasets: Sequence[Dataset], thresholds: Thresholds | None = None) -> str:
    """The Markdown report of these datasets (no plots; `render.write_report` writes them)."""
    from cublas_audit.judge.audited import audit_all
    from cublas_audit.report.render import render_report

    return render_report(audit_all(datasets, thresholds))


def plan(
    sizes: Sequence[int] = (),
    shapes: Sequence[tuple[int, int, int]] = (),
    batches: Sequence[int] = (4, 8, 16),
    modes: Sequence[str] = ("fp32",),
    apis: Sequence[str] = ("cublas", "cublasLt"),
    single: bool = True,
    batched: bool = True,
) -> list[Case]:
    """The cases of a grid, as `cublas-audit sweep` plans them."""
    from cublas_audit.planning.grid import build_plan

    return build_plan(
        sizes=sizes,
        shapes=shapes,
        batches=batches,
        modes=modes,
        apis=apis,
        single=single,
        batched=batched,
    )


def run_sweep(options: SweepOptions) -> SweepResult:
    """Runs a sweep on this machine's GPU (ncu, CuPy and a GPU needed) into a run directory."""
    from cublas_audit.jobs.measure import sweep

    return sweep(options)


def __getattr__(name: str) -> object:
    if name == "SweepOptions":  # a dataclass, imported on first use like the rest
        from cublas_audit.run.sweep_options import SweepOptions

        return SweepOptions
    raise AttributeError(f"module 'cublas_audit' has no attribute {name!r}")
