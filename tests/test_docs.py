"""The README stays a short guide, and what it and docs/ point at exists: every relative link (and
its #anchor), every repository path they name, every command of the CLI in the README's table,
and the test command as CI runs it."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import typer

from cublas_audit.cli import app

from .conftest import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_LIMIT = 12_000  # characters: usage first, the rest in docs/ (issue 38)

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# a path from the repository's root, as the pages name them in prose and commands
ROOTED = re.compile(
    r"(?<![\w/.-])((?:reports|tests|benchmarks|tools|examples|cublas_audit|probes|reference_kernels"
    r"|docs)/[\w./<>{}*,-]*)"
)


def _prose(page: Path) -> str:
    """The page without its fenced code: a `#` comment there is no heading, `[x](y)` no link."""
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: the text lowercased, code and link marks dropped, punctuation but
    `-` and `_` removed, spaces as `-`; a repeated id gets -1, -2, ..."""
    seen: Counter[str] = Counter()
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", _prose(page), re.M):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return anchors


def test_the_readme_is_a_short_guide() -> None:
    assert len(README.read_text(encoding="utf-8")) <= README_LIMIT


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_an_existing_file_and_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(REPO):
            broken.append(f"{target}: outside the repository")
        elif not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    """Commands and prose name runs, fixtures and modules from the repository's root; a
    placeholder (`<label>`, `{fp32,bf16}`, `*`) names none."""
    named = {p.rstrip(".,") for p in ROOTED.findall(page.read_text(encoding="utf-8"))}
    missing = [p for p in named if not re.search(r"[<>{}*]", p) and not (REPO / p).exists()]
    assert not missing, sorted(missing)


def test_the_readme_names_every_command_of_the_cli() -> None:
    section = README.read_text(encoding="utf-8").split("## Every command", 1)[1].split("\n## ")[0]
    listed = set(re.findall(r"^\| `([a-z]+)` \|", section, re.M))
    assert listed == set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_the_readme_gives_the_test_command_ci_runs() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    command = next(line for line in ci.splitlines() if line.startswith("python -m pytest"))
    assert f"\n    {command}\n" in README.read_text(encoding="utf-8")
