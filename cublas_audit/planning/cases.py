"""The plan: `Case` records from the CLI's grid, with stable case ids.

A case id names one cuBLAS / cuBLASLt call; it is the NVTX range the probe opens around the call
and the key that ties ncu's launches, the timings and the table rows together. Ids only use
`[A-Za-z0-9._-]`, so they are safe in file names, NVTX filters and regexes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.files import write_text_atomic
from cublas_audit.planning.modes import MODE_NAMES as MODES
from cublas_audit.planning.modes import mode as mode_of

DEFAULT_SIZES = (256, 512, 1024, 2048, 4096, 8192)
DEFAULT_BATCHES = (4, 8, 16)
# Workspace a cuBLASLt call may use, bytes: what the sweep's cuBLASLt cases and every candidate of
# the candidate audit are given (cuBLAS's own default on Hopper is 32 MiB too).
DEFAULT_WORKSPACE_BYTES = 32 * 1024 * 1024

LOOP_ROUTINE = "sgemm-loop"
APIS = ("cublas", "cublasLt")
_SAFE_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DIGITS = re.compile(r"[0-9]+")
# cuBLAS takes m, n, k and the batch count as 32-bit ints.
MAX_DIMENSION = 2**31 - 1
# No GPU holds a case this large; smaller ones that do not fit this GPU are skipped by the probe
# (recorded with the reason), but this one is refused before anything runs.
MAX_CASE_BYTES = 2**44


@dataclass(frozen=True)
class OperandLayout:
    """How one operand sits in memory, in cuBLAS's column-major terms: a `rows` x `cols` matrix
    with leading dimension `ld` (>= rows), batch entry i at offset i * `stride` elements, and
    `stored` entries really held (1 for a broadcast operand, whose stride is 0)."""

    rows: int
    cols: int
    ld: int
    stride: int
    stored: int

    @property
    def elements(self) -> int:
        return self.stored * self.cols * self.ld


@dataclass(frozen=True, order=True)
class Case:
    """One GEMM call, in cuBLAS's column-major terms:
    C (m x n) = alpha * op(A) (m x k) @ op(B) (k x n) + beta * C, `batch` times.

    transa / transb: "n" (op(X) = X) or "t" (op(X) = X^T: A is stored k x m, B n x k). In a
    row-major user's terms (NumPy, PyTorch) the same call computes C^T = op(B)^T op(A)^T, so a
    row-major `X @ W.T` is cuBLAS's transa "t" on W (see docs/schema.md).
    lda / ldb: leading dimensions; 0 means packed (the stored rows). broadcast: "a" or "b" gives
    that operand batch stride 0 (one matrix shared by the batch). strided: call the
    strided-batched routine even at batch 1. bias (cuBLASLt): the BIAS epilogue adds a vector of
    m values to every column. workspace_mib (cuBLASLt): the workspace limit, -1 for the default.
    """

    api: str
    mode: str
    m: int
    n: int
    k: int
    batch: int
    transa: str = "n"
    transb: str = "n"
    loop: bool = False
    lda: int = 0
    ldb: int = 0
    broadcast: str = ""
    beta: float = 0.0
    strided: bool = False
    bias: bool = False
    workspace_mib: int = -1

    def __post_init__(self) -> None:
        for name in ("transa", "transb"):
            if getattr(self, name) not in TRANSPOSES:
                raise AuditError(f"{name}: {getattr(self, name)!r} is not one of n, t")
        if self.broadcast not in BROADCASTS:
            raise AuditError(f"broadcast: {self.broadcast!r} is not one of a, b (or empty)")
        a, b = self.operand("a"), self.operand("b")
        for name, layout, given in (("lda", a, self.lda), ("ldb", b, self.ldb)):
            if given and given < layout.rows:
                raise AuditError(
                    f"{self.case_id}: {name} {given} is smaller than the {layout.rows} rows "
                    "of the stored operand"
                )
        if not math.isfinite(self.beta):
            raise AuditError(f"beta: {self.beta!r} is not a finite number")
        if (self.bias or self.workspace_mib >= 0) and self.api != "cublasLt":
            raise AuditError("--bias and --workspace-mib are cuBLASLt settings (--api cublasLt)")

    @property
    def batched_call(self) -> bool:
        return self.batch > 1 or self.strided

    @property
    def routine(self) -> str:
        if self.loop:
            return LOOP_ROUTINE
        if self.api == "cublasLt":
            return "cublasLtMatmul"
        if self.mode == "fp32":
            return "cublasSgemmStridedBatched" if self.batched_call else "cublasSgemm"
        return "cublasGemmStridedBatchedEx" if self.batched_call else "cublasGemmEx"

    @property
    def layout(self) -> str:
        return self.transa + self.transb

    @property
    def case_id(self) -> str:
        """`api.mode.MxNxK.bB.layout`, then only the settings that differ from the defaults."""
        api = "loop" if self.loop else self.api
        problem = [api, self.mode, f"{self.m}x{self.n}x{self.k}", f"b{self.batch}"]
        return ".".join([*problem, self.layout, *self._settings()])

    @property
    def variant(self) -> str:
        """How the problem is posed where it is not the default: 'tn lda7 bcast-b', or ''."""
        parts = [self.layout] if self.layout != "nn" else []
        return " ".join([*parts, *self._settings()])

    def _settings(self) -> list[str]:
        parts = [f"lda{self.lda}"] if self.lda else []
        parts += [f"ldb{self.ldb}"] if self.ldb else []
        parts += [f"bcast-{self.broadcast}"] if self.broadcast else []
        parts += [f"beta{_number_id(self.beta)}"] if self.beta else []
        parts += ["strided"] if self.strided and self.batch == 1 else []
        parts += ["bias"] if self.bias else []
        parts += [f"ws{self.workspace_mib}m"] if self.workspace_mib >= 0 else []
        return parts

    @property
    def reference_computes(self) -> bool:
        """Whether the bundled reference SGEMM computes this call's C: a classic FP32 call,
        packed and untransposed, beta 0, nothing else set."""
        plain = Case("cublas", "fp32", self.m, self.n, self.k, self.batch, strided=self.strided)
        return self == plain

    @property
    def profiled(self) -> bool:
        """Loop companions are only timed: their kernel is the single call's."""
        return not self.loop

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    def operand(self, name: str) -> OperandLayout:
        """The memory layout of operand "a", "b" or "c" (C is packed and never broadcast)."""
        if name == "c":
            return OperandLayout(self.m, self.n, self.m, self.m * self.n, self.batch)
        trans, ld = (self.transa, self.lda) if name == "a" else (self.transb, self.ldb)
        rows, cols = (self.m, self.k) if name == "a" else (self.k, self.n)
        if trans == "t":
            rows, cols = cols, rows
        ld = ld or rows
        shared = self.broadcast == name
        return OperandLayout(
            rows, cols, ld, 0 if shared else cols * ld, 1 if shared else self.batch
        )

    @property
    def bytes_needed(self) -> int:
        item = mode_of(self.mode).element_bytes
        elements = sum(self.operand(name).elements for name in "abc")
        return item * (elements + (self.m if self.bias else 0))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "case_id": self.case_id, "routine": self.routine}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        fields = {k: data[k] for k in ("api", "mode", "m", "n", "k", "batch")}
        optional = {
            name: kind(data[name])
            for name, kind in _OPTIONAL_FIELDS.items()
            if data.get(name) is not None
        }
        return cls(**fields, **optional)


