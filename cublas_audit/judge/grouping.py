"""One finding per cause: after the rules run, the findings one root cause explains at one problem
become the cause's finding, the others kept inside it as its observations.

Without this, bf16 2073^3 on the H100 (reports/h100/checks/20261127-100356-2073: odd sizes, the
Hopper kernels ineligible) is eight findings: `unaligned-operand`, `size-inversion`,
`dispatch-cliff` and `low-utilization`, each for cuBLAS and cuBLASLt. Every one of them observes
the same call dispatching an sm75 kernel because M, N and K are no multiple of 16 bytes; it is one
finding, the cause's, with the seven others as its evidence.

A problem is one (GPU, mode, batch, shape): the shape label names the layout and leading
dimensions where they are not packed nn (judge.rules.frame), and the api is left out, so the
same problem through cuBLAS and cuBLASLt is one finding that lists both calls. A finding joins
only where it concerns that one problem alone (a `low-utilization` over several sizes says more
than one problem's cause explains and stays its own) and only where its rule observes what the
cause brings about (`EXPLAINS`): another cause at the same problem (a heuristic that ranks a
faster candidate lower, a grid that leaves SMs idle) stays a finding of its own.

The grouped finding is the cause's finding of its best-ranked call (`order`: severity, then the
time its fix gives back) with the highest severity of the group; its rows, evidence and
`compared` stay that call's own, and each other finding is kept whole in `observations` (its
JSON record: rule, call, message, workaround, rows, compared, effect), so `members` gives every
original finding back: a fix is made per call (judge.fixes), a report flags every row
(`every_row`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from cublas_audit.judge.finding import SEVERITIES, Finding, order

# A root cause's rule -> the rules whose finding at the same problem it explains. An unaligned
# dimension leaves the call an older kernel: that kernel's low utilization, its time against the
# larger aligned size (size-inversion) and the smaller aligned one (dispatch-cliff), its legacy
# family, the reference beating it, and the aligned layout's gain (layout-penalty) follow.
EXPLAINS: dict[str, frozenset[str]] = {
    "unaligned-operand": frozenset(
        {
            "low-utilization",
            "size-inversion",
            "dispatch-cliff",
            "legacy-kernel",
            "reference-faster",
            "layout-penalty",
        }
    ),
}

Problem = tuple[str, str, int, str]


def by_cause(found: Sequence[Finding]) -> list[Finding]:
    """The findings with each problem's observations of one cause made one finding, in `order`.
    A finding list without a cause's finding comes back as it was (sorted)."""
    causes: dict[Problem, list[Finding]] = {}
    for finding in found:
        key = problem_of(finding)
        if key is not None and finding.rule in EXPLAINS:
            causes.setdefault(key, []).append(finding)
    if not causes:
        return sorted(found, key=order)
    lead = {key: min(group, key=order) for key, group in causes.items()}
    members: dict[Problem, list[Finding]] = {key: [] for key in lead}
    kept = []
    for finding in found:
        key = problem_of(finding)
        if key is None or key not in lead or not _explained(lead[key], finding):
            kept.append(finding)
        elif finding is not lead[key]:
            members[key].append(finding)
    grouped = [_grouped(lead[key], members[key]) for key in lead]
    return sorted([*kept, *grouped], key=order)


def problem_of(finding: Finding) -> Problem | None:
    """The one problem a finding concerns (GPU, mode, batch, shape; any api), or None where it
    concerns several sizes."""
    if len(finding.sizes) != 1:
        return None
    return (finding.gpu_label, finding.mode, finding.batch, finding.sizes[0])


def _explained(cause: Finding, finding: Finding) -> bool:
    return finding.rule == cause.rule or finding.rule in EXPLAINS[cause.rule]


def _grouped(cause: Finding, others: list[Finding]) -> Finding:
    if not others:
        return cause
    others = sorted(others, key=order)
    severity = min((cause.severity, *(f.severity for f in others)), key=SEVERITIES.index)
    records = [_record(f) for f in others]
    return replace(cause, severity=severity, observations=[*cause.observations, *records])


def _record(finding: Finding) -> dict[str, object]:
    """A finding kept inside another: its whole JSON record (its own observations flattened
    into the group's by the caller's order, never nested)."""
    record = finding.to_json()
    record.pop("observations", None)
    return record


def members(finding: Finding) -> list[Finding]:
    """Every finding a grouped one was made of: itself (with the group's severity), then each
    observation as its rule found it."""
    own = replace(finding, observations=[])
    return [own, *(Finding(**record) for record in finding.observations)]


def every_row(finding: Finding) -> list[int]:
    """The rows the finding and its observations judged (each call's), each once."""
    rows = [*finding.rows, *(row for record in finding.observations for row in record["rows"])]
    return list(dict.fromkeys(rows))


def calls(findings: Iterable[Finding]) -> list[str]:
    """'cublas cublasGemmEx', 'cublasLt cublasLtMatmul': the calls of findings, each once."""
    said = (" ".join(part for part in (f.api, f.routine) if part) for f in findings)
    return list(dict.fromkeys(said))


def where(finding: Finding) -> str:
    """The finding's calls, mode and batch in words: every call its observations name too."""
    said = " ".join(part for part in (", ".join(calls(members(finding))), finding.mode) if part)
    return f"{said}, batch {finding.batch}"


def observed(finding: Finding) -> list[tuple[str, str, str]]:
    """The finding's observations as a report lists them: (rule, calls, message), a message the
    calls share said once ('cublas cublasGemmEx, cublasLt cublasLtMatmul'); one that repeats
    the finding's own message word for word is said by it (`where` names its call)."""
    said: dict[tuple[str, str], list[Finding]] = {}
    for member in members(finding)[1:]:
        said.setdefault((member.rule, member.message), []).append(member)
    said.pop((finding.rule, finding.message), None)
    return [(rule, ", ".join(calls(group)), message) for (rule, message), group in said.items()]
