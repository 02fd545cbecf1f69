"""A plan in parts: the I-th of N parts of a plan (`--shard I/N`), balanced by estimated work and
the same for the same plan on every machine, and the plan's fingerprint that ties the parts of one
plan together (`cublas-audit merge`).

`--devices` shards a plan across the GPUs of one host with the same function, so a part of a
`--shard` run is what one GPU of `--devices` would have measured.

Shards are numbered from 1 (1/4 .. 4/4), as a Slurm job array's SLURM_ARRAY_TASK_ID with
`--array=1-N` counts them.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import Case
from cublas_audit.planning.plan_file import FIELDS, PlanFile, StatedCases

# A case's cost for balancing: its FLOPs plus what the probe spends on any case (operands, the
# check, the record): about 6 ms on the H100's map, 5e10 FLOPs of work at its ~50 TFLOP/s x 6
# calls. The sweep's per-case cost is larger, and scales alike on every shard.
CASE_FLOPS = 5e10

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def shard(cases: Sequence[Case], count: int) -> list[list[Case]]:
    """`count` shards of about equal work (largest cases first onto the least loaded shard),
    each in plan order. Deterministic: ties go to the earlier case and the lower shard, so the
    same plan splits the same way on every machine."""
    return [[cases[p] for p in part] for part in split([case.flops for case in cases], count)]


def split(flops: Sequence[float], count: int) -> list[list[int]]:
    """The positions of each of `count` shards of a plan whose cases have these FLOPs (what
    `shard` splits by; a stated plan gives them without building its cases)."""
    loads = [(0.0, i) for i in range(count)]
    owner = [0] * len(flops)
    for position in sorted(range(len(flops)), key=lambda p: -flops[p]):
        load, index = heapq.heappop(loads)
        owner[position] = index
        heapq.heappush(loads, (load + CASE_FLOPS + flops[position], index))
    parts: list[list[int]] = [[] for _ in range(count)]
    for position, index in enumerate(owner):
        parts[index].append(position)
    return parts


def work(case: Case) -> float:
    """The estimated work of a case, what shards are balanced by."""
    return CASE_FLOPS + case.flops


@dataclass(frozen=True, order=True)
class ShardSpec:
    """`--shard I/N`: the I-th (from 1) of N parts of a plan."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        """`I/N` with 1 <= I <= N; anything else is a one-line error."""
        found = _SPEC.match(text)
        if found is None:
            raise AuditError(f"--shard: {text!r} is not I/N (e.g. 2/8: the 2nd of 8 parts)")
        index, count = int(found[1]), int(found[2])
        if count < 1:
            raise AuditError(f"--shard {text}: N must be 1 or more")
        if not 1 <= index <= count:
            raise AuditError(f"--shard {text}: I counts from 1 to N ({count}), got {index}")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def cases(self, plan: Sequence[Case]) -> list[Case]:
        """This part of `plan`, in plan order."""
        return shard(plan, self.count)[self.index - 1]


def fingerprint(plan: Sequence[Case]) -> str:
    """sha256 of the whole plan's statement, canonical (plan_file.PlanFile.fingerprint: every
    case, before sharding): equal exactly for parts of one plan."""
    return PlanFile.of(plan).fingerprint()


@dataclass(frozen=True)
class PlanPart:
    """A shard run's share of a plan: which part, and the whole plan it is a part of (recorded in
    the shard's run directory, so merge knows the plan's order and what is missing).

    The whole plan is held as plan.json states it (a full map's grid: its axes), not as its cases:
    what a Ray task is sent (cloudpickling a full map's 262,144 cases took seconds a shard on the
    driver and more to load in the task), what plan-whole.json and the fingerprint are written
    from; the part's cases are built from it where no caller gave them (`given`: the whole plan's
    cases, kept on this machine only, never pickled)."""

    spec: ShardSpec
    plan: PlanFile
    given: tuple[Case, ...] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, spec: ShardSpec, whole: Sequence[Case] | PlanFile) -> PlanPart:
        """The part, refused where a shard would be empty (more parts than cases)."""
        plan = whole if isinstance(whole, PlanFile) else PlanFile.of(whole)
        if spec.count > plan.count:
            raise AuditError(
                f"--shard {spec}: the plan has {plan.count} case{'s' if plan.count != 1 else ''}, "
                "fewer than the parts; give N of at most that"
            )
        # (a plan made as its statement: the part's cases made from it, not the whole plan's)
        if isinstance(whole, PlanFile | StatedCases):
            return cls(spec, plan)
        return cls(spec, plan, tuple(whole))

    def cases(self) -> list[Case]:
        """This part of the plan, in plan order (split as `shard` splits the cases)."""
        positions = split(self.plan.flops(), self.spec.count)[self.spec.index - 1]
        if self.given is not None:
            return [self.given[p] for p in positions]
        columns = [self.plan.column(name) for name in FIELDS]
        return [Case(*(column[p] for column in columns)) for p in positions]

    def record(self) -> dict[str, Any]:
        """What the shard's env.json says of it."""
        return {
            "shard": str(self.spec),
            "plan_fingerprint": self.plan.fingerprint(),
            "plan_cases": self.plan.count,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (to a Ray task, a shard's process) as its part and statement: no cases."""
        return (PlanPart, (self.spec, self.plan))
