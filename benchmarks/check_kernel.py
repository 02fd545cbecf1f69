"""The map's float64 check (device.quick_check) on its own: GPU seconds a grid problem and the
error it reports, the committed kernel against an earlier one and against other block counts,
and a chunk's problems checked by one launch (device.check_chunk, as the map now checks them)
against each checked by its own.

    python benchmarks/check_kernel.py JSON [--module NAME=PATH ...] [--sample N] [--fill 264,528]
        [--most-k 512,1024,2048]

A uniform sample of the BF16 full grid's problems (M, N, K in 64..4096 step 64, both operands
untransposed, as `cublas-audit map` lays them out; seed 0), plus a smaller FP32 sample and a
transposed-A one. Each problem's GEMM runs once through cuBLAS (so C holds a real product),
then every variant's check (what the map queues after a problem's calls) is timed GPU-paced: a
CUDA graph of REPEATS checks back to back, launched LAUNCHES times, the best (events around a
launch: no host launch cost in it, no profiler). `--module NAME=PATH` adds the module file of
another quick_check (e.g. `git show 612aa03:cublas_audit/device/quick_check.py`, the kernel
before the tensor cores, its .cu in ../data beside it), run with its own FILL_BLOCKS; `--fill`
the FILL_BLOCKS values to try with the committed kernel.

The chunk leg: the BF16 sample's first 256 problems in two chunks of 128 on one pool (each
problem's C its own in the region, as the map lays them out), GPU-paced the same way: the
chunk's one launch (for each --most-k) against the chunk's problems each checked by its own
launch (the committed per-problem kernel, one graph of 128 launches), their errors compared.

Printed and written: each variant's mean microseconds a problem, that times 262,144 (the grid's
check seconds, as the sample is uniform over it), a least-squares fit of its microseconds to
fixed + slope x (m k / 1e6), the largest relative difference of its errors from the first
variant's (the same float64 metric summed in another order: ~1e-12), and of each variant's error
after its graph's checks from its first (a scratch left dirty by a check would show).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GRID = list(range(64, 4097, 64))
GRID_PROBLEMS = len(GRID) ** 3
REPEATS = 10  # checks in a timed graph
LAUNCHES = 3  # the graph's timed launches (the best kept)


def problems(count: int, seed: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    return [(rng.choice(GRID), rng.choice(GRID), rng.choice(GRID)) for _ in range(count)]


def module_from(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def variants(modules: list[str], fills: list[int]) -> dict[str, tuple[Any, int]]:
    """name -> (quick_check module, FILL_BLOCKS)."""
    from cublas_audit.device import quick_check

    found: dict[str, tuple[Any, int]] = {}
    for named in modules:
        name, path = named.split("=", 1)
        module = module_from(Path(path), f"{name}_quick_check")
        found[name] = (module, module.FILL_BLOCKS)
    for fill in fills:
        found[f"new-{fill}"] = (quick_check, fill)
    return found


def timed_check(module: Any, fill: int, ops: Any, scratch: Any) -> tuple[float, float, float]:
    """Microseconds of one check (GPU-paced: a graph of REPEATS, best of LAUNCHES), its error,
    and its error again after the graph's checks (a scratch left dirty would show)."""
    import cupy

    module.FILL_BLOCKS = fill
    module.geometry.cache_clear()
    case = ops.case
    chosen = module.picked(case.batch, case.n)
    indices = cupy.asarray(chosen.index_values(), dtype=cupy.int32)
    sums = cupy.zeros(2 * len(chosen.entries), dtype=cupy.float64)
    module.enqueue(ops, ops.c, chosen, indices, sums, scratch)
    error = module.error_from_sums(sums.get().tolist())
    best = paced(lambda: module.enqueue(ops, ops.c, chosen, indices, sums, scratch), REPEATS)
    sums.fill(0)
    module.enqueue(ops, ops.c, chosen, indices, sums, scratch)
    again = module.error_from_sums(sums.get().tolist())
    return best, error, again


def sample_leg(
    mode: str, transa: str, shapes: list[tuple[int, int, int]], found: dict[str, tuple[Any, int]]
) -> dict[str, Any]:
    from cublas_audit.device import launchers, operands, quick_check
    from cublas_audit.planning.cases import Case

    micro: dict[str, list[float]] = {name: [] for name in found}
    errors: dict[str, list[float]] = {name: [] for name in found}
    repeats: dict[str, list[float]] = {name: [] for name in found}
    scratches = {name: module.Scratch() for name, (module, _fill) in found.items()}
    for m, n, k in shapes:
        case = Case("cublas", mode, m, n, k, 1, transa=transa)
        ops = operands.make_for(case, seed=1)
        launchers.classic(case, ops)()
        for name, (module, fill) in found.items():
            us, error, again = timed_check(module, fill, ops, scratches[name])
            micro[name].append(us)
            errors[name].append(error)
            repeats[name].append(again)
    quick_check.geometry.cache_clear()
    first = next(iter(found))
    return {
        "mode": mode,
        "transa": transa,
        "problems": len(shapes),
        "variants": {
            name: {
                "mean_us": round(statistics.fmean(micro[name]), 2),
                "grid_seconds": round(statistics.fmean(micro[name]) * GRID_PROBLEMS / 1e6, 2),
                "max_error_rel_diff": max(
                    abs(e / f - 1) for e, f in zip(errors[name], errors[first], strict=True)
                ),
                "max_error": max(errors[name]),
                "max_repeat_rel_diff": max(
                    abs(a / e - 1) for a, e in zip(repeats[name], errors[name], strict=True)
                ),
                **size_fit(shapes, micro[name]),
            }
            for name in found
        },
    }


