"""`verify --torch`'s verdicts (judge.framework), on what PyTorch really ran on the H100.

The runs are reports/h100/fixes/20261125-092546/pinned_torch.json: torch.mm's own kernels and
kernel time per call, and the pinned call's, for the fixes of that directory's fix.json (torch
2.11 through PinnedGemm, the same kernels TunableOp runs from the file: ../shared/DESIGN.md,
2026-11-27). A pin TunableOp skips is what the two torch versions do with too little workspace:
2.14 launches no kernel (NaN left in the output, as measured on the H100), 2.15 runs its default
call (per its source): the pinned side then shows no kernel, or torch's own.
"""

from __future__ import annotations

import json

import pytest

from cublas_audit.judge import framework
from cublas_audit.judge.candidates import DEFAULT_THRESHOLD
from cublas_audit.table.fix_file import Fix, read_fix_file
from tests.conftest import REPORTS

RUN = REPORTS / "h100" / "fixes" / "20261125-092546"


def recorded() -> dict[str, dict[str, object]]:
    found = json.loads((RUN / "pinned_torch.json").read_text())
    return {p["fix"]: p for p in found["problems"]}


def fix(fix_id: str) -> Fix:
    return next(f for f in read_fix_file(RUN / "fix.json").fixes if f.id == fix_id)


def side(measured: dict[str, object], rounds: int = 2) -> framework.FrameworkRun:
    kernels = tuple(measured["kernels"])  # type: ignore[arg-type]
    ms = float(measured["kernel_ms"])  # type: ignore[arg-type]
    return framework.FrameworkRun(kernels, (ms,) * rounds, 1e-6, True)


@pytest.mark.parametrize("fix_id", ["fp32.192x256x64.b1.nn", "fp32.1152x128x2816.b1.nn"])
def test_the_pin_torch_ran_faster_holds_and_agrees_with_its_claim(fix_id: str) -> None:
    seen = recorded()[fix_id]
    found = framework.judge_framework(
        fix(fix_id), "torch.mm", side(seen["pinned_eager"]), side(seen["torch"]), DEFAULT_THRESHOLD
    )
    assert found.status == framework.HOLDS
    assert found.kernels.startswith("xmma_") and found.default_kernels.startswith("simt_")
    # 0.00624 / 0.00326 = 1.91x against the claimed 1.85x; 0.05124 / 0.02716 = 1.89x vs 1.85x
    assert found.speedups[0] == pytest.approx(
        float(seen["torch"]["kernel_ms"]) / float(seen["pinned_eager"]["kernel_ms"])  # type: ignore[index]
    )
    assert found.agrees is True and "within the floor" in found.line


def test_a_gain_inside_the_floor_does_not_hold() -> None:
    seen = recorded()["fp32.192x256x64.b1.nn"]
    pinned = side(seen["pinned_eager"])
    # torch's own call only 4 % slower than the pin: inside the 6 % floor + 10 % threshold
    plain = framework.FrameworkRun(
        side(seen["torch"]).kernels, tuple(ms * 1.04 for ms in pinned.ms), 0, True
    )
    found = framework.judge_framework(
        fix("fp32.192x256x64.b1.nn"), "torch.mm", pinned, plain, DEFAULT_THRESHOLD
    )
    assert found.status == framework.DOES_NOT_HOLD and found.agrees is False
    assert "not beyond" in found.line and "outside the floor" in found.line


def test_one_round_inside_the_floor_is_enough_to_fail() -> None:
    seen = recorded()["fp32.192x256x64.b1.nn"]
    pinned = side(seen["pinned_eager"])
    plain_ms = (pinned.ms[0] * 1.9, pinned.ms[1] * 1.05)
    plain = framework.FrameworkRun(side(seen["torch"]).kernels, plain_ms, 0, True)
    found = framework.judge_framework(
        fix("fp32.192x256x64.b1.nn"), "torch.mm", pinned, plain, DEFAULT_THRESHOLD
    )
    assert found.status == framework.DOES_NOT_HOLD


