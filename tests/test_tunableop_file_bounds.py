"""table/tunableop_file.py pinned (issue 39 item 6): torch 2.14.1's recorded results files
(tests/fixtures/tunableop) parsed and written back byte for byte, and each malformed line named
by its number, at each field's edge (4 fields, 3 validator parts, a batch only on the batched op,
a time of 0 ms and none below)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.table.tunableop_file import LtSolution, parse_tunableop, read_tunableop
from tests.conftest import FIXTURES

FILES = sorted((FIXTURES / "tunableop").glob("*.csv"))
MODELS = FIXTURES / "tunableop" / "tunableop_h100_torch2.14.1_models.csv"
HEAD = "Validator,PT_VERSION,2.14.1\nValidator,CUBLASLT_VERSION,130100\n"
ROW = "GemmTunableOp_float_NN,nn_2112_64_2048_ld_2112_2048_2112,Default,0.0409622"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_a_recorded_file_reads_and_writes_back_the_same_bytes(path: Path) -> None:
    found = read_tunableop(path)
    assert found.text == path.read_text()
    assert found.validator("PT_VERSION") == "2.14.1" and found.validator("NOPE") is None


def test_the_models_file_rows() -> None:
    found = read_tunableop(MODELS)
    assert len(found.rows) == 64
    batched = [r for r in found.rows if r.batch is not None]
    assert len(batched) == 4 and {r.op for r in batched} == {"GemmStridedBatchedTunableOp"}
    assert "_B_" in batched[0].params and "_B_" not in found.rows[0].params
    assert sum(r.solution is None for r in found.rows) == 28  # Default: torch's own call
    solved = next(r for r in found.rows if r.solution is not None)
    assert solved.solution_text == solved.solution.text  # type: ignore[union-attr]
    assert LtSolution.parse(solved.solution_text) == solved.solution


def fault(text: str) -> str:
    with pytest.raises(AuditError) as caught:
        parse_tunableop(text, "t.csv")
    return str(caught.value)


def test_rows_and_their_line_numbers() -> None:
    found = parse_tunableop(HEAD + "\n" + ROW + "\n")
    (row,) = found.rows
    assert (row.m, row.n, row.k, row.batch, row.lda, row.ms) == (
        2112,
        64,
        2048,
        None,
        2112,
        0.0409622,
    )
    assert row.line == ROW and row.op_signature == "GemmTunableOp_float_NN"
    assert fault(HEAD + ROW + "\n" + ROW) == (
        "t.csv:4: GemmTunableOp_float_NN nn_2112_64_2048_ld_2112_2048_2112 is already on line 3"
    )
    assert fault(HEAD + "Validator,PT_VERSION,2.14.1\n").startswith(
        "t.csv:3: validator PT_VERSION is already on line 1"
    )


def test_validator_lines() -> None:
    assert fault("Validator,PT_VERSION").startswith(
        "t.csv:1: a Validator line is `Validator,KEY,VALUE`"
    )
    assert fault("Validator,,x").startswith("t.csv:1: a Validator line is")
    assert parse_tunableop("Validator,CUDA_DEVICE,9.0:a,b\n").validator("CUDA_DEVICE") == "9.0:a,b"
    assert fault("Validator,PT_VERSON,2.14.1").startswith("t.csv:1: unknown validator 'PT_VERSON'")
    assert "is not torch's MAJOR.MINOR.PATCH" in fault("Validator,PT_VERSION,2.14")
    assert "is not cuBLASLt's version number" in fault("Validator,CUBLASLT_VERSION,13.1")
    assert (
        parse_tunableop("Validator,CUBLASLT_VERSION,130100").validator("CUBLASLT_VERSION")
        == "130100"
    )


def test_row_fields() -> None:
    assert "a row has 4 fields (operator, parameters, solution, ms), not 3" in fault(
        ROW.rsplit(",", 1)[0]
    )
    assert "a row has 4 fields" in fault(ROW + ",1")
    assert "is not <GemmTunableOp|" in fault(ROW.replace("GemmTunableOp_float_NN", "Gemm_float_NN"))
    assert "are not <tt>_<m>" in fault(ROW.replace("nn_2112", "nn_x"))
    assert "parameters tn do not match the operator's NN" in fault(
        ROW.replace("nn_2112", "tn_2112")
    )
    assert "parameters nt do not match" in fault(ROW.replace("nn_2112", "nt_2112"))
    assert "only GemmStridedBatchedTunableOp parameters carry _B_<batch>" in fault(
        ROW.replace("_ld_", "_B_4_ld_")
    )
    batched = ROW.replace("GemmTunableOp", "GemmStridedBatchedTunableOp").replace(
        "_ld_", "_B_4_ld_"
    )
    assert parse_tunableop(batched).rows[0].batch == 4
    assert "only GemmStridedBatchedTunableOp" in fault(batched.replace("_B_4", ""))
    assert "is neither Default nor Gemm_Cublaslt_" in fault(ROW.replace("Default", "default"))


def test_times_from_zero() -> None:
    assert parse_tunableop(ROW.replace("0.0409622", "0")).rows[0].ms == 0.0
    assert "time 'x' is not a number" in fault(ROW.replace("0.0409622", "x"))
    for text in ("-0.5", "inf", "nan"):
        assert f"time {text!r} is not a time in ms" in fault(ROW.replace("0.0409622", text))


def test_a_file_that_is_no_text(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="cannot read"):
        read_tunableop(tmp_path / "none.csv")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe")
    with pytest.raises(AuditError, match=r"not UTF-8 text \(byte 0\)"):
        read_tunableop(tmp_path / "bin.csv")
