"""device.clocks.cool_down: every judging round starts with the clocks free of power and heat.

The reasons are NVML's clock event bits as the H100 reported them in the ViT candidate audit
(0x4, the software power cap, with the SM clock at 1485-1830 MHz instead of 1980)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cublas_audit.device import clocks

POWER_CAP = 0x4
IDLE = 0x1  # "GPU idle": not a slowdown


def states(reasons: list[int]) -> Iterator[dict[str, float | int]]:
    yield from ({"sm_clock_mhz": 1980.0, "clock_reasons": r} for r in reasons)
    while True:
        yield {"sm_clock_mhz": 1980.0, "clock_reasons": reasons[-1]}


def test_a_power_capped_gpu_is_waited_for_until_the_cap_lets_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reported = states([POWER_CAP, POWER_CAP, POWER_CAP, IDLE])
    monkeypatch.setattr(clocks, "state", lambda: next(reported))
    slept: list[float] = []
    waited = clocks.cool_down(slept.append)
    assert slept == [clocks.COOL_STEP_S] * 3 and waited == pytest.approx(3 * clocks.COOL_STEP_S)


@pytest.mark.parametrize("reasons", [0, IDLE, 0x1000])
def test_free_clocks_or_no_nvml_never_wait(monkeypatch: pytest.MonkeyPatch, reasons: int) -> None:
    monkeypatch.setattr(clocks, "state", lambda: {"clock_reasons": reasons})
    assert clocks.cool_down(lambda s: pytest.fail("slept")) == 0.0
    monkeypatch.setattr(clocks, "state", lambda: {})  # NVML cannot say
    assert clocks.cool_down(lambda s: pytest.fail("slept")) == 0.0


@pytest.mark.parametrize("reason", [0x4, 0x8, 0x20, 0x40, 0x80])
def test_a_cap_that_never_lets_go_costs_at_most_the_limit(
    monkeypatch: pytest.MonkeyPatch, reason: int
) -> None:
    monkeypatch.setattr(clocks, "state", lambda: {"clock_reasons": reason | IDLE})
    slept: list[float] = []
    assert clocks.cool_down(slept.append) == pytest.approx(clocks.COOL_MAX_S)
    assert len(slept) == round(clocks.COOL_MAX_S / clocks.COOL_STEP_S)
