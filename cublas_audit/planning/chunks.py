"""How the map engine (device.map_engine) takes a plan: which cases it queues from its operand
pool, and in which chunks (one synchronisation each). Pure: no GPU is needed to plan them."""

from __future__ import annotations

from collections.abc import Sequence

from cublas_audit.planning.cases import Case

CHUNK = 128  # problems queued per synchronisation (each settles with a ~6 ms CUPTI flush)
POOLED_BYTES = 1 << 30  # a problem needing more runs alone: its calls hide the host's work


def pooled(case: Case) -> bool:
    """Whether the engine queues this case (else it runs alone, through `single`)."""
    return case.beta == 0 and case.bytes_needed <= POOLED_BYTES


def chunk_groups(cases: Sequence[Case], careful: int) -> list[tuple[list[Case], bool]]:
    """The cases as the engine takes them, each group with whether it runs alone (nothing else
    in flight): the first `careful` one by one, then each mode's pooled cases in chunks of like
    GPU time (`dealt`; one mode at a time, as the pool holds one mode's operands), then the
    cases that are not pooled, each alone and last, as the largest are."""
    groups = [([case], True) for case in cases[:careful]]
    rest = cases[careful:]
    in_pool = [pooled(case) for case in rest]  # once a case: ~1 s of a full grid's start-up
    for mode in dict.fromkeys(case.mode for case in rest):
        same = [case for case, p in zip(rest, in_pool, strict=True) if p and case.mode == mode]
        groups += [(chunk, False) for chunk in dealt(same, CHUNK)]
    groups += [([case], True) for case, p in zip(rest, in_pool, strict=True) if not p]
    return groups


def dealt(cases: Sequence[Case], size: int) -> list[list[Case]]:
    """`cases` in chunks of at most `size` and of like GPU time: ranked by work and dealt out
    like cards, the largest first. In plan order a chunk holds neighbours (whole K axes of a few
    M x N): one of small problems leaves the GPU waiting while the host queues it, one of large
    problems the host waiting on the GPU. Largest first within a chunk: the GPU starts on long
    work at once, and the host queues the small problems while it runs."""
    count = -(-len(cases) // size)
    ranked = sorted(cases, key=lambda case: case.flops, reverse=True)  # stable: ties in order
    return [ranked[start::count] for start in range(count)]
