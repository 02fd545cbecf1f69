"""table.tunableop_file: PyTorch TunableOp's results file, on the two files torch 2.14.1 wrote on
the H100 (tests/fixtures/tunableop/, copied unchanged from the GPU machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table.tunableop_file import (
    LtSolution,
    TunableRow,
    parse_tunableop,
    read_tunableop,
)
from tests.conftest import FIXTURES

TUNABLEOP = FIXTURES / "tunableop"
PINS = TUNABLEOP / "tunableop_h100_torch2.14.1.csv"
MODELS = TUNABLEOP / "tunableop_h100_torch2.14.1_models.csv"


@pytest.mark.parametrize("path", [PINS, MODELS], ids=["pins", "models"])
def test_every_row_torch_wrote_renders_back_exactly(path: Path) -> None:
    text = path.read_text()
    parsed = read_tunableop(path)
    assert parsed.text == text
    assert [row.line for row in parsed.rows] == text.splitlines()[3:]


def test_the_validators() -> None:
    parsed = read_tunableop(PINS)
    assert parsed.validator("PT_VERSION") == "2.14.1"
    assert parsed.validator("CUBLASLT_VERSION") == "130100"
    assert parsed.validator("CUDA_DEVICE") == "9.0:NVIDIA H100 80GB HBM3"
    assert parsed.validator("HIPBLASLT_VERSION") is None
    assert len(parsed.rows) == 8


def test_a_pinned_row_in_its_fields() -> None:
    first = read_tunableop(PINS).rows[0]
    assert first == TunableRow(
        op="GemmTunableOp",
        dtype="float",
        transa="n",
        transb="n",
        m=2496,
        n=128,
        k=1600,
        batch=None,
        lda=2496,
        ldb=1600,
        ldc=2496,
        solution=LtSolution(20, 18, 28, 2, 1, 0, 0, 0, 0),
        ms=0.0565478,
    )


def test_the_other_operators_and_a_default_solution() -> None:
    rows = {(r.op_signature, r.params): r for r in read_tunableop(MODELS).rows}
    batched = rows["GemmStridedBatchedTunableOp_BFloat16_TN", "tn_512_512_128_B_64_ld_128_128_512"]
    assert (batched.op, batched.batch, batched.transa, batched.solution) == (
        "GemmStridedBatchedTunableOp", 64, "t", None,
    )  # fmt: skip
    bias = rows["GemmAndBiasTunableOp_Half_TN", "tn_768_12608_3072_ld_3072_3072_768"]
    assert (bias.op, bias.dtype, bias.batch) == ("GemmAndBiasTunableOp", "Half", None)
    assert bias.solution is not None and (bias.solution.tile, bias.solution.cluster) == (209, 5)
    # a non-tiled algorithm: tile and stages 0, split-K -1
    gemv = rows["GemmTunableOp_float_TN", "tn_32000_4_2048_ld_2048_2048_32000"]
    assert gemv.solution == LtSolution(11, 0, 0, -1, 2, 0, 0, 0, 0)
    assert {r.dtype for r in rows.values()} == {"float", "double", "BFloat16", "Half"}


def _broken(line_number: int, line: str) -> str:
    lines = PINS.read_text().splitlines()
    lines[line_number - 1] = line
    return "\n".join(lines) + "\n"


FIRST = (
    "GemmTunableOp_float_NN,nn_2496_128_1600_ld_2496_1600_2496,"
    "Gemm_Cublaslt_id_20_tile_18_stages_28_splitk_2_red_1_swizzle_0_custom_0_inner_0_cluster_0,"
    "0.0565478"
)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (FIRST.rsplit(",", 1)[0], "4 fields"),
        (FIRST.replace("float_NN", "float_TN"), "do not match the operator's TN"),
        (FIRST.replace("GemmTunableOp", "GemmTunable"), "operator 'GemmTunable_float_NN'"),
        (FIRST.replace("1600_ld", "1600_B_8_ld"), "only GemmStridedBatchedTunableOp"),
        (FIRST.replace("_cluster_0", ""), "neither Default nor Gemm_Cublaslt"),
        (FIRST.replace("Gemm_Cublaslt", "Gemm_Hipblaslt"), "neither Default nor Gemm_Cublaslt"),
        (FIRST.replace("0.0565478", "nan"), "not a time"),
        (FIRST.replace("0.0565478", "fast"), "not a number"),
        (FIRST.replace("_ld_2496_1600_2496", "_ld_2496_1600"), "are not <tt>"),
        ("Validator,PT_VERSION", "Validator,KEY,VALUE"),
    ],
)
def test_a_malformed_line_is_one_error_naming_it(line: str, says: str) -> None:
    with pytest.raises(AuditError, match=r"^pins.csv:6: ") as raised:
        parse_tunableop(_broken(6, line), "pins.csv")
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_a_repeated_problem_names_both_lines() -> None:
    text = PINS.read_text()
    repeated = text + text.splitlines()[4] + "\n"
    with pytest.raises(AuditError, match=r"^pins.csv:12: .*already on line 5$"):
        parse_tunableop(repeated, "pins.csv")


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="cannot read"):
        read_tunableop(tmp_path / "tunableop0.csv")
