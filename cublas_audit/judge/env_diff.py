"""What two tables recorded of their machines, key by key (the diff's header): env.json's keys,
or a bare table's own provenance columns where it has no env.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cublas_audit.table.inputs import Dataset
from cublas_audit.table.rundir import env_value

# env.json keys the header compares; env.json may lack any of them (a bare table has none).
ENV_KEYS = (
    "gpu_label",
    "gpu_name",
    "cc",
    "driver_version",
    "cuda_runtime",
    "cublas_version",
    "probe_env",
    "ncu_version",
    "ncu_clock_control",
    "tool_version",
    "operands",  # table.env_record.EnvRecord.operands: cold, warm, or warm before cold timing
)
# Provenance a table carries in its own columns, for inputs without env.json.
TABLE_ENV_COLUMNS = ("gpu_name", "cc", "driver_version", "cublas_version")


@dataclass(frozen=True)
class EnvRow:
    """One compared env.json key: what each side recorded ("not recorded" when absent)."""

    key: str
    a: str
    b: str

    @property
    def differs(self) -> bool:
        return self.a != self.b


def env_differences(a: Dataset, b: Dataset) -> list[EnvRow]:
    env_a, env_b = _env(a), _env(b)
    missing = "not recorded"
    return [
        EnvRow(key, env_a.get(key, missing), env_b.get(key, missing))
        for key in ENV_KEYS
        if key in env_a or key in env_b
    ]


def _env(dataset: Dataset) -> dict[str, str]:
    values: dict[str, Any] = {"gpu_label": dataset.gpu_label}
    for column in TABLE_ENV_COLUMNS:
        if column in dataset.frame.columns and dataset.frame[column].notna().any():
            values[column] = dataset.frame[column].dropna().iloc[0]
    recorded = dataset.env.raw  # the header's keys as env.json holds them
    values.update({k: v for k, v in recorded.items() if k in ENV_KEYS and v not in (None, "")})
    if dataset.env.recorded:  # cold against warm moves memory-bound times by up to 2x: said
        values["operands"] = dataset.env.operands
    return {k: env_value(v) for k, v in values.items()}
