"""The fake probe child (and fake ncu) the CPU tests start in place of the real ones.

What these replace is the child process only: ProbeCommand.python is a small fake interpreter
written into tmp_path, which receives the real argv (`-m cublas_audit.probes.gemm_probe --plan ...
--phase ... --results ... --only ...`) and speaks the real probe's protocol (probes/gemm_probe.py:
a `probe` record, then per case a `start` record and @@start line, the `done` record and @@done
line). It replays the `done` records the real probe wrote on an H100 (tests/fixtures/h100-*/ or a
bundled run's timing.jsonl, profile.jsonl), or dies inside a named case, or exits without a
result. It also answers the import check the sweep makes before a run directory exists
(`-c "import cupy, cupy_backends.cuda.libs.cublas, <probe module>"`): CuPy stands in as present
(or absent, with `behaviour="no-cupy"`), the probe module must really be found on the child's
PYTHONPATH. In the `candidates` phase it copies a recorded candidates.csv into the run directory.

Every start (`-c` or `-m`) is recorded in `probe-seen.jsonl` beside the script: its whole argv
(argv[0] is the interpreter path the sweep started), the environment variables named in
`env_keys` and the process id of its parent (the sweep's process); `seen(tmp_path)` reads them
back. The `probe` record's `cublas_paths` can be replaced: `"preloaded"` reports the libcublas*
files LD_PRELOAD named (what the dynamic linker maps first), a list reports that list.

A fake ncu likewise stands in for the profiler: it records each call, runs the probe command it
wraps, and exports a recorded ncu CSV. Two stand-ins for the machine complete them: a --cublas-lib
directory (`cublas_dir`: files named as CUDA names them) and what environment.collect found on the
H100 of a bundled run (`h100_environment`), so that sweep_setup.sweep gets past require_gpu here.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import FrameType
from typing import Any

from cublas_audit.observe.environment import Environment
from cublas_audit.resources import PROBE_MODULE
from cublas_audit.run import sweep
from cublas_audit.run.probe_process import DONE_LINE, START_LINE, ProbeCommand
from cublas_audit.table.rundir import NCU_DIR, PROFILE_RESULTS, TIME_RESULTS

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "tests" / "fixtures" / "h100-smoke"
BATCHED = REPO / "tests" / "fixtures" / "h100-batched-cublas"
SEEN_FILE = "probe-seen.jsonl"

FAKE_PROBE = '''\
#!{python}
"""A stand-in for `python -m cublas_audit.probes.gemm_probe`: replays recorded results."""
import argparse, json, os, shutil, sys

CONFIG = json.loads({config!r})
with open(CONFIG["seen"], "a") as seen:
    wanted = {{key: os.environ.get(key) for key in CONFIG["env_keys"]}}
    # ppid: the process that started it (a --devices shard's own process)
    seen.write(json.dumps({{"argv": sys.argv, "env": wanted, "ppid": os.getppid()}}) + "\\n")
if sys.argv[1:2] == ["-c"]:
    # the import check: `import cupy, cupy_backends.cuda.libs.cublas, <probe module>`
    import importlib.util
    statement = sys.argv[2] if len(sys.argv) == 3 else ""
    if not statement.startswith("import "):
        sys.exit("fake probe: unexpected argv " + repr(sys.argv))
    for name in statement.removeprefix("import ").split(", "):
        if name.split(".")[0] in ("cupy", "cupy_backends"):
            if CONFIG["behaviour"] == "no-cupy":
                sys.exit("ModuleNotFoundError: No module named 'cupy'")
        elif importlib.util.find_spec(name) is None:
            sys.exit("ModuleNotFoundError: No module named " + repr(name))
    sys.exit(0)
if sys.argv[1:3] != ["-m", CONFIG["module"]]:
    sys.exit("fake probe: unexpected argv " + repr(sys.argv))
parser = argparse.ArgumentParser()
for option in ("--plan", "--phase", "--results", "--only", "--min-reps", "--gpu-label", "--limit",
               "--threshold", "--candidate-min-reps", "--workspace-bytes"):
    parser.add_argument(option)
parser.add_argument("--reference", action="store_true")
parser.add_argument("--warm", action="store_true")  # operands left in L2: nothing to fake
parser.add_argument("--careful", type=int, default=0)
args = parser.parse_args(sys.argv[3:])
only = open(args.only).read().split() if args.only else None
with open(CONFIG["calls"], "a") as calls:
    record = {{"phase": args.phase, "only": only}}
    if args.careful:
        record["careful"] = args.careful
    calls.write(json.dumps(record) + "\\n")
if CONFIG["behaviour"] == "exit-0-silently":
    print("fake probe: exiting 0 without writing a result")
    sys.exit(0)
if CONFIG["behaviour"] == "no-cupy":
    print("ModuleNotFoundError: No module named 'cupy'")
    sys.exit(1)
replayed = "profile" if args.phase == "profile" else "time"
recorded = [json.loads(line) for line in open(CONFIG["replay"][replayed])]
probe = next(r for r in recorded if r.get("event") == "probe")
if CONFIG["cublas_paths"] == "preloaded":
    preloaded = os.environ.get("LD_PRELOAD", "").split(os.pathsep)
    probe = {{**probe, "cublas_paths": [
        p for p in preloaded if os.path.basename(p).startswith("libcublas")
    ]}}
elif CONFIG["cublas_paths"] is not None:
    probe = {{**probe, "cublas_paths": CONFIG["cublas_paths"]}}
done = {{r["case_id"]: r for r in recorded if r.get("event") == "done"}}
from cublas_audit.planning.plan_file import plan_case_ids
plan = plan_case_ids(args.plan)
with open(args.results, "a", buffering=1) as out:
    def emit(record):
        out.write(json.dumps(record) + "\\n")
        out.flush()

    emit(probe)
    run_dir = os.path.dirname(args.results)
    if args.phase == "candidates" and not CONFIG["candidates_per_problem"]:
        shutil.copy(CONFIG["candidates"], os.path.join(run_dir, "candidates.csv"))
        print("fake probe: candidates.csv copied", flush=True)
        sys.exit(0)
    if args.phase == "candidates":  # each problem of the plan: its recorded rows, journaled
        import csv
        with open(CONFIG["candidates"]) as recorded_csv:
            reader = csv.DictReader(recorded_csv)
            header, recorded_rows = reader.fieldnames, list(reader)
        journal = os.path.join(run_dir, "candidates.jsonl")
        finished = {{}}
        if os.path.exists(journal):
            for line in open(journal):
                finished[json.loads(line)["case_id"]] = json.loads(line)["rows"]
        with open(journal, "a") as journal_out, open(CONFIG["calls"], "a") as calls:
            for case_id in plan:
                if case_id in finished:
                    continue
                print(CONFIG["start_line"] + case_id, flush=True)
                if case_id == CONFIG["crash_on"]:
                    os._exit(139)
                rows = [{{k: v for k, v in r.items() if v != ""}}
                        for r in recorded_rows if r["case_id"] == case_id]
                journal_out.write(json.dumps({{"case_id": case_id, "rows": rows}}) + "\\n")
                journal_out.flush()
                finished[case_id] = rows
                calls.write(json.dumps({{"audited": case_id,
                    "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}}) + "\\n")
                calls.flush()
                print(CONFIG["done_line"] + case_id, flush=True)
        with open(os.path.join(run_dir, "candidates.csv"), "w", newline="") as out_csv:
            writer = csv.DictWriter(out_csv, header)
            writer.writeheader()
            writer.writerows(row for case_id in plan for row in finished[case_id])
        sys.exit(0)
    if CONFIG["behaviour"] == "chunked":  # as the map engine: a chunk started, then measured
        todo = plan if only is None else only  # the real probe keeps --only's order
        groups = [[c] for c in todo[:args.careful]]
        rest = todo[args.careful:]
        # the engine deals its chunks out of plan order: here the last chunk goes first
        groups += [rest[i:i + 3] for i in range(0, len(rest), 3)][::-1]
        for group in groups:
            for case_id in group:
                emit({{"event": "start", "case_id": case_id, "phase": args.phase}})
                print(CONFIG["start_line"] + case_id, flush=True)
            if CONFIG["crash_on"] in group:
                print("fake probe: illegal address in a chunk", flush=True)
                os._exit(139)
            for case_id in group:
                emit(done[case_id])
                print(CONFIG["done_line"] + case_id, flush=True)
        sys.exit(0)
    for case_id in plan:
        if only is not None and case_id not in only:
            continue
        emit({{"event": "start", "case_id": case_id, "phase": args.phase}})
        print(CONFIG["start_line"] + case_id, flush=True)
        if case_id == CONFIG["crash_on"]:
            print("fake probe: Segmentation fault in " + case_id, flush=True)
            os._exit(139)
        emit(done[case_id])
        print(CONFIG["done_line"] + case_id, flush=True)
        if CONFIG["pause_s"]:  # a shard still at work when the test interrupts it
            import time
            time.sleep(CONFIG["pause_s"])
'''

FAKE_NCU = '''\
#!{python}
"""A stand-in for ncu: records its call; profiles by running the probe it wraps and writing a
report; `--import REPORT --csv` prints the recorded export of that chunk."""
import json, os, subprocess, sys

CONFIG = json.loads({config!r})
argv = sys.argv[1:]
with open(CONFIG["calls"], "a") as calls:
    calls.write(json.dumps(argv) + "\\n")
if CONFIG["fail"]:
    print("==ERROR== fake ncu: this call was not expected")
    sys.exit(1)
if argv[0] == "--import":
    name = os.path.basename(argv[1]).split(".")[0]
    sys.stdout.write(open(CONFIG["exports"][name]).read())
    sys.exit(0)
end = argv.index("--log-file") + 2
report, log = argv[argv.index("--export") + 1], argv[end - 1]
code = subprocess.call(argv[end:])
with open(log, "w") as out:
    out.write("==PROF== Report: " + report + "\\n")
with open(report, "w") as out:
    out.write("fake report\\n")
sys.exit(code)
'''


def executable(path: Path, template: str, config: dict[str, Any]) -> Path:
    path.write_text(template.format(python=sys.executable, config=json.dumps(config)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def fake_probe(
    tmp_path: Path,
    *,
    replay: Path = SMOKE,
    crash_on: str | None = None,
    behaviour: str = "replay",
    cublas_paths: str | Sequence[str] | None = None,
    env_keys: Sequence[str] = ("LD_PRELOAD", "PYTHONPATH"),
    candidates: Path | None = None,
    candidates_per_problem: bool = False,
    pause_s: float = 0.0,
) -> tuple[ProbeCommand, Path]:
    """The fake probe interpreter and the file it records its calls in, one JSON line a call."""
    calls = tmp_path / "probe-calls.jsonl"
    config = {
        "module": PROBE_MODULE,
        "calls": str(calls),
        "seen": str(tmp_path / SEEN_FILE),
        "env_keys": list(env_keys),
        "behaviour": behaviour,
        "crash_on": crash_on,
        "replay": {"time": str(replay / TIME_RESULTS), "profile": str(replay / PROFILE_RESULTS)},
        "cublas_paths": cublas_paths if isinstance(cublas_paths, str | None) else [*cublas_paths],
        "candidates": str(candidates) if candidates else None,
        "candidates_per_problem": candidates_per_problem,
        "pause_s": pause_s,
        "start_line": START_LINE,
        "done_line": DONE_LINE,
    }
    script = executable(tmp_path / "fake-python", FAKE_PROBE, config)
    return ProbeCommand(python=str(script), env=dict(os.environ)), calls


def fake_ncu(tmp_path: Path, *, fail: bool, exports: Path = BATCHED) -> tuple[str, Path]:
    calls = tmp_path / "ncu-calls.jsonl"
    config = {
        "calls": str(calls),
        "fail": fail,
        "exports": {p.stem: str(p) for p in (exports / NCU_DIR).glob("chunk-*.csv")},
    }
    return str(executable(tmp_path / "fake-ncu", FAKE_NCU, config)), calls


def call_records(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def seen(tmp_path: Path) -> list[dict[str, Any]]:
    """Every start of the fake probe: {"argv": [...], "env": {key: value or None}}."""
    return call_records(tmp_path / SEEN_FILE)


@dataclass
class Recorded:
    """A Progress that remembers what the sweep reported."""

    totals: list[int] = field(default_factory=list)
    advanced: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def progress(self) -> sweep.Progress:
        return sweep.Progress(
            start=self.totals.append, advance=self.advanced.append, note=self.notes.append
        )


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fails the test (instead of hanging the suite) if the block runs past `seconds`."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"sweep.run still running after {seconds} s: a retry loop?")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ----- stand-ins for the machine: a cuBLAS directory, a GPU ------------------------------------

H100_RUN = REPO / "reports" / "h100" / "20261123-145452-batched"


def cublas_dir(path: Path, *, cuda_layout: bool = False) -> Path:
    """A --cublas-lib directory: libcublasLt.so.13 and libcublas.so.13 (empty files: only their
    names matter before the child maps them). With `cuda_layout`, as CUDA installs them: the
    .so.13.1.0.3 files, .so.13 and .so links to them."""
    path.mkdir(parents=True)
    for stem in ("libcublasLt", "libcublas"):
        if cuda_layout:
            (path / f"{stem}.so.13.1.0.3").touch()
            (path / f"{stem}.so.13").symlink_to(f"{stem}.so.13.1.0.3")
            (path / f"{stem}.so").symlink_to(f"{stem}.so.13")
        else:
            (path / f"{stem}.so.13").touch()
    return path


def as_h100s(uuids: Sequence[str]) -> None:
    """In a --devices shard's own process (run.shard_processes.CHILD_SETUP, with
    functools.partial): environment.collect finds the bundled run's H100 under the shard's GPU
    index and the UUID `uuids` gives that index, and the roofline's DRAM measurement records
    which process ran it. A shard process starts clean: one that finds the test's own
    measure_dram (the parent's, refusing any GPU work there) was forked, and says so."""
    from cublas_audit.device import dram_bandwidth
    from cublas_audit.observe import environment

    if dram_bandwidth.measure_dram.__module__ != dram_bandwidth.__name__:
        raise AssertionError("the shard's process was forked: it holds the parent's patches")

    def collect(ncu: str | None = None, device: int | None = None) -> Environment:
        return replace(h100_environment(ncu), device_index=device, gpu_uuid=uuids[device or 0])

    def measure_dram(device: int = 0) -> dict[str, Any]:
        return {"measured_by_pid": os.getpid(), "device": device}

    environment.collect = collect
    dram_bandwidth.measure_dram = measure_dram


def h100_environment(ncu: str | None = None) -> Environment:
    """What environment.collect found on the H100 of a bundled run (its env.json): a stand-in for
    the machine, so that sweep_setup.sweep gets past require_gpu here."""
    recorded = json.loads((H100_RUN / "env.json").read_text())
    found = Environment(**{f.name: recorded.get(f.name) for f in fields(Environment)})
    return replace(found, ncu_path=ncu, counters_permitted=True if ncu else None)
