"""judge.diff's small parts pinned at their edges: the clock note's 2 %, which cases changed
kernel (full names first, short names where a side has none), the host's share, the gate, one
verdict from two timings, the evidence's words. Kernel names are the H100's, as
reports/h100/noise/kernel-b/run-00 recorded them; the whole comparison is tested on recorded
runs in tests/test_diff*.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.judge.diff import Diff, _clock_note, _combine, _evidence, compare
from cublas_audit.judge.env_diff import EnvRow
from cublas_audit.judge.noise import EDGES_MS, NoiseModel
from cublas_audit.judge.verdicts import Timed, judge
from cublas_audit.table.inputs import Dataset, load_one_gpu

SM80_32 = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas"  # noqa: E501
SM90_32 = SM80_32.replace("sm80_", "sm90_", 1)  # the same short name, another kernel
SM80_64 = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas"  # noqa: E501


def clocks(a: float | None, b: float | None) -> str:
    return _clock_note({"sm_clock_mhz_a": a, "sm_clock_mhz_b": b})


def test_the_clock_note_says_clocks_further_apart_than_2_percent() -> None:
    assert clocks(1980.0, 1755.0) == "SM clock 1980 / 1755 MHz"  # 11.4 % apart
    assert clocks(1000.0, 1025.0) == "SM clock 1000 / 1025 MHz"  # 2.5 %: beyond 2 %
    assert clocks(1000.0, 975.0) == "SM clock 1000 / 975 MHz"  # slower by 2.5 % too
    # 1.99 % apart: within (x 101 / 100 would be 2.0099 %, beyond)
    assert clocks(1000.0, 1019.9) == ""
    assert clocks(1000.0, 1010.0) == ""  # 1 %
    # a side without a recorded clock: nothing to say
    assert clocks(None, 1755.0) == "" and clocks(1980.0, None) == "" and clocks(None, None) == ""


def test_an_env_row_differs_where_its_sides_do() -> None:
    assert EnvRow("cc", "9.0", "8.0").differs
    assert not EnvRow("cc", "9.0", "9.0").differs


def _diff(matched: pd.DataFrame) -> Diff:
    empty = matched.iloc[0:0]
    return Diff("a", "b", [], matched, empty, empty)


def _names(rows: list[tuple[object, str, object, str]]) -> pd.DataFrame:
    return pd.DataFrame(
        rows, columns=["kernel_name_a", "kernel_short_a", "kernel_name_b", "kernel_short_b"]
    ).assign(verdict="same")


def test_kernel_changes_by_full_name_then_by_short_name() -> None:
    changes = _diff(
        _names(
            [
                (SM80_32, "xmma_32x32x8", SM80_32, "xmma_32x32x8"),  # 0: the same kernel
                (SM80_32, "xmma_32x32x8", SM90_32, "xmma_32x32x8"),  # 1: sm80 -> sm90
                (SM80_32, "xmma_32x32x8", SM80_64, "xmma_64x64x8"),  # 2: another tile
                # 3: a side named only by its short name (a published table): short names decide
                ("xmma_32x32x8", "xmma_32x32x8", SM80_32, "xmma_32x32x8"),
                (None, "xmma_32x32x8", SM80_64, "xmma_64x64x8"),  # 4: no full name, changed
            ]
        )
    ).kernel_changes
    assert changes.index.tolist() == [1, 2, 4]


def _verdicts(rows: list[tuple[str, object, object]]) -> Diff:
    return _diff(
        pd.DataFrame(rows, columns=["verdict", "kernel_verdict", "call_verdict"]).assign(
            kernel_name_a=SM80_32,
            kernel_short_a="xmma_32x32x8",
            kernel_name_b=SM80_32,
            kernel_short_b="xmma_32x32x8",
        )
    )


def test_the_host_is_slower_where_the_call_is_and_the_kernels_are_not() -> None:
    diff = _verdicts(
        [
            ("same", "same", "regression"),  # 0: the host's share
            ("improvement", "improvement", "regression"),  # 1: the host's too
            ("regression", "regression", "regression"),  # 2: the kernels: a regression
            ("regression", None, "regression"),  # 3: kernels not judged: the call decides
            ("same", "same", "same"),  # 4
        ]
    )
    assert diff.host_slower.index.tolist() == [0, 1]
    assert diff.rows("regression").index.tolist() == [2, 3] and diff.has_regression
    assert diff.fails("regression") and diff.fails("host") and diff.fails("any")
    assert not diff.fails("kernel-change")
    # a diff without the call's verdicts has no host's share
    bare = _diff(diff.matched.drop(columns=["call_verdict"]))
    assert bare.host_slower.empty and not bare.fails("host")


def test_each_gate_alone() -> None:
    quiet = _verdicts([("same", "same", "same")])
    assert not any(quiet.fails(gate) for gate in ("regression", "kernel-change", "host", "any"))
    host = _verdicts([("same", "same", "regression")])
    assert host.fails("host") and host.fails("any") and not host.fails("regression")
    changed = _diff(_names([(SM80_32, "xmma_32x32x8", SM80_64, "xmma_64x64x8")]))
    changed = _diff(changed.matched.assign(kernel_verdict="same", call_verdict="same"))
    assert changed.fails("kernel-change") and changed.fails("any")
    assert not changed.fails("regression") and not changed.fails("host")
    with pytest.raises(ValueError):
        quiet.fails("everything")


# 1.0 -> 1.5 ms with a 1 % floor and a 5 % threshold: slower; 1.0 -> 1.0: same
SLOWER = judge(Timed(1.0), Timed(1.5), 0.01, 0.05)
SAME = judge(Timed(1.0), Timed(1.0), 0.01, 0.05)


def test_one_verdict_from_the_kernels_else_the_call() -> None:
    assert _combine(SAME, SLOWER) == "same"  # the kernels decide where judged
    assert _combine(None, SLOWER) == "regression"  # else the call
    assert _combine(SLOWER, None) == "regression"
    assert _combine(None, None) is None


def test_the_evidence_names_each_time_judged() -> None:
    assert _evidence(SLOWER, SAME) == f"kernels {SLOWER.describe()}; call {SAME.describe()}"
    assert _evidence(None, SAME) == f"call {SAME.describe()}"
    assert _evidence(None, None) == ""


KERNEL_B = Path(__file__).resolve().parents[1] / "reports/h100/noise/kernel-b"


@pytest.fixture(scope="module")
def reruns() -> tuple[Dataset, Dataset]:
    # two back-to-back CUPTI-traced reruns of the same 54 cases on the H100
    return load_one_gpu(KERNEL_B / "run-00"), load_one_gpu(KERNEL_B / "run-01")


@pytest.fixture(scope="module")
def judged(reruns: tuple[Dataset, Dataset]) -> Diff:
    return compare(*reruns)


def test_the_floors_table_of_two_reruns(judged: Diff) -> None:
    floors = judged.floors
    # cases by time per launch (a loop's time over its launches), in the shipped model's bins
    assert floors["cases"].tolist() == [7, 12, 4, 7, 7, 2, 7, 4, 4]
    assert floors["kernel_cases"].tolist() == floors["cases"].tolist()  # every case traced
    # under 0.1 ms the call's floor (0.7752, 0.5062) is the host's, >= 0.5: not judged
    assert floors["floor_pct"].isna().tolist() == [True, True] + [False] * 7
    # from 0.1 to 0.3 ms: 0.1985 -> 19.85 %; detectable max(1.05, 1.1985) - 1 -> 19.85 %
    assert floors["floor_pct"][2] == pytest.approx(19.85)
    assert floors["detectable_pct"][2] == pytest.approx(19.85)
    # the kernels' (FP32: kernel): 2.83 %, 1.95 % and 1.58 % above 30 ms; the gate's 5 % is
    # above each, so that is what can be detected
    assert floors["kernel_floor_pct"].tolist() == pytest.approx([2.83] * 7 + [1.95, 1.58])
    assert floors["kernel_detectable_pct"].tolist() == pytest.approx([5.0] * 9)


def test_the_floors_table_without_kernel_times(reruns: tuple[Dataset, Dataset]) -> None:
    a, b = reruns
    untraced = replace(b, frame=b.frame.drop(columns=["kernel_time_ms"]))
    floors = compare(a, untraced).floors
    assert floors["kernel_cases"].tolist() == [0] * 9
    assert floors["kernel_floor_pct"].tolist() == [0.0] * 9  # no traced case: no floor


def test_the_host_bound_floor_is_at_least_half(reruns: tuple[Dataset, Dataset]) -> None:
    # a model whose call floor is exactly 0.5 everywhere: host-bound, nothing judged on calls
    model = NoiseModel(EDGES_MS, (0.5,) * len(EDGES_MS))
    assert compare(*reruns, model=model).floors["floor_pct"].isna().all()


def test_the_time_delta_of_a_case(judged: Diff) -> None:
    row = judged.matched.iloc[0]
    # cublas.fp32.256x256x256.b4: 0.022624 -> 0.025376 ms: (1.12164 - 1) x 100 = 12.164 %
    assert (row["shape"], row["batch"], row["launches"]) == ("256", 4, 1)
    assert row["time_delta_pct"] == pytest.approx((0.025376 / 0.022624 - 1) * 100, rel=1e-12)
    assert row["judged_on"] == "kernel" and row["judged_ms_a"] == row["kernel_time_ms_a"]


def test_a_case_listed_twice_is_named_by_its_row(reruns: tuple[Dataset, Dataset]) -> None:
    a, _ = reruns
    twice = pd.concat([a.frame, a.frame.iloc[[3]]], ignore_index=True)  # 54 rows, then row 4
    with pytest.raises(AuditError) as caught:
        compare(a, replace(a, frame=twice))
    # the repeat is the 55th data row; the key's last column is named
    message = str(caught.value)
    assert "row 55, column 'workspace_mib': case cublas, cublasSgemmStridedBatched" in message
    assert message.endswith("appears twice")


def test_a_side_without_routines_matches_without_loops(reruns: tuple[Dataset, Dataset]) -> None:
    a, b = reruns
    # b as a table from elsewhere: no routine column, so no loop companions either
    batched_b = b.frame[b.frame["routine"] != "sgemm-loop"]
    bare = replace(b, frame=batched_b.drop(columns=["routine"]))
    matched = compare(a, bare).matched
    # a table without routine holds no loop companions, so a's are not matched (they would have
    # their batched call's key): its 36 other calls are, one launch each
    batched = int((a.frame["routine"] != "sgemm-loop").sum())
    assert len(matched) == batched == 36
    assert (matched["launches"] == 1).all()
