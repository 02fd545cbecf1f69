"""Rewrites every file a test compares output against, from the code in this checkout:

    .venv/bin/python tests/regenerate_golden.py            # all of them
    .venv/bin/python tests/regenerate_golden.py markdown   # all but the ptxas record
    .venv/bin/python tests/regenerate_golden.py ptxas      # the ptxas record alone

- tests/golden/*.md: the report of each fixture (tests/test_render.py)
- reports/audit.md and reports/plots/: the bundled audit, each GPU's newest batched run
- reports/<gpu>/<run>/report.md and its plots/: each bundled run's own report
- reports/diffs/*.md: each bundled diff, between the runs its A and B lines name
  (those three: tests/test_bundled.py)
- tests/golden/reference_ptxas.json: ptxas's registers and spills of every reference-kernel
  variant (tests/test_reference_build.py); needs nvcc and takes ~2.5 minutes on two cores

Then review `git diff`: every change must be one the code change intended. The tests render these
files with the same functions (below) and also check facts that do not come from the code: the
article's published tables and TFLOP/s worked out by hand.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: `tests` and `cublas_audit` from this checkout
    sys.path.insert(0, str(REPO))

from cublas_audit.judge.audited import Audited, audit_all, audit_dataset  # noqa: E402
from cublas_audit.judge.diff import compare  # noqa: E402
from cublas_audit.judge.thresholds import Thresholds  # noqa: E402
from cublas_audit.report.diff_report import to_markdown  # noqa: E402
from cublas_audit.report.render import render_report  # noqa: E402
from cublas_audit.table.inputs import Dataset, bundled_runs, load_inputs  # noqa: E402
from cublas_audit.table.rundir import PLOTS_DIR, REPORT_FILE, TABLE_FILE  # noqa: E402

GOLDEN = REPO / "tests" / "golden"
REPORTS = REPO / "reports"
AUDIT = REPORTS / "audit.md"
# Inputs as a user in the repository would type them (paths in reports are shown so).
GOLDEN_INPUTS = {
    "published_article_b8.md": ["tests/fixtures/published_article_b8.csv"],
    "published_article_single_5090.md": ["tests/fixtures/published_article_single_5090.csv"],
    "h100-smoke.md": ["tests/fixtures/h100-smoke"],
    "h100-batched-cublas.md": ["tests/fixtures/h100-batched-cublas"],
}
RUNS = sorted(table.parent for table in REPORTS.glob(f"*/*/{TABLE_FILE}"))
DIFFS = sorted((REPORTS / "diffs").glob("*.md"))
# What the everyday test command renders in the background: the runs reports/audit.md shows (it
# judges them anyway) and the diff between two GPUs. The other runs and diffs are rendered by
# CI's second step (`heavy`): each takes a second or more of CPU to read, judge and render.
QUICK_RUNS = [
    REPORTS / "h100" / "20261123-145452-batched",
    REPORTS / "h200" / "20261123-083048-batched",
]
QUICK_DIFFS = [REPORTS / "diffs" / "h100-vs-h200-batched.md"]
DIFF_SIDES = re.compile(r"^[AB] \((?:baseline|compared)\): `(.+)`$", re.MULTILINE)


# Each renderer expects the repository as the working directory.
def fixture_report(name: str) -> str:
    """tests/golden/<name>: the report of its fixture, no plots."""
    return render_report(
        audit_all(load_inputs([Path(p) for p in GOLDEN_INPUTS[name]]), Thresholds())
    )


@functools.cache
def _loaded(run: Path) -> Dataset:
    """A bundled run loaded once: audit.md, its own report and the diffs all read it."""
    (dataset,) = load_inputs([run])
    return dataset


@functools.cache
def _audited(run: Path) -> Audited:
    """A bundled run judged once: audit.md and the run's own report both show it."""
    return audit_dataset(_loaded(run), Thresholds())


def bundled_audit(plots: Path) -> str:
    """reports/audit.md, its plots written to `plots`."""
    return render_report(
        [_audited(run.resolve().relative_to(REPO)) for run in bundled_runs()], plots
    )


def run_report(run: Path, plots: Path) -> str:
    """reports/<gpu>/<run>/report.md, its plot written to `plots`."""
    return render_report([_audited(run.relative_to(REPO))], plots)


def diff_sides(committed: Path) -> tuple[Path, Path]:
    a, b = DIFF_SIDES.findall(committed.read_text())
    return Path(a), Path(b)


def bundled_diff(committed: Path) -> str:
    """reports/diffs/<name>.md: the diff of the runs its own A and B lines name."""
    a, b = diff_sides(committed)
    return to_markdown(compare(_loaded(a), _loaded(b)))


