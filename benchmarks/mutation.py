"""One-token mutation testing of judge/ and table/ against the CPU tests that run each mutated line.

    python benchmarks/mutation.py [--modules GLOB...] [--sample N --seed S] [--jobs J]
                                  [--timeout S] [--out FILE] [--only FILE:LINE...] [--list]
                                  [--rescore]

Each mutant changes one token of one module (tokenize, so never inside a string or comment):
a comparison swapped (> >=, < <=, == !=), and <-> or, is <-> is not, True <-> False, a number
plus 1, + <-> -, * <-> /, a `not` removed. A mutant that does not compile, or parses to the
same tree, is no mutant. Each is applied to a scratch copy of the committed tree (`--rev`,
HEAD by default: never the checkout, where others' edits may be half done; one copy per job, the
mutated file restored after each mutant).

The tests a mutant runs are those that execute its line (as mutmut and cosmic-ray select them):
once per commit, the CPU suite (`-m "not slow and not gpu"`: `pytest -q`'s tests and CI's
second step's heavy ones, all that a mutant must get past) runs in one process under
coverage.py, measuring judge/ and table/ with each test as its own context
(mutation_coverage.py), and the map from line to passing tests (one that fails or skips there is
never selected), with each test's CPU seconds, is cached under ~/.cache/cublas-audit (a rerun or
`--only` reuses it). A mutant's tests are those of any line of its statement; for a line outside
any function body (run at import: a module's constants, a default argument), every test that
runs a line of its module. A mutant runs its tests cheapest first, in a child forked from a
process that has pandas, numpy and pytest imported already, stopping at the first failure, under
a timeout of `--timeout` or five times the tests' recorded CPU seconds, whichever is longer, in
the child's CPU seconds (four times that in wall-clock seconds for a child hung idle; a
timed-out mutant is counted killed: it changed behaviour enough to hang a test, and is listed).
A mutant that no test runs (its line unreached, or reached only in a child process the map does
not measure) is listed as not covered and counts as survived.

Equivalent mutants (no test can tell them apart: the same behaviour) are listed with why in
benchmarks/mutation_equivalent.json, keyed by file, line text, column and token; the score is
killed / (judged - equivalent), with its 95 % Wilson interval where the run was a sample.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import io
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tokenize
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mutation_coverage import WITH_HEAVY, CoverageMap, fork_in

REPO = Path(__file__).resolve().parent.parent
TREE = REPO  # the committed tree mutated (a scratch copy of --rev), set by main
RESULT = REPO / "benchmarks" / "results" / "mutation_judge_table.json"
EQUIVALENT = REPO / "benchmarks" / "mutation_equivalent.json"
DEFAULT_MODULES = ("cublas_audit/judge/**/*.py", "cublas_audit/table/*.py")

SWAPS = {
    ">": ">=", ">=": ">", "<": "<=", "<=": "<", "==": "!=", "!=": "==",
    "+": "-", "-": "+", "*": "/", "/": "*", "and": "or", "or": "and",
    "True": "False", "False": "True",
}  # fmt: skip


@dataclass(frozen=True)
class Mutant:
    file: str  # relative to the repository
    line: int
    col: int
    end: tuple[int, int]  # the replaced text's end (line, col)
    token: str
    replacement: str
    text: str  # the line as it stands, stripped: the equivalent list's key

    @property
    def name(self) -> str:
        change = f"{self.token} -> {self.replacement or '(removed)'}"
        return f"{self.file}:{self.line}:{self.col}: {change}"

    @property
    def key(self) -> str:
        return f"{self.file}|{self.text}|{self.col}|{self.token}->{self.replacement}"


def mutants_of(path: Path) -> list[Mutant]:
    """The one-token mutants of a module of the committed tree (`path` under TREE)."""
    source = path.read_text()
    lines = source.splitlines()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    tree = ast.dump(ast.parse(source))
    found = []
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else tok
        prev = tokens[i - 1] if i else tok
        end, replacement = tok.end, None
        if tok.type in (tokenize.OP, tokenize.NAME) and tok.string in SWAPS:
            replacement = SWAPS[tok.string]
        elif tok.type == tokenize.NAME and tok.string == "is":
            if nxt.string == "not":
                end, replacement = nxt.end, "is"
            else:
                replacement = "is not"
        elif tok.type == tokenize.NAME and tok.string == "not" and prev.string != "is":
            end, replacement = nxt.start, ""
        elif tok.type == tokenize.NUMBER and not tok.string.lower().endswith("j"):
            value = ast.literal_eval(tok.string)
            replacement = repr(value + 1 if isinstance(value, int) else round(value + 1, 10))
        if replacement is None or lines[tok.start[0] - 1].lstrip().startswith("@"):
            continue  # nothing to change; a decorator's arguments (frozen=True) are no logic
        mutated = apply(source, tok.start, end, replacement)
        try:
            if ast.dump(ast.parse(mutated)) == tree:
                continue
            compile(mutated, str(path), "exec")
        except (SyntaxError, ValueError):
            continue  # `*args` made `/args`: no program
        rel = str(path.relative_to(TREE))
        original = source_span(lines, tok.start, end)
        found.append(
            Mutant(rel, tok.start[0], tok.start[1], end, original, replacement,
                   lines[tok.start[0] - 1].strip())
        )  # fmt: skip
    return found


def source_span(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    if start[0] == end[0]:
        return lines[start[0] - 1][start[1] : end[1]].rstrip()
    return lines[start[0] - 1][start[1] :].rstrip()


def apply(source: str, start: tuple[int, int], end: tuple[int, int], text: str) -> str:
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    a = offsets[start[0] - 1] + start[1]
    b = offsets[end[0] - 1] + end[1]
    return source[:a] + text + source[b:]


# ----- the scratch trees and the forked runs -----------------------------------------------------


def scratch_tree(root: Path, rev: str) -> Path:
    """The whole tree as commit `rev` holds it (git archive): never the working tree, where
    others' edits and runs may be half done, and nothing in it links back to the checkout."""
    root.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    for name, folder in (("probes", "probes"), ("reference_kernels", "reference_kernels"),
                         ("bundled", "reports")):  # fmt: skip
        if not (root / "cublas_audit" / name).exists():  # as pyproject.toml maps them
            (root / "cublas_audit" / name).symlink_to(root / folder)
    return root


