"""One-token mutation testing of judge/ and table/ against the CPU tests that cover each module.

    python benchmarks/mutation.py [--modules GLOB...] [--sample N --seed S] [--jobs J]
                                  [--timeout S] [--out FILE] [--only FILE:LINE...] [--list]

Each mutant changes one token of one module (tokenize, so never inside a string or comment):
a comparison swapped (> >=, < <=, == !=), and <-> or, is <-> is not, True <-> False, a number
plus 1, + <-> -, * <-> /, a `not` removed. A mutant that does not compile, or parses to the
same tree, is no mutant. Each is applied to a scratch copy of the committed tree (`--rev`,
HEAD by default: never the checkout, where others' edits may be half done; one copy per job, the
mutated file restored after each mutant), and the tests mapped to its module
(`TESTS`, else the test files that import it; the first, or a rule's own, alone first) run in a
child forked from a process that has
pandas, numpy and pytest imported already (1.5 s a mutant saved), stopping at the first
failure, under a timeout of `--timeout` or five times the unmutated run, whichever is longer (a
timed-out mutant is counted killed: it changed behaviour enough to hang a test, and is listed).
Each test set first runs unmutated: a set that fails is reported and its mutants not judged.

Equivalent mutants (no test can tell them apart: the same behaviour) are listed with why in
benchmarks/mutation_equivalent.json, keyed by file, line text, column and token; the score is
killed / (judged - equivalent), with its 95 % Wilson interval where the run was a sample.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import functools
import importlib.util
import io
import json
import math
import os
import random
import re
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

REPO = Path(__file__).resolve().parent.parent
TREE = REPO  # the committed tree mutated (a scratch copy of --rev), set by main
RESULT = REPO / "benchmarks" / "results" / "mutation_judge_table.json"
EQUIVALENT = REPO / "benchmarks" / "mutation_equivalent.json"
DEFAULT_MODULES = ("cublas_audit/judge/**/*.py", "cublas_audit/table/*.py")

RULE_TESTS = (
    "tests/rules",
    "tests/test_rule_thresholds.py",
    "tests/test_layout_rules.py",
    "tests/test_map_rules.py",
    "tests/test_findings_kernel_time.py",
)
# A rule module's own tests, run first.
RULE_FIRST = {
    "utilization": (
        "tests/rules/test_no_escalation.py",
        "tests/rules/test_legacy_kernel.py",
        "tests/rules/test_low_utilization.py",
    ),
    "timing_rules": (
        "tests/rules/test_reference_faster.py",
        "tests/rules/test_batched_slower_than_loop.py",
    ),
    "layout": (
        "tests/rules/test_layout_penalty.py",
        "tests/rules/test_broadcast_slower_than_folded.py",
    ),
    "maps": ("tests/rules/test_size_inversion.py", "tests/rules/test_dispatch_cliff.py"),
    "occupancy": ("tests/rules/test_underfilled_grid.py",),
    "causes": ("tests/rules/test_unaligned_operand.py",),
    "better_candidate": ("tests/rules/test_better_candidate.py",),
    "registry": ("tests/rules/test_registry.py",),
    "__init__": (
        "tests/rules/test_registry.py",
        "tests/rules/test_reference_faster.py",
        "tests/rules/test_batched_slower_than_loop.py",
    ),
}
# The tests that cover each module, most specific first (a killed mutant stops at its first
# failure); a module not named here gets the test files that import it.
TESTS: dict[str, tuple[str, ...]] = {
    "cublas_audit/judge/verdicts.py": (
        "tests/test_verdict_arithmetic.py",
        "tests/rules",
        "tests/test_diff.py",
        "tests/test_findings_kernel_time.py",
    ),
    "cublas_audit/judge/noise.py": (
        "tests/test_verdict_arithmetic.py",
        "tests/test_rerun_noise.py",
        "tests/test_map_noise.py",
        "tests/rules",
    ),
    "cublas_audit/judge/timed_rows.py": (
        "tests/rules",
        "tests/test_findings_kernel_time.py",
        "tests/test_diff_kernel_time.py",
        "tests/test_rule_thresholds.py",
    ),
    "cublas_audit/judge/finding.py": (
        "tests/rules", "tests/test_findings.py", "tests/test_grouping.py",
    ),
    "cublas_audit/judge/thresholds.py": (
        "tests/rules", "tests/test_findings.py", "tests/test_cli_errors.py",
    ),
    "cublas_audit/judge/audited.py": (
        "tests/rules", "tests/test_findings.py", "tests/test_render.py",
    ),
    "cublas_audit/judge/roofline.py": ("tests/test_roofline.py", "tests/rules"),
    "cublas_audit/judge/candidates.py": (
        "tests/rules/test_better_candidate.py",
        "tests/test_candidates.py",
        "tests/test_candidates_kernel_times.py",
    ),
    "cublas_audit/judge/diff.py": (
        "tests/test_diff_gate_decisions.py",
        "tests/test_diff.py",
        "tests/test_diff_kernel_time.py",
        "tests/test_diff_judged_time.py",
    ),
    "cublas_audit/judge/fixes.py": (
        "tests/rules/test_shape_fixes.py",
        "tests/test_fixes.py",
        "tests/test_fix_inputs.py",
    ),
    "cublas_audit/judge/grouping.py": ("tests/test_grouping.py", "tests/rules"),
    "cublas_audit/judge/impact.py": ("tests/test_trace_impact.py", "tests/test_fixes.py"),
    "cublas_audit/judge/map_audit.py": (
        "tests/test_map_noise.py", "tests/test_map.py", "tests/test_map_rules.py",
    ),
    "cublas_audit/judge/units.py": ("tests/rules/test_unit_mismatch.py", "tests/test_multi_gpu.py"),
    "cublas_audit/table/validation.py": (
        "tests/test_table.py", "tests/test_hardening.py", "tests/test_rule_thresholds.py",
    ),
    "cublas_audit/table/dispatch.py": (
        "tests/test_table.py", "tests/test_table_inputs.py", "tests/rules",
    ),
    "cublas_audit/table/fix_file.py": (
        "tests/rules/test_shape_fixes.py",
        "tests/test_fixes.py",
        "tests/test_verify_inputs.py",
        "tests/test_fix_inputs.py",
    ),
    "cublas_audit/table/json_records.py": ("tests/test_fixes.py", "tests/test_vocabulary.py"),
    "cublas_audit/table/inputs.py": ("tests/test_table_inputs.py", "tests/test_table.py"),
    "cublas_audit/table/rundir.py": ("tests/test_table_inputs.py", "tests/test_resume.py"),
}  # fmt: skip
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


def tests_of(module: str) -> tuple[str, ...]:
    """The test files of a module: `TESTS`, else those that import it (the tests/rules modules
    for a rule module), its own rule's tests first."""
    if module in TESTS:
        return TESTS[module]
    if module.startswith("cublas_audit/judge/rules/"):
        return (*RULE_FIRST.get(Path(module).stem, ()), *RULE_TESTS)
    dotted = module.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    package, _, short = dotted.rpartition(".")
    imported = rf"from {re.escape(package)} import [^\n]*\b{short}\b"
    pattern = re.compile(rf"{re.escape(dotted)}\b|{imported}")
    files = sorted(TREE.glob("tests/**/test_*.py"))
    importing = [f for f in files if pattern.search(f.read_text())]
    importing.sort(key=lambda f: f.stat().st_size)  # the smaller first: a kill comes sooner
    return tuple(str(f.relative_to(TREE)) for f in importing[:6])