def render_bundled(
    out: Path,
    runs: Sequence[Path] | None = None,
    diffs: Sequence[Path] | None = None,
    audit_md: bool = True,
) -> None:
    """Every committed file under reports/ that a test compares (or reports/audit.md and the
    `runs` and `diffs` given), rendered afresh into `out`, laid out as in the repository
    (reports/audit.md, reports/plots/, reports/<gpu>/<run>/report.md and plots/,
    reports/diffs/*.md)."""
    if audit_md:
        audit = out / AUDIT.relative_to(REPO)
        audit.parent.mkdir(parents=True, exist_ok=True)
        audit.write_text(bundled_audit(audit.parent / PLOTS_DIR))
    for run in RUNS if runs is None else runs:
        there = out / run.relative_to(REPO)
        there.mkdir(parents=True, exist_ok=True)
        (there / REPORT_FILE).write_text(run_report(run, there / PLOTS_DIR))
    for committed in DIFFS if diffs is None else diffs:
        there = out / committed.relative_to(REPO)
        there.parent.mkdir(parents=True, exist_ok=True)
        there.write_text(bundled_diff(committed))


def _write(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        print(f"rewrote {path.relative_to(REPO)}")


def _sync_plots(rendered: Path, plots: Path) -> None:
    """plots/ holds exactly the PNGs just rendered; unchanged files are left alone."""
    plots.mkdir(exist_ok=True)
    fresh = {p.name: p.read_bytes() for p in rendered.glob("*.png")}
    for old in plots.glob("*.png"):
        if old.name not in fresh:
            old.unlink()
            print(f"removed {old.relative_to(REPO)}")
    for name, data in fresh.items():
        if not (plots / name).exists() or (plots / name).read_bytes() != data:
            (plots / name).write_bytes(data)
            print(f"rewrote {(plots / name).relative_to(REPO)}")


def regenerate_markdown() -> None:
    for name in GOLDEN_INPUTS:
        _write(GOLDEN / name, fixture_report(name))
    with tempfile.TemporaryDirectory() as tmp:
        render_bundled(Path(tmp))
        for committed in [AUDIT, *(run / REPORT_FILE for run in RUNS), *DIFFS]:
            _write(committed, (Path(tmp) / committed.relative_to(REPO)).read_text())
        for folder in [AUDIT.parent, *RUNS]:
            rendered = Path(tmp) / folder.relative_to(REPO) / PLOTS_DIR
            _sync_plots(rendered, folder / PLOTS_DIR)


def regenerate_ptxas() -> None:
    from tests import test_reference_build as build

    if build.NVCC is None:
        raise SystemExit("nvcc not found: the ptxas record needs it")
    record = build.build_record()
    _write(build.PTXAS_RECORD, json.dumps(record, indent=1) + "\n")


def render_into(
    out: Path,
    runs: Sequence[Path] | None = None,
    diffs: Sequence[Path] | None = None,
    audit_md: bool = True,
) -> None:
    """The tests' job: render_bundled(out, runs, diffs) from the repository as the working
    directory, the pictures as empty files under their names (the tests compare the Markdown and
    the pictures' names, not their pixels); the process's directory and functions restored after,
    so that a test worker can do it in its own process."""
    with contextlib.chdir(REPO), _names_only():
        render_bundled(out, runs, diffs, audit_md)


@contextlib.contextmanager
def _names_only() -> Iterator[None]:
    """Pictures written as empty files under their real names (report.plots.picture_name):
    drawing and encoding them is most of the render's time, and no test reads a pixel."""
    from matplotlib import pyplot as plt

    from cublas_audit.report import map_plots, plots

    def save(figure: object, title: str, where: Path, dpi: int, tight: bool = False) -> str:
        plt.close(figure)  # type: ignore[arg-type]
        where.mkdir(parents=True, exist_ok=True)
        (where / plots.picture_name(title)).write_bytes(b"")
        return f"{PLOTS_DIR}/{plots.picture_name(title)}"

    saved = plots.save_figure, map_plots.save_figure
    plots.save_figure = save  # type: ignore[assignment]
    map_plots.save_figure = save  # type: ignore[assignment]
    try:
        yield
    finally:
        plots.save_figure, map_plots.save_figure = saved


def main(argv: Sequence[str]) -> None:
    os.chdir(REPO)
    if argv[:1] == ["render-into"] and len(argv) == 2:  # the tests' background job
        render_into(Path(argv[1]), QUICK_RUNS, QUICK_DIFFS)
        return
    which = set(argv) or {"markdown", "ptxas"}
    if which - {"markdown", "ptxas"}:
        raise SystemExit(__doc__)
    if "markdown" in which:
        regenerate_markdown()
    if "ptxas" in which:
        regenerate_ptxas()


if __name__ == "__main__":
    main(sys.argv[1:])
