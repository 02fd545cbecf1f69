"""Which CPU tests run each line of the package (benchmarks/mutation.py's test selection).

The quick CPU suite runs once, in one process, under coverage.py measuring some of the package's
folders (cublas_audit/judge and cublas_audit/table unless told), each test its own dynamic
context; what a test's shared work runs (a module or session fixture, a result
tests/conftest.py caches for the session) is its own context too, mapped to every test that uses
it, and the measured modules' own caches are emptied before each test: otherwise the first test
to ask would hold the lines all of them rely on. The map keeps passing tests only, each with its
CPU seconds (setup, call and teardown, with the children it waited for).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MEASURED = ("cublas_audit/judge", "cublas_audit/table")
# The CPU tests as pytest runs them in one process: `pytest -q`'s own (QUICK), or with CI's
# second step's heavy ones too (WITH_HEAVY: what a mutant must survive is the whole CPU suite).
QUICK = ("-n", "0", "-p", "no:cacheprovider", "-o", "addopts=",
         "-m", "not slow and not heavy and not gpu")  # fmt: skip
WITH_HEAVY = (*QUICK[:-1], "not slow and not gpu")
SUITES = {"quick": QUICK, "with-heavy": WITH_HEAVY}
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cublas-audit"


def fork_in(tree: Path, work: Callable[[], int]) -> int:
    """Fork a child that runs work() in `tree` (its own process group, its output in
    tree/pytest.log) and exits with what it returns; its pid."""
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
        os._exit(work())
    except BaseException:
        os._exit(99)


def _cpu() -> float:
    now = os.times()
    return now.user + now.system + now.children_user + now.children_system


class Recorder:
    """The pytest plugin of the map's run: switches coverage's context per test and per piece of
    shared work, and notes who uses the shared work, which tests pass and their CPU seconds."""

    def __init__(self, cov: Any, tree: Path, measured: tuple[str, ...]) -> None:
        self.cov, self.tree, self.measured = cov, tree, measured
        self.stack = [""]  # "" is import time
        self.users: dict[str, set[str]] = defaultdict(set)  # shared work's context: its tests
        self.seconds: dict[str, float] = {}
        self.failed: set[str] = set()
        self.caches: list[Any] = []

    def tests_of(self, context: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """The tests a context's lines ran for: a test's own, or every test that used the
        shared work (itself perhaps used by other shared work)."""
        if context not in self.users:
            return {context}
        return {
            test
            for user in self.users[context] - seen
            for test in self.tests_of(user, seen | {context})
        }

    def _enter(self, context: str) -> None:
        self.stack.append(context)
        self.cov.switch_context(context)

    def _leave(self) -> None:
        self.stack.pop()
        self.cov.switch_context(self.stack[-1])

    def pytest_sessionstart(self) -> None:
        """tests/conftest.py's session caches (loaded by now, before the test modules that
        import them) wrapped: the first call for a key runs in a context of its own."""
        for module in list(sys.modules.values()):
            if not str(getattr(module, "__file__", "")).startswith(str(self.tree / "tests")):
                continue
            for name, value in list(vars(module).items()):
                if callable(value) and hasattr(value, "cache_clear"):
                    setattr(module, name, self._shared(name, value))

    def _shared(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        done: set[str] = set()

        def call(*args: Any) -> Any:
            key = f"cache {name}{args!r}"
            self.users[key].add(self.stack[-1])  # a test, or shared work that tests use
            if key in done:
                return function(*args)
            done.add(key)
            self._enter(key)
            try:
                return function(*args)
            finally:
                self._leave()

        return call

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> Generator[None, None, None]:
        """tests/conftest.py starts some modules' slow work in threads once collected, unless it
        only collects: it is told so, and each such module's fixture does the work itself, in its
        own context, not in a thread whose lines would go to whichever test ran meanwhile."""
        option = session.config.option
        was, option.collectonly = option.collectonly, True
        try:
            yield
        finally:
            option.collectonly = was
        prefixes = tuple(m.replace("/", ".") for m in self.measured)
        self.caches = [
            value
            for name, module in list(sys.modules.items())
            if name.startswith(prefixes)
            for value in vars(module).values()
            if callable(value) and hasattr(value, "cache_clear")
        ]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        for cache in self.caches:
            cache.cache_clear()
        self._enter(item.nodeid)
        began = _cpu()
        try:
            return (yield)
        finally:
            self.seconds[item.nodeid] = _cpu() - began
            self._leave()
            info = getattr(item, "_fixtureinfo", None)
            for defs in getattr(info, "name2fixturedefs", {}).values():
                if defs and defs[-1].scope != "function":
                    self.users[_fixture(defs[-1])].add(item.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any) -> Generator[None, object, object]:
        shared = fixturedef.scope != "function"
        if shared:
            self._enter(_fixture(fixturedef))
        try:
            return (yield)
        finally:
            if shared:
                self._leave()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.outcome != "passed":
            self.failed.add(report.nodeid)


def _fixture(fixturedef: Any) -> str:
    return f"fixture {fixturedef.baseid}::{fixturedef.argname}"


def record(tree: Path, out: Path, measured: tuple[str, ...], suite: str) -> int:
    """The map's run (in a forked child in `tree`): the tests of `suite` (SUITES) under coverage
    of the folders `measured`, the map written to `out` as JSON; 0, or 1 where some tests failed
    or skipped (they are left out of the map)."""
    import coverage

    cov = coverage.Coverage(
        data_file=str(out.with_suffix(".coverage")),
        source=[str(tree / folder) for folder in measured],
        config_file=False,
    )
    recorder = Recorder(cov, tree, measured)
    cov.start()
    pytest.main(["-q", *SUITES[suite]], plugins=[recorder])
    cov.stop()
    cov.save()
    data = cov.get_data()
    passed = sorted(set(recorder.seconds) - recorder.failed)
    index = {test: i for i, test in enumerate(passed)}
    lines: dict[str, dict[int, list[int]]] = {}
    for path in data.measured_files():
        by_line = lines.setdefault(str(Path(path).relative_to(tree)), {})
        for line, contexts in data.contexts_by_lineno(path).items():
            tests = {t for c in contexts for t in recorder.tests_of(c)} & set(index)
            by_line[line] = sorted(index[test] for test in tests)
    out.write_text(json.dumps({
        "tests": [[test, round(recorder.seconds[test], 3)] for test in passed],
        "failed": sorted(recorder.failed),
        "lines": lines,
    }))  # fmt: skip
    return 1 if recorder.failed else 0


@dataclass(frozen=True)
class CoverageMap:
    commit: str
    build_s: float
    seconds: dict[str, float]  # each passing test: its CPU seconds
    failed: list[str]  # tests that failed or skipped in the map's run: never selected
    lines: dict[str, dict[int, frozenset[str]]]  # file: line: the passing tests that run it

    @classmethod
    def of(
        cls, tree: Path, commit: str, measured: tuple[str, ...] = MEASURED, suite: str = "quick"
    ) -> CoverageMap:
        """The map of `tree` (commit `commit`'s) over the folders `measured`, by the tests of
        `suite` (SUITES): the cached one, else built now (minutes)."""
        folders = "+".join(folder.replace("/", ".") for folder in measured)
        cached = CACHE / f"coverage-{commit}-{folders}-{suite}.json"
        if not cached.exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            began = time.monotonic()
            partial = cached.with_suffix(f".{os.getpid()}.partial")
            pid = fork_in(tree, lambda: record(tree, partial, measured, suite))
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            if code not in (0, 1) or not partial.exists():
                print((tree / "pytest.log").read_text()[-3000:], file=sys.stderr)
                raise RuntimeError(f"the coverage run failed (exit {code})")
            made = json.loads(partial.read_text())
            made["build_s"] = round(time.monotonic() - began, 1)
            partial.write_text(json.dumps(made))
            partial.rename(cached)
            partial.with_suffix(".coverage").unlink(missing_ok=True)
        made = json.loads(cached.read_text())
        names = [test for test, _ in made["tests"]]
        return cls(
            commit, made["build_s"], dict(made["tests"]), made["failed"],
            {file: {int(line): frozenset(names[i] for i in tests) for line, tests in by.items()}
             for file, by in made["lines"].items()},
        )  # fmt: skip

    def tests_for(self, file: str, line: int, source: str) -> tuple[str, ...]:
        """The passing tests that run the statement at `line` of `file` (whose text is
        `source`), cheapest first; for a statement run at import, every test that runs a line of
        the module."""
        spans, at_import = statements(source)
        first, last = spans.get(line, (line, line))
        covered = self.lines.get(file, {})
        if line in at_import:
            tests: Iterable[str] = {t for by_line in covered.values() for t in by_line}
        else:
            tests = {t for n in range(first, last + 1) for t in covered.get(n, ())}
        return tuple(sorted(tests, key=lambda test: (self.seconds[test], test)))


@functools.cache
def statements(source: str) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """Each line's innermost statement as (first line, last line): a compound statement's header
    only (coverage.py records a multi-line statement on whichever of its lines the bytecode
    names); and the lines outside any function body, which run at import."""
    tree = ast.parse(source)
    spans: dict[int, tuple[int, int]] = {}
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1))
        if not isinstance(node, ast.stmt):
            continue
        body = getattr(node, "body", None)
        last = body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno
        last = max(node.lineno, last or node.lineno)
        for n in range(node.lineno, last + 1):
            if n not in spans or spans[n][1] - spans[n][0] > last - node.lineno:
                spans[n] = (node.lineno, last)
    every = set(range(1, len(source.splitlines()) + 1))
    return spans, every - inside
