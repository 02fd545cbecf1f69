"""A timing distribution's columns in the dispatch table (table.dispatch): what the probe child
writes for each timed contender. Kept apart from table.dispatch, which imports pandas: the probe
imports this at start-up, every map shard's probe too."""

from __future__ import annotations

# a distribution's columns after `<prefix>_ms` (its median), with their types
DISTRIBUTION = {
    "n": "int",
    "min_ms": "float",
    "q1_ms": "float",
    "q3_ms": "float",
    "max_ms": "float",
}


def distribution_columns(prefix: str) -> list[str]:
    """`time` -> time_n, time_min_ms, time_q1_ms, time_q3_ms, time_max_ms."""
    return [f"{prefix}_{field}" for field in DISTRIBUTION]
