"""report.tunableop: the TunableOp file `fix` writes, checked against the files torch 2.14.1 wrote
on the H100 (its validators, and its rows rebuilt from pins) and against fixes from a recorded
run (tests/fix_examples.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import Case
from cublas_audit.report import tunableop
from cublas_audit.report.tunableop import (
    not_carried_reason,
    pt_version,
    tunable_row,
    tunableop_environment,
    tunableop_export,
    write_tunableop,
)
from cublas_audit.table.fix_file import Pin, Problem
from cublas_audit.table.tunableop_file import read_tunableop
from tests.fix_examples import candidate_fix, candidate_row, fix_set, pad_fix, pin_of
from tests.test_tunableop_file import MODELS, PINS


def _problem(
    mode: str, m: int, n: int, k: int, layout: str = "nn", lda: int = 0, ldb: int = 0,
    bias: bool = False,
) -> Problem:  # fmt: skip
    case = Case("cublasLt", mode, m, n, k, 1, layout[0], layout[1], lda=lda, ldb=ldb, bias=bias)
    return Problem.of_case(case)


def _pin(algo: int, tile: str, stages: str, split_k: int, scheme: str, custom: int,
         cluster: str, swizzle: int = 0, inner: int = 0) -> Pin:  # fmt: skip
    # The file records no workspace, and a row does not depend on it.
    return Pin(algo, tile, stages, split_k, scheme, swizzle, custom, inner, cluster, 0)


# torch's own rows for the H100 misses (tunableop_h100_torch2.14.1.csv), each rebuilt from the
# problem (cuBLAS nn, packed) and the pin by its table names; the 2112x64x2048 row is Default.
EIGHT_PINS = [
    (_problem("fp32", 2496, 128, 1600), _pin(20, "128x64", "8x5", 2, "INPLACE", 0, "AUTO")),
    (_problem("fp32", 768, 192, 3840), _pin(20, "128x64", "8x5", 4, "INPLACE", 0, "AUTO")),
    (_problem("fp32", 2496, 128, 1408), _pin(55, "64x64", "8x3", 1, "NONE", 0, "AUTO")),
    (_problem("bf16", 5952, 832, 5952), _pin(66, "128x192", "64xAUTO", 1, "NONE", 4, "4x1x1")),
    (_problem("bf16", 5696, 576, 4544), _pin(66, "256x128", "64xAUTO", 1, "NONE", 5, "4x1x1")),
    (_problem("bf16", 7744, 448, 1664), _pin(66, "256x128", "64xAUTO", 1, "NONE", 7, "1x2x1")),
    (_problem("bf16", 896, 3648, 6976), _pin(66, "256x128", "64xAUTO", 1, "NONE", 7, "4x2x1")),
]


def test_the_h100_pins_rebuild_torchs_own_rows() -> None:
    torch_rows = [row for row in read_tunableop(PINS).rows if row.solution is not None]
    assert len(torch_rows) == len(EIGHT_PINS) == 7
    for (problem, pin), torch_row in zip(EIGHT_PINS, torch_rows, strict=True):
        assert tunable_row(problem, pin, torch_row.ms).line == torch_row.line


# Rows of tunableop_h100_torch2.14.1_models.csv in the other forms: (problem, pin) -> its line.
OTHER_FORMS = [
    (  # tn (a row-major X @ W.T), a tile the H100's candidates never recorded by name
        _problem("bf16", 5632, 2048, 2048, "tn", lda=2048, ldb=2048),
        _pin(66, "201", "64xAUTO", 1, "NONE", 2, "1x2x1"),
    ),
    (  # nt, split-K with the COMPUTE_TYPE reduction
        _problem("fp32", 1024, 1024, 2048, "nt", lda=1024, ldb=1024),
        _pin(20, "256x128", "8x4", 4, "COMPUTE_TYPE", 0, "AUTO"),
    ),
    (  # the bias epilogue
        _problem("fp32", 1024, 2048, 479, "tn", lda=479, ldb=479, bias=True),
        _pin(55, "128x128", "8x3", 1, "NONE", 0, "AUTO"),
    ),
    (  # fp16 with the bias epilogue
        _problem("fp16", 768, 12608, 3072, "tn", lda=3072, ldb=3072, bias=True),
        _pin(66, "192x192", "64xAUTO", 1, "NONE", 6, "1x2x1"),
    ),
]


@pytest.mark.parametrize("index", range(len(OTHER_FORMS)))
def test_other_layouts_and_the_bias_op_rebuild_torchs_rows(index: int) -> None:
    problem, pin = OTHER_FORMS[index]
    rows = {(row.op_signature, row.params): row for row in read_tunableop(MODELS).rows}
    mine = tunable_row(problem, pin, 1.0)
    torch_row = rows[mine.op_signature, mine.params]
    assert mine.solution == torch_row.solution
    assert replace(mine, ms=torch_row.ms).line == torch_row.line


@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_a_packed_batched_call_takes_the_strided_batched_form(layout: str) -> None:
    # torch's bf16 batched rows of the models file (Default there: a pin takes the same names)
    m, n, k = (128, 512, 512) if layout == "nn" else (512, 512, 128)
    case = Case("cublasLt", "bf16", m, n, k, 64, transa=layout[0], transb=layout[1])
    row = tunable_row(Problem.of_case(case), EIGHT_PINS[3][1], 1.0)
    torch_lines = MODELS.read_text().splitlines()
    prefix = f"{row.op_signature},{row.params},"
    assert [line for line in torch_lines if line.startswith(prefix)] == [prefix + "Default,"
        + ("0.0238237" if layout == "nn" else "0.02312")]  # fmt: skip
    assert row.op == "GemmStridedBatchedTunableOp" and row.batch == 64


def test_the_file_of_a_fix_set() -> None:
    export = tunableop_export(fix_set(), torch_version="2.14.1+cu130")
    # the validators torch 2.14.1 itself wrote on this H100, cuBLAS 13.1.0
    assert export.file.text.splitlines()[:3] == PINS.read_text().splitlines()[:3]
    assert export.carried == ("pin-1856", "pin-2112")
    (row, _) = export.file.rows
    assert row.line == (
        "GemmStridedBatchedTunableOp_float_NN,nn_1856_1856_1856_B_8_ld_1856_1856_1856,"
        "Gemm_Cublaslt_id_55_tile_20_stages_31_splitk_1_red_0_swizzle_0_custom_0_inner_0_"
        "cluster_0,2.08907"
    )
    ((skipped),) = export.not_carried
    assert (skipped.fix_id, skipped.problem) == ("pad-1856", "fp32 1856x1856x1856 nn batch 8")
    assert "a pad fix changes the call itself (it runs fp32 1920x1920x1920" in skipped.reason
    assert export.torch_version == "2.14.1"
    assert export.torch_settings == [tunableop.TORCH_SETTINGS["float"]]


def test_the_written_file_reads_back_under_the_name_torch_reads(tmp_path: Path) -> None:
    export = tunableop_export(fix_set(), torch_version="2.14.1")
    written = write_tunableop(export, tmp_path)
    assert written == tmp_path / "tunableop0.csv"
    assert read_tunableop(written) == export.file
    env = export.environment(tmp_path)
    # TunableOp inserts the device ordinal: tunableop.csv is read as tunableop0.csv
    assert env["PYTORCH_TUNABLEOP_FILENAME"] == str(tmp_path.resolve() / "tunableop.csv")
    assert (env["PYTORCH_TUNABLEOP_ENABLED"], env["PYTORCH_TUNABLEOP_TUNING"]) == ("1", "0")


def test_the_workspace_is_the_largest_carried_pins_and_never_below_torchs() -> None:
    # Both carried pins need no workspace: torch's default stays.
    assert tunableop_export(fix_set(), "2.14.1").workspace_kib == 1024
    # The run's split-K candidate of 2048^3 (5 splits, COMPUTE_TYPE) needs 16779423 bytes.
    split_k = pin_of(candidate_row("cublasLt.fp32.2048x2048x2048.b1.nn", 3))
    fix = candidate_fix("cublasLt.fp32.2048x2048x2048.b1.nn", 3, "split-k")
    assert fix.pin == split_k and split_k.workspace_bytes == 16779423
    fixes = replace(fix_set(), fixes=(*fix_set().fixes, fix))
    assert tunableop_export(fixes, "2.14.1").workspace_kib == math.ceil(16779423 / 1024) == 16387
    # a pin the file does not carry needs no workspace from torch
    beta = replace(fix, problem=replace(fix.problem, beta=1.0))
    fixes = replace(fix_set(), fixes=(*fix_set().fixes, beta))
    assert tunableop_export(fixes, "2.14.1").workspace_kib == 1024
    env = tunableop_environment(Path("x"), 512)
    assert env["CUBLASLT_WORKSPACE_SIZE"] == "1024"


def _posed(**changes: object) -> str:
    """Why the recorded 1856^3 batch 8 pin would not be carried were its call posed otherwise
    (only the problem decides; the times stay the recorded ones)."""
    fix = fix_set().fixes[0]
    return not_carried_reason(replace(fix, problem=replace(fix.problem, **changes)))


def test_what_a_row_cannot_carry() -> None:
    assert _posed() == ""
    assert "FP32 data with COMPUTE_32F_FAST_16BF" in _posed(mode="bf16x")
    assert _posed(mode="tf32") == ""
    assert "predates layouts" in _posed(layout_known=False)
    assert "operand A's batch stride 0 (shared by the batch)" in _posed(stride_a=0)
    assert "operand B's batch stride 1 is not the packed 3444736" in _posed(stride_b=1)
    assert "beta 1" in _posed(beta=1.0)
    assert "bias epilogue on a batched call" in _posed(bias=True)
    assert "a pad fix" in not_carried_reason(pad_fix())


def test_a_tf32_pin_is_a_tf32_row_and_says_so() -> None:
    fix = fix_set().fixes[0]
    tf32 = replace(fix, problem=replace(fix.problem, mode="tf32"))
    export = tunableop_export(replace(fix_set(), fixes=(tf32,)), "2.14.1")
    assert export.file.rows[0].op_signature == "GemmStridedBatchedTunableOp_tf32_NN"
    assert export.torch_settings == [tunableop.TORCH_SETTINGS["tf32"]]


def test_two_fixes_of_one_call_keep_the_first() -> None:
    first = fix_set().fixes[0]
    again = replace(first, id="again")
    export = tunableop_export(replace(fix_set(), fixes=(first, again)), "2.14.1")
    assert export.carried == ("pin-1856",)
    assert "fix pin-1856 already pins this call" in export.not_carried[0].reason


def test_the_torch_version(monkeypatch: pytest.MonkeyPatch) -> None:
    assert pt_version("2.14.1+cu130") == "2.14.1"
    assert pt_version("2.15.0a0+git5c48869") == "2.15.0"
    with pytest.raises(AuditError, match=r"not MAJOR\.MINOR\.PATCH"):
        pt_version("2.14")
    monkeypatch.setattr(tunableop, "_installed_torch", lambda: "2.14.1+cu130")
    assert pt_version() == "2.14.1"
    monkeypatch.setattr(tunableop, "_installed_torch", lambda: None)
    with pytest.raises(AuditError, match="give --torch-version") as raised:
        tunableop_export(fix_set())
    assert "\n" not in str(raised.value)


def test_a_stamp_without_a_cublas_version_is_one_line() -> None:
    fixes = replace(fix_set(), stamp=replace(fix_set().stamp, cublas_version="unknown"))
    with pytest.raises(AuditError, match=r"cuBLAS version 'unknown' is not MAJOR\.MINOR\.PATCH"):
        tunableop_export(fixes, "2.14.1")
