"""The reference SGEMM against cuBLAS (checked, then timed interleaved) and the tuner that writes
the strategy tables. Needs a GPU; CuPy is imported on use.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from cublas_audit.device import launchers, operands
from cublas_audit.device.reference.build import build_all, device_cc, prepare
from cublas_audit.device.reference.config import (
    ACC_LAYOUTS,
    DATA_DIR,
    FMA_ORDERS,
    Config,
    arch_of,
    fit,
    load_table,
    strategy_for,
    table_path,
)
from cublas_audit.device.timing import time_interleaved
from cublas_audit.errors import AuditError
from cublas_audit.files import write_text_atomic
from cublas_audit.planning.cases import Case

TOLERANCE = operands.tolerance("fp32")
TUNE_REPS = 10  # timed calls per candidate tile, at least (the search is bounded by a budget)


@dataclass(frozen=True)
class Comparison:
    """One problem: the reference against cuBLAS, timed interleaved (median of >= 20)."""

    m: int
    n: int
    k: int
    batch: int
    config: str
    ref_ms: float
    cublas_ms: float
    ref_error: float
    cublas_error: float

    @property
    def efficiency(self) -> float:
        """cuBLAS time / reference time: above 1 the reference is faster."""
        return self.cublas_ms / self.ref_ms

    @property
    def ref_tflops(self) -> float:
        return 2e-9 * self.m * self.n * self.k * self.batch / self.ref_ms

    @property
    def cublas_tflops(self) -> float:
        return 2e-9 * self.m * self.n * self.k * self.batch / self.cublas_ms

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "efficiency": self.efficiency,
            "ref_tflops": self.ref_tflops,
            "cublas_tflops": self.cublas_tflops,
        }


def compare(
    m: int, n: int, k: int, batch: int, config: Config | None = None, min_reps: int = 20
) -> Comparison:
    """Checks both contenders on fresh random inputs, then times them interleaved."""
    cc = device_cc()  # first: no CuPy or no GPU is one clear error, before any allocation
    ops = operands.make("fp32", m, n, k, batch)
    ref_c = ops.c.copy()
    chosen = fit(config, cc, m, n, k) if config else strategy_for(cc, m, n, k, batch)
    ref = prepare(m, n, k, batch, ops.a, ops.b, ref_c, chosen)
    blas = launchers.classic(Case("cublas", "fp32", m, n, k, batch), ops)
    ref_error = operands.checked(ref, ops, ref_c)
    blas_error = operands.checked(blas, ops)
    if not ref_error <= TOLERANCE:
        raise AuditError(
            f"reference {chosen.label()} wrong at {m}x{n}x{k} batch {batch}: "
            f"relative error {ref_error:.3g} > {TOLERANCE:g}"
        )
    times = time_interleaved({"ref": ref, "cublas": blas}, min_reps)
    return Comparison(
        m,
        n,
        k,
        batch,
        chosen.label(),
        times["ref"].median_ms,
        times["cublas"].median_ms,
        ref_error,
        blas_error,
    )


# ----- tuning ------------------------------------------------------------------------------------


def candidates(cc: str, m: int, n: int, k: int, batch: int) -> list[Config]:
    """The tile space searched for one problem on this architecture, fitted and deduplicated."""
    kernel = "tma" if int(arch_of(cc)) >= 90 else "cpasync"
    tiles = [
        (256, 128, 16, 16, 8, 4, 1),
        (128, 256, 16, 16, 8, 4, 1),
        (256, 128, 32, 16, 8, 3, 1),
        (128, 256, 32, 16, 8, 3, 1),
        (128, 128, 16, 16, 8, 4, 1),
        (128, 128, 32, 16, 8, 4, 1),
        (128, 128, 16, 8, 8, 4, 2),
        (128, 64, 16, 8, 8, 4, 2),
        (64, 64, 16, 8, 4, 4, 1),
    ]
    work = m * n * batch
    splits = [1, 2, 4, 8] if work <= 1024 * 1024 * 4 else [1]
    found: dict[Config, None] = {}
    for bm, bn, bk, tm, tn, stages, min_blocks in tiles:
        for splitk in splits:
            for swizzle in (8, 16) if work >= 4096 * 4096 else (8,):
                raw = Config(kernel, bm, bn, bk, tm, tn, stages, splitk, swizzle, min_blocks)
                found[fit(raw, cc, m, n, k)] = None
    return list(found)


def tune_problem(
    m: int,
    n: int,
    k: int,
    batch: int,
    space: Sequence[Config],
    deadline: float,
    log: Callable[[str], None],
) -> Config | None:
    """The fastest correct config of `space` (search_space's order) for one problem, measured in
    that order until `deadline` (time.monotonic)."""
    best: tuple[float, Config] | None = None
    ops = operands.make("fp32", m, n, k, batch)
    for config in space:
        if time.monotonic() > deadline:
            log(f"  time budget spent at {m}x{n}x{k} batch {batch}")
            break
        try:
            launch = prepare(m, n, k, batch, ops.a, ops.b, ops.c, config)
            error = operands.checked(launch, ops)
            if not error <= TOLERANCE:
                log(f"  {config.label()}: WRONG, relative error {error:.3g}")
                continue
            ms = time_interleaved({"config": launch}, TUNE_REPS)["config"].median_ms
        except Exception as exc:  # one failing tile must not stop the search
            log(f"  {config.label()}: failed: {type(exc).__name__}: {exc}".splitlines()[0])
            continue
        log(f"  {config.label()}: {ms:.4f} ms")
        if best is None or ms < best[0]:
            best = (ms, config)
    return best[1] if best else None


def search_space(cc: str, m: int, n: int, k: int, batch: int) -> list[Config]:
    """The current table's pick first, then its tile in every accumulator layout and FMA order
    (the pick's order first), then every other candidate tile (in the pick's order and layout): a
    short budget still refines the pick."""
    current = strategy_for(cc, m, n, k, batch)
    orders = dict.fromkeys([current.order, *FMA_ORDERS])
    layouts = dict.fromkeys([current.acc_layout, *ACC_LAYOUTS])
    loops = [replace(current, order=o, acc_layout=x) for o in orders for x in layouts]
    tiles = [
        replace(x, order=current.order, acc_layout=current.acc_layout)
        for x in candidates(cc, m, n, k, batch)
    ]
    return list(dict.fromkeys([current, *loops, *tiles]))


def tune(
    sizes: Sequence[int], batches: Sequence[int], budget_s: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """This GPU's strategy table with the fastest tile of each (size, batch) searched, square
    problems. Every candidate is compiled first, in parallel and off the clock; the budget is for
    measuring, each problem getting an equal share (what one leaves unused passes to the next).
    Entries of the current table that were not searched, or where nothing was measured in time,
    stay as they were."""
    cc = device_cc()
    spaces = {
        (size, batch): search_space(cc, size, size, size, batch)
        for size in sizes
        for batch in batches
    }
    log(f"compiling the candidates of {len(spaces)} problems")
    build_all((config, size, size, size) for (size, _), space in spaces.items() for config in space)
    start = time.monotonic()
    measured: dict[tuple[int, int], Config] = {}
    for i, ((size, batch), space) in enumerate(spaces.items()):
        log(f"tuning {size}^3 batch {batch}")
        deadline = start + budget_s * (i + 1) / len(spaces)
        best = tune_problem(size, size, size, batch, space, deadline, log)
        if best is not None:
            measured[(size, batch)] = best
    return merged_table(cc, measured, list(spaces))


def merged_table(
    cc: str, measured: dict[tuple[int, int], Config], searched: Sequence[tuple[int, int]]
) -> dict[str, Any]:
    """The current table with the measured entries replaced or added, its source saying which."""
    entries = {(size, batch): config for size, batch, config in load_table(table_path(cc))}
    entries.update(measured)
    sizes = sorted({size for size, _ in measured})
    source = (
        f"cublas-audit reference --tune on {len(measured)} of {len(searched)} searched problems "
        f"(sizes {', '.join(map(str, sizes)) or 'none'}); other entries as before"
    )
    return {
        "arch": f"sm_{arch_of(cc)}",
        "source": source,
        "entries": [
            {"size": size, "batch": batch, "config": config.to_json()}
            for (size, batch), config in sorted(entries.items())
        ],
    }


def write_table(table: dict[str, Any], out: Path | None) -> Path:
    path = out or DATA_DIR / f"strategy_{table['arch'].replace('_', '')}.json"
    write_text_atomic(path, json.dumps(table, indent=1) + "\n")
    load_table.cache_clear()
    return path


def comparisons(
    sizes: Iterable[int],
    batches: Sequence[int],
    log: Callable[[str], None],
    min_reps: int = 20,
    problems: Iterable[tuple[int, int, int, int]] = (),
) -> list[Comparison]:
    """compare() over a grid of square problems, then over `problems` (m, n, k, batch: a shape
    list's). A missing tool or a wrong result stops it; any other failure (out of memory, a
    launch error) is logged and the grid goes on."""
    grid = [(size, size, size, batch) for size in sizes for batch in batches]
    rows = []
    for m, n, k, batch in [*grid, *problems]:
        try:
            rows.append(compare(m, n, k, batch, min_reps=min_reps))
        except AuditError:
            raise
        except Exception as exc:
            log(f"{m}x{n}x{k} batch {batch}: {type(exc).__name__}: {exc}".splitlines()[0])
    return rows


def markdown(rows: Sequence[Comparison]) -> str:
    """The comparison as a Markdown table, one row per problem."""
    from tabulate import tabulate

    body = [
        [
            f"{r.m}x{r.n}x{r.k}",
            r.batch,
            r.config,
            f"{r.ref_ms:.4f}",
            f"{r.cublas_ms:.4f}",
            f"{r.efficiency:.3f}",
            f"{r.ref_tflops:.1f}",
            f"{r.cublas_tflops:.1f}",
            f"{r.ref_error:.1e}",
        ]
        for r in rows
    ]
    headers = ["size", "batch", "config", "ref ms", "cuBLAS ms", "efficiency", "ref TFLOP/s"]
    headers += ["cuBLAS TFLOP/s", "ref rel. error"]
    return str(tabulate(body, headers=headers, tablefmt="github"))
