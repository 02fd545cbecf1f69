"""The collector around a map probe's start-up (cublas_audit.gc_pause): what the start-up made
is frozen out of the collector's reach and the collector runs again for the map itself."""

from __future__ import annotations

import gc

from cublas_audit import gc_pause
from cublas_audit.planning.cases import Case


def test_the_start_ups_objects_are_frozen_and_the_collector_runs_again() -> None:
    enabled = gc.isenabled()
    gc.disable()  # as the probe's map phase starts
    try:
        before = gc.get_freeze_count()
        plan = [Case("cublas", "bf16", 64 * i, 64, 64, 1) for i in range(1, 200)]
        gc_pause.long_lived_settled()
        assert gc.isenabled()  # the map's own garbage is still collected
        assert gc.get_freeze_count() >= before + len(plan)  # never walked again
    finally:
        gc.unfreeze()
        if not enabled:
            gc.disable()