def fork_tests(tree: Path, tests: tuple[str, ...]) -> int:
    """Fork a child that runs the tests `tests` (node ids, each its own argument) in `tree`, in
    that order, stopping at the first failure; its pid."""

    def work() -> int:
        import pytest

        return int(pytest.main([*tests, "-x", "-q", *WITH_HEAVY]))

    return fork_in(tree, work)


def cpu_seconds(pid: int) -> float:
    """A child's CPU seconds so far, with those of the children it waited for (/proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(tick) for tick in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def wait_all(running: dict[int, float], limit: dict[int, float]) -> tuple[int, int, bool]:
    """Wait for one child: (pid, exit code, timed out). A child times out past its limit in CPU
    seconds (on the shared machine the neighbours set the wall clock), or, hung without using
    the CPU, past four times that in wall-clock seconds."""
    while True:
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return pid, os.waitstatus_to_exitcode(status), False
            wall = time.monotonic() - running[pid]
            if cpu_seconds(pid) > limit[pid] or wall > 4 * limit[pid]:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return pid, -9, True
        time.sleep(0.05)


def pristine_pyc(path: Path) -> None:
    """The mutated module's cached bytecode removed: a mutant of the same size written in the
    same second would otherwise load the previous one's."""
    cached = Path(importlib.util.cache_from_source(str(path)))
    cached.unlink(missing_ok=True)