TRANSPOSES = ("n", "t")
LAYOUTS = ("nn", "nt", "tn", "tt")
BROADCASTS = ("", "a", "b")
# Case fields beyond the problem, with their types: a plan written before one existed reads as
# the default.
_OPTIONAL_FIELDS: dict[str, Any] = {
    "transa": str,
    "transb": str,
    "loop": bool,
    "lda": int,
    "ldb": int,
    "broadcast": str,
    "beta": float,
    "strided": bool,
    "bias": bool,
    "workspace_mib": int,
}


def _number_id(value: float) -> str:
    """0.5 -> '0p5', -1.0 -> 'm1': a number safe in a case id."""
    text = f"{value:g}".replace("-", "m").replace(".", "p").replace("+", "")
    return text


# A range item expands to at most this many values: a typo must not plan a billion cases.
MAX_RANGE_ITEMS = 100_000


def parse_int_list(text: str, what: str) -> list[int]:
    """'256,512' -> [256, 512]; 'FIRST:LAST:STEP' ranges too ('64:4096:64', LAST included):
    dense grids for dispatch maps. Anything else is a one-line error."""
    found: set[int] = set()
    for item in _items(text, what):
        if ":" in item:
            found.update(_range(item, what))
        else:
            found.add(_positive(item, what))
    return sorted(found)


