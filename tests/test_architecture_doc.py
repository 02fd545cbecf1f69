"""docs/architecture.md's module table names every module of the package in its stage's rows, and
names no module that does not exist: a newcomer finds any module's job there (issue 39)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "cublas_audit"
DOC = REPO / "docs" / "architecture.md"
ROW = re.compile(r"^\| (\w+) \| (.+?) \| .+ \|$", re.MULTILINE)
NAMED = re.compile(r"`([\w/]+(?:\.py|/))`")


def rows() -> dict[str, set[str]]:
    """stage -> the files and folders its rows of the module table name."""
    named: dict[str, set[str]] = {}
    for stage, modules in ROW.findall(DOC.read_text()):
        named.setdefault(stage, set()).update(NAMED.findall(modules))
    return named


def stage_of(module: Path) -> str:
    parts = module.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else "base"


def is_named(module: Path, names: set[str]) -> bool:
    """By its file name, its path below the stage, or a folder of it (`rules/`, `reference/`)."""
    whole = module.relative_to(PACKAGE).parts
    below = whole[1:]
    folders = {f"{'/'.join(below[:i])}/" for i in range(1, len(below))}
    return bool({module.name, "/".join(below), "/".join(whole)} & names or folders & names)


def test_every_module_is_in_its_stages_rows() -> None:
    named = rows()
    modules = [p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    missing = [
        str(p.relative_to(PACKAGE))
        for p in modules
        if "templates" not in p.parts and not is_named(p, named.get(stage_of(p), set()))
    ]
    assert not missing, f"docs/architecture.md's module table lacks {missing}"


def test_every_named_module_exists() -> None:
    stages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")}
    ghosts = []
    for stage, names in rows().items():
        folder = PACKAGE / stage if stage in stages else PACKAGE
        for name in names:
            candidates = [folder / name, PACKAGE / name, *folder.rglob(name.rstrip("/"))]
            if not any(c.exists() for c in candidates):
                ghosts.append(f"{stage}: {name}")
    assert not ghosts, f"docs/architecture.md names modules that do not exist: {ghosts}"


def test_each_module_name_belongs_to_one_stage() -> None:
    """A module's file name says which one it is: no two stages hold a `merge.py` (issue 39)."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_no_import_renames_a_module() -> None:
    """`import x.y as z` / `from x import y as z` with y a module of the package: a reader meets
    the module under its own name everywhere (a function may still be aliased)."""
    renamed = []
    pattern = re.compile(r"^\s*from (cublas_audit[\w.]*) import (\w+) as (\w+)", re.MULTILINE)
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        for package, name, alias in pattern.findall(path.read_text()):
            module = REPO / package.replace(".", "/") / f"{name}.py"
            if module.exists() and alias != name:
                renamed.append(f"{path.relative_to(REPO)}: {name} as {alias}")
    assert not renamed, renamed


STAGE_REFERENCE = re.compile(
    r"`((?:cli|jobs|report|run|device|judge|table|observe|planning|plan)(?:\.\w+)+)(?:\(\))?`"
)


def resolves(dotted: str) -> bool:
    """`judge.rules.audit`-style: a module of the package, then attributes of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module("cublas_audit." + ".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_every_module_and_function_a_text_points_to_exists() -> None:
    """A docstring or page that says `plan.prepare_sweep` makes it sends a reader nowhere: every
    backticked stage.module[.name] in the package's docstrings and in docs/ names a real one
    (file names such as `report.md` are not references)."""
    texts = [*PACKAGE.rglob("*.py"), *(REPO / "docs").glob("*.md"), REPO / "README.md"]
    dangling = {
        f"{path.relative_to(REPO)}: {dotted}"
        for path in texts
        for dotted in STAGE_REFERENCE.findall(path.read_text())
        if dotted.rsplit(".", 1)[-1] not in ("py", "md", "json", "csv") and not resolves(dotted)
    }
    assert not dangling, sorted(dangling)