@functools.cache
def stages_of(module: str) -> tuple[tuple[str, ...], ...]:
    """The module's test files in two runs: the first file (or its rule's own) alone, where a
    mutant is most often killed at a fraction of the collection cost, then the others."""
    files: list[str] = []
    for entry in tests_of(module):
        found = sorted(TREE.glob(f"{entry}/test_*.py")) if (TREE / entry).is_dir() else []
        for name in [str(f.relative_to(TREE)) for f in found] or [entry]:
            if name not in files and (TREE / name).exists():
                files.append(name)
    own = RULE_FIRST.get(Path(module).stem, ()) if "/rules/" in module else ()
    if own:  # then every rule test: one second run (and one baseline) for all rule modules
        return (own, tuple(sorted(files)))
    return tuple(stage for stage in (tuple(files[:1]), tuple(files[1:])) if stage)


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
    """Fork a child that runs `tests` in `tree` (its own process group); its pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setpgid(0, 0)
        os.chdir(tree)
        sys.path.insert(0, str(tree))
        os.environ["PYTHONPATH"] = str(tree)  # the tests' own child processes import it too
        log = os.open(tree / "pytest.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        import pytest

        code = pytest.main(
            [*tests, "-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-o", "addopts=",
             "-m", "not slow and not heavy and not gpu"]
        )  # fmt: skip
        os._exit(0 if code == pytest.ExitCode.NO_TESTS_COLLECTED else int(code))  # all GPU
    except BaseException:
        os._exit(99)


def wait_all(running: dict[int, float], limit: dict[int, float]) -> tuple[int, int, bool]:
    """Wait for one child: (pid, exit code, timed out)."""
    while True:
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return pid, os.waitstatus_to_exitcode(status), False
            if time.monotonic() - running[pid] > limit[pid]:
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
    trees: list[Path],
    floor_s: float,
    progress: Callable[[dict[str, Any]], object] = lambda outcome: None,
) -> dict[str, Any]:
    jobs = len(trees)
    free = list(range(jobs))
    by_module: dict[str, list[Mutant]] = defaultdict(list)
    for mutant in mutants:
        by_module[mutant.file].append(mutant)
    baseline: dict[str, float] = {}
    outcome: dict[str, Any] = {
        "killed": [], "survived": [], "timeouts": [], "not_judged": {}, "baseline_s": baseline,
    }  # fmt: skip
    try:
        # each stage's tests, unmutated (in parallel): they must pass, and give the timeout
        took: dict[tuple[str, ...], tuple[float, int]] = {}
        pending = sorted({stage for module in by_module for stage in stages_of(module)})
        while pending:
            started: dict[int, tuple[tuple[str, ...], int]] = {}
            running: dict[int, float] = {}
            limit: dict[int, float] = {}
            for slot in list(free)[: len(pending)]:
                tests = pending.pop(0)
                pid = fork_tests(trees[slot], tests)
                started[pid], running[pid], limit[pid] = (tests, slot), time.monotonic(), 1800
            while running:
                pid, code, _ = wait_all(running, limit)
                tests, slot = started[pid]
                took[tests] = (time.monotonic() - running.pop(pid), code)
                if code != 0:  # why, for the record
                    failed = (trees[slot] / "pytest.log").read_text().splitlines()
                    print("\n".join(failed[-30:]), flush=True)
                words = f"baseline {' '.join(tests)}: {took[tests][0]:.1f} s, exit {code}"
                print(words, flush=True)
        for module in by_module:
            baseline[module] = sum(took[stage][0] for stage in stages_of(module))
            codes = [took[stage][1] for stage in stages_of(module)]
            if any(codes):
                outcome["not_judged"][module] = f"its tests fail unmutated (pytest exit {codes})"
        queue = [m for m in mutants if m.file not in outcome["not_judged"]]
        running, limit = {}, {}
        # each running child: its mutant, slot, the module's text, the stage it runs, its start
        held: dict[int, tuple[Mutant, int, str, int, float]] = {}
        done = 0
        while queue or running:
            while queue and free:
                mutant, slot = queue.pop(0), free.pop()
                path = trees[slot] / mutant.file
                original = path.read_text()
                pristine_pyc(path)
                path.write_text(
                    apply(original, (mutant.line, mutant.col), mutant.end, mutant.replacement)
                )
                pid = fork_tests(trees[slot], stages_of(mutant.file)[0])
                held[pid] = (mutant, slot, original, 0, time.monotonic())
                running[pid] = time.monotonic()
                limit[pid] = max(floor_s, 5 * took[stages_of(mutant.file)[0]][0])
            pid, code, timed_out = wait_all(running, limit)
            running.pop(pid)
            mutant, slot, original, stage, began = held.pop(pid)
            stages = stages_of(mutant.file)
            if code == 0 and not timed_out and stage + 1 < len(stages):  # on to the next stage
                nxt = fork_tests(trees[slot], stages[stage + 1])
                held[nxt] = (mutant, slot, original, stage + 1, began)
                running[nxt] = time.monotonic()
                limit[nxt] = max(floor_s, 5 * took[stages[stage + 1]][0])
                continue
            path = trees[slot] / mutant.file
            path.write_text(original)
            pristine_pyc(path)
            free.append(slot)
            kind = "timeouts" if timed_out else "killed" if code != 0 else "survived"
            outcome[kind].append(mutant)
            done += 1
            spent = time.monotonic() - began
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
    every = [m for path in files for m in mutants_of(path)]
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
    import pytest  # noqa: F401

    started = time.monotonic()
    tests = {module: stages_of(module) for module in sorted({m.file for m in chosen})}

    def write(outcome: dict[str, Any], complete: bool = False) -> dict[str, Any]:
        done = {m.key for kind in ("killed", "survived", "timeouts") for m in outcome[kind]}
        judged = [m for m in chosen if m.key in done]
        equivalent = [m for m in outcome["survived"] if m.key in allowed]
        survived = [m for m in outcome["survived"] if m.key not in allowed]
        detected = len(outcome["killed"]) + len(outcome["timeouts"])
        scored = len(judged) - len(equivalent)
        record = {
            "what": "one-token mutation testing of cublas_audit/judge/ and cublas_audit/table/",
            "date": datetime.date.today().isoformat(),
            "command": " ".join(["python benchmarks/mutation.py", *(argv or sys.argv[1:])]),
            "commit": rev,
            "complete": complete,
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
                "survived": len(survived),
                "score": round(detected / scored, 4) if scored else None,
                "wilson_95": list(wilson(detected, scored)),
            },
            "not_judged": outcome["not_judged"],
            "survived": [m.name for m in survived],
            "timeouts": [m.name for m in outcome["timeouts"]],
            "equivalent": [{"mutant": m.name, "reason": allowed[m.key]} for m in equivalent],
            "tests": {module: [list(stage) for stage in st] for module, st in tests.items()},
            "baseline_s": {m: round(t, 1) for m, t in sorted(outcome["baseline_s"].items())},
            "wall_s": round(time.monotonic() - started, 1),
        }
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        return record

    outcome = run(chosen, trees, args.timeout, write)
    shutil.rmtree(scratch, ignore_errors=True)
    record = write(outcome, complete=True)
    print(json.dumps(record["totals"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
