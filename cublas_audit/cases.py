"""The plan: `Case` records from the CLI's grid, with stable case ids.

A case id names one cuBLAS / cuBLASLt call; it is the NVTX range the probe opens around the call
and the key that ties ncu's launches, the timings and the table rows together. Ids only use
`[A-Za-z0-9._-]`, so they are safe in file names, NVTX filters and regexes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.modes import MODE_NAMES as MODES
from cublas_audit.modes import mode as mode_of
from cublas_audit.rundir import write_text_atomic
from cublas_audit.table import APIS

DEFAULT_SIZES = (256, 512, 1024, 2048, 4096, 8192)
DEFAULT_BATCHES = (4, 8, 16)
# Workspace a cuBLASLt call may use, bytes: what the sweep's cuBLASLt cases and every candidate of
# the candidate audit are given (cuBLAS's own default on Hopper is 32 MiB too).
DEFAULT_WORKSPACE_BYTES = 32 * 1024 * 1024

LOOP_ROUTINE = "sgemm-loop"
_SAFE_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DIGITS = re.compile(r"[0-9]+")
# cuBLAS takes m, n, k and the batch count as 32-bit ints.
MAX_DIMENSION = 2**31 - 1
# No GPU holds a case this large; smaller ones that do not fit this GPU are skipped by the probe
# (recorded with the reason), but this one is refused before anything runs.
MAX_CASE_BYTES = 2**44


@dataclass(frozen=True, order=True)
class Case:
    """One GEMM call: C (m x n) = A (m x k) @ B (k x n), column-major, `batch` times."""

    api: str
    mode: str
    m: int
    n: int
    k: int
    batch: int
    transa: str = "n"
    transb: str = "n"
    loop: bool = False

    @property
    def routine(self) -> str:
        if self.loop:
            return LOOP_ROUTINE
        if self.api == "cublasLt":
            return "cublasLtMatmul"
        if self.mode == "fp32":
            return "cublasSgemm" if self.batch == 1 else "cublasSgemmStridedBatched"
        return "cublasGemmEx" if self.batch == 1 else "cublasGemmStridedBatchedEx"

    @property
    def case_id(self) -> str:
        api = "loop" if self.loop else self.api
        return (
            f"{api}.{self.mode}.{self.m}x{self.n}x{self.k}.b{self.batch}.{self.transa}{self.transb}"
        )

    @property
    def profiled(self) -> bool:
        """Loop companions are only timed: their kernel is the single call's."""
        return not self.loop

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def bytes_needed(self) -> int:
        item = mode_of(self.mode).element_bytes
        return self.batch * item * (self.m * self.k + self.k * self.n + self.m * self.n)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "case_id": self.case_id, "routine": self.routine}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Case:
        fields = {k: data[k] for k in ("api", "mode", "m", "n", "k", "batch")}
        return cls(
            **fields,
            transa=data.get("transa", "n"),
            transb=data.get("transb", "n"),
            loop=bool(data.get("loop", False)),
        )


def parse_int_list(text: str, what: str) -> list[int]:
    """'256,512' -> [256, 512]; anything that is not a positive integer is a one-line error."""
    return sorted({_positive(item, what) for item in _items(text, what)})


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


def plan_from_options(
    single: bool | None,
    batched: bool | None,
    sizes: str,
    shapes: str,
    batches: str,
    modes: str,
    apis: str,
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
) -> list[Case]:
    """The grid of cases, smallest problems first so that an out-of-memory case comes last."""
    problems = sorted({(s, s, s) for s in sizes} | set(shapes))
    if not problems:
        raise AuditError("nothing to run: --sizes and --shapes are both empty")
    batched_counts = [b for b in batches if b > 1] if batched else []
    if batched and not single and not batched_counts:
        raise AuditError("--batches: a batched call needs a batch count of at least 2")
    batch_counts = ([1] if single else []) + batched_counts
    if not batch_counts:
        raise AuditError("nothing to run: both --no-single and --no-batched were given")
    cases: list[Case] = []
    for m, n, k in problems:
        for batch in batch_counts:
            for mode in modes:
                for api in apis:
                    cases.append(_fits(Case(api, mode, m, n, k, batch)))
                if batch > 1 and mode == "fp32" and "cublas" in apis:
                    cases.append(Case("cublas", mode, m, n, k, batch, loop=True))
    return cases


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
