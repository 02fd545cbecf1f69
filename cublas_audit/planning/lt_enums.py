"""cuBLASLt's algorithm enums as names and numbers, without a GPU or nvmath.

The candidates table (and fix.json's `Pin`) records four algorithm attributes by the names
nvmath's enums give them, less a prefix (device.lt `_enum_name`): tile '128x64', stages '8x5',
reduction scheme 'INPLACE', cluster shape '4x1x1' or 'AUTO'. What is written for another program
(a TunableOp results file, a C snippet) needs cuBLASLt's numbers instead: this module maps one to
the other through cublas_audit/data/cublaslt_enums.json, which tools/cublaslt_enums.py generates
from nvmath's enums (tests/test_lt_enums.py checks it against them on a GPU machine). A value the
binding did not know is recorded as its number ('201'); it maps to itself.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cublas_audit.errors import AuditError

ENUMS_FILE = Path(__file__).resolve().parent.parent / "data" / "cublaslt_enums.json"

# cuBLASLt never assumes more than 256-byte alignment; telling it less than the truth only
# hides candidates, telling it more makes them fail.
MAX_ALIGNMENT = 256

# The attributes that rebuild an algorithm besides its id, in the order they are set:
# (MatmulAlgoConfigAttribute, the LtCandidate / Pin field). The enum ones (planning.lt_enums.SPECS
# names their enums) are kept as names without the prefix ('128x64', 'INPLACE', '4x1x1'); a value
# the binding has no name for, as its number.
ALGO_ATTRIBUTES = (
    ("TILE_ID", "tile"),
    ("STAGES_ID", "stages"),
    ("SPLITK_NUM", "split_k"),
    ("REDUCTION_SCHEME", "reduction_scheme"),
    ("CTA_SWIZZLING", "cta_swizzling"),
    ("CUSTOM_OPTION", "custom_option"),
    ("INNER_SHAPE_ID", "inner_shape"),
    ("CLUSTER_SHAPE_ID", "cluster_shape"),
)


def alignment(*values: int) -> int:
    """Largest power of two dividing every pointer / stride in bytes, at most MAX_ALIGNMENT."""
    combined = 0
    for value in values:
        combined = math.gcd(combined, value)
    if combined == 0:
        return MAX_ALIGNMENT
    return min(MAX_ALIGNMENT, combined & -combined)


@dataclass(frozen=True)
class EnumSpec:
    """One enum: the table column holding it, its C type and the prefix its C names share, and
    nvmath's enum class with the prefix the table's names drop from nvmath's member names."""

    column: str
    c_type: str
    c_prefix: str
    nvmath_enum: str
    nvmath_prefix: str


SPECS: dict[str, EnumSpec] = {
    spec.column: spec
    for spec in (
        EnumSpec("tile", "cublasLtMatmulTile_t", "CUBLASLT_MATMUL_TILE_", "MatmulTile", "TILE_"),
        EnumSpec("stages", "cublasLtMatmulStages_t", "CUBLASLT_MATMUL_STAGES_", "MatmulStages",
                 "STAGES_"),
        EnumSpec("reduction_scheme", "cublasLtReductionScheme_t", "CUBLASLT_REDUCTION_SCHEME_",
                 "ReductionScheme", ""),
        EnumSpec("cluster_shape", "cublasLtClusterShape_t", "CUBLASLT_CLUSTER_SHAPE_",
                 "ClusterShape", "SHAPE_"),
    )
}  # fmt: skip

# The number attributes of an algorithm, each at most what cuBLASLt stores it as (cublasLt.h:
# cublasLtMatmulAlgoInit's int algoId; the config attributes' uint32_t and uint16_t), and a
# workspace no GPU has (1 TiB): what the candidates table and fix.json may hold.
NUMBER_LIMITS: dict[str, int] = {
    "algo_id": 2**31 - 1,
    "cta_swizzling": 2**32 - 1,
    "custom_option": 2**32 - 1,
    "inner_shape": 2**16 - 1,
    "workspace_bytes": 2**40,
}
# SPLITK_NUM (int32_t) as cuBLASLt itself reports it for an algorithm without split-K: the H100's
# heuristic gave -1 (algo 11) and 0 (algo 10) on the Llama trace's fp32 LM head (reports/h100/
# traces/20261125-093616-llama-v2/candidates.csv), and torch's TunableOp pinned `splitk_-1` itself.
# Otherwise 1..k: K is not cut into more parts than it has elements (k is within int32).
NO_SPLIT_K = (-1, 0)


def split_k_fault(split_k: int, k: int) -> str:
    """'' where cuBLASLt can take `split_k` on a problem of this k, else why not."""
    if min(NO_SPLIT_K) <= split_k <= k:
        return ""
    return (
        f"split_k {split_k} is not in {min(NO_SPLIT_K)}..{k} (cuBLASLt's -1 or 0 for no split, "
        "else at most the problem's k)"
    )


@dataclass(frozen=True)
class LtEnum:
    """One enum's table names and their numbers."""

    spec: EnumSpec
    values: Mapping[str, int]

    def number(self, name: str) -> int:
        """'128x64' -> 18; a number the table kept as text ('201') is itself."""
        if name in self.values:
            return self.values[name]
        if name.isdigit():
            return int(name)
        raise AuditError(
            f"{self.spec.column} {name!r} is not a {self.spec.c_type} name this cublas-audit "
            f"knows ({ENUMS_FILE.name} comes from tools/cublaslt_enums.py)"
        )

    def name(self, number: int) -> str:
        """18 -> '128x64'; a number the enum lacks stays a number, as the table keeps it."""
        for name, value in self.values.items():
            if value == number:
                return name
        return str(number)

    def c_name(self, name: str) -> str | None:
        """'128x64' -> 'CUBLASLT_MATMUL_TILE_128x64'; None for a bare number."""
        return self.spec.c_prefix + name if name in self.values else None


@functools.cache
def lt_enums() -> dict[str, LtEnum]:
    """The four enums by table column, from the shipped JSON (read once)."""
    data = json.loads(ENUMS_FILE.read_text())
    return {column: LtEnum(spec, data["enums"][column]) for column, spec in SPECS.items()}


def enum_number(column: str, name: str) -> int:
    """The cuBLASLt number of a table name: enum_number('stages', '8x5') == 28."""
    return lt_enums()[column].number(name)


def check_pin_names(names: Mapping[str, str]) -> None:
    """Every enum attribute of a pin (column -> table name) one this cuBLASLt table knows: a
    hand-edited tile is one AuditError before any GPU work."""
    for column, name in names.items():
        lt_enums()[column].number(name)
