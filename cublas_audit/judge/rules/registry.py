"""The one list of the rules, in the manner of ruff's: each rule has a stable id (`CA301`), a
group, its public name (what findings, findings.json, fix.json's `source.rule` and the docs say)
and a one-line summary.

The id is the rule's identity and is never reused or renumbered: a rule that goes away keeps its
number retired. It is not derived from the check's function name (renaming a function must not
rename a rule). The public name stays what run directories already recorded, so an old
findings.json or fix.json reads and judges as it did. The hundreds are the group: 1 dispatch,
2 utilization, 3 timing, 4 layout, 5 shape, 6 sizes, 7 units. docs/report.md's rule table lists
the same ids, names and groups in this order (tests/rules/test_registry.py checks it).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from cublas_audit.judge.rules.better_candidate import better_candidate
from cublas_audit.judge.rules.causes import unaligned_operand
from cublas_audit.judge.rules.frame import Rule
from cublas_audit.judge.rules.layout import broadcast_slower_than_folded, layout_penalty
from cublas_audit.judge.rules.maps import dispatch_cliff, size_inversion
from cublas_audit.judge.rules.occupancy import underfilled_grid
from cublas_audit.judge.rules.timing_rules import batched_slower_than_loop, reference_faster
from cublas_audit.judge.rules.utilization import legacy_kernel, low_utilization, no_escalation

GROUPS = ("dispatch", "utilization", "timing", "layout", "shape", "sizes", "units")


@dataclass(frozen=True)
class RuleSpec:
    """One rule. `check` is None for a rule judged elsewhere than over one prepared table
    (`unit-mismatch`: judge.units compares the units of a replicated run)."""

    id: str
    name: str
    group: str
    summary: str
    check: Rule | None = None


# In the order audit runs them (findings of equal rank keep it) and the docs list them.
REGISTRY: tuple[RuleSpec, ...] = (
    RuleSpec(
        "CA101", "no-escalation", "dispatch",
        "one kernel kept across a wide range of a series' sizes at low utilization",
        no_escalation,
    ),
    RuleSpec(
        "CA102", "legacy-kernel", "dispatch",
        "a kernel of a legacy family (magma, maxwell, gemv on a GEMM) dispatched",
        legacy_kernel,
    ),
    RuleSpec(
        "CA201", "low-utilization", "utilization",
        "far below the table's best utilization, or the DRAM bound where memory-bound",
        low_utilization,
    ),
    RuleSpec(
        "CA301", "reference-faster", "timing",
        "the bundled reference kernel confirmed faster than cuBLAS",
        reference_faster,
    ),
    RuleSpec(
        "CA302", "batched-slower-than-loop", "timing",
        "a batched call confirmed slower than its loop of single calls",
        batched_slower_than_loop,
    ),
    RuleSpec(
        "CA103", "better-candidate", "dispatch",
        "a cuBLASLt candidate beats the heuristic's default in two independent rounds",
        better_candidate,
    ),
    RuleSpec(
        "CA401", "layout-penalty", "layout",
        "the same call in another layout confirmed much faster",
        layout_penalty,
    ),
    RuleSpec(
        "CA303", "broadcast-slower-than-folded", "timing",
        "a batch-shared A call confirmed slower than the one GEMM it folds into",
        broadcast_slower_than_folded,
    ),
    RuleSpec(
        "CA501", "unaligned-operand", "shape",
        "a tensor-core dimension or leading dimension off 16 bytes, with its measured cost",
        unaligned_operand,
    ),
    RuleSpec(
        "CA202", "underfilled-grid", "utilization",
        "the main kernel launches too few CTAs for the GPU's SMs on a large problem",
        underfilled_grid,
    ),
    RuleSpec(
        "CA601", "size-inversion", "sizes",
        "a problem confidently slower than a no-smaller one of its series",
        size_inversion,
    ),
    RuleSpec(
        "CA602", "dispatch-cliff", "sizes",
        "a kernel change between neighbouring sizes with a throughput drop",
        dispatch_cliff,
    ),
    RuleSpec(
        "CA701", "unit-mismatch", "units",
        "one unit of a replicated run dispatching another kernel, or slower",
    ),
)  # fmt: skip

_BY_KEY = {key: spec for spec in REGISTRY for key in (spec.id, spec.name)}


def spec(key: str) -> RuleSpec:
    """The rule with this id or public name; an unknown one is a ValueError naming it."""
    found = _BY_KEY.get(key)
    if found is None:
        raise ValueError(f"no rule {key!r} (the rules: {', '.join(s.id for s in REGISTRY)})")
    return found


def checks(selected: Collection[str] | None = None) -> list[RuleSpec]:
    """The rules audit runs over one table, in registry order: every one, or those whose id or
    name is selected (an unknown one is a ValueError, never a rule silently not run)."""
    wanted = None if selected is None else {spec(key).id for key in selected}
    return [s for s in REGISTRY if s.check is not None and (wanted is None or s.id in wanted)]


def name_of(check: Rule) -> str:
    """The public name of a registered check (a function not registered is a ValueError)."""
    for entry in REGISTRY:
        if entry.check is check:
            return entry.name
    raise ValueError(f"{getattr(check, '__name__', check)!r} is no registered rule")
