"""The quick suite's heavy list (tests/heavy_tests.txt, benchmarks/heavy_tests.py): what it names
exists, takes the `heavy` marker, and was chosen so the quick tests still run every line."""

from __future__ import annotations

import ast
import functools
import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import HEAVY_LIST, REPO, listed_heavy


def chooser() -> ModuleType:
    """benchmarks/heavy_tests.py, imported as a module (benchmarks/ is no package)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module("heavy_tests")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


@functools.cache
def defined(path: Path) -> set[str]:
    """A test file's test functions and methods, as "Class::method" or "function"."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
    return names


def test_every_listed_test_is_defined_in_its_file() -> None:
    # a renamed or deleted test left in the list would silently move nothing
    listed = listed_heavy()
    assert listed, f"{HEAVY_LIST} names no test"
    missing = []
    for entry in sorted(listed):
        file, _, name = entry.partition("[")[0].partition("::")
        if not (REPO / file).exists() or name not in defined(REPO / file):
            missing.append(entry)
    assert not missing


def test_a_listed_function_is_marked_heavy_before_the_marker_filter(
    request: pytest.FixtureRequest,
) -> None:
    # the hook must run before `-m` deselects: after it, a listed test would still run quick
    listed = listed_heavy()
    items = [item for item in request.session.items if item.nodeid in listed]
    assert all(item.get_closest_marker("heavy") for item in items)
    if "not heavy" in (request.config.option.markexpr or ""):
        assert not items  # `pytest -q` (pyproject's addopts) leaves them to CI's second step


def test_the_costliest_function_moves_first_and_the_budget_stops_it() -> None:
    heavy = chooser()
    seconds = {"a": 3.0, "b": 2.0, "c": 1.0}
    runs = {"a": {"x:1"}, "b": {"x:1"}, "c": {"x:1"}}
    # 6 s in all: moving a (3 s) leaves 3 s, within a 3.5 s budget: b and c stay
    assert heavy.choose(seconds, runs, budget=3.5, floor=0.0) == ["a"]
    # a 1 s budget moves a and b; c, the last to run x:1, stays
    assert heavy.choose(seconds, runs, budget=1.0, floor=0.0) == ["a", "b"]


def test_a_line_only_one_quick_function_runs_keeps_that_function() -> None:
    heavy = chooser()
    seconds = {"a": 3.0, "b": 2.0}
    runs = {"a": {"x:1", "x:2"}, "b": {"x:1"}}
    # only a runs x:2: it stays although it costs most; b moves (a still runs x:1)
    assert heavy.choose(seconds, runs, budget=0.0, floor=0.0) == ["b"]


def test_no_function_under_the_floor_moves() -> None:
    heavy = chooser()
    seconds = {"a": 0.5, "b": 0.1}
    runs = {"a": {"x:1"}, "b": {"x:1"}}
    assert heavy.choose(seconds, runs, budget=0.0, floor=0.2) == ["a"]


def test_each_test_gets_the_lines_it_runs() -> None:
    heavy = chooser()
    lines = {"pkg/m.py": {3: ["tests/t.py::f[1]", "tests/t.py::C::g"], 4: ["tests/t.py::f[2]"]}}
    assert heavy.lines_by_test(lines) == {
        "tests/t.py::f[1]": {"pkg/m.py:3"},
        "tests/t.py::f[2]": {"pkg/m.py:4"},
        "tests/t.py::C::g": {"pkg/m.py:3"},
    }


def test_a_test_moved_before_runs_no_line_for_the_quick_ones() -> None:
    heavy = chooser()
    seconds = {"b": 2.0, "c": 1.0}  # the quick tests as they cost with a moved
    runs = {"a": {"x:1"}, "b": {"x:1"}, "c": {"x:1", "x:2"}}
    # a moved before: of b and c, c alone runs x:2, and still runs x:1 once b moves
    assert heavy.choose(seconds, runs, budget=1.0, floor=0.0, moved_before=["a"]) == ["b"]
    # a counted as quick still, b would be no sole runner either; counted out, a 0.5 s budget
    # moves b, then stops at c, the last runner of x:1 and x:2
    assert heavy.choose(seconds, runs, budget=0.5, floor=0.0, moved_before=["a"]) == ["b"]