def run(
    mutants: list[Mutant],
    selected: dict[str, tuple[str, ...]],
    limits: dict[str, float],
    trees: list[Path],
    progress: Callable[[dict[str, Any]], object] = lambda outcome: None,
) -> dict[str, Any]:
    """Each mutant's tests (`selected`, by its key) run on it, under its time limit: the outcome,
    mutants by kind (a mutant no test runs: not covered)."""
    free = list(range(len(trees)))
    outcome: dict[str, Any] = {
        "killed": [], "survived": [], "timeouts": [], "not_covered": [], "not_judged": {},
    }  # fmt: skip
    queue: list[Mutant] = []
    for mutant in mutants:
        (queue if selected[mutant.key] else outcome["not_covered"]).append(mutant)
    running: dict[int, float] = {}
    limit: dict[int, float] = {}
    held: dict[int, tuple[Mutant, int, str]] = {}  # a child's mutant, slot and module's text
    done = len(outcome["not_covered"])
    try:
        while queue or running:
            while queue and free:
                mutant, slot = queue.pop(0), free.pop()
                path = trees[slot] / mutant.file
                original = path.read_text()
                pristine_pyc(path)
                path.write_text(
                    apply(original, (mutant.line, mutant.col), mutant.end, mutant.replacement)
                )
                pid = fork_tests(trees[slot], selected[mutant.key])
                held[pid] = (mutant, slot, original)
                running[pid], limit[pid] = time.monotonic(), limits[mutant.key]
            pid, code, timed_out = wait_all(running, limit)
            spent = time.monotonic() - running.pop(pid)
            mutant, slot, original = held.pop(pid)
            path = trees[slot] / mutant.file
            path.write_text(original)
            pristine_pyc(path)
            free.append(slot)
            if code == pytest.ExitCode.USAGE_ERROR:  # a test id not found: no verdict
                log = (trees[slot] / "pytest.log").read_text().splitlines()
                outcome["not_judged"][mutant.name] = " ".join(log[-3:])
                kind = "not judged"
            else:
                kind = "timeouts" if timed_out else "killed" if code != 0 else "survived"
                outcome[kind].append(mutant)
            done += 1
            print(f"[{done}/{len(mutants)}] {kind:9} {spent:5.1f} s  {mutant.name}", flush=True)
            if done % 10 == 0:
                progress(outcome)  # the record so far: a run cut short still says what it did
    finally:
        for tree in trees:
            shutil.rmtree(tree, ignore_errors=True)
    return outcome


# ----- the record --------------------------------------------------------------------------------


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (round(centre - half, 4), round(centre + half, 4))