def _range(item: str, what: str) -> range:
    parts = item.split(":")
    if len(parts) != 3:
        raise AuditError(f"{what}: {item!r} is not FIRST:LAST:STEP")
    first, last, step = (_positive(part, f"{what} {item!r}") for part in parts)
    if last < first:
        raise AuditError(f"{what}: {item!r} ends before it starts")
    values = range(first, last + 1, step)
    if len(values) > MAX_RANGE_ITEMS:
        raise AuditError(f"{what}: {item!r} has {len(values)} values, more than {MAX_RANGE_ITEMS}")
    return values


def _positive(item: str, what: str) -> int:
    """A positive integer in ASCII digits that cuBLAS's 32-bit ints can hold."""
    if not _DIGITS.fullmatch(item) or int(item) <= 0:
        raise AuditError(f"{what}: {item!r} is not a positive integer")
    if int(item) > MAX_DIMENSION:
        raise AuditError(f"{what}: {item} is larger than cuBLAS's 32-bit limit {MAX_DIMENSION}")
    return int(item)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in _items(text, "--shapes"):
        parts = item.lower().split("x")
        if len(parts) != 3:
            raise AuditError(f"--shapes: {item!r} is not MxNxK with positive integers")
        m, n, k = (_positive(part, f"--shapes {item!r}") for part in parts)
        shapes.append((m, n, k))
    return shapes


def parse_choices(text: str, what: str, allowed: Sequence[str]) -> list[str]:
    chosen = []
    for item in _items(text, what):
        match = next((a for a in allowed if a.lower() == item.lower()), None)
        if match is None:
            raise AuditError(f"{what}: unknown value {item!r} (choose from {', '.join(allowed)})")
        if match not in chosen:
            chosen.append(match)
    return chosen


def parse_modes(text: str) -> list[str]:
    return parse_choices(text, "--modes", MODES)


def parse_apis(text: str) -> list[str]:
    return parse_choices(text, "--api", APIS)


def check_label(label: str) -> str:
    if not _SAFE_LABEL.match(label) or label in (".", ".."):
        raise AuditError(
            f"--gpu-label: {label!r} is not a safe file name "
            "(use letters, digits, '.', '_' or '-', at most 64 characters)"
        )
    return label


def label_from_gpu_name(gpu_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; 'NVIDIA GeForce RTX 5090' -> '5090'."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", gpu_name) if w]
    skip = {"nvidia", "geforce", "rtx", "tesla", "quadro", "pcie", "sxm", "sxm5", "hbm3", "hbm3e"}
    meaningful = [
        w for w in words if w.lower() not in skip and not re.fullmatch(r"\d+gb", w.lower())
    ]
    label = (meaningful[0] if meaningful else "gpu").lower()
    return check_label(label)


