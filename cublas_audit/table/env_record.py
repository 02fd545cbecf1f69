"""A run's env.json as a typed record (`EnvRecord`), read once and checked where it is read.

env.json grew over the tool's life: a run recorded before a key existed lacks it, and every
default here is what the tool did before the key was written (no `phase`: a sweep; no `warm`:
timed before cold timing; no `allow_mixed`: one GPU model). A key of the wrong type is one line
naming the file and the key (exit 2), never a silent default. `raw` keeps the whole object as
recorded, for what is rendered or compared key by key (the report's header, the diff's,
atlas.json, a merge's shard checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.vocabulary import Phase

# key -> the JSON types it may hold (besides null: "not recorded")
_TYPES: dict[str, tuple[type, ...]] = {
    "gpu_label": (str,),
    "gpu_name": (str,),
    "cc": (str,),
    "sm_count": (int,),
    "sm_clock_max_mhz": (int, float),
    "device_index": (int,),
    "gpu_uuid": (str,),
    "driver_version": (str,),
    "cublas_version": (str,),
    "observer": (str,),
    "probe_python": (str,),
    "cublas_lib": (str,),
    "roofline": (dict,),
    "command": (list,),
    "probe_env": (dict,),
    "phase_seconds": (dict,),
    "earlier": (dict,),
    "parts": (int,),
    "allow_mixed": (bool,),
    "replicate": (bool,),
    "warm": (bool,),
    "candidate_threshold": (int, float),
    "engine": (str,),
    "ray_address": (str,),
    "plan_fingerprint": (str,),
    "unit_label": (str,),
    "devices": (list,),
    "shard": (str,),
}
_WORDS = {int: "an integer", float: "a number", str: "text", bool: "true or false"}
_WORDS.update({dict: "a dict", list: "a list"})


@dataclass(frozen=True)
class EnvRecord:
    """What env.json says; None where it says nothing (or null). Built by `of` / `read`."""

    raw: Mapping[str, Any] = field(default_factory=dict)
    phase: Phase = Phase.time
    gpu_label: str | None = None
    gpu_name: str | None = None
    cc: str | None = None
    sm_count: int | None = None
    sm_clock_max_mhz: float | None = None
    device_index: int | None = None
    gpu_uuid: str | None = None
    driver_version: str | None = None
    cublas_version: str | None = None
    observer: str | None = None  # observe.observer's name; None: a candidates run, or older
    roofline: Mapping[str, Any] | None = None  # the GPU's figures measured once per run
    command: tuple[str, ...] | None = None  # the command line that started the run
    probe_env: Mapping[str, str] = field(default_factory=dict)
    probe_python: str | None = None  # the probe's interpreter
    cublas_lib: str | None = None  # --cublas-lib's directory; None: the system's cuBLAS
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    earlier: Mapping[str, Any] = field(default_factory=dict)  # interrupted parts' times
    parts: int = 1  # runs of a resumed run (the last one's included)
    allow_mixed: bool = False  # a run over GPUs of several models (--allow-mixed)
    replicate: bool = False
    # L2 left warm between timed calls (--warm); None: recorded before cold timing existed
    warm: bool | None = None
    candidate_threshold: float | None = None
    engine: str | None = None  # "ray" for a --ray run
    ray_address: str | None = None
    plan_fingerprint: str | None = None
    unit_label: str | None = None
    devices: tuple[Any, ...] | None = None  # a --devices run's GPUs
    shard: str | None = None  # a --shard run's part, "I/N"

    @classmethod
    def of(cls, data: Mapping[str, Any], where: Path | str = "env.json") -> EnvRecord:
        """The record of an env.json object; a key of the wrong type is an AuditError naming
        `where` and the key."""
        for key, kinds in _TYPES.items():
            value = data.get(key)
            wrong_bool = isinstance(value, bool) and bool not in kinds
            if value is not None and (not isinstance(value, kinds) or wrong_bool):
                words = " or ".join(_WORDS[kind] for kind in kinds)
                raise AuditError(f"{where}: {key} must be {words}, got {value!r}")
        try:
            phase = Phase.of(data.get("phase"))
        except ValueError:
            words = ", ".join(Phase)
            raise AuditError(
                f"{where}: phase {data.get('phase')!r} is not one of {words}"
            ) from None
        command, devices = data.get("command"), data.get("devices")
        return cls(
            raw=data,
            phase=phase,
            gpu_label=data.get("gpu_label"),
            gpu_name=data.get("gpu_name"),
            cc=data.get("cc"),
            sm_count=data.get("sm_count"),
            sm_clock_max_mhz=data.get("sm_clock_max_mhz"),
            device_index=data.get("device_index"),
            gpu_uuid=data.get("gpu_uuid"),
            driver_version=data.get("driver_version"),
            cublas_version=data.get("cublas_version"),
            observer=data.get("observer"),
            roofline=data.get("roofline"),
            command=None if command is None else tuple(str(word) for word in command),
            probe_env={str(k): str(v) for k, v in (data.get("probe_env") or {}).items()},
            probe_python=data.get("probe_python"),
            cublas_lib=data.get("cublas_lib"),
            phase_seconds=dict(data.get("phase_seconds") or {}),
            earlier=dict(data.get("earlier") or {}),
            parts=int(data.get("parts") or 1),
            allow_mixed=bool(data.get("allow_mixed")),
            replicate=bool(data.get("replicate")),
            warm=bool(data["warm"]) if "warm" in data else None,
            candidate_threshold=data.get("candidate_threshold"),
            engine=data.get("engine"),
            ray_address=data.get("ray_address"),
            plan_fingerprint=data.get("plan_fingerprint"),
            unit_label=data.get("unit_label"),
            devices=None if devices is None else tuple(devices),
            shard=data.get("shard"),
        )

    @classmethod
    def read(cls, run_dir: Path) -> EnvRecord:
        """A run directory's env.json, checked; the empty record where there is none."""
        from cublas_audit.table.rundir import ENV_FILE, read_env

        return cls.of(read_env(run_dir), Path(run_dir) / ENV_FILE)

    @property
    def recorded(self) -> bool:
        """Whether there was an env.json (a bare table has none)."""
        return bool(self.raw)

    @property
    def operands(self) -> str:
        """How the run's timed calls found their operands: 'cold' (L2 flushed before each, the
        default since cold timing), 'warm' (--warm, and a map's fast pass), or warm before cold
        timing existed (no `warm` key: every timing then left L2 as the last call left it)."""
        if self.phase is Phase.map:
            return "warm (a map's fast pass)"
        if self.warm is None:
            return "warm (recorded before cold timing)"
        return "warm" if self.warm else "cold"

    @property
    def time_seconds(self) -> float | None:
        """The measuring phase's seconds (phase_seconds' `time`), over every part of the run."""
        seconds = self.phase_seconds.get("time")
        return float(seconds) if seconds else None


def as_record(env: EnvRecord | Mapping[str, Any]) -> EnvRecord:
    """A record as it is; an env.json object read into one (a caller holding the JSON)."""
    return env if isinstance(env, EnvRecord) else EnvRecord.of(env)
