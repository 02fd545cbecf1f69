"""PyTorch TunableOp's results file, as torch 2.14 reads and writes it: a typed model, its parser
and its renderer (docs/schema.md, "The TunableOp file").

The format, from the files torch 2.14.1 wrote on the H100 (tests/fixtures/tunableop/) and its
headers (ATen/cuda/tunable/TunableGemm.h, GemmCommon.h, GemmCublaslt.h):

    Validator,PT_VERSION,2.14.1
    Validator,CUBLASLT_VERSION,130100
    Validator,CUDA_DEVICE,9.0:NVIDIA H100 80GB HBM3
    GemmTunableOp_float_NN,nn_2496_128_1600_ld_2496_1600_2496,Gemm_Cublaslt_id_20_tile_18_...,0.0565478

A row is `<op>_<dtype>_<TT>,<params>,<solution>,<ms>`: the operator (GemmTunableOp,
GemmAndBiasTunableOp for the bias epilogue, GemmStridedBatchedTunableOp), the element type as
TunableOp names it (float, tf32 for float under torch's TF32 setting, Half, BFloat16, double),
the transposes; the parameters `<tt>_<m>_<n>_<k>[_B_<batch>]_ld_<lda>_<ldb>_<ldc>` in cuBLAS's
column-major terms (batch only for the strided-batched op; no strides, no beta); the solution
`Default` or a cuBLASLt algorithm by its attribute numbers; the time in ms as C++ streams print a
double (six significant digits). This module is below report and run so that the writer
(report.tunableop) and whatever reads a file back (`verify --torch`) share it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from cublas_audit.errors import AuditError

OPS = ("GemmTunableOp", "GemmAndBiasTunableOp", "GemmStridedBatchedTunableOp")
BATCHED_OP = "GemmStridedBatchedTunableOp"
BIAS_OP = "GemmAndBiasTunableOp"
DEFAULT = "Default"
VALIDATOR = "Validator"
# The validators torch 2.14 writes on CUDA and checks on reading (every file in
# tests/fixtures/tunableop/): a key misspelt is no validator TunableOp checks, so it is refused.
VALIDATOR_KEYS = ("PT_VERSION", "CUBLASLT_VERSION", "CUDA_DEVICE")
# The element type TunableOp names in a row, per cublas-audit mode (TunableGemm.h TypeName):
# `tf32` is float data while torch allows TF32 (torch.backends.cuda.matmul.allow_tf32), which is
# also when it runs cuBLASLt with CUBLAS_COMPUTE_32F_FAST_TF32 (CublasLtUtils.h). bf16x (FP32
# data, COMPUTE_32F_FAST_16BF) has no name: torch never asks cuBLASLt for that compute type.
DTYPE_OF_MODE = {"fp32": "float", "tf32": "tf32", "fp16": "Half", "bf16": "BFloat16"}

_OP = re.compile(rf"^({'|'.join(OPS)})_(.+)_([NT])([NT])$")
_PARAMS = re.compile(r"^([nt])([nt])_(\d+)_(\d+)_(\d+)(?:_B_(\d+))?_ld_(\d+)_(\d+)_(\d+)$")
_SOLUTION = re.compile(
    r"^Gemm_Cublaslt_id_(-?\d+)_tile_(\d+)_stages_(\d+)_splitk_(-?\d+)_red_(\d+)_swizzle_(\d+)"
    r"_custom_(\d+)_inner_(\d+)_cluster_(\d+)$"
)


@dataclass(frozen=True)
class LtSolution:
    """A cuBLASLt algorithm as TunableOp names it: every attribute as cuBLASLt's number."""

    algo_id: int
    tile: int
    stages: int
    split_k: int
    reduction: int
    swizzle: int
    custom: int
    inner: int
    cluster: int

    @property
    def text(self) -> str:
        return (
            f"Gemm_Cublaslt_id_{self.algo_id}_tile_{self.tile}_stages_{self.stages}"
            f"_splitk_{self.split_k}_red_{self.reduction}_swizzle_{self.swizzle}"
            f"_custom_{self.custom}_inner_{self.inner}_cluster_{self.cluster}"
        )

    @classmethod
    def parse(cls, text: str) -> LtSolution | None:
        match = _SOLUTION.match(text)
        return cls(*(int(group) for group in match.groups())) if match else None


@dataclass(frozen=True)
class TunableRow:
    """One row: which GEMM call (op, dtype, transposes, sizes, leading dimensions; batch for the
    strided-batched op only) runs which solution (None: `Default`, torch's own call)."""

    op: str
    dtype: str
    transa: str
    transb: str
    m: int
    n: int
    k: int
    batch: int | None
    lda: int
    ldb: int
    ldc: int
    solution: LtSolution | None
    ms: float

    @property
    def op_signature(self) -> str:
        return f"{self.op}_{self.dtype}_{(self.transa + self.transb).upper()}"

    @property
    def params(self) -> str:
        batch = f"_B_{self.batch}" if self.batch is not None else ""
        return (
            f"{self.transa}{self.transb}_{self.m}_{self.n}_{self.k}{batch}"
            f"_ld_{self.lda}_{self.ldb}_{self.ldc}"
        )

    @property
    def solution_text(self) -> str:
        return self.solution.text if self.solution else DEFAULT

    @property
    def line(self) -> str:
        # `:g` is C's %g, six significant digits: what TunableOp's `stream << double` writes
        return f"{self.op_signature},{self.params},{self.solution_text},{self.ms:g}"