def _items(text: str, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise AuditError(f"{what}: empty list")
    return items


def call_kinds(single: bool | None, batched: bool | None) -> tuple[bool, bool]:
    """`--batched` alone means batched only, `--single` alone single only, neither means both."""
    return (
        single if single is not None else batched is not True,
        batched if batched is not None else single is not True,
    )


@dataclass(frozen=True)
class Variants:
    """How each planned problem is posed beyond its size: layouts (cuBLAS's transa + transb),
    leading dimensions padded by `ld_pad` elements, a broadcast operand, beta, and for cuBLASLt
    calls the bias epilogue and a workspace limit (MiB, -1 for the default)."""

    layouts: tuple[str, ...] = ("nn",)
    ld_pad: int = 0
    broadcast: str = ""
    beta: float = 0.0
    bias: bool = False
    workspace_mib: int = -1

    def cases(self, api: str, mode: str, m: int, n: int, k: int, batch: int) -> list[Case]:
        """The calls of one problem: one per layout (with its loop companion where one applies)."""
        batched = batch > 1
        lt = api == "cublasLt"
        found = []
        for layout in self.layouts:
            plain = Case(api, mode, m, n, k, batch, layout[0], layout[1])
            pad = self.ld_pad
            case = dataclasses.replace(
                plain,
                lda=plain.operand("a").rows + pad if pad else 0,
                ldb=plain.operand("b").rows + pad if pad else 0,
                broadcast=self.broadcast if batched else "",
                beta=self.beta,
                bias=self.bias and lt,
                workspace_mib=self.workspace_mib if lt else -1,
            )
            found.append(case)
            if batch > 1 and mode == "fp32" and api == "cublas":
                found.append(dataclasses.replace(case, loop=True))
            folded = self.folded(case)
            if folded is not None:
                found.append(folded)
        return found

    @staticmethod
    def folded(case: Case) -> Case | None:
        """The one GEMM a batched call with a shared A folds into, C = A @ [B_1 .. B_batch]
        (m x n*batch, packed B), which broadcast-slower-than-folded compares it with."""
        if case.broadcast != "a" or case.transb != "n" or case.ldb or case.batch < 2:
            return None
        return dataclasses.replace(
            case, n=case.n * case.batch, batch=1, broadcast="", strided=False, loop=False
        )


def parse_layouts(text: str) -> tuple[str, ...]:
    return tuple(parse_choices(text, "--layouts", LAYOUTS))


def parse_broadcast(text: str) -> str:
    if text not in BROADCASTS:
        raise AuditError(f"--broadcast: {text!r} is not a or b (the operand with batch stride 0)")
    return text


def parse_beta(text: str) -> float:
    try:
        beta = float(text)
    except ValueError:
        raise AuditError(f"--beta: {text!r} is not a number") from None
    if not math.isfinite(beta):
        raise AuditError(f"--beta: {text!r} is not a finite number")
    return beta


def plan_from_options(
    single: bool | None,
    batched: bool | None,
    sizes: str,
    shapes: str,
    batches: str,
    modes: str,
    apis: str,
    variants: Variants | None = None,
) -> list[Case]:
    """The plan of the command line's grid options, each checked (a one-line error naming it)."""
    run_single, run_batched = call_kinds(single, batched)
    return build_plan(
        sizes=parse_int_list(sizes, "--sizes") if sizes.strip() else [],
        shapes=parse_shapes(shapes) if shapes.strip() else [],
        batches=parse_int_list(batches, "--batches"),
        modes=parse_modes(modes),
        apis=parse_apis(apis),
        single=run_single,
        batched=run_batched,
        variants=variants,
    )


def build_plan(
    *,
    sizes: Iterable[int],
    shapes: Iterable[tuple[int, int, int]] = (),
    batches: Iterable[int],
    modes: Iterable[str],
    apis: Iterable[str],
    single: bool,
    batched: bool,
    variants: Variants | None = None,
) -> list[Case]:
    """The grid of cases, smallest problems first so that an out-of-memory case comes last. A
    batched call of batch 1 is the strided-batched routine with one entry."""
    variants = variants or Variants()
    apis = list(apis)
    if (variants.bias or variants.workspace_mib >= 0) and "cublasLt" not in apis:
        raise AuditError("--bias and --workspace-mib are cuBLASLt settings (--api cublasLt)")
    problems = sorted({(s, s, s) for s in sizes} | set(shapes))
    if not problems:
        raise AuditError("nothing to run: --sizes and --shapes are both empty")
    batched_counts = list(batches) if batched else []
    # (batch, strided): single calls, then the batched ones (batch 1 included, as strided)
    calls = ([(1, False)] if single else []) + [(b, True) for b in batched_counts]
    if not calls:
        raise AuditError("nothing to run: both --no-single and --no-batched were given")
    cases: list[Case] = []
    for m, n, k in problems:
        for batch, strided in calls:
            for mode in modes:
                for api in apis:
                    for case in variants.cases(api, mode, m, n, k, batch):
                        if strided and batch == 1:
                            case = dataclasses.replace(case, strided=True)
                        cases.append(_fits(case))
    return list(dict.fromkeys(cases))


SHAPE_FILE_COLUMNS = ("m", "n", "k", "batch", "layout", "mode", "api", "lda", "ldb",
                      "broadcast", "beta", "bias", "workspace_mib", "strided")  # fmt: skip


def read_shapes_file(path: Path, modes: Sequence[str], apis: Sequence[str]) -> list[Case]:
    """A shape list (CSV, or JSON: a list of objects) as cases, in cuBLAS's column-major terms
    (docs/schema.md): m, n, k required; batch (1), layout (nn), mode and api (each row in every
    --modes / --api value when absent), and lda, ldb, broadcast, beta, bias, workspace_mib,
    strided optional. A bad row is a one-line error naming the file and the row."""
    import pandas as pd

    try:
        if path.suffix.lower() == ".json":
            rows = json.loads(path.read_text())
            if not isinstance(rows, list):
                raise ValueError("a JSON shape list is a list of objects")
            frame = pd.DataFrame(rows)
        else:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as exc:
        raise AuditError(f"--shapes-file {path}: cannot read it ({exc})") from None
    unknown = [c for c in frame.columns if c not in SHAPE_FILE_COLUMNS]
    missing = [c for c in ("m", "n", "k") if c not in frame.columns]
    if unknown or missing or frame.empty:
        why = f"unknown column(s) {', '.join(unknown)}" if unknown else "no rows"
        why = f"missing column(s) {', '.join(missing)}" if missing else why
        raise AuditError(f"--shapes-file {path}: {why} (columns: {', '.join(SHAPE_FILE_COLUMNS)})")
    cases: list[Case] = []
    for number, row in enumerate(frame.to_dict("records"), start=1):
        try:
            cases += _shape_row(row, modes, apis)
        except (AuditError, ValueError, KeyError) as exc:
            message = str(exc).removeprefix("AuditError: ")
            raise AuditError(f"--shapes-file {path}, row {number}: {message}") from None
    return list(dict.fromkeys(cases))


def _shape_row(
    row: Mapping[Hashable, Any], modes: Sequence[str], apis: Sequence[str]
) -> list[Case]:
    def text(name: str, default: str) -> str:
        value = row.get(name)
        return default if value is None or str(value).strip() in ("", "nan") else str(value).strip()

    m, n, k = (_positive(text(dim, ""), dim) for dim in ("m", "n", "k"))
    batch = _positive(text("batch", "1"), "batch")
    layout = parse_choices(text("layout", "nn"), "layout", LAYOUTS)[0]
    row_modes = parse_modes(text("mode", "")) if text("mode", "") else list(modes)
    row_apis = parse_apis(text("api", "")) if text("api", "") else list(apis)
    flag = {"1", "true", "yes"}
    bias = text("bias", "0").lower() in flag
    workspace = int(text("workspace_mib", "-1"))
    found = []
    for mode in row_modes:
        for api in row_apis:
            lt = api == "cublasLt"
            case = Case(
                api, mode, m, n, k, batch, layout[0], layout[1],
                lda=int(text("lda", "0")),
                ldb=int(text("ldb", "0")),
                broadcast=parse_broadcast(text("broadcast", "")),
                beta=parse_beta(text("beta", "0")),
                strided=text("strided", "0").lower() in flag,
                bias=bias and lt,
                workspace_mib=workspace if lt else -1,
            )  # fmt: skip
            found.append(_fits(case))
    return found


def _fits(case: Case) -> Case:
    if case.bytes_needed > MAX_CASE_BYTES:
        raise AuditError(
            f"{case.case_id} needs {case.bytes_needed / 2**40:.0f} TiB of operands: no GPU holds it"
        )
    return case


def write_plan(cases: Sequence[Case], path: Path) -> None:
    write_text_atomic(path, json.dumps([c.to_json() for c in cases], indent=1) + "\n")


def read_plan(path: Path) -> list[Case]:
    try:
        return [Case.from_json(item) for item in json.loads(path.read_text())]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AuditError(f"{path}: not a cublas-audit plan ({exc})") from exc
