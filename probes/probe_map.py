"""The probe's map phase (probes/gemm_probe.py --phase map): the runner's map engine
(device.map_engine: pooled operands, many cases queued per synchronisation; a case it does not
pool runs alone) over every case, and where its time went."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .probe_records import ProbeRecords, process_age_s

if TYPE_CHECKING:
    from cublas_audit.device.map_engine import MapEngine
    from cublas_audit.planning.cases import Case


def map_all(
    engine: MapEngine,
    cases: list[Case],
    records: ProbeRecords,
    careful: int,
    timeline: dict[str, float] | None = None,
) -> None:
    """Every case mapped, its records written a chunk at a time. Where the engine's time went
    goes to the records at the end, also of an interrupted run, with `timeline` (the start-up's
    steps) and the engine's own: made (its pool sized), its set-up (chunks, warm workers, C
    thread) done, its end."""
    timeline = {**(timeline or {}), "engine_start_s": process_age_s()}
    try:
        engine.run(cases, records.started, records.finished, careful, records.settled)
    finally:
        seconds = {name: round(value, 3) for name, value in engine.seconds.items()}
        timeline["engine_end_s"] = process_age_s()
        timeline["set_up_s"] = round(engine.set_up_s, 2)
        # the GPU's last chunk done, from the process's exec (its work: engine_start_s + set_up_s
        # to here; the engine's reading and the exit after)
        timeline["gpu_done_s"] = round(timeline["engine_start_s"] + engine.gpu_done_s, 2)
        records.spent(seconds, engine.warm, timeline)
