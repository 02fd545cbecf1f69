"""judge.rules.utilization's no-escalation at its boundaries on the article's RTX 5090 table
(tests/fixtures/published_article_b8.csv, FP32 batch 8): simt_128x32_8x5 at every size from 256
to 8192 (32x in linear size), FMA utilization 33, 39, 41, 41, 42 and 42 %."""

from __future__ import annotations

import json
from functools import cache

import pandas as pd

from cublas_audit.judge.finding import Finding
from cublas_audit.judge.roofline import Machine, machine_of, with_roofline
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.rules.frame import RuleContext
from cublas_audit.judge.rules.utilization import legacy_kernel, low_utilization, no_escalation
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.dispatch import from_records
from tests.conftest import FIXTURES


@cache
def _rows() -> pd.DataFrame:
    table = pd.read_csv(FIXTURES / "published_article_b8.csv")
    return prepare(from_records(table[table["gpu_label"] == "5090"].to_dict("records")))


def escalation(rows: pd.DataFrame | None = None, **thresholds: float) -> list[Finding]:
    ctx = RuleContext(_rows() if rows is None else rows, Thresholds(**thresholds))  # type: ignore[arg-type]
    return no_escalation(ctx)


def test_the_5090_at_the_default_limits() -> None:
    (found,) = escalation()
    assert found.sizes == ["256", "512", "1024", "2048", "4096", "8192"]
    assert "from 256 to 8192 (32x in linear size)" in found.message
    assert "utilization stays at 33-42 % (below 60 % from 4096 up)" in found.message


def test_the_range_and_the_largest_size_at_their_limits() -> None:
    # 8192 / 256 = 32: a range of exactly 32 is enough; the largest size 8192 reaches 8192
    assert len(escalation(escalation_min_range=32)) == 1
    assert len(escalation(escalation_min_size=8192)) == 1
    # a run that never reaches the size judged from is no finding, however wide
    assert escalation(escalation_min_size=8193) == []


def test_only_the_sizes_from_the_limit_up_count() -> None:
    # from 8192 up: 42 %, at a limit of 42 % (reached: it escalates enough) -> nothing; 42.5 fires
    assert escalation(escalation_min_size=8192, escalation_max_pct=42) == []
    assert len(escalation(escalation_min_size=8192, escalation_max_pct=42.5)) == 1
    # from 4096 up (42, 42 %), 512's 39 % is not judged: a limit of 40 % is reached -> nothing
    assert escalation(escalation_max_pct=40) == []
    # from 512 up: 39 % is below 40, but 41 and 42 reach it
    assert escalation(escalation_min_size=512, escalation_max_pct=40) == []
    assert len(escalation(escalation_min_size=512, escalation_max_pct=42.5)) == 1


def test_a_size_without_its_utilization_is_no_finding() -> None:
    rows = _rows().copy()
    rows.loc[5, "util"] = None  # 8192 without ncu's counters: it might have escalated
    assert escalation(rows) == []
    # one kernel at one size (a range of 1 is allowed here): the run is that one row
    (one,) = escalation(_rows().iloc[[5]], escalation_min_range=1)
    assert one.sizes == ["8192"] and "(1x in linear size)" in one.message


@cache
def _h100() -> tuple[pd.DataFrame, Machine]:
    """tests/fixtures/h100-batched-cublas: FP32 256^3 on xmma_32x32x8 at 18.2718 % (batch 4)
    and 33.3562 % (batch 8); the table's best 82.1128 % (8192^3 batch 8, xmma_128x128x8), then
    82.1033 % (batch 16)."""
    run = FIXTURES / "h100-batched-cublas"
    table = pd.read_csv(run / "dispatch.csv")
    machine = machine_of(json.loads((run / "env.json").read_text()), table)
    assert machine is not None
    return with_roofline(prepare(from_records(table.to_dict("records"))), machine), machine


def low(**thresholds: float) -> list[Finding]:
    rows, machine = _h100()
    return low_utilization(RuleContext(rows, Thresholds(**thresholds), machine=machine))  # type: ignore[arg-type]


def test_low_against_the_best_at_exactly_the_fraction() -> None:
    fraction = 33.3562 / 82.1128  # x 82.1128 is 33.3562 again, exactly
    assert low(fill_min_elements=524288, low_util_fraction=fraction) == []
    (found,) = low(fill_min_elements=524288, low_util_fraction=fraction + 1e-9)
    assert found.batch == 8
    # 33.3562 / 82.1128 = 41 % of the best, named by its kernel, routine, shape and batch
    assert found.message.startswith(
        "xmma_32x32x8 reaches only 33 % FMA-pipe utilization at size 256, 41% of the 82 % this "
        "GPU reaches in fp32 with xmma_128x128x8 (cublasSgemmStridedBatched, 8192, batch 8)"
    )


def test_a_legacy_kernel_at_one_size() -> None:
    # the article's RTX PRO 6000 dispatches magma_Ex at 256 and 512 (FP32 batch 8): at 512 alone
    # the finding is that one row's, its kernel, family and mode read off it
    table = pd.read_csv(FIXTURES / "published_article_b8.csv")
    frame = table[table["gpu_label"] == "pro6000"]
    machine = machine_of({}, frame)  # None: the table names no GPU the data sheets know
    pro = with_roofline(prepare(from_records(frame.to_dict("records"))), machine)
    at_512 = pro[(pro["kernel_short"] == "magma_Ex") & (pro["m"] == 512)]
    (found,) = legacy_kernel(RuleContext(at_512, Thresholds(), machine=machine))
    assert found.message.startswith(
        "magma_Ex (family magma) is dispatched at size 512: a code path older than this GPU, at "
    )
    assert "FMA-pipe utilization" in found.message  # fp32's pipe