def test_torch_2_14_skipping_the_pin_launches_nothing_and_is_not_applied() -> None:
    seen = recorded()["fp32.1152x128x2816.b1.nn"]
    nothing = framework.FrameworkRun((), (0.0, 0.0), float("nan"), False)
    found = framework.judge_framework(
        fix("fp32.1152x128x2816.b1.nn"), "torch.mm", nothing, side(seen["torch"]), DEFAULT_THRESHOLD
    )
    assert found.status == framework.NOT_APPLIED and "launched no kernel" in found.line


def test_torch_2_15_falling_back_to_its_default_is_not_applied_and_names_its_kernel() -> None:
    seen = recorded()["fp32.1152x128x2816.b1.nn"]
    found = framework.judge_framework(
        fix("fp32.1152x128x2816.b1.nn"), "torch.mm", side(seen["torch"]), side(seen["torch"]),
        DEFAULT_THRESHOLD,
    )  # fmt: skip
    assert found.status == framework.NOT_APPLIED
    assert "simt_128x128_8x4" in found.line and "xmma_64x64x8" in found.line


def test_a_wrong_result_is_said_before_any_time() -> None:
    seen = recorded()["fp32.192x256x64.b1.nn"]
    wrong = framework.FrameworkRun(side(seen["pinned_eager"]).kernels, (0.001, 0.001), 0.5, False)
    found = framework.judge_framework(
        fix("fp32.192x256x64.b1.nn"), "torch.mm", wrong, side(seen["torch"]), DEFAULT_THRESHOLD
    )
    assert found.status == framework.WRONG and found.speedups == ()


def test_a_third_kernel_is_another_kernel() -> None:
    seen = recorded()
    other = side(seen["fp32.1152x192x1664.b1.nn"]["pinned_eager"])  # xmma_64x128x8: not this pin's
    own = side(seen["fp32.192x256x64.b1.nn"]["torch"])
    found = framework.judge_framework(
        fix("fp32.192x256x64.b1.nn"), "torch.mm", other, own, DEFAULT_THRESHOLD
    )
    assert found.status == framework.ANOTHER_KERNEL


def test_bias_and_layouts_map_to_the_calls_a_model_makes() -> None:
    from dataclasses import replace

    from cublas_audit.run.torch_check import runnable, torch_call

    pin = fix("fp32.192x256x64.b1.nn")
    assert torch_call(pin) == "torch.mm" and runnable(pin)
    with_bias = replace(pin, problem=replace(pin.problem, bias=True))
    assert torch_call(with_bias) == "torch.addmm" and runnable(with_bias)
    tn = replace(with_bias, problem=replace(with_bias.problem, transa="t", lda=pin.problem.k))
    assert torch_call(tn) == "F.linear with bias"
    assert not runnable(replace(pin, problem=replace(pin.problem, beta=0.5)))


def test_the_rounds_alternate_processes_and_each_side_keeps_every_rounds_time() -> None:
    from cublas_audit.run.torch_check import _runs

    seen = recorded()["fp32.192x256x64.b1.nn"]

    def found(which: str, scale: float) -> dict[str, dict[str, object]]:
        side = seen[which]
        record = {"kernels": list(side["kernels"]), "ms": float(side["kernel_ms"]) * scale}  # type: ignore[index]
        return {"fp32.192x256x64.b1.nn": {**record, "error": 1e-6, "correct": True}}

    rounds = [
        (found("pinned_eager", 1.0), found("torch", 1.0)),
        (found("pinned_eager", 1.02), found("torch", 0.98)),
    ]
    pinned, plain = _runs("fp32.192x256x64.b1.nn", rounds)
    assert pinned.ms == pytest.approx((0.00326, 0.00326 * 1.02))
    assert plain.ms == pytest.approx((0.00624, 0.00624 * 0.98))
    assert pinned.kernels[0].startswith("sm80_xmma") and plain.kernels[0].startswith("void cutlass")
