"""judge.fixes' branches the recorded runs leave alone: a stamp without env.json nor table
columns, a candidate's kernels named by its own row or by the dispatch table, a shape fix timed on
the call where one side has no kernels' time, and a PyTorch problem with a shared A.

Rows: the H100's K = 140 layouts check (reports/h100/checks/20261125-092057-k140-layouts: bf16
1024x1024x140 batch 8, nn against nt; cuBLAS's call 0.031120 against 0.022128 ms, kernels 0.020832
against 0.009888) and its candidate audit's first row (reports/h100/checks/20261127-100356-2073).
"""

from __future__ import annotations

from functools import cache

import pandas as pd

from cublas_audit.judge.fixes import _timed, _traced_problem, shape_fixes, stamp_of
from cublas_audit.judge.rules import prepare
from cublas_audit.judge.rules.frame import RuleContext
from cublas_audit.judge.rules.layout import layout_penalty
from cublas_audit.judge.thresholds import Thresholds
from cublas_audit.table.dispatch import from_records
from cublas_audit.table.env_record import EnvRecord
from tests.conftest import REPORTS, ZERO_NOISE

K140 = REPORTS / "h100" / "checks" / "20261125-092057-k140-layouts" / "dispatch.csv"
CANDIDATES = REPORTS / "h100" / "checks" / "20261127-100356-2073" / "candidates.csv"


@cache
def _k140() -> pd.DataFrame:
    return prepare(from_records(pd.read_csv(K140).to_dict("records")))


def test_a_stamp_without_env_json_nor_table_columns_is_unknown() -> None:
    unknown = stamp_of(EnvRecord())  # no frame to read from
    assert (unknown.gpu_name, unknown.cc, unknown.gpu_label) == ("unknown", "unknown", "")
    # the label given, else env.json's
    assert stamp_of(EnvRecord(), label="h100").gpu_label == "h100"
    assert stamp_of({"gpu_label": "a"}).gpu_label == "a"
    # a frame without the column, and one whose column is empty, are as unknown
    assert stamp_of({}, pd.DataFrame({"cc": [None]})).gpu_name == "unknown"
    assert stamp_of({}, pd.DataFrame({"gpu_name": [None, "H100"]})).gpu_name == "H100"
    assert stamp_of({"gpu_name": "NVIDIA H100"}, pd.DataFrame({"gpu_name": ["x"]})).gpu_name == (
        "NVIDIA H100"
    )


def test_a_candidates_kernels_from_its_row_else_the_dispatch_table() -> None:
    row = pd.read_csv(CANDIDATES, nrows=1).iloc[0]  # nvjet_sm90_tst_64x24_64x16_2x4_h_bz_NNT
    own = _timed(row, "call")  # no dispatched kernel given: the row's own
    assert (own.kernel, own.ms, own.confirm_ms) == ("nvjet_tst_64x24_64x16_2x4", 0.005376, None)
    told = _timed(row.drop("kernels"), "call", "cutlass_80_simt_sgemm_64x64_8x5_nt_align1")
    assert told.kernel == "simt_64x64_8x5"
    assert _timed(row.drop("kernels"), "call").kernel == "algo 66 tile 64x24"


def test_a_shape_fix_on_the_calls_time_where_one_side_has_no_kernels() -> None:
    rows = _k140()
    ctx = RuleContext(rows, Thresholds(), model=ZERO_NOISE)
    cublas = layout_penalty(ctx)[0]  # cuBLAS nn (row 0) against nt (row 3)
    (traced,) = shape_fixes(rows, [cublas], {}, "run")
    assert (traced.timing, traced.default.ms, traced.fixed.ms) == ("kernel", 0.020832, 0.009888)
    for untraced in (0, 3):  # either side without its kernels' time: both on the call's
        other = rows.copy()
        other.loc[untraced, "kernel_time_ms"] = None
        (fix,) = shape_fixes(other, [cublas], {}, "run")
        assert (fix.timing, fix.default.ms, fix.fixed.ms) == ("call", 0.03112, 0.022128)


def test_a_pytorch_problem_with_a_shared_a() -> None:
    # tests/fixtures/torch_traces/ops.json.gz: bmm(x, w.expand(4, 256, 192)) in fp32, cuBLAS's
    # terms as observe.torch_trace.problems gives them (tests/test_torch_trace.py pins them)
    row = pd.Series({
        "mode": "fp32", "cublas_m": 192, "cublas_n": 128, "cublas_k": 256, "batch": 4,
        "cublas_transa": "n", "cublas_transb": "n", "cublas_lda": 192, "cublas_ldb": 256,
        "cublas_broadcast": "a", "cublas_beta": 0.0, "cublas_bias": False,
    })  # fmt: skip
    problem = _traced_problem(row)
    assert problem is not None and problem.stride_a == 0  # the shared A: batch stride 0
    # no cublas_broadcast column: a problem this tool cannot pose (KeyError), no fix names it
    assert _traced_problem(row.drop("cublas_broadcast")) is None
    unshared = _traced_problem(row.where(row.index != "cublas_broadcast", None))
    assert unshared is not None and unshared.stride_a == 192 * 256  # A's own matrix per batch
