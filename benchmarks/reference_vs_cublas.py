"""The reference SGEMM against cuBLAS on this GPU (issue 4): one self-checking device script.

    python3 benchmarks/reference_vs_cublas.py [--tune] [--json FILE]
    python3 benchmarks/reference_vs_cublas.py --profile 8192,1   # under ncu

With the project installed (`pip install -e '.[gpu]'` in a checkout): the reference kernels are
read from the installed package (cublas_audit.reference_kernels).

Steps (each unit runs in a child process with a time limit, so that a kernel fault, which leaves
the CUDA context unusable, or a hang costs that unit only; its traceback goes to the log):
1. check: every candidate tile on ragged sizes, odd batches and non-square problems against
   float64, output poisoned with NaN first: PASS/FAIL with the normwise relative error;
2. build: registers and local memory of every candidate tile at 4096 (as the driver loaded it);
3. tune (--tune): a bounded tile search (--tune-budget-s), written to --table-out, used below;
4. table: sizes x batches, reference and cuBLAS timed interleaved (first call discarded, median of
   at least 20, CUDA events), efficiency = cuBLAS time / reference time, TFLOP/s against the FP32
   peak of the device (66.9 TFLOP/s on the H100 SXM at 1.98 GHz);
5. fma: FMA-pipe utilization of the reference and of cuBLAS under ncu (--fma-problems, one
   call each, this script's --profile mode as the profiled program).
--json is rewritten after every unit, with the device, date and versions. `--profile SIZE,BATCH`
runs one reference and one cuBLAS call inside NVTX ranges `ref` and `cublas`, for ncu.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import traceback
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cublas_audit.device import launchers, operands
from cublas_audit.device.reference import bench
from cublas_audit.device.reference.build import build, device_cc, prepare
from cublas_audit.device.reference.config import Config, fit, strategy_for
from cublas_audit.errors import AuditError
from cublas_audit.observe import environment
from cublas_audit.observe.ncu_command import export_csv
from cublas_audit.observe.ncu_export import FMA_PCT, parse_number
from cublas_audit.planning.cases import Case

CHECK_PROBLEMS = [
    (256, 256, 256, 5),
    (1000, 1000, 1000, 1),
    (1023, 1023, 1023, 3),
    (1024, 520, 1000, 3),
    (72, 4100, 36, 1),
    (3000, 3000, 3000, 1),
    (2999, 3001, 3003, 2),
    (4096, 4096, 4096, 3),
]
BUILD_PROBLEM = (4096, 4096, 4096, 8)
UNIT_TIMEOUT_S = 150


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.profile:
        return profile_one(args.profile, Path(args.table) if args.table else None)
    if args.unit:
        return run_unit(args)
    return orchestrate(args)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--tune", action="store_true", help="search tiles first (bounded)")
    parser.add_argument("--tune-budget-s", type=float, default=150.0)
    parser.add_argument("--tune-sizes", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--tune-batches", default="1,8")
    parser.add_argument(
        "--table-out", help="where --tune writes its table [default: beside --json]"
    )
    parser.add_argument("--skip-check", action="store_true", help="skip the check and build steps")
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--profile", help="SIZE,BATCH: one reference and one cuBLAS call, for ncu")
    parser.add_argument(
        "--fma-problems",
        default="8192,1;8192,8",
        help="SIZE,BATCH;...: problems whose FMA-pipe utilization ncu measures ('' skips)",
    )
    parser.add_argument("--unit", help=argparse.SUPPRESS)  # child: one unit of work, JSON out
    parser.add_argument("--unit-arg", default="", help=argparse.SUPPRESS)
    parser.add_argument("--unit-out", help=argparse.SUPPRESS)
    parser.add_argument("--table", help="strategy table for --profile [default: the shipped one]")
    return parser.parse_args(argv)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# ----- parent ------------------------------------------------------------------------------------


def orchestrate(args: argparse.Namespace) -> int:
    results: dict[str, Any] = {"command": sys.argv}
    results["device"] = child(args, "device", "")
    print(json.dumps(results["device"], indent=1), flush=True)
    if not args.skip_check:
        print(
            f"\n== check (normwise relative error vs float64, limit {bench.TOLERANCE:g}) ==",
            flush=True,
        )
        results["check"] = [
            child(args, "check", ",".join(map(str, dims)), results) for dims in CHECK_PROBLEMS
        ]
        print("\n== build (registers, local memory, shared memory per variant) ==", flush=True)
        results["build"] = child(args, "build", "", results)
    table: Path | None = None
    if args.tune:
        print(f"\n== tune (budget {args.tune_budget_s:.0f} s) ==", flush=True)
        table = Path(
            args.table_out or Path(args.json or "reference.json").with_suffix(".table.json")
        )
        limit = args.tune_budget_s + UNIT_TIMEOUT_S
        results["tune"] = child(args, "tune", str(table), results, limit)
        table = table if table.exists() else None
        results["tuned_table"] = json.loads(table.read_text()) if table else None
    print("\n== reference vs cuBLAS ==", flush=True)
    rows: list[dict[str, Any]] = []
    results["table"] = rows
    for size in ints(args.sizes):
        unit = child(args, "time", str(size), results, table=table)
        rows.extend(unit.get("rows") or [{"size": size, "status": "FAIL", **unit}])
    specs = [spec for spec in args.fma_problems.split(";") if spec.strip()]
    if specs:
        print("\n== FMA-pipe utilization under ncu ==", flush=True)
    results["fma"] = [fma_under_ncu(spec, table) for spec in specs]
    print_summary(results)
    save(args, results)
    return 0


def child(
    args: argparse.Namespace,
    unit: str,
    arg: str,
    results: dict[str, Any] | None = None,
    limit: float = UNIT_TIMEOUT_S,
    table: Path | None = None,
) -> dict[str, Any]:
    """Runs one unit in a fresh process; its JSON result, or why there is none."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "unit.json"
        cmd = [sys.executable, __file__, "--unit", unit, "--unit-arg", arg, "--unit-out", str(out)]
        cmd += ["--batches", args.batches, "--tune-budget-s", str(args.tune_budget_s)]
        cmd += ["--tune-sizes", args.tune_sizes, "--tune-batches", args.tune_batches]
        cmd += ["--table", str(table)] if table else []
        try:
            done = subprocess.run(cmd, timeout=limit, check=False, env=os.environ.copy())
            outcome: dict[str, Any] = (
                json.loads(out.read_text())
                if out.exists()
                else {"status": "FAIL", "error": f"child exited {done.returncode}, no result"}
            )
        except subprocess.TimeoutExpired:
            outcome = {"status": "FAIL", "error": f"timed out after {limit:.0f} s (hang?)"}
    if outcome.get("status") == "FAIL":
        print(f"FAIL unit {unit} {arg}: {outcome.get('error')}", flush=True)
    if results is not None:
        save(args, {**results, f"last_{unit}": outcome})
    return outcome


