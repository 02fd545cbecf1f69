"""Which tests leave the everyday `pytest -q` for CI's second step (issue 38 item 4: the quick
suite in at most 80 s of CPU on the 2-core machine, without dropping what it proves).

    python benchmarks/heavy_tests.py [--budget S] [--floor S] [--cpu-log FILE] [--rev REV] [--more]

The quick suite (`pytest -q`'s tests at --rev, with tests/heavy_tests.txt emptied) runs once
under coverage.py over the whole package, each test its own context (mutation_coverage.py's
recorder: a fixture's or a session cache's lines go to every test that uses it). Then, costliest
test first (a parametrized test's cases each on their own), a test moves to
tests/heavy_tests.txt only where every line of cublas_audit it runs is still run by a test that
stays quick; it stops once the quick tests' CPU is within --budget, and never moves a test
cheaper than --floor. So the quick suite still runs every line it ran before; what moves is the
same paths run again by costlier end-to-end tests, which CI's second step (`pytest -q -m heavy`)
keeps proving. Each test's CPU comes from --cpu-log (tests/conftest.py's CUBLAS_AUDIT_TEST_CPU
log of `pytest -q`), else from a `pytest -q` run of the same scratch tree made here (a worker per
core, as the README runs it: run it on a quiet machine); never from the coverage run, whose
seconds tracing inflates. A shared fixture's setup is paid by the first quick test to use it:
once that test moves, the next one pays, so `--more` measures `pytest -q` as the list leaves it
and moves more, until the budget holds. Lines run only in a child process (a test that starts
`cublas-audit` as a program) are outside the map.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import mutation  # noqa: E402
from mutation_coverage import CoverageMap  # noqa: E402
from test_suite_time import cpu_log  # noqa: E402

LIST = REPO / "tests" / "heavy_tests.txt"
HEADER = """\
# The quick suite's costliest tests: they carry the `heavy` marker (tests/conftest.py), so
# `pytest -q` leaves them to CI's second step, `pytest -q -m heavy`. Chosen by
# benchmarks/heavy_tests.py: each runs no line of cublas_audit that a quick test leaves unrun.
# Regenerate it after changing the tests: python benchmarks/heavy_tests.py --cpu-log LOG
# CPU seconds (quiet 2-core machine)  test
"""


def lines_by_test(lines: Mapping[str, Mapping[int, Iterable[str]]]) -> dict[str, set[str]]:
    """Each test's lines of the package, as "file:line"."""
    runs: dict[str, set[str]] = defaultdict(set)
    for file, by_line in lines.items():
        for line, tests in by_line.items():
            for test in tests:
                runs[test].add(f"{file}:{line}")
    return dict(runs)


def choose(
    seconds: Mapping[str, float],
    runs: Mapping[str, set[str]],
    budget: float,
    floor: float,
    moved_before: Iterable[str] = (),
) -> list[str]:
    """The tests to move, costliest first, while the quick ones cost more than `budget`: each
    only where every line it runs stays run by a test that stays quick; none under `floor`.
    `moved_before`: tests already moved (the list as it stands; `seconds` then holds the quick
    tests as they cost without them: a shared fixture's setup moves to the next test using it)."""
    gone = set(moved_before)
    runners = Counter(line for test, lines in runs.items() if test not in gone for line in lines)
    quick = sum(spent for test, spent in seconds.items() if test not in gone)
    moved: list[str] = []
    for test in sorted(set(seconds) - gone, key=lambda name: (-seconds[name], name)):
        if quick <= budget or seconds[test] < floor:
            break
        own = runs.get(test, set())
        if any(runners[line] <= 1 for line in own):
            continue  # the only quick test of some line: it stays
        for line in own:
            runners[line] -= 1
        moved.append(test)
        quick -= seconds[test]
    return moved


def scratch_tree(rev: str) -> Path:
    """The package and tests of `rev` in a scratch directory (mutation.py's copy, the package's
    data folders linked as pyproject.toml maps them), with no heavy list: the quick suite as it
    was before any test moved."""
    tree = mutation.scratch_tree(Path(tempfile.mkdtemp(prefix="heavy-tests-")) / "tree", rev)
    (tree / "tests" / "heavy_tests.txt").unlink(missing_ok=True)
    return tree


def measured_cpu(tree: Path) -> dict[str, float]:
    """Each quick test's CPU seconds in a `pytest -q` run of `tree` (tests/conftest.py's log)."""
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "cpu.log"
        env = {**os.environ, "CUBLAS_AUDIT_TEST_CPU": str(log), "PYTHONPATH": str(tree)}
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        subprocess.run(argv, cwd=tree, env=env, capture_output=True, check=False)
        return cpu_log(log)


def listed() -> dict[str, str]:
    """The list as it stands: each node id and its line."""
    if not LIST.exists():
        return {}
    rows = [line for line in LIST.read_text().splitlines() if line.strip() and line[0] != "#"]
    return {row.split(None, 1)[1]: row for row in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=40.0, help="quick tests' CPU seconds")
    parser.add_argument("--floor", type=float, default=0.1, help="never move a cheaper test")
    parser.add_argument("--cpu-log", type=Path, help="a CUBLAS_AUDIT_TEST_CPU log")
    parser.add_argument("--rev", default="HEAD", help="the commit whose quick suite is mapped")
    parser.add_argument(
        "--more",
        action="store_true",
        help="keep the list and add to it; the CPU log is then of `pytest -q` with the list",
    )
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", args.rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    before = listed() if args.more else {}
    tree = scratch_tree(commit)
    try:
        if args.cpu_log:
            measured = cpu_log(args.cpu_log)
        else:
            measured = measured_cpu(REPO if args.more else tree)
        covered = CoverageMap.of(tree, commit, measured=("cublas_audit",), suite="quick")
    finally:
        shutil.rmtree(tree.parent, ignore_errors=True)
    seconds = {test: measured.get(test, 0.0) for test in covered.seconds}
    moved = choose(seconds, lines_by_test(covered.lines), args.budget, args.floor, before)
    rows = [*before.values(), *(f"{seconds[test]:7.2f}  {test}" for test in moved)]
    LIST.write_text(HEADER + "\n".join(rows) + "\n")
    kept = sum(spent for test, spent in seconds.items() if test not in {*before, *moved})
    print(
        f"{len(before) + len(moved)} tests to CI's second step ({len(moved)} new);"
        f" the quick ones keep {kept:.1f} s of CPU and every line they ran; {LIST}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
