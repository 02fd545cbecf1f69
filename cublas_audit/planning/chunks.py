"""How the map engine (device.map_engine) takes a plan: which cases it queues from its operand
pool, and in which chunks (one synchronisation each). Pure: no GPU is needed to plan them."""

from __future__ import annotations

from collections.abc import Sequence

from cublas_audit.planning.cases import Case
from cublas_audit.planning.modes import mode as mode_of

CHUNK = 128  # problems queued per synchronisation (a chunk's records, sums and events read as one)
POOLED_BYTES = 1 << 30  # a problem needing more runs alone: its calls hide the host's work
# A chunk's outputs lie side by side in one region (each kept until the chunk's one check:
# device.check_chunk), each at a multiple of OUTPUT_ALIGN bytes (as aligned as the pool's own
# arrays: cuBLAS sees the same alignment of C); a chunk needing more than the region (at most
# REGION_BYTES: the engine asks less of a GPU with little free memory) is cut.
OUTPUT_ALIGN = 256
REGION_BYTES = 4 << 30


def pooled(case: Case) -> bool:
    """Whether the engine queues this case (else it runs alone, through `single`)."""
    return case.beta == 0 and case.bytes_needed <= POOLED_BYTES


def chunk_groups(
    cases: Sequence[Case], careful: int, region: int = REGION_BYTES
) -> list[tuple[list[Case], bool]]:
    """The cases as the engine takes them, each group with whether it runs alone (nothing else
    in flight): the first `careful` one by one, then each mode's pooled cases in chunks of like
    GPU time (`dealt`; one mode at a time, as the pool holds one mode's operands; cut where their
    outputs pass `region` bytes), then the cases that are not pooled, each alone and last, as the
    largest are."""
    groups = [([case], True) for case in cases[:careful]]
    rest = cases[careful:]
    in_pool = [pooled(case) for case in rest]  # once a case: ~1 s of a full grid's start-up
    for mode in dict.fromkeys(case.mode for case in rest):
        same = [case for case, p in zip(rest, in_pool, strict=True) if p and case.mode == mode]
        dealt_out = dealt(same, CHUNK)
        groups += [(part, False) for chunk in dealt_out for part in within_region(chunk, region)]
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


def output_span(case: Case) -> int:
    """The bytes a case's C takes in its chunk's region: its values' bytes to OUTPUT_ALIGN."""
    return aligned(case.elements("c") * mode_of(case.mode).element_bytes)


def aligned(size: int) -> int:
    """`size` bytes taken up to a multiple of OUTPUT_ALIGN."""
    return -(-size // OUTPUT_ALIGN) * OUTPUT_ALIGN


def output_offsets(cases: Sequence[Case]) -> list[int]:
    """Where each case's C begins in its chunk's region, in bytes (each OUTPUT_ALIGN-aligned)."""
    offsets, end = [], 0
    for case in cases:
        offsets.append(end)
        end += output_span(case)
    return offsets


def region_limit(largest_output: int, region: int = REGION_BYTES) -> int:
    """The bytes a chunk's outputs may take, where none is larger than `largest_output` bytes:
    CHUNK of them side by side, `region` at most (within_region cuts a chunk there), the
    largest alone at least."""
    span = aligned(largest_output)
    return max(span, min(region, CHUNK * span))


def within_region(chunk: list[Case], region: int = REGION_BYTES) -> list[list[Case]]:
    """`chunk` cut, in order, into parts whose outputs fit `region` bytes (a case whose output
    alone is larger: a part of its own)."""
    parts: list[list[Case]] = [[]]
    used = 0
    for case in chunk:
        size = output_span(case)
        if parts[-1] and used + size > region:
            parts.append([])
            used = 0
        parts[-1].append(case)
        used += size
    return parts