def save(args: argparse.Namespace, results: dict[str, Any]) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")


def print_summary(results: dict[str, Any]) -> None:
    from tabulate import tabulate

    checks = [row for unit in results.get("check", []) for row in unit.get("rows", [])]
    failed = [row for row in checks if row["status"] != "PASS"]
    print(f"\ncheck: {len(checks) - len(failed)} of {len(checks)} PASS", flush=True)
    for row in failed:
        print(f"  FAIL {row['problem']} {row['config']}: {row.get('error')}")
    peak = results["device"].get("peak_tflops", 66.9)
    body = [
        [
            r["size"],
            r.get("batch", ""),
            r.get("config", "FAILED"),
            f"{r['ref_ms']:.4f}" if "ref_ms" in r else "",
            f"{r['cublas_ms']:.4f}" if "cublas_ms" in r else "",
            f"{r['efficiency']:.3f}" if "efficiency" in r else "",
            f"{r['ref_tflops']:.1f}" if "ref_tflops" in r else "",
            f"{r['cublas_tflops']:.1f}" if "cublas_tflops" in r else "",
            f"{peak:.1f}",
        ]
        for r in results["table"]
    ]
    headers = ["size", "batch", "config", "ref ms", "cuBLAS ms", "eff", "ref TF/s", "cuBLAS TF/s"]
    print("\n" + tabulate(body, headers=[*headers, "peak TF/s"], tablefmt="github"), flush=True)
    fma = [
        [r["size"], r["batch"], k["kernel"][:60], k["fma_pct"]]
        for r in results.get("fma", [])
        for k in r.get("kernels", [])
    ]
    if fma:
        table = tabulate(fma, headers=["size", "batch", "kernel", "FMA %"], floatfmt=".1f")
        print("\n" + table, flush=True)


