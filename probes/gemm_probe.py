"""The program ncu profiles: makes each planned cuBLAS / cuBLASLt call, checks it, times it.

    python -m cublas_audit.probes.gemm_probe --plan plan.json --phase profile|time|candidates \
        --results out.jsonl [--only ids.txt] [--reference] [--min-reps 20]

`profile` makes each call once inside an NVTX range named `audit.<case_id>` (and the bundled
reference kernel inside `audit-ref.<case_id>`), so that ncu, filtering on those ranges, profiles
exactly the launches of the call and nothing else. `time` runs without a profiler: it checks each
result against a float64 product (device.operands), then times the call with CUDA events.
`recheck` is `time` again, for the cases of a comparison the first timing left unsure (the sweep
passes them with more repetitions): a loop companion then also times its batched call,
interleaved with the loop. `map` is the dispatch map's fast pass: a quick float64 check (a few
columns), then exactly --min-reps calls, each timed with CUDA events and traced with CUPTI at
once (kernel names, kernel times, launch geometry). `candidates` runs the cuBLASLt candidate
audit of the plan's problems into the run directory.

Every finished case is one JSON line appended to --results (probes/probe_records.py): flushed at
once, so that a crash or Ctrl-C loses at most the case in flight and the `start` line before it
names the culprit; the map's, a chunk at a time. The sweep
(cublas_audit.run.sweep) starts this program as a child, with the package on its PYTHONPATH.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cublas_audit.device import loaded
from cublas_audit.device.nvtx import Range
from cublas_audit.errors import ToolMissingError
from cublas_audit.fast_exit import run_and_end
from cublas_audit.observe.ncu_export import CALL_RANGE_PREFIX, REFERENCE_RANGE_PREFIX
from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case
from cublas_audit.planning.plan_file import plan_case_ids, read_plan
from cublas_audit.run.probe_process import NO_CUPTI_ENV

from .probe_candidates import candidates
from .probe_map import map_all
from .probe_records import ProbeRecords, process_age_s

if TYPE_CHECKING:
    from cublas_audit.device.map_engine import MapEngine
    from cublas_audit.device.operands import Operands
    from cublas_audit.device.reference.build import Launch
    from cublas_audit.device.timing import Timing

MEMORY_SHARE = 0.9  # a case may take this share of the free GPU memory, or it is skipped


class Skip(Exception):
    """The case cannot run here (memory, missing library); recorded, the sweep goes on."""


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # when each step of the start-up ended, from the process's exec (the map's engine record)
    timeline = {"main_s": process_age_s()}
    import cupy

    timeline["cupy_s"] = process_age_s()
    if args.phase == "map":  # its start-up's objects live to the end (gc_pause)
        gc.disable()
    cases = read_plan(Path(args.plan), checked=True)  # (by the sweep, which wrote and read it)
    if args.only:  # in the file's order: after a crash the sweep lists the cases in flight first
        place = {case_id: i for i, case_id in enumerate(plan_case_ids(Path(args.plan)))}
        listed = dict.fromkeys(Path(args.only).read_text().split())
        cases = [cases[place[case_id]] for case_id in listed if case_id in place]
    timeline["plan_s"] = process_age_s()
    with open(args.results, "a") as out:
        records = ProbeRecords(out, args.phase)
        records.emit({"event": "probe", **loaded.versions(cupy)})
        timeline["versions_s"] = process_age_s()
        if args.phase == "candidates":
            return candidates(cases, Path(args.results).parent, args)  # (probe_candidates)
        runner = Runner(args.phase, args.reference, args.min_reps, cold=not args.warm)
        runner.precompile_reference(cases)
        if args.phase == "map":
            map_all(runner.map_engine(cases), cases, records, args.careful, timeline)
            return 0
        for case in cases:
            records.started(case)
            records.finished(case, runner.timed_run(case))
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument(
        "--phase", choices=("profile", "time", "recheck", "map", "candidates"), required=True
    )
    parser.add_argument("--results", required=True)
    parser.add_argument("--only", help="file with the case ids to run, one per line")
    parser.add_argument("--reference", action="store_true", help="also run the reference kernel")
    parser.add_argument("--min-reps", type=int, default=20)
    # the candidate audit's settings: their defaults are read where it runs (they live beside
    # pandas, which the other phases' start-up never imports: ~0.7 s of every map shard's)
    parser.add_argument("--limit", type=int, help="candidates per problem")
    parser.add_argument("--threshold", type=float, help="gap to confirm")
    parser.add_argument("--candidate-min-reps", type=int)
    parser.add_argument("--workspace-bytes", type=int, default=DEFAULT_WORKSPACE_BYTES)
    parser.add_argument("--gpu-label", default="")
    parser.add_argument("--warm", action="store_true", help="no L2 flush before timed calls")
    careful = "map: the first N cases one at a time (after a crash, to name the culprit)"
    parser.add_argument("--careful", type=int, default=0, help=careful)
    return parser.parse_args(argv)


class Runner:
    def __init__(self, phase: str, reference: bool, min_reps: int, *, cold: bool) -> None:
        self.phase = phase
        self.cold = cold  # L2 flushed before every timed call (device.l2); the map stays warm
        self.reference = reference
        self.min_reps = min_reps
        self.operands: Operands | None = None
        self.reference_missing: str | None = None
        self.cupti_missing: str | None = None  # "" once CUPTI is known to trace here
        self.closers: list[Callable[[], None]] = []

    def precompile_reference(self, cases: list[Case]) -> None:
        """Compiles the reference for every problem up front, in parallel. A failure here is
        only logged: the case that needs the kernel meets it again and records the reason."""
        if not self.reference:  # (a map's 262,144 cases not walked for nothing)
            return
        wanted = [(c.m, c.n, c.k, c.batch) for c in cases if self._wants_reference(c)]
        if not wanted:
            return
        try:
            from cublas_audit.device.reference.build import precompile

            precompile(wanted)
        except Exception:
            traceback.print_exc()

    def _wants_reference(self, case: Case) -> bool:
        return self.reference and case.reference_computes

    def timed_run(self, case: Case) -> dict[str, Any]:
        """run(case) with the probe's wall time on it (operands, check, calls): `case_s`."""
        started = time.perf_counter()
        result = self.run(case)
        return {**result, "case_s": round(time.perf_counter() - started, 5)}

    def run(self, case: Case) -> dict[str, Any]:
        try:
            ops = self.prepare(case)
            launch = self.launcher(case, ops)
            if self.phase == "profile":
                return self.profile(case, ops, launch)
            if self.phase == "map":
                return self.map(ops, launch)
            return self.time(case, ops, launch)
        except Exception as exc:  # a failing call is recorded and the sweep goes on
            self.release()
            return self.failed(exc)
        finally:
            for close in self.closers:  # cuBLASLt descriptors and workspace are per case
                close()
            self.closers = []

    @staticmethod
    def failed(exc: BaseException) -> dict[str, Any]:
        """A case that could not run, as its result: skipped (Skip: memory, a missing library;
        CuPy out of memory, as the map's operand pool can be) or an error (with its traceback
        in the probe's log)."""
        if isinstance(exc, Skip):
            return {"status": "skipped", "detail": str(exc)}
        if type(exc).__name__ == "OutOfMemoryError":  # cupy.cuda.memory's, not imported here
            return {"status": "skipped", "detail": f"out of memory: {str(exc).splitlines()[0]}"}
        traceback.print_exc()
        return {"status": "error", "detail": f"{type(exc).__name__}: {exc}".splitlines()[0]}

    def map_engine(self, cases: list[Case]) -> MapEngine:
        """The map phase's engine on these cases (probes/probe_map.py runs it): this runner's
        launchers on its pooled operands, a case it does not pool run alone (timed_run)."""
        from cublas_audit.device import native_queue
        from cublas_audit.device.heuristic_warm import thread_count
        from cublas_audit.device.map_engine import MapEngine

        return MapEngine(
            cases, self.min_reps, self.pooled_launcher, self.failed, self.timed_run,
            untraced=self.cupti_reason(), warm_threads=thread_count(),
            native=native_queue.wanted(),
        )  # fmt: skip

    def pooled_launcher(
        self, case: Case, ops: Operands
    ) -> tuple[Callable[[], None], list[Callable[[], None]]]:
        """The case's launcher on the engine's operands, and what closes it once its calls ran."""
        launch = self.launcher(case, ops)
        closers, self.closers = self.closers, []
        return launch, closers

    def release(self) -> None:
        import cupy

        self.operands = None
        cupy.get_default_memory_pool().free_all_blocks()

    def _make_room(self, needed: int) -> None:
        """Drops the last case's operands; gives CuPy's cached blocks back to the device only
        where the new operands would not fit beside them (cudaFree synchronizes, and a map makes
        new operands for every case), then Skip if they still do not fit."""
        import cupy

        self.operands = None
        free, _total = cupy.cuda.runtime.memGetInfo()
        if needed > MEMORY_SHARE * free:
            cupy.get_default_memory_pool().free_all_blocks()
            free, _total = cupy.cuda.runtime.memGetInfo()
        if needed > MEMORY_SHARE * free:
            needed_gib, available = needed / 2**30, free / 2**30
            raise Skip(f"out of memory: needs {needed_gib:.1f} GiB, {available:.1f} GiB free")

    # ----- operands and launchers ------------------------------------------------------------
    def prepare(self, case: Case) -> Operands:
        """The case's operands; consecutive cases of one problem and mode share them."""
        import cupy

        from cublas_audit.device import operands

        current = self.operands
        if current is not None and current.key == operands.key_of(case):
            current.case = case  # same arrays; the case's other settings (api, beta) are its own
            return current
        self._make_room(case.bytes_needed)
        try:
            self.operands = operands.make_for(case)
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise Skip(f"out of memory: {str(exc).splitlines()[0]}") from exc
        return self.operands

    def launcher(self, case: Case, ops: Operands) -> Callable[[], None]:
        from cublas_audit.device import launchers

        if case.api == "cublasLt":
            return self.lt_launcher(case, ops)
        if case.loop:
            return launchers.loop(case, ops)
        return launchers.classic(case, ops)

    def lt_launcher(self, case: Case, ops: Operands) -> Callable[[], None]:
        from cublas_audit.device import launchers

        try:
            gemm = launchers.lt(case, ops)
        except ImportError as exc:
            raise Skip(f"cuBLASLt wrapper unavailable: {exc}") from exc
        except ToolMissingError as exc:
            raise Skip(str(exc)) from exc
        self.closers.append(gemm.close)
        launch: Callable[[], None] = gemm.run
        return launch

    # ----- phases -----------------------------------------------------------------------------
    def profile(self, case: Case, ops: Operands, launch: Callable[[], None]) -> dict[str, Any]:
        import cupy

        cupy.cuda.Device().synchronize()
        with Range(CALL_RANGE_PREFIX + case.case_id):
            launch()
            cupy.cuda.Device().synchronize()
        result: dict[str, Any] = {"status": "ok"}
        ref = self._reference_or_reason(case, ops, result)
        if ref is not None:
            ref.launch.zero()  # outside the range: ncu profiles the reference SGEMM alone
            with Range(REFERENCE_RANGE_PREFIX + case.case_id):
                ref.launch.sgemm()
                cupy.cuda.Device().synchronize()
        return result

    def time(self, case: Case, ops: Operands, launch: Callable[[], None]) -> dict[str, Any]:
        from cublas_audit.device import clocks, l2, operands

        error = operands.checked(launch, ops)
        result: dict[str, Any] = {"max_rel_err": error}
        tolerance = operands.tolerance(case.mode)
        if not error <= tolerance:
            detail = f"relative error {error:.3g} > {tolerance:g}"
            return {**result, "status": "wrong", "detail": detail}
        contenders = {"call": launch}
        if self.phase == "recheck" and case.loop:  # the batched call, interleaved with its loop
            contenders["batched"] = self.launcher(dataclasses.replace(case, loop=False), ops)
        ref = self._reference_or_reason(case, ops, result)
        if ref is not None:
            ref_error = operands.checked(ref.launch, ops, ref.out)
            result["ref_max_rel_err"] = ref_error
            if ref_error <= operands.tolerance("fp32"):
                contenders["ref"] = ref.launch
            else:
                result["ref_status"] = f"wrong: relative error {ref_error:.3g}"
        before = clocks.state()
        timings, kernel_times = self.kernel_times(contenders, case.batch if case.loop else 1)
        after = clocks.state()
        result.update(status="ok", operands=l2.temperature(self.cold))
        result.update(timings["call"].summary("time"))
        result["time_samples_ms"] = list(timings["call"].samples_ms)  # for a later bootstrap
        if "ref" in timings:
            result.update(timings["ref"].summary("ref_time"))
        if "batched" in timings:
            result.update(timings["batched"].summary("batched_time"))
        result.update(after, sm_clock_before_mhz=before.get("sm_clock_mhz"))
        if "clock_reasons" in before and "clock_reasons" in after:
            result["clock_reasons"] = int(before["clock_reasons"]) | int(after["clock_reasons"])
        return {**result, **kernel_times}

    def map(self, ops: Operands, launch: Callable[[], None]) -> dict[str, Any]:
        """A map case the engine does not pool, on its own (device.map_result.measure_alone)."""
        from cublas_audit.device.map_result import measure_alone

        return measure_alone(ops, launch, self.min_reps, self.cupti_reason())

    def cupti_reason(self) -> str:
        """Why CUPTI cannot trace in this probe ('' where it can), found once."""
        from cublas_audit.device import kernel_trace

        if self.cupti_missing is None:
            off = os.environ.get(NO_CUPTI_ENV)
            self.cupti_missing = (
                "off (--observer events)" if off else kernel_trace.available() or ""
            )
        return self.cupti_missing

    def kernel_times(
        self, contenders: dict[str, Callable[[], None]], call_launches: int
    ) -> tuple[dict[str, Timing], dict[str, Any]]:
        """The contenders timed with CUDA events, interleaved (the check was their warm-up), and
        their kernel-only times, traced with the timed calls where these are long enough per launch
        (`call_launches`: the call's), else after them; where CUPTI cannot trace, why (once)."""
        from cublas_audit.device import kernel_trace
        from cublas_audit.device.timing import time_interleaved

        if self.cupti_reason():
            timings = time_interleaved(contenders, self.min_reps, warmed_up=True, cold=self.cold)
            return timings, {"kernel_time_status": f"unavailable: {self.cupti_missing}"}
        seen = kernel_trace.time_interleaved_traced(
            contenders,
            self.min_reps,
            warmed_up=True,
            launches={"call": call_launches},
            cold=self.cold,
        )
        return seen.timings, seen.columns()

    def _reference_or_reason(
        self, case: Case, ops: Operands, result: dict[str, Any]
    ) -> _Reference | None:
        """The reference on the case's problem (its own output array), or None with the reason
        in `result`: the reference is optional, its failure never loses the case."""
        if not self._wants_reference(case):
            return None
        if self.reference_missing:
            result["ref_status"] = self.reference_missing
            return None
        from cublas_audit.device import launchers

        try:
            out = ops.c.copy()
            ref = _Reference(launchers.reference(case, ops, out), out)
        except ImportError as exc:  # not built for this machine: say so once, quietly
            self.reference_missing = f"unavailable: {exc}"
            result["ref_status"] = self.reference_missing
            return None
        except Exception as exc:
            traceback.print_exc()
            result["ref_status"] = f"unavailable: {type(exc).__name__}: {exc}".splitlines()[0]
            return None
        result.setdefault("ref_status", "ok")
        return ref


@dataclasses.dataclass
class _Reference:
    launch: Launch
    out: Any


if __name__ == "__main__":
    # ended without Python's teardown of the plan's objects (a full map's 262,144 cases and
    # their layouts), once the atexit handlers ran: the sweep's phase waits for this exit
    run_and_end(lambda: sys.exit(main(sys.argv[1:])))
