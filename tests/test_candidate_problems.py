"""Which problems the cuBLASLt candidate audit measures (planning.cases.candidate_problems), on the
real plans bundled under reports/: each distinct problem once, posed exactly as its sweep posed it.
Pure: no GPU, no measurement."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from cublas_audit.planning.cases import DEFAULT_WORKSPACE_BYTES, Case, candidate_problems
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.table.candidates_table import read_candidates
from tests.conftest import REPORTS

BATCHED = REPORTS / "h100" / "20261123-012340-batched"  # classic, cuBLASLt and loop cases
OPS = REPORTS / "h100" / "traces" / "20261123-233621-ops"  # a trace's tn, nt, bias, beta, ...
K140 = REPORTS / "h100" / "checks" / "20261125-074637-k140"  # packed, ldb 144, and K 144


def problems(run: Path) -> list[str]:
    return [case.case_id for case in candidate_problems(read_plan(run / "plan.json"))]


def test_twins_and_loop_companions_are_one_problem() -> None:
    # 54 cases: each of 18 problems as cublasSgemmStridedBatched, cublasLtMatmul and a loop of
    # cublasSgemm. The recorded audit measured exactly those 18 (in plan order), under the
    # cuBLASLt case's id.
    assert len(read_plan(BATCHED / "plan.json")) == 54
    recorded = list(dict.fromkeys(read_candidates(BATCHED)["case_id"]))
    assert problems(BATCHED) == recorded
    assert len(recorded) == 18


def test_every_way_a_problem_is_posed_stays_its_own_problem() -> None:
    found = problems(OPS)
    assert len(found) == len(set(found))
    # The trace's five fp32 384x512x256 calls: F.linear's tn, a transposed B, addmm's bias on
    # either layout. The version-1 audit had timed all five as one packed nn problem.
    assert [p for p in found if p.startswith("cublasLt.fp32.384x512x256.")] == [
        "cublasLt.fp32.384x512x256.b1.nn",
        "cublasLt.fp32.384x512x256.b1.tn",
        "cublasLt.fp32.384x512x256.b1.nt",
        "cublasLt.fp32.384x512x256.b1.nn.bias",
        "cublasLt.fp32.384x512x256.b1.tn.bias",
    ]
    for setting in (".nn.beta0p5", ".nn.bcast-a", ".b1.nn.strided"):
        assert any(p.startswith("cublasLt.fp32.") and p.endswith(setting) for p in found), setting
    # every classic case has its cuBLASLt twin in this plan: one problem per cuBLASLt case
    lt_cases = [c for c in read_plan(OPS / "plan.json") if c.api == "cublasLt"]
    assert found == [c.case_id for c in lt_cases]


def test_a_padded_leading_dimension_is_its_own_problem() -> None:
    # bf16 1024x1024x140 batch 8 packed and with ldb 144: the recorded (version-1) audit timed
    # only the packed one; the K=144 companion is a third problem.
    assert problems(K140) == [
        "cublasLt.bf16.1024x1024x140.b8.nn",
        "cublasLt.bf16.1024x1024x140.b8.nn.ldb144",
        "cublasLt.bf16.1024x1024x144.b8.nn",
    ]
    recorded = set(read_candidates(K140)["case_id"])
    assert recorded == {"cublasLt.bf16.1024x1024x140.b8.nn", "cublasLt.bf16.1024x1024x144.b8.nn"}


def test_problems_keep_every_setting_but_the_api_and_the_loop() -> None:
    loop = next(c for c in read_plan(BATCHED / "plan.json") if c.loop)
    (problem,) = candidate_problems([loop])
    assert problem == replace(loop, api="cublasLt", loop=False)
    posed = Case("cublasLt", "fp32", 384, 512, 256, 1, "t", "n", lda=300, bias=True)
    assert candidate_problems([posed, replace(posed, workspace_mib=4)]) == [
        posed,
        replace(posed, workspace_mib=4),
    ]


def test_a_problems_own_workspace_limit_overrides_the_audits() -> None:
    posed = Case("cublasLt", "fp32", 384, 512, 256, 1, workspace_mib=4)
    assert posed.workspace_limit(DEFAULT_WORKSPACE_BYTES) == 4 * 2**20
    assert replace(posed, workspace_mib=0).workspace_limit(DEFAULT_WORKSPACE_BYTES) == 0
    assert replace(posed, workspace_mib=-1).workspace_limit(8 * 2**20) == 8 * 2**20