def fma_under_ncu(spec: str, table: Path | None) -> dict[str, Any]:
    """`sm__pipe_fma_cycles_active` of the reference and of cuBLAS on one problem: ncu profiles
    this script's --profile mode (NVTX ranges `ref` and `cublas`), then exports its raw page."""
    size, batch = ints(spec)
    row: dict[str, Any] = {"size": size, "batch": batch}
    ncu = environment.find_ncu()
    if ncu is None:
        return {**row, "status": "SKIP", "error": "ncu not found"}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "fma.ncu-rep"
        profiled = [sys.executable, __file__, "--profile", spec]
        profiled += ["--table", str(table)] if table else []
        ranges = ["--nvtx", "--nvtx-include", "ref/", "--nvtx-include", "cublas/"]
        argv = [ncu, *ranges, "--metrics", FMA_PCT, "--export", str(report), *profiled]
        try:
            subprocess.run(argv, timeout=UNIT_TIMEOUT_S, check=True, capture_output=True)
            raw = export_csv(ncu, report, Path(tmp) / "fma.csv").read_text()
        except (subprocess.SubprocessError, OSError, AuditError) as exc:
            return {**row, "status": "FAIL", "error": f"{type(exc).__name__}: {exc}"}
    kernels = fma_by_kernel(raw)
    row |= {"status": "ok", "kernels": kernels}
    print(json.dumps(row), flush=True)
    return row


def fma_by_kernel(raw_csv: str) -> list[dict[str, Any]]:
    """(kernel, FMA %) per profiled launch of ncu's raw-page CSV (its second row holds units)."""
    import csv

    rows = list(csv.DictReader(raw_csv.splitlines()))[1:]
    return [{"kernel": r["Kernel Name"], "fma_pct": parse_number(r[FMA_PCT])} for r in rows]


# ----- child -------------------------------------------------------------------------------------


def run_unit(args: argparse.Namespace) -> int:
    units = {"device": unit_device, "check": unit_check, "build": unit_build}
    units |= {"tune": unit_tune, "time": unit_time}
    try:
        outcome = units[args.unit](args)
    except Exception as exc:
        traceback.print_exc()
        outcome = {"status": "FAIL", "error": f"{type(exc).__name__}: {exc}"}
    Path(args.unit_out).write_text(json.dumps(outcome, default=str))
    return 0


def attempt(name: str, step: Any) -> dict[str, Any]:
    """One variant inside a unit: a failure is printed with its traceback, recorded, not raised."""
    try:
        result: dict[str, Any] = step()
        return result
    except Exception as exc:
        print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        return {"status": "FAIL", "error": f"{type(exc).__name__}: {exc}"}


def unit_device(args: argparse.Namespace) -> dict[str, Any]:
    import cupy
    from cupy_backends.cuda.libs import cublas

    device = cupy.cuda.Device()
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
        "name": cupy.cuda.runtime.getDeviceProperties(device.id)["name"].decode(),
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


def all_tiles(cc: str, m: int, n: int, k: int, batch: int) -> list[Config]:
    """Every candidate tile shape, unsplit and split 4 ways, fitted to the problem."""
    tiles = [c for c in bench.candidates(cc, m, n, k, batch) if c.swizzle == 8 and c.splitk == 1]
    found = dict.fromkeys(tiles)
    for config in tiles:
        found[fit(replace(config, splitk=4), cc, m, n, k)] = None
    return list(found)


