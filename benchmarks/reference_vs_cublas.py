"""The reference SGEMM against cuBLAS on this GPU (issue 4): one self-checking device script.

    PYTHONPATH=$PWD python3 benchmarks/reference_vs_cublas.py [--tune] [--json FILE]
    PYTHONPATH=$PWD python3 benchmarks/reference_vs_cublas.py --profile 8192,1   # under ncu

Steps, each independent (a failure prints its traceback and the script goes on):
1. build: compiles every candidate tile for an aligned and a ragged problem (NVRTC, via CuPy);
2. check: each tile on ragged sizes, odd batches and non-square problems against float64, output
   poisoned with NaN first: PASS/FAIL with the normwise relative error;
3. tune (--tune): a bounded tile search (--tune-budget-s), written to --table-out and used below;
4. table: sizes x batches, reference and cuBLAS timed interleaved (first call discarded, median of
   at least 20, CUDA events), efficiency = cuBLAS time / reference time, TFLOP/s against the FP32
   peak of the device (66.9 TFLOP/s on the H100 SXM at 1.98 GHz).
--json writes everything with the device, date and versions. `--profile SIZE,BATCH` runs the
reference and cuBLAS once each inside NVTX ranges `ref` and `cublas`, for ncu.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cublas_audit import reference  # noqa: E402

CHECK_PROBLEMS = [
    (1000, 1000, 1000, 1),
    (1023, 1023, 1023, 3),
    (3000, 3000, 3000, 1),
    (2999, 3001, 3003, 2),
    (4096, 4096, 4096, 3),
    (256, 256, 256, 5),
    (1024, 520, 1000, 3),
    (72, 4100, 36, 1),
]
BUILD_PROBLEMS = [(4096, 4096, 4096, 8), (1023, 1023, 1023, 3)]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import cupy

    if args.profile:
        return profile_one(args.profile)
    results: dict[str, Any] = {"device": device_info(cupy), "command": sys.argv}
    print(json.dumps(results["device"], indent=1), flush=True)
    cc = results["device"]["cc"]
    if not args.skip_check:
        results["build"] = build_all(cc)
        results["check"] = check_all(cc)
    table_path: Path | None = None
    if args.tune:
        table_path = tune(args, results)
    results["table"] = time_table(cc, args, table_path)
    print_table(results["table"], results["device"]["peak_tflops"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--tune", action="store_true", help="search tiles first (bounded)")
    parser.add_argument("--tune-budget-s", type=float, default=180.0)
    parser.add_argument("--tune-sizes", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--tune-batches", default="1,8")
    parser.add_argument(
        "--table-out", help="where --tune writes its table [default: beside --json]"
    )
    parser.add_argument("--skip-check", action="store_true", help="skip build and check steps")
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--profile", help="SIZE,BATCH: one reference and one cuBLAS call, for ncu")
    return parser.parse_args(argv)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def device_info(cupy: Any) -> dict[str, Any]:
    from cupy_backends.cuda.libs import cublas

    device = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    attrs = device.attributes
    cc = str(device.compute_capability)
    lanes = 64 if cc == "80" else 128  # FP32 FMA lanes per SM
    # CUDA 13 dropped the clock from the device properties; the attribute may go too.
    clock_ghz = attrs.get("ClockRate", 1_980_000) / 1e6
    sms = attrs["MultiProcessorCount"]
    try:
        import cuda.bindings

        bindings = str(cuda.bindings.__version__)
    except Exception as exc:
        bindings = f"unavailable: {exc}"
    return {
        "name": props["name"].decode(),
        "cc": cc,
        "sms": sms,
        "clock_ghz": clock_ghz,
        "peak_tflops": sms * lanes * 2 * clock_ghz / 1e3,
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cublas": cublas.getVersion(cupy.cuda.device.get_cublas_handle()),
        "cupy": cupy.__version__,
        "cuda_bindings": bindings,
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def guarded(what: str, step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Runs one step; a failure is printed with its traceback and recorded, never raised."""
    try:
        return step()
    except Exception as exc:
        print(f"FAIL {what}: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        return {"status": "FAIL", "error": f"{type(exc).__name__}: {exc}"}


def all_tiles(cc: str, m: int, n: int, k: int, batch: int) -> list[reference.Config]:
    """Every candidate tile with and without split-K, fitted to the problem."""
    found = dict.fromkeys(reference.candidates(cc, m, n, k, batch))
    for config in list(found):
        found[reference.fit(replace(config, splitk=4), cc, m, n, k)] = None
    return list(found)


def build_all(cc: str) -> list[dict[str, Any]]:
    print("\n== build (registers and local memory as the driver reports them) ==", flush=True)
    rows = []
    for dims in BUILD_PROBLEMS:
        for config in all_tiles(cc, *dims):
            name = f"{config.label()} @ {'x'.join(map(str, dims))}"
            row = {"variant": name, **guarded(name, partial(build_one, config, dims))}
            print(
                f"{row['status']:4s} {name}  {row.get('registers', '?')} regs, local "
                f"{row.get('local_bytes', '?')} B, smem {config.smem_bytes} B",
                flush=True,
            )
            rows.append(row)
    return rows


def build_one(config: reference.Config, dims: tuple[int, int, int, int]) -> dict[str, Any]:
    kernel = reference.build(config, *dims)
    return {"status": "ok", "registers": kernel.num_regs, "local_bytes": kernel.local_size_bytes}


def check_all(cc: str) -> list[dict[str, Any]]:
    print("\n== check (normwise relative error vs float64, limit 1e-5) ==", flush=True)
    rows = []
    for dims in CHECK_PROBLEMS:
        operands = reference.random_operands(*dims)
        default = reference.strategy_for(cc, *dims)
        for config in [default, *(x for x in all_tiles(cc, *dims) if x != default)]:
            name = f"{'x'.join(map(str, dims[:3]))} batch {dims[3]} {config.label()}"
            row = {
                "problem": list(dims),
                "config": config.label(),
                **guarded(name, partial(check_one, config, dims, operands)),
            }
            print(f"{row['status']:4s} {name}: {row['error']}", flush=True)
            rows.append(row)
    return rows


def check_one(
    config: reference.Config, dims: tuple[int, int, int, int], operands: tuple[Any, Any, Any]
) -> dict[str, Any]:
    launch = reference.prepare(*dims, *operands, config)
    error = reference.checked(launch, *operands)
    return {"status": "PASS" if error <= reference.TOLERANCE else "FAIL", "error": error}


def tune(args: argparse.Namespace, results: dict[str, Any]) -> Path | None:
    print(f"\n== tune (budget {args.tune_budget_s:.0f} s) ==", flush=True)
    out = Path(
        args.table_out or Path(args.json or "reference_vs_cublas.json").with_suffix(".table.json")
    )

    def run() -> dict[str, Any]:
        table = reference.tune(
            ints(args.tune_sizes), ints(args.tune_batches), args.tune_budget_s, print
        )
        reference.write_table(table, out)
        return table

    started = time.monotonic()
    results["tuned_table"] = guarded("tune", run)
    print(f"tuning took {time.monotonic() - started:.0f} s; table: {out}", flush=True)
    return out if out.exists() else None


def time_table(cc: str, args: argparse.Namespace, table: Path | None) -> list[dict[str, Any]]:
    print("\n== reference vs cuBLAS ==", flush=True)
    rows = []
    for size in ints(args.sizes):
        for batch in ints(args.batches):
            name = f"{size} batch {batch}"

            def one(size: int = size, batch: int = batch) -> dict[str, Any]:
                config = reference.strategy_for(cc, size, size, size, batch, table)
                row = reference.compare(size, size, size, batch, config).to_json()
                return {"status": "ok", **row}

            row = {"size": size, "batch": batch, **guarded(name, one)}
            print(json.dumps(row), flush=True)
            rows.append(row)
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def print_table(rows: list[dict[str, Any]], peak: float) -> None:
    from tabulate import tabulate

    body = []
    for r in rows:
        if r["status"] != "ok":
            body.append([r["size"], r["batch"], "FAILED", "", "", "", "", "", f"{peak:.1f}"])
            continue
        body.append(
            [
                r["size"],
                r["batch"],
                r["config"],
                f"{r['ref_ms']:.4f}",
                f"{r['cublas_ms']:.4f}",
                f"{r['efficiency']:.3f}",
                f"{r['ref_tflops']:.1f}",
                f"{r['cublas_tflops']:.1f}",
                f"{peak:.1f}",
            ]
        )
    headers = ["size", "batch", "config", "ref ms", "cuBLAS ms", "eff", "ref TF/s", "cuBLAS TF/s"]
    print("\n" + tabulate(body, headers=[*headers, "peak TF/s"], tablefmt="github"), flush=True)


def profile_one(spec: str) -> int:
    """One warmed-up reference call and one cuBLAS call, each in its own NVTX range."""
    import cupy

    size, batch = ints(spec)
    a, b, c = reference.random_operands(size, size, size, batch)
    ref = reference.prepare(size, size, size, batch, a, b, c)
    blas = reference.cublas_launcher(size, size, size, batch, a, b, c)
    print(f"reference error {reference.checked(ref, a, b, c):.3g}", flush=True)
    blas()
    for name, launch in (("ref", ref), ("cublas", blas)):
        cupy.cuda.Device().synchronize()
        cupy.cuda.nvtx.RangePush(name)
        launch()
        cupy.cuda.Device().synchronize()
        cupy.cuda.nvtx.RangePop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
