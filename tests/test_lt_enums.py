"""cuBLASLt's enum names and numbers (planning.lt_enums, data/cublaslt_enums.json): the names the
recorded candidates tables hold, the numbers cuBLASLt's header and nvmath give them."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning.lt_enums import SPECS, enum_number, lt_enums
from tests.conftest import REPORTS
from tests.cublaslt_header import cublaslt_include

TOOL = Path(__file__).resolve().parent.parent / "tools" / "cublaslt_enums.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cublaslt_enums", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_numbers_torch_wrote_for_the_h100_pins() -> None:
    # tunableop_h100_torch2.14.1.csv: the fp32 2496x128x1600 pin (algo 20, tile 128x64, stages
    # 8x5, split-K 2, INPLACE) is tile_18_stages_28_red_1_cluster_0; the bf16 pins run on
    # cluster 4 (4x1x1)
    assert enum_number("tile", "128x64") == 18
    assert enum_number("stages", "8x5") == 28
    assert enum_number("reduction_scheme", "INPLACE") == 1
    assert enum_number("cluster_shape", "AUTO") == 0
    assert enum_number("cluster_shape", "4x1x1") == 4
    schemes = {"NONE": 0, "INPLACE": 1, "COMPUTE_TYPE": 2, "OUTPUT_TYPE": 4}
    assert {name: enum_number("reduction_scheme", name) for name in schemes} == schemes


def test_every_name_the_recorded_candidates_tables_hold_has_its_number() -> None:
    names: dict[str, set[str]] = {column: set() for column in SPECS}
    for path in REPORTS.rglob("candidates.csv"):
        with path.open() as handle:
            for row in csv.DictReader(handle):
                for column in SPECS:
                    names[column].add(row[column])
    assert "128x128" in names["tile"] and "64xAUTO" in names["stages"]
    for column, found in names.items():
        enum = lt_enums()[column]
        for name in found:
            assert enum.name(enum.number(name)) == name, (column, name)


def test_names_and_numbers_are_one_to_one() -> None:
    for enum in lt_enums().values():
        assert len(set(enum.values.values())) == len(enum.values)
        assert all(enum.name(number) == name for name, number in enum.values.items())


def test_a_number_the_binding_did_not_know_maps_to_itself() -> None:
    assert enum_number("tile", "201") == 201
    assert enum_number("stages", "66") == 66
    assert lt_enums()["tile"].name(9999) == "9999"
    assert lt_enums()["tile"].c_name("9999") is None
    assert lt_enums()["stages"].c_name("8x5") == "CUBLASLT_MATMUL_STAGES_8x5"


def test_an_unknown_name_is_one_line() -> None:
    with pytest.raises(AuditError, match=r"tile '128x64x' is not a cublasLtMatmulTile_t name"):
        enum_number("tile", "128x64x")


@pytest.mark.skipif(cublaslt_include() is None, reason="no cublasLt.h here (tests/cublaslt_header)")
def test_every_member_of_cublas_header_has_the_same_number() -> None:
    # The header may be an older or newer cuBLAS than the nvmath the file came from: a member
    # both know has one number.
    include = cublaslt_include()
    assert include is not None
    header = (include / "cublasLt.h").read_text()
    tool = _tool()
    for column, spec in SPECS.items():
        members = tool._members(header, spec)
        assert members, column
        known = lt_enums()[column].values
        assert {name: known.get(name) for name in members} == members, column


def test_the_tool_reads_both_spellings() -> None:
    tool = _tool()
    # the lines as nvmath 1.0's cycublasLt.pxd and cuBLAS 13.1's cublasLt.h spell them
    pxd = '    CUBLASLT_MATMUL_STAGES_8x5 "CUBLASLT_MATMUL_STAGES_8x5" = 28\n'
    header = "typedef enum {\n  CUBLASLT_MATMUL_STAGES_8x5 = 28,\n  CUBLASLT_MATMUL_STAGES_END\n}"
    mask = "  CUBLASLT_REDUCTION_SCHEME_MASK = 0x7,\n"
    assert tool._members(pxd, SPECS["stages"]) == {"8x5": 28}
    assert tool._members(header, SPECS["stages"]) == {"8x5": 28}
    assert tool._members(mask, SPECS["reduction_scheme"]) == {"MASK": 7}


@pytest.mark.gpu
def test_the_file_is_the_installed_nvmath() -> None:
    # What the probe records is nvmath's member name less its prefix (device.lt._enum_name):
    # the shipped file must give every one of them its number, and nothing else.
    from nvmath.bindings import cublasLt

    from cublas_audit.device.lt import _enum_name

    _, enums = _tool().from_nvmath()
    for column, values in enums.items():
        assert dict(lt_enums()[column].values) == values, column
        for number in values.values():
            name = _enum_name(cublasLt, column, number)
            assert name is not None and lt_enums()[column].number(name) == number