def unit_check(args: argparse.Namespace) -> dict[str, Any]:
    m, n, k, batch = ints(args.unit_arg)
    cc = device_cc()
    ops = operands.make("fp32", m, n, k, batch)
    default = strategy_for(cc, m, n, k, batch)
    rows = []
    for config in [default, *(x for x in all_tiles(cc, m, n, k, batch) if x != default)]:
        name = f"{m}x{n}x{k} batch {batch} {config.label()}"

        def check(config: Config = config) -> dict[str, Any]:
            launch = prepare(m, n, k, batch, ops.a, ops.b, ops.c, config)
            error = operands.checked(launch, ops)
            return {"status": "PASS" if error <= bench.TOLERANCE else "FAIL", "error": error}

        row = {"problem": [m, n, k, batch], "config": config.label(), **attempt(name, check)}
        print(f"{row['status']:4s} {name}: {row['error']}", flush=True)
        rows.append(row)
    return {"status": "ok", "rows": rows}


def unit_build(args: argparse.Namespace) -> dict[str, Any]:
    cc = device_cc()
    rows = []
    for config in all_tiles(cc, *BUILD_PROBLEM):
        name = f"{config.label()} @ {'x'.join(map(str, BUILD_PROBLEM))}"

        def compile_one(config: Config = config) -> dict[str, Any]:
            kernel = build(config, *BUILD_PROBLEM[:3]).sgemm
            regs, local = kernel.num_regs, kernel.local_size_bytes
            return {"status": "ok", "registers": regs, "local_bytes": local}

        row = {"variant": name, "smem": config.smem_bytes, **attempt(name, compile_one)}
        print(
            f"{row['status']:4s} {name}: {row.get('registers', '?')} registers, "
            f"{row.get('local_bytes', '?')} B local, {config.smem_bytes} B shared",
            flush=True,
        )
        rows.append(row)
    return {"status": "ok", "rows": rows}


def unit_tune(args: argparse.Namespace) -> dict[str, Any]:
    table = bench.tune(ints(args.tune_sizes), ints(args.tune_batches), args.tune_budget_s, print)
    path = bench.write_table(table, Path(args.unit_arg))
    print(f"strategy table written to {path}", flush=True)
    return {"status": "ok", "path": str(path)}


def unit_time(args: argparse.Namespace) -> dict[str, Any]:
    import cupy

    size = int(args.unit_arg)
    cc = device_cc()
    table = Path(args.table) if args.table else None
    rows = []
    for batch in ints(args.batches):

        def one(batch: int = batch) -> dict[str, Any]:
            config = strategy_for(cc, size, size, size, batch, table)
            return {"status": "ok", **bench.compare(size, size, size, batch, config).to_json()}

        row = {"size": size, "batch": batch, **attempt(f"{size} batch {batch}", one)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        cupy.get_default_memory_pool().free_all_blocks()
    return {"status": "ok", "rows": rows}


def profile_one(spec: str, table: Path | None) -> int:
    """One warmed-up reference call and one cuBLAS call, each in its own NVTX range."""
    import cupy

    size, batch = ints(spec)
    ops = operands.make("fp32", size, size, size, batch)
    config = strategy_for(device_cc(), size, size, size, batch, table)
    print(f"reference {config.label()}", flush=True)
    ref = prepare(size, size, size, batch, ops.a, ops.b, ops.c, config)
    blas = launchers.classic(Case("cublas", "fp32", size, size, size, batch), ops)
    print(f"reference error {operands.checked(ref, ops):.3g}", flush=True)
    blas()
    ref.zero()  # outside the ranges: ncu sees the reference SGEMM alone
    for name, launch in (("ref", ref.sgemm), ("cublas", blas)):
        cupy.cuda.Device().synchronize()
        cupy.cuda.nvtx.RangePush(name)
        launch()
        cupy.cuda.Device().synchronize()
        cupy.cuda.nvtx.RangePop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
