"""The dispatch map's plan: dense grids of problems (square sizes, or the cross product of M, N
and K ranges), sampled without building the grid, and the map's cases of them (no loop
companions: a map asks what cuBLAS dispatches, not how a loop compares)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import MAX_DIMENSION, Case
from cublas_audit.planning.grid import Variants, parse_int_list
from cublas_audit.planning.plan_file import FIELDS, StatedCases, stated

MAX_MAP_CASES = 1_000_000  # beyond this, --sample: a plan.json of millions of cases is no map


@dataclass(frozen=True)
class Grid:
    """The problems of a map: square sizes, and the cross product of m, n and k values."""

    sizes: tuple[int, ...] = ()
    m: tuple[int, ...] = ()
    n: tuple[int, ...] = ()
    k: tuple[int, ...] = ()

    @classmethod
    def parse(cls, sizes: str, m: str, n: str, k: str) -> Grid:
        """From the command line's texts; --m, --n and --k come together or not at all."""
        dims = {"--m": m, "--n": n, "--k": k}
        given = [name for name, text in dims.items() if text.strip()]
        if given and len(given) < 3:
            missing = ", ".join(name for name in dims if name not in given)
            raise AuditError(
                f"{', '.join(given)} without {missing}: give --m, --n and --k together"
            )
        grid = cls(
            sizes=tuple(parse_int_list(sizes, "--sizes")) if sizes.strip() else (),
            **{
                name.strip("-"): tuple(parse_int_list(text, name)) if text.strip() else ()
                for name, text in dims.items()
            },
        )
        if grid.count == 0:
            raise AuditError("nothing to map: give --sizes, or --m, --n and --k")
        return grid

    @property
    def count(self) -> int:
        return len(self.sizes) + len(self.m) * len(self.n) * len(self.k)

    def problem(self, index: int) -> tuple[int, int, int]:
        """The index-th problem: squares first, then the cross product in m, n, k order."""
        if index < len(self.sizes):
            size = self.sizes[index]
            return size, size, size
        index -= len(self.sizes)
        rest, k = divmod(index, len(self.k))
        i, j = divmod(rest, len(self.n))
        return self.m[i], self.n[j], self.k[k]

    def problems(self, sample: int | None = None, seed: int = 0) -> list[tuple[int, int, int]]:
        """Every problem, or `sample` of them drawn at random (without building the whole grid),
        deduplicated and in ascending order: memory grows along the map, and an out-of-memory
        case comes last."""
        picked: Sequence[int] = range(self.count)
        if sample is not None and sample < self.count:
            picked = random.Random(seed).sample(picked, sample)
        elif not self.sizes and all(_rising(axis) for axis in (self.m, self.n, self.k)):
            # the cross product of rising values is every problem once, in ascending order
            # (made in C: a full grid's 262,144 one index at a time took ~0.8 s of CPU here)
            return list(itertools.product(self.m, self.n, self.k))
        return sorted({self.problem(i) for i in picked})


def _rising(values: Sequence[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def plan(
    problems: Sequence[tuple[int, int, int]],
    batches: Sequence[int],
    modes: Sequence[str],
    apis: Sequence[str],
    variants: Variants | None = None,
) -> list[Case]:
    """The map's cases: every problem at every batch count (1: the single call), mode, API and
    layout. No loop companions: a map asks what cuBLAS dispatches, not how a loop compares."""
    variants = variants or Variants()
    _check_size(len(problems) * _cases_per_problem(batches, modes, apis, variants))
    cases = [
        case
        for (m, n, k), batch, mode, api in itertools.product(problems, batches, modes, apis)
        for case in variants.cases(api, mode, m, n, k, batch)
        if not case.loop
    ]
    return list(dict.fromkeys(cases))


def listed(cases: Sequence[Case]) -> list[Case]:
    """A shape list's or a trace's cases as map cases (their loop companions dropped)."""
    return [case for case in cases if not case.loop]


def grid_plan(
    grid: Grid,
    batches: Sequence[int],
    modes: Sequence[str],
    apis: Sequence[str],
    variants: Variants | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> Sequence[Case]:
    """The map's cases of a grid (or of `sample` problems drawn from it), counted before any is
    built: a grid of 10^9 problems is refused at once, not after minutes and gigabytes; as their
    statement where it can be made without them (StatedCases)."""
    variants = variants or Variants()
    drawn = grid.count if sample is None else min(sample, grid.count)
    _check_size(drawn * _cases_per_problem(batches, modes, apis, variants))
    problems = grid.problems(sample, seed)
    return _as_stated(problems, batches, modes, apis, variants) or plan(
        problems, batches, modes, apis, variants
    )


def _as_stated(
    problems: Sequence[tuple[int, int, int]],
    batches: Sequence[int],
    modes: Sequence[str],
    apis: Sequence[str],
    variants: Variants,
) -> StatedCases | None:
    """`plan`'s cases as their statement, no case made (plan_file.StatedCases: made where they
    are asked for), where every problem is posed alike: the cases of one problem (`templates`:
    each batch, mode, API and layout, loop companions left out) differ from another's only in
    m, n and k (no leading dimension padded, no batched call folded), and no two are one. None
    where they are not (`plan` then makes them), or where a size is beyond cuBLAS's limit (the
    case that has it says so)."""
    if variants.ld_pad or variants.broadcast == "a" or not problems:
        return None
    largest = max(max(problem) for problem in problems)
    if largest > MAX_DIMENSION:
        return None
    templates = [
        case
        for batch, mode, api in itertools.product(batches, modes, apis)
        for case in variants.cases(api, mode, largest, largest, largest, batch)  # (checked)
        if not case.loop
    ]
    if len(set(templates)) < len(templates) or len(set(problems)) < len(problems):
        return None
    columns: dict[str, list[Any]] = {}
    for name in FIELDS:
        if name in ("m", "n", "k"):
            at = "mnk".index(name)
            columns[name] = [problem[at] for problem in problems for _ in templates]
        else:
            columns[name] = [getattr(case, name) for case in templates] * len(problems)
    return StatedCases(stated(columns))


def _cases_per_problem(
    batches: Sequence[int], modes: Sequence[str], apis: Sequence[str], variants: Variants
) -> int:
    return len(batches) * len(modes) * len(apis) * len(variants.layouts)


def _check_size(total: int) -> None:
    if total > MAX_MAP_CASES:
        raise AuditError(
            f"the map has {total:,} cases (at most {MAX_MAP_CASES:,}): take --sample N of them"
        )