def rescore(path: Path) -> int:
    """A finished record's survivors that benchmarks/mutation_equivalent.json now lists (each
    with why) moved to its equivalent ones, and the score again: no mutant is run."""
    record = json.loads(path.read_text())
    allowed = {e["key"]: e["reason"] for e in json.loads(EQUIVALENT.read_text())}
    moved = {}
    for name in record["survived"]:
        file, line, col, change = name.split(":", 3)
        token, replacement = (part.strip() for part in change.split(" -> "))
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{record['commit']}:{file}"],
            check=True, capture_output=True, text=True,
        ).stdout.splitlines()  # fmt: skip
        text = source[int(line) - 1].strip()
        replacement = "" if replacement == "(removed)" else replacement
        key = f"{file}|{text}|{col}|{token}->{replacement}"
        if key in allowed:
            moved[name] = allowed[key]
    record["survived"] = [name for name in record["survived"] if name not in moved]
    if "not_covered" in record:  # a not covered mutant is among the survivors too
        record["not_covered"] = [name for name in record["not_covered"] if name not in moved]
        record["totals"]["not_covered"] = len(record["not_covered"])
    record["equivalent"] += [{"mutant": name, "reason": why} for name, why in moved.items()]
    totals = record["totals"]
    totals["equivalent"], totals["survived"] = len(record["equivalent"]), len(record["survived"])
    detected = totals["killed"] + totals["timeouts"]
    scored = totals["judged"] - totals["equivalent"]
    totals["score"] = round(detected / scored, 4) if scored else None
    totals["wilson_95"] = list(wilson(detected, scored))
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(totals))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", default=list(DEFAULT_MODULES))
    parser.add_argument("--sample", type=int, default=0, help="judge N mutants drawn at random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--rev", default="HEAD", help="the commit whose tree is mutated")
    parser.add_argument("--timeout", type=float, default=60.0, help="the least, in seconds")
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument(
        "--only", nargs="+", default=[], help="only the mutants at FILE:LINE (a survivor again)"
    )
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument(
        "--rescore", action="store_true", help="reread --out with the equivalent list as it is now"
    )
    args = parser.parse_args(argv)
    if args.rescore:
        return rescore(args.out)
    global TREE
    scratch = Path(tempfile.mkdtemp(prefix="cublas-audit-mutation-"))
    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", args.rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    trees = [scratch_tree(scratch / f"tree{i}", rev) for i in range(max(1, args.jobs))]
    TREE = trees[0]
    files = sorted({p for pattern in args.modules for p in TREE.glob(pattern) if p.is_file()})
    named = {spot.rpartition(":")[0] for spot in args.only}
    every = [
        m
        for path in files
        if not named or str(path.relative_to(TREE)) in named  # no mutants made for nothing
        for m in mutants_of(path)
    ]
    if args.only:
        every = [m for m in every if f"{m.file}:{m.line}" in args.only]
    allowed = {e["key"]: e["reason"] for e in json.loads(EQUIVALENT.read_text())}
    size = min(args.sample, len(every))
    chosen = random.Random(args.seed).sample(every, size) if args.sample else every
    chosen.sort(key=lambda m: (m.file, m.line, m.col))
    if args.list:
        for mutant in chosen:
            print(mutant.name, "(equivalent)" if mutant.key in allowed else "")
        shutil.rmtree(scratch, ignore_errors=True)
        return 0
    # for speed: the children start from a process with the test suite's libraries imported
    import numpy  # noqa: F401
    import pandas  # noqa: F401

    started = time.monotonic()
    covering = CoverageMap.of(TREE, rev, suite="with-heavy")
    print(f"coverage map: {len(covering.seconds)} tests, built in {covering.build_s} s", flush=True)
    selected = {
        m.key: covering.tests_for(m.file, m.line, (TREE / m.file).read_text()) for m in chosen
    }
    limits = {
        key: max(args.timeout, 5 * sum(covering.seconds[t] for t in tests))
        for key, tests in selected.items()
    }
    covers: dict[str, set[str]] = defaultdict(set)
    for mutant in chosen:
        covers[mutant.file].update(selected[mutant.key])

    def write(outcome: dict[str, Any], complete: bool = False) -> dict[str, Any]:
        kinds = ("killed", "survived", "timeouts", "not_covered")
        done = {m.key for kind in kinds for m in outcome[kind]}
        judged = [m for m in chosen if m.key in done]
        unrun = outcome["not_covered"]
        equivalent = [m for m in outcome["survived"] + unrun if m.key in allowed]
        survived = [m for m in outcome["survived"] + unrun if m.key not in allowed]
        detected = len(outcome["killed"]) + len(outcome["timeouts"])
        scored = len(judged) - len(equivalent)
        spent = time.monotonic() - started
        record = {
            "what": "one-token mutation testing of cublas_audit/judge/ and cublas_audit/table/",
            "date": datetime.date.today().isoformat(),
            "command": " ".join(["python benchmarks/mutation.py", *(argv or sys.argv[1:])]),
            "commit": rev,
            "complete": complete,
            "selection": "coverage",
            "modules": [str(f.relative_to(TREE)) for f in files],
            "mutants_generated": len(every),
            "sample": args.sample or None,
            "seed": args.seed if args.sample else None,
            "totals": {
                "mutants": len(chosen),
                "judged": len(judged),
                "killed": len(outcome["killed"]),
                "timeouts": len(outcome["timeouts"]),
                "equivalent": len(equivalent),
                "survived": len(survived),  # the not covered among them
                "not_covered": len([m for m in unrun if m.key not in allowed]),
                "score": round(detected / scored, 4) if scored else None,
                "wilson_95": list(wilson(detected, scored)),
            },
            "not_judged": outcome["not_judged"],
            "survived": [m.name for m in survived],
            "not_covered": [m.name for m in unrun if m.key not in allowed],
            "timeouts": [m.name for m in outcome["timeouts"]],
            "equivalent": [{"mutant": m.name, "reason": allowed[m.key]} for m in equivalent],
            "coverage_map": {
                "tests": len(covering.seconds),
                "not_passed": covering.failed,  # failed or skipped there: never selected
                "build_s": covering.build_s,
            },
            # each module: how many tests run its mutants' lines, and their CPU seconds in all
            "tests": {module: len(tests) for module, tests in covers.items()},
            "baseline_s": {
                module: round(sum(covering.seconds[t] for t in tests), 1)
                for module, tests in covers.items()
            },
            "wall_s": round(spent, 1),
            "s_per_mutant": round(spent / len(judged), 2) if judged else None,
        }
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        return record

    outcome = run(chosen, selected, limits, trees, write)
    shutil.rmtree(scratch, ignore_errors=True)
    record = write(outcome, complete=True)
    print(json.dumps(record["totals"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
