"""The words a run records and a judgement is made of, as enums: a severity, a timing verdict, a
run's phase, a noise-floor kind, a fix's kind, the diff's gate, a follow-up's and verify's
verdicts.

Every one is a `StrEnum` whose value is the text the files hold (env.json's `phase`, a finding's
`severity`, fix.json's `kind`, the table's `floor_kind`), so a member written to CSV or JSON is
byte for byte the string it replaced, and reading one back is `Enum(text)`: an unknown word is a
ValueError, never a silent default. Below every stage, as errors.py is: the table reads phases
and fix kinds, the judge decides the rest, the reports render them.
"""

from __future__ import annotations

from enum import StrEnum


class Severity(StrEnum):
    """A finding's severity, most severe first (the order reports list them in)."""

    high = "high"
    medium = "medium"
    info = "info"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {severity: i for i, severity in enumerate(Severity)}


class Verdict(StrEnum):
    """One timing comparison's verdict (judge.verdicts.judge): B against A."""

    faster = "faster"
    slower = "slower"
    same = "same"
    unsure = "unsure"


class Phase(StrEnum):
    """What a run measured (env.json's `phase`): a sweep's timing, the dispatch map's fast pass,
    or the cuBLASLt candidate audit alone."""

    time = "time"
    map = "map"
    candidates = "candidates"

    @classmethod
    def of(cls, recorded: str | None) -> Phase:
        """The phase env.json records; a run written before the field existed was a sweep."""
        return cls(recorded) if recorded else cls.time

    @property
    def command(self) -> str:
        """The command that measures this phase (and resumes it)."""
        return {Phase.map: "map", Phase.candidates: "candidates"}.get(self, "sweep")


class FloorKind(StrEnum):
    """The noise model's kinds (judge.noise): which time a between-run floor is of. The kernels'
    time by pipe; a ratio of two interleaved times; each as a map measures it."""

    call = "call"
    kernel = "kernel"
    kernel_tensor = "kernel_tensor"
    call_ratio = "call_ratio"
    kernel_ratio = "kernel_ratio"
    map_call = "map_call"
    map_kernel = "map_kernel"
    map_kernel_tensor = "map_kernel_tensor"

    @property
    def interleaved(self) -> FloorKind:
        """The floor of this time as a ratio timed interleaved (call -> call_ratio)."""
        return _INTERLEAVED[self]

    @property
    def on_map(self) -> FloorKind:
        """The kind of this time as a map measures it (kernel -> map_kernel)."""
        return _ON_MAP[self]

    @property
    def base(self) -> FloorKind:
        """A map kind's base kind (map_kernel -> kernel); a base kind itself."""
        return _BASE.get(self, self)


_INTERLEAVED = {FloorKind.call: FloorKind.call_ratio, FloorKind.kernel: FloorKind.kernel_ratio}
_ON_MAP = {
    FloorKind.call: FloorKind.map_call,
    FloorKind.kernel: FloorKind.map_kernel,
    FloorKind.kernel_tensor: FloorKind.map_kernel_tensor,
}
_BASE = {mapped: base for base, mapped in _ON_MAP.items()}


class FixKind(StrEnum):
    """fix.json's `kind`: a pinned cuBLASLt algorithm, or a change of the call's shape."""

    pin = "pin"
    pad = "pad"
    layout = "layout"


class Gate(StrEnum):
    """The diff's gate (`diff --fail-on`)."""

    regression = "regression"
    kernel_change = "kernel-change"
    host = "host"
    any = "any"


class FollowUp(StrEnum):
    """A map finding on its follow-up's full-length measurement."""

    holds = "holds on the full-length measurement"
    not_confirmed = "not confirmed there"


class Outcome(StrEnum):
    """A fix as `verify` measured it on this GPU."""

    holds = "holds"
    does_not_hold = "does not hold here"
    refused = "refused"
    wrong = "wrong result"
