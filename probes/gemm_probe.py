"""The program ncu profiles: makes each planned cuBLAS / cuBLASLt call, checks it, times it.

    python probes/gemm_probe.py --plan plan.json --phase profile|time --results out.jsonl

`profile` makes each call once inside an NVTX range named `audit.<case_id>` (and the bundled
reference kernel inside `audit-ref.<case_id>`), so that ncu, filtering on those ranges, profiles
exactly the launches of the call and nothing else. `time` runs without a profiler: it checks each
result against a float64 product on sampled entries, then times the call with CUDA events.

Every finished case is one JSON line appended to --results and flushed at once: a crash or Ctrl-C
loses at most the case in flight, and the `start` line before it names the culprit.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cublas_audit.cases import Case, read_plan
from cublas_audit.errors import ToolMissingError
from cublas_audit.ncu_parse import CALL_RANGE_PREFIX, REFERENCE_RANGE_PREFIX

if TYPE_CHECKING:
    from cublas_audit.reference import Launch

# cudaDataType and cublasComputeType_t values (library_types.h, cublas_api.h).
R_32F, R_16F, R_16BF = 0, 2, 14
COMPUTE_32F, COMPUTE_32F_FAST_16BF, COMPUTE_32F_FAST_TF32 = 68, 75, 77
GEMM_DEFAULT_ALGO = -1
OP_N = 0

# mode -> (storage of A/B/C, cudaDataType, cublasComputeType)
MODE_TYPES = {
    "fp32": ("float32", R_32F, COMPUTE_32F),
    "tf32": ("float32", R_32F, COMPUTE_32F_FAST_TF32),
    "bf16x": ("float32", R_32F, COMPUTE_32F_FAST_16BF),
    "fp16": ("float16", R_16F, COMPUTE_32F),
    "bf16": ("bfloat16", R_16BF, COMPUTE_32F),
}
# Largest accepted |C - ref| / sum|a*b| over sampled entries: a few units of the mode's input or
# output rounding; a wrong kernel is off by order one.
TOLERANCE = {"fp32": 1e-4, "tf32": 4e-3, "bf16x": 2e-2, "fp16": 4e-3, "bf16": 1e-2}
SAMPLES = 256


@dataclass
class Operands:
    a: Any
    b: Any
    c: Any
    mode: str
    shape: tuple[int, int, int, int]


class Skip(Exception):
    """The case cannot run here (memory, missing library); recorded, the sweep goes on."""


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import cupy

    cases = read_plan(Path(args.plan))
    if args.only:
        wanted = set(Path(args.only).read_text().split())
        cases = [c for c in cases if c.case_id in wanted]
    with open(args.results, "a", buffering=1) as out:
        emit(out, {"event": "probe", **versions(cupy)})
        runner = Runner(cupy, args.phase, args.reference, args.min_reps)
        runner.precompile_reference(cases)
        for case in cases:
            emit(out, {"event": "start", "case_id": case.case_id, "phase": args.phase})
            print(f"@@start {case.case_id}", flush=True)
            result = runner.run(case)
            emit(out, {"event": "done", "case_id": case.case_id, "phase": args.phase, **result})
            print(f"@@done {case.case_id}", flush=True)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--phase", choices=("profile", "time"), required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--only", help="file with the case ids to run, one per line")
    parser.add_argument("--reference", action="store_true", help="also run the reference kernel")
    parser.add_argument("--min-reps", type=int, default=20)
    return parser.parse_args(argv)


def emit(out: Any, record: dict[str, Any]) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()


def versions(cupy: Any) -> dict[str, Any]:
    from cupy_backends.cuda.libs import cublas

    runtime = cupy.cuda.runtime.runtimeGetVersion()
    return {
        "cublas_version_int": cublas.getVersion(cupy.cuda.device.get_cublas_handle()),
        "cuda_runtime_int": runtime,
        "cupy": cupy.__version__,
        "python": sys.version.split()[0],
    }


class Runner:
    def __init__(self, cupy: Any, phase: str, reference: bool, min_reps: int) -> None:
        from cupy_backends.cuda.libs import cublas

        self.cp = cupy
        self.cublas = cublas
        self.phase = phase
        self.reference = reference
        self.min_reps = min_reps
        self.handle = cupy.cuda.device.get_cublas_handle()
        cublas.setPointerMode(self.handle, cublas.CUBLAS_POINTER_MODE_HOST)
        cublas.setMathMode(self.handle, cublas.CUBLAS_DEFAULT_MATH)
        self.alpha = self._host_scalar(1.0)
        self.beta = self._host_scalar(0.0)
        self.operands: Operands | None = None
        self.reference_missing: str | None = None
        self.lt_gemm: Any = None

    def precompile_reference(self, cases: list[Case]) -> None:
        """Compiles the reference for every problem up front, in parallel. A failure here is
        only logged: the case that needs the kernel meets it again and records the reason."""
        wanted = [(c.m, c.n, c.k, c.batch) for c in cases if self._wants_reference(c)]
        if not wanted:
            return
        try:
            from cublas_audit.reference import precompile

            precompile(wanted)
        except Exception:
            traceback.print_exc()

    def _wants_reference(self, case: Case) -> bool:
        return self.reference and case.mode == "fp32" and case.api == "cublas" and not case.loop

    def _host_scalar(self, value: float) -> Any:
        import numpy

        return numpy.array(value, dtype=numpy.float32)

    def run(self, case: Case) -> dict[str, Any]:
        try:
            ops = self.prepare(case)
            launch = self.launcher(case, ops)
            if self.phase == "profile":
                return self.profile(case, ops, launch)
            return self.time(case, ops, launch)
        except Skip as why:
            self.operands = None
            self.cp.get_default_memory_pool().free_all_blocks()
            return {"status": "skipped", "detail": str(why)}
        except Exception as exc:  # a failing call is recorded and the sweep goes on
            traceback.print_exc()
            self.operands = None
            return {"status": "error", "detail": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        finally:
            if self.lt_gemm is not None:  # descriptors and workspace are per case
                self.lt_gemm.close()
                self.lt_gemm = None

    # ----- operands -----------------------------------------------------------------------------
    def prepare(self, case: Case) -> Operands:
        shape = (case.m, case.n, case.k, case.batch)
        if self.operands is not None and (self.operands.mode, self.operands.shape) == (
            case.mode,
            shape,
        ):
            return self.operands
        self.operands = None
        self.cp.get_default_memory_pool().free_all_blocks()
        free, _total = self.cp.cuda.runtime.memGetInfo()
        if case.bytes_needed > 0.9 * free:
            needed, available = case.bytes_needed / 2**30, free / 2**30
            raise Skip(f"out of memory: needs {needed:.1f} GiB, {available:.1f} GiB free")
        try:
            self.operands = Operands(
                a=self.random((case.batch, case.k, case.m), case.mode),
                b=self.random((case.batch, case.n, case.k), case.mode),
                c=self.empty((case.batch, case.n, case.m), case.mode),
                mode=case.mode,
                shape=shape,
            )
        except self.cp.cuda.memory.OutOfMemoryError as exc:
            raise Skip(f"out of memory: {str(exc).splitlines()[0]}") from exc
        return self.operands

    def random(self, shape: tuple[int, ...], mode: str) -> Any:
        values = self.cp.random.standard_normal(shape, dtype=self.cp.float32)
        storage = MODE_TYPES[mode][0]
        if storage == "bfloat16":
            bits = values.view(self.cp.uint32)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(self.cp.uint16)
        return values.astype(storage)

    def empty(self, shape: tuple[int, ...], mode: str) -> Any:
        storage = MODE_TYPES[mode][0]
        dtype = self.cp.uint16 if storage == "bfloat16" else storage
        return self.cp.full(shape, self.cp.nan if storage != "bfloat16" else 0x7FC0, dtype=dtype)

    def as_float64(self, values: Any, mode: str) -> Any:
        if MODE_TYPES[mode][0] == "bfloat16":
            return (
                (values.astype(self.cp.uint32) << 16).view(self.cp.float32).astype(self.cp.float64)
            )
        return values.astype(self.cp.float64)

    # ----- launchers ------------------------------------------------------------------------------
    def launcher(self, case: Case, ops: Operands) -> Callable[[], None]:
        if case.api == "cublasLt":
            return self.lt_launcher(case, ops)
        if case.loop:
            return self.loop_launcher(case, ops)
        return self.classic_launcher(case, ops)

    def classic_launcher(self, case: Case, ops: Operands) -> Callable[[], None]:
        blas, h, m, n, k, batch = self.cublas, self.handle, case.m, case.n, case.k, case.batch
        alpha, beta = self.alpha.ctypes.data, self.beta.ctypes.data
        a, b, c = ops.a.data.ptr, ops.b.data.ptr, ops.c.data.ptr
        _, dtype, compute = MODE_TYPES[case.mode]
        if case.mode == "fp32" and batch == 1:
            return lambda: blas.sgemm(h, OP_N, OP_N, m, n, k, alpha, a, m, b, k, beta, c, m)
        if case.mode == "fp32":
            return lambda: blas.sgemmStridedBatched(
                h, OP_N, OP_N, m, n, k, alpha, a, m, m * k, b, k, k * n, beta, c, m, m * n, batch
            )
        if batch == 1:
            return lambda: blas.gemmEx(
                h,
                OP_N,
                OP_N,
                m,
                n,
                k,
                alpha,
                a,
                dtype,
                m,
                b,
                dtype,
                k,
                beta,
                c,
                dtype,
                m,
                compute,
                GEMM_DEFAULT_ALGO,
            )
        return lambda: blas.gemmStridedBatchedEx(
            h,
            OP_N,
            OP_N,
            m,
            n,
            k,
            alpha,
            a,
            dtype,
            m,
            m * k,
            b,
            dtype,
            k,
            k * n,
            beta,
            c,
            dtype,
            m,
            m * n,
            batch,
            compute,
            GEMM_DEFAULT_ALGO,
        )

    def loop_launcher(self, case: Case, ops: Operands) -> Callable[[], None]:
        blas, h, m, n, k = self.cublas, self.handle, case.m, case.n, case.k
        alpha, beta = self.alpha.ctypes.data, self.beta.ctypes.data
        item = ops.a.itemsize
        calls = [
            (
                ops.a.data.ptr + i * m * k * item,
                ops.b.data.ptr + i * k * n * item,
                ops.c.data.ptr + i * m * n * item,
            )
            for i in range(case.batch)
        ]

        def loop() -> None:
            for a, b, c in calls:
                blas.sgemm(h, OP_N, OP_N, m, n, k, alpha, a, m, b, k, beta, c, m)

        return loop

    def lt_launcher(self, case: Case, ops: Operands) -> Callable[[], None]:
        try:
            from cublas_audit.lt import LtGemm
        except ImportError as exc:
            raise Skip(f"cuBLASLt wrapper unavailable: {exc}") from exc
        try:
            gemm = LtGemm(
                case.mode,
                case.m,
                case.n,
                case.k,
                case.batch,
                ops.a.data.ptr,
                ops.b.data.ptr,
                ops.c.data.ptr,
            )
        except ToolMissingError as exc:
            raise Skip(str(exc)) from exc
        self.lt_gemm = gemm
        launch: Callable[[], None] = gemm.run
        return launch

    def reference_launcher(self, case: Case, ops: Operands) -> Launch | None:
        """The bundled reference on the same problem: FP32 only, once per problem (cublas api)."""
        if not self._wants_reference(case):
            return None
        from cublas_audit.reference import prepare

        ref_c = self.empty(ops.c.shape, case.mode)
        launch = prepare(case.m, case.n, case.k, case.batch, ops.a, ops.b, ref_c)
        self.ref_c = ref_c
        return launch

    # ----- phases ---------------------------------------------------------------------------------
    def profile(self, case: Case, ops: Operands, launch: Callable[[], None]) -> dict[str, Any]:
        self.cp.cuda.Device().synchronize()
        with _Range(self.cp, CALL_RANGE_PREFIX + case.case_id):
            launch()
            self.cp.cuda.Device().synchronize()
        result: dict[str, Any] = {"status": "ok"}
        ref = self._reference_or_reason(case, ops, result)
        if ref is not None:
            ref.zero()  # outside the range: ncu profiles the reference SGEMM alone
            with _Range(self.cp, REFERENCE_RANGE_PREFIX + case.case_id):
                ref.sgemm()
                self.cp.cuda.Device().synchronize()
        return result

    def time(self, case: Case, ops: Operands, launch: Callable[[], None]) -> dict[str, Any]:
        from cublas_audit.timing import time_interleaved

        error = self.checked_error(case, ops, launch, ops.c)
        result: dict[str, Any] = {"max_rel_err": error}
        if not error <= TOLERANCE[case.mode]:
            return {
                **result,
                "status": "wrong",
                "detail": f"sampled relative error {error:.3g} > {TOLERANCE[case.mode]:g}",
            }
        contenders = {"call": launch}
        ref = self._reference_or_reason(case, ops, result)
        if ref is not None:
            ref_error = self.checked_error(case, ops, ref, self.ref_c)
            result["ref_max_rel_err"] = ref_error
            if ref_error <= TOLERANCE["fp32"]:
                contenders["ref"] = ref
            else:
                result["ref_status"] = f"wrong: sampled relative error {ref_error:.3g}"
        timings = time_interleaved(contenders, self.min_reps, warm=True)  # checked just now
        result.update(
            status="ok",
            time_ms=timings["call"].median_ms,
            time_min_ms=timings["call"].min_ms,
            reps=timings["call"].reps,
        )
        if "ref" in timings:
            result.update(
                ref_time_ms=timings["ref"].median_ms, ref_time_min_ms=timings["ref"].min_ms
            )
        return result

    def _reference_or_reason(
        self, case: Case, ops: Operands, result: dict[str, Any]
    ) -> Launch | None:
        if self.reference_missing:
            result["ref_status"] = self.reference_missing
            return None
        try:
            ref = self.reference_launcher(case, ops)
        except ImportError as exc:  # not built for this machine: say so once per case, quietly
            self.reference_missing = f"unavailable: {exc}"
            result["ref_status"] = self.reference_missing
            return None
        except Exception as exc:  # the reference is optional: its failure never loses the case
            traceback.print_exc()
            result["ref_status"] = f"unavailable: {type(exc).__name__}: {exc}".splitlines()[0]
            return None
        if ref is not None:
            result.setdefault("ref_status", "ok")
        return ref

    def checked_error(
        self, case: Case, ops: Operands, launch: Callable[[], None], out: Any
    ) -> float:
        """Runs once on a poisoned output, then compares sampled entries with a float64 product."""
        cp = self.cp
        out.fill(cp.nan if MODE_TYPES[case.mode][0] != "bfloat16" else 0x7FC0)
        launch()
        cp.cuda.Device().synchronize()
        rng = cp.random.default_rng(12345)
        bs = rng.integers(0, case.batch, SAMPLES)
        rows = rng.integers(0, case.m, SAMPLES)
        cols = rng.integers(0, case.n, SAMPLES)
        a_rows = self.as_float64(ops.a[bs, :, rows], case.mode)
        b_cols = self.as_float64(ops.b[bs, cols, :], case.mode)
        products = a_rows * b_cols
        exact = products.sum(axis=1)
        scale = cp.abs(products).sum(axis=1)
        got = self.as_float64(out[bs, cols, rows], case.mode)
        errors = cp.abs(got - exact) / cp.maximum(scale, 1e-30)
        worst = float(errors.max())
        return worst if cp.isfinite(got).all() else float("inf")


class _Range:
    """An NVTX push/pop range as a context manager."""

    def __init__(self, cupy: Any, name: str) -> None:
        self.nvtx = cupy.cuda.nvtx
        self.name = name

    def __enter__(self) -> None:
        self.nvtx.RangePush(self.name)

    def __exit__(self, *exc: object) -> None:
        self.nvtx.RangePop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
