"""Python's cyclic garbage collector paused around work that makes millions of objects that
live until it ends (a full map's rows, findings and records): judging a map, reporting it,
merging its shards. Below every stage: the jobs and the measuring run (a --devices map judged
for its follow-up) both use it."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a map is judged and reported: the objects
    made (a full map's 86,000 findings and their records) had it walk the whole heap again and
    again (the BF16 atlas: judging 11.7 -> 7.2 s of CPU, its report 15.4 -> 9.6 s, for 0.1 GB
    more at the peak). What it would have collected goes at the next collection after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def long_lived_settled() -> None:
    """What exists now lives until the process ends (a map probe's plan: 262,144 cases, their
    operand layouts, the engine's chunks): moved out of the collector's reach (gc.freeze) and
    the collector enabled again. Made with the collector running, a full grid's start-up spent
    about half its CPU in collections walking them (the pool's sizes: 5.0 -> 2.7 s here); the
    map's per-problem objects are young and die young."""
    gc.freeze()
    gc.enable()