@dataclass(frozen=True)
class TunableFile:
    """A results file: its validators in order (key, value), then its rows."""

    validators: tuple[tuple[str, str], ...]
    rows: tuple[TunableRow, ...]

    def validator(self, key: str) -> str | None:
        return next((value for name, value in self.validators if name == key), None)

    @property
    def text(self) -> str:
        lines = [f"{VALIDATOR},{key},{value}" for key, value in self.validators]
        return "\n".join([*lines, *(row.line for row in self.rows)]) + "\n"


def parse_tunableop(text: str, where: str = "TunableOp file") -> TunableFile:
    """A results file's text, every line checked: a malformed line is one AuditError naming it
    (`where:LINE: ...`). Blank lines are skipped."""
    validators: list[tuple[str, str]] = []
    rows: list[TunableRow] = []
    seen: dict[tuple[str, str], int] = {}
    names: dict[str, int] = {}  # each validator's line
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            if line.startswith(f"{VALIDATOR},"):
                validators.append(_validator(line))
                name = validators[-1][0]
                if name in names:
                    raise AuditError(
                        f"{where}:{number}: validator {name} is already on line {names[name]}"
                    )
                names[name] = number
                continue
            row = _row(line)
        except ValueError as exc:
            raise AuditError(f"{where}:{number}: {exc}: {line[:200]!r}") from None
        key = (row.op_signature, row.params)
        if key in seen:
            raise AuditError(
                f"{where}:{number}: {row.op_signature} {row.params} is already on line {seen[key]}"
            )
        seen[key] = number
        rows.append(row)
    return TunableFile(tuple(validators), tuple(rows))


def read_tunableop(path: Path) -> TunableFile:
    """A results file from disk: the one way the package reads one (one line for a file that
    cannot be read or is not text)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AuditError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise AuditError(
            f"{path}: not a TunableOp file: not UTF-8 text (byte {exc.start})"
        ) from None
    return parse_tunableop(text, str(path))


def _validator(line: str) -> tuple[str, str]:
    parts = line.split(",", 2)
    if len(parts) != 3 or not parts[1]:
        raise ValueError("a Validator line is `Validator,KEY,VALUE`")
    key, value = parts[1], parts[2]
    if key not in VALIDATOR_KEYS:
        raise ValueError(f"unknown validator {key!r} (known: {', '.join(VALIDATOR_KEYS)})")
    if key == "PT_VERSION" and not re.fullmatch(r"\d+\.\d+\.\d+", value):
        raise ValueError(f"PT_VERSION {value!r} is not torch's MAJOR.MINOR.PATCH")
    if key == "CUBLASLT_VERSION" and not value.isdigit():
        raise ValueError(f"CUBLASLT_VERSION {value!r} is not cuBLASLt's version number")
    return key, value


def _row(line: str) -> TunableRow:
    parts = line.split(",")
    if len(parts) != 4:
        raise ValueError(
            f"a row has 4 fields (operator, parameters, solution, ms), not {len(parts)}"
        )
    op_text, params_text, solution_text, ms_text = parts
    op = _OP.match(op_text)
    if not op:
        raise ValueError(f"operator {op_text!r} is not <{'|'.join(OPS)}>_<dtype>_<NN|NT|TN|TT>")
    params = _PARAMS.match(params_text)
    if not params:
        raise ValueError(
            f"parameters {params_text!r} are not <tt>_<m>_<n>_<k>[_B_<b>]_ld_<lda>_<ldb>_<ldc>"
        )
    transa, transb, m, n, k, batch, lda, ldb, ldc = params.groups()
    if (transa + transb).upper() != op[3] + op[4]:
        raise ValueError(f"parameters {transa}{transb} do not match the operator's {op[3]}{op[4]}")
    if (batch is not None) != (op[1] == BATCHED_OP):
        raise ValueError(f"only {BATCHED_OP} parameters carry _B_<batch>")
    solution = LtSolution.parse(solution_text)
    if solution is None and solution_text != DEFAULT:
        raise ValueError(f"solution {solution_text!r} is neither {DEFAULT} nor Gemm_Cublaslt_...")
    return TunableRow(
        op=op[1],
        dtype=op[2],
        transa=transa,
        transb=transb,
        m=int(m),
        n=int(n),
        k=int(k),
        batch=None if batch is None else int(batch),
        lda=int(lda),
        ldb=int(ldb),
        ldc=int(ldc),
        solution=solution,
        ms=_ms(ms_text),
    )


def _ms(text: str) -> float:
    try:
        ms = float(text)
    except ValueError:
        raise ValueError(f"time {text!r} is not a number") from None
    if not math.isfinite(ms) or ms < 0:
        raise ValueError(f"time {text!r} is not a time in ms")
    return ms
