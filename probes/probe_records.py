"""The probe's records (probes/gemm_probe.py): one JSON line each appended to --results, and a
progress line on stdout for the sweep (START_LINE, DONE_LINE).

Every phase but the map flushes each record at once: a crash or Ctrl-C loses at most the case
in flight, and its `start` line names the culprit. The map flushes a chunk's records together
(`settled`, called by device.map_engine): its start records before its GPU work is queued, its
results once they are read; two flushes and two pipe writes a record were host time the map's
262,144 problems paid one by one.
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any

from cublas_audit.planning.cases import Case
from cublas_audit.run.probe_process import DONE_LINE, START_LINE

# Modules a map probe's start-up and engine never need, each ~0.5 s or more to import: the
# engine record names those loaded anyway (tests/test_gpu_map.py asserts none). cupyx itself is
# in sys.modules from `import cupy` on (cupy.random's lazy import, loaded on first use): its
# linalg, which a real load imports first, tells it loaded.
HEAVY_MODULES = ("cupyx.linalg", "scipy", "pandas", "matplotlib")


class ProbeRecords:
    def __init__(self, out: IO[str], phase: str) -> None:
        self.out = out
        self.phase = phase
        self.each = phase != "map"  # flush every record

    def emit(self, record: dict[str, Any], flush: bool = True) -> None:
        self.out.write(json.dumps(record) + "\n")
        if flush:
            self.out.flush()

    def started(self, case: Case) -> None:
        # json.dumps's very line, formatted directly: a case id and a phase are plain words
        # (planning.cases: [A-Za-z0-9._-]), and a full map writes 262,144 of them on its one
        # thread (~1 s of it through json)
        self.out.write(
            f'{{"event": "start", "case_id": "{case.case_id}", "phase": "{self.phase}"}}\n'
        )
        if self.each:
            self.out.flush()
        print(START_LINE + case.case_id, flush=self.each)

    def finished(self, case: Case, result: dict[str, Any]) -> None:
        record = {"event": "done", "case_id": case.case_id, "phase": self.phase, **result}
        self.emit(record, self.each)
        print(DONE_LINE + case.case_id, flush=self.each)

    def settled(self) -> None:
        self.out.flush()
        sys.stdout.flush()

    def spent(
        self, seconds: dict[str, float], warm: dict[str, Any], timeline: dict[str, float]
    ) -> None:
        """Where the map engine's time went, its kernel choices made ahead, and when it began
        and ended in the probe's life (`timeline`: process_age_s): the map phase's time outside
        the engine is the probe's start-up before, and its exit and the parent's work after."""
        heavy = [name for name in HEAVY_MODULES if name in sys.modules]
        self.emit({"event": "engine", "seconds": seconds, "warm": warm, "timeline": timeline,
                   "heavy_modules": heavy})  # fmt: skip


def process_age_s() -> float:
    """Seconds since this process started (Linux's /proc, to its clock tick; -1 elsewhere):
    the probe's start-up counted from exec, its interpreter and imports included."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
            now = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return -1.0
    return round(now - started / os.sysconf("SC_CLK_TCK"), 2)
