"""judge/thresholds.py pinned: every default is the one docs/report.md's table documents (the
spec a user reads before `--threshold`), LISTED_MAX is the 200 the report says it lists, and each
override's range is checked at, inside and just outside its bounds."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.judge.thresholds import LISTED_MAX, Thresholds, limits, names, with_overrides

DOC = Path(__file__).resolve().parent.parent / "docs" / "report.md"


def _documented() -> dict[str, float]:
    """The `| `name` | default | meaning |` rows of docs/report.md's Thresholds table."""
    rows = re.findall(r"^\| `(\w+)` \| ([0-9.]+) \|", DOC.read_text(), flags=re.MULTILINE)
    return {name: float(value) for name, value in rows}


def test_every_default_is_the_documented_one() -> None:
    documented = _documented()
    assert sorted(documented) == sorted(names())  # each threshold documented, none extra
    defaults = Thresholds()
    # exact equality: 4194304 = 2048 * 2048 and 134217728 = 128 * 2**20 in the doc's digits
    assert {name: getattr(defaults, name) for name in names()} == documented


def test_listed_max_is_the_documented_200() -> None:
    assert "lists at most 200 findings of each" in " ".join(DOC.read_text().split())
    assert LISTED_MAX == 200


@pytest.mark.parametrize(
    ("name", "bounds"),
    [
        ("low_util_fraction", (0.0, 1.0)),
        ("underfill_sm_fraction", (0.0, 1.0)),
        ("cliff_drop_pct", (0.0, 100.0)),
        ("diff_util_noise_pts", (0.0, 100.0)),
        ("high_ratio", (1.0, math.inf)),
        ("escalation_min_range", (1.0, math.inf)),
        ("fill_min_elements", (0.0, math.inf)),
    ],
)
def test_limits_by_the_name_s_ending(name: str, bounds: tuple[float, float]) -> None:
    assert limits(name) == bounds


@pytest.mark.parametrize(
    ("item", "field", "value"),
    [
        ("low_util_fraction=0", "low_util_fraction", 0.0),  # at each end: allowed
        ("low_util_fraction=1", "low_util_fraction", 1.0),
        ("cliff_drop_pct=100", "cliff_drop_pct", 100.0),
        ("cliff_drop_pct=0", "cliff_drop_pct", 0.0),
        ("high_ratio=1", "high_ratio", 1.0),
        ("high_ratio=1e300", "high_ratio", 1e300),
        ("fill_min_elements=0", "fill_min_elements", 0.0),
        (" fill-min-elements =5", "fill_min_elements", 5.0),  # `-` for `_`, spaces around
    ],
)
def test_an_override_at_its_bounds_is_taken(item: str, field: str, value: float) -> None:
    changed = with_overrides([item])
    assert getattr(changed, field) == value
    # the other fields stay the base's
    assert changed == Thresholds(**{field: value})


@pytest.mark.parametrize(
    "item",
    [
        "low_util_fraction=-0.001",
        "low_util_fraction=1.001",
        "cliff_drop_pct=100.5",
        "cliff_drop_pct=-1",
        "high_ratio=0.999",
        "fill_min_elements=-1",
        "fill_min_elements=inf",  # from 0 to inf, yet never inf itself
        "high_ratio=nan",
    ],
)
def test_an_override_outside_its_bounds_is_one_line(item: str) -> None:
    name = item.split("=")[0]
    with pytest.raises(AuditError, match=rf"^--threshold {name}: must be a number from") as err:
        with_overrides([item])
    assert "\n" not in str(err.value)


def test_several_overrides_on_a_base() -> None:
    base = Thresholds(high_ratio=1.5)
    changed = with_overrides(["cliff_drop_pct=20", "loop_margin_pct=7"], base)
    assert changed == Thresholds(high_ratio=1.5, cliff_drop_pct=20.0, loop_margin_pct=7.0)
    assert with_overrides([], base) is not None and with_overrides([], base) == base


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("high_ratio", "expected NAME=VALUE"),
        ("nope=1", "unknown name 'nope'"),
        ("high_ratio=fast", "'fast' is not a number"),
    ],
)
def test_a_bad_item_says_what_is_wrong(item: str, words: str) -> None:
    with pytest.raises(AuditError, match=re.escape(words)):
        with_overrides([item])