def paced(queue: Any, repeats: int) -> float:
    """Microseconds of `queue()` on the current stream, GPU-paced: a graph of `repeats` of it,
    best of LAUNCHES launches."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    stream.begin_capture()
    for _ in range(repeats):
        queue()
    graph = stream.end_capture()
    best = math.inf
    for _ in range(LAUNCHES):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, end) * 1000 / repeats)
    return best


def chunk_leg(shapes: list[tuple[int, int, int]], most_k: list[int]) -> dict[str, Any]:
    """A chunk's problems checked by one launch against each by its own (the module doc)."""
    from cublas_audit.device import check_chunk
    from cublas_audit.planning.cases import Case

    micro: dict[str, float] = {}
    worst = 0.0
    cases = [Case("cublas", "bf16", m, n, k, 1) for m, n, k in shapes]
    size = check_chunk.CHUNK_JOBS
    committed = check_chunk.MOST_K
    for chunk in [cases[i : i + size] for i in range(0, len(cases), size)]:
        totals, diff = one_chunk(chunk, most_k)
        worst = max(worst, diff)
        for name, total in totals.items():
            micro[name] = micro.get(name, 0.0) + total
    check_chunk.MOST_K = committed
    per = {name: round(total / len(cases), 2) for name, total in micro.items()}
    return {
        "problems": len(cases),
        "mean_us": per,
        "grid_seconds": {name: round(us * GRID_PROBLEMS / 1e6, 2) for name, us in per.items()},
        "max_error_rel_diff": worst,
    }


def one_chunk(chunk: list[Any], most_k: list[int]) -> tuple[dict[str, float], float]:
    """One chunk's microseconds, all its problems, checked each by its own launch ("own") and by
    one launch for each MOST_K; the largest relative difference of their errors."""
    import cupy

    from cublas_audit.device import check_chunk, launchers, quick_check
    from cublas_audit.device.operand_pool import OperandPool
    from cublas_audit.planning.chunks import output_offsets

    pool = OperandPool(chunk)
    offsets = output_offsets(chunk)
    made = [pool.operands(case, offset) for case, offset in zip(chunk, offsets, strict=True)]
    for case, ops in zip(chunk, made, strict=True):
        launchers.classic(case, ops)()
    picks = [quick_check.picked(1, case.n) for case in chunk]
    starts, values = quick_check.laid_out(picks)
    indices = cupy.asarray(values, dtype=cupy.int32)
    sums = cupy.zeros(quick_check.SUMS_PER_CASE * len(chunk), dtype=cupy.float64)
    scratch = quick_check.Scratch()
    own = [quick_check.error_now(ops, ops.c) for ops in made]
    stream = cupy.cuda.get_current_stream().ptr

    def each() -> None:
        for slot, (ops, pick) in enumerate(zip(made, picks, strict=True)):
            at = quick_check.index_address(indices.data.ptr, starts[slot])
            out = quick_check.sums_address(sums.data.ptr, slot)
            quick_check.enqueue_at(ops, ops.c, pick, at, out, scratch)

    totals = {"own": paced(each, 1) * len(chunk)}
    worst = 0.0
    a, b, region = pool.addresses()["bf16"]
    on = check_chunk.Operands(a, b, 0, [region + offset for offset in offsets])
    for k in most_k:
        check_chunk.MOST_K = k
        room = cupy.zeros(check_chunk.scratch_values(4096), dtype=cupy.float64)
        sums.fill(0)
        plan = check_chunk.planned(
            chunk, picks, starts, on, indices.data.ptr, sums.data.ptr, room.data.ptr
        )
        check_chunk.launch(plan, stream)
        got = sums.get().tolist()
        for slot, error in enumerate(own):
            mine = quick_check.error_from_sums(got[4 * slot : 4 * slot + 2])
            worst = max(worst, abs(mine / error - 1))
        totals[f"chunk-{k}"] = paced(functools.partial(check_chunk.launch, plan, stream), REPEATS)
        assert not room.any(), "a chunk's check left its scratch dirty"
    return totals, worst


def size_fit(shapes: list[tuple[int, int, int]], micro: list[float]) -> dict[str, float]:
    """A check's microseconds as fixed + slope x (m k / 1e6), least squares: what a check costs
    whatever its size, and what its arithmetic adds."""
    import numpy

    size = numpy.array([m * k / 1e6 for m, _n, k in shapes])
    design = numpy.vstack([numpy.ones_like(size), size]).T
    fixed, slope = numpy.linalg.lstsq(design, numpy.array(micro), rcond=None)[0]
    return {"fixed_us": round(float(fixed), 2), "us_per_million_mk": round(float(slope), 3)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--module", action="append", default=[])
    parser.add_argument("--sample", type=int, default=400)
    parser.add_argument("--fill", default="264,528")
    parser.add_argument("--most-k", default="512,1024,2048")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import cupy

    found = variants(args.module, [int(x) for x in args.fill.split(",")])
    with cupy.cuda.Stream(non_blocking=True):  # (the null stream cannot be captured)
        legs = {
            "bf16": sample_leg("bf16", "n", problems(args.sample, 0), found),
            "fp32": sample_leg("fp32", "n", problems(args.sample // 4, 1), found),
            "bf16_transa": sample_leg("bf16", "t", problems(args.sample // 4, 2), found),
        }
        most_k = [int(x) for x in args.most_k.split(",")]
        chunk = chunk_leg(problems(args.sample, 0)[:256], most_k)
    result: dict[str, Any] = {
        "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "repeats": REPEATS,
        "timing": f"GPU-paced: a CUDA graph of `repeats` checks, best of {LAUNCHES} launches",
        "legs": legs,
    }
    result["chunk"] = chunk
    for leg, values in result["legs"].items():
        for name, figures in values["variants"].items():
            print(f"{leg:12} {name:10} {figures}")
    print(f"chunk        {chunk}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
