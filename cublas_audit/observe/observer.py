"""How the planned calls are observed: one typed value instead of names compared everywhere.

- ncu: Nsight Compute's counters and stalls per launch (needs ncu and counter permission);
- cupti: CUPTI activity tracing: kernel names, kernel-only times and launch geometry, no counter
  permission needed;
- events: CUDA events alone: call times, no kernel names.
"""

from __future__ import annotations

from enum import StrEnum

from cublas_audit.errors import AuditError


class Observer(StrEnum):
    ncu = "ncu"
    cupti = "cupti"
    events = "events"

    @classmethod
    def parse(
        cls, text: str | None, allowed: tuple[Observer, ...] | None = None
    ) -> Observer | None:
        """`--observer TEXT` (None: not given), refused in one line when not among `allowed`."""
        if text is None:
            return None
        allowed = allowed or tuple(cls)
        if text not in {o.value for o in allowed}:
            raise AuditError(
                f"--observer: {text!r} is not one of {', '.join(o.value for o in allowed)}"
            )
        return cls(text)


# What a map observes with: its pass is cheap; --follow-up takes flagged cases to ncu.
MAP_OBSERVERS = (Observer.cupti, Observer.events)
