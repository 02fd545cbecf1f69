"""The dispatch map's own rules (size-inversion, dispatch-cliff), judged once per map: the
follow-up, the report and the CLI's summary all take these findings."""

from __future__ import annotations

import pandas as pd

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.rules import audit
from cublas_audit.judge.thresholds import Thresholds

MAP_RULES = ("size-inversion", "dispatch-cliff")


def map_findings(frame: pd.DataFrame, thresholds: Thresholds | None = None) -> list[Finding]:
    """The map rules' findings, largest effect first."""
    found = audit(frame, thresholds=thresholds, rules=MAP_RULES)
    return sorted(found, key=lambda f: (-f.effect, f.rule, f.sizes))
