"""The command line's grid as a plan: --sizes, --shapes, --batches, --modes, --api, the layouts
and the other variants, each parsed and checked (a one-line error naming the option), and the
grid of cases they make."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import APIS, BROADCASTS, LAYOUTS, MAX_DIMENSION, Case
from cublas_audit.planning.modes import MODE_NAMES as MODES

DEFAULT_SIZES = (256, 512, 1024, 2048, 4096, 8192)
DEFAULT_BATCHES = (4, 8, 16)
_SAFE_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DIGITS = re.compile(r"[0-9]+")
# No GPU holds a case this large; smaller ones that do not fit this GPU are skipped by the probe
# (recorded with the reason), but this one is refused before anything runs.
MAX_CASE_BYTES = 2**44
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
            found.add(positive_int(item, what))
    return sorted(found)


def _range(item: str, what: str) -> range:
    parts = item.split(":")
    if len(parts) != 3:
        raise AuditError(f"{what}: {item!r} is not FIRST:LAST:STEP")
    first, last, step = (positive_int(part, f"{what} {item!r}") for part in parts)
    if last < first:
        raise AuditError(f"{what}: {item!r} ends before it starts")
    values = range(first, last + 1, step)
    if len(values) > MAX_RANGE_ITEMS:
        raise AuditError(f"{what}: {item!r} has {len(values)} values, more than {MAX_RANGE_ITEMS}")
    return values


def positive_int(item: str, what: str) -> int:
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
        m, n, k = (positive_int(part, f"--shapes {item!r}") for part in parts)
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


def option_name(setting: str) -> str:
    """A setting's command-line option: workspace_mib -> --workspace-mib."""
    return "--" + setting.replace("_", "-")


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

    def check(self, apis: Sequence[str], name: Callable[[str], str] = option_name) -> Variants:
        """These settings themselves, or a one-line error naming the one that cannot be, as its
        input names it (`name`: the command line's --workspace-mib, a shape list's workspace_mib
        column): the checks each value gets beyond its parsing (parse_beta, parse_broadcast,
        ...), made here once for both. ld_pad is 0 or more, a workspace 0 MiB or more (-1: the
        default), and the bias epilogue and a workspace limit are cuBLASLt's: `apis` has it."""
        if self.ld_pad < 0:
            raise AuditError(f"{name('ld_pad')}: {self.ld_pad} is negative")
        if self.workspace_mib < -1:
            raise AuditError(
                f"{name('workspace_mib')}: {self.workspace_mib} is no workspace size (0 MiB or "
                "more, or -1 for the default)"
            )
        if (self.bias or self.workspace_mib >= 0) and "cublasLt" not in apis:
            raise AuditError(
                f"{name('bias')} and {name('workspace_mib')} are cuBLASLt settings "
                f"({name('api')} cublasLt)"
            )
        return self

    def cases(self, api: str, mode: str, m: int, n: int, k: int, batch: int) -> list[Case]:
        """The calls of one problem: one per layout (with its loop companion where one applies)."""
        batched = batch > 1
        lt = api == "cublasLt"
        found = []
        for layout in self.layouts:
            pad = self.ld_pad
            # made once (not a plain case, then replaced: a full map plans 262,144 of them); a
            # padded leading dimension is the stored operand's rows (m or k for A, k or n for B)
            case = Case(
                api, mode, m, n, k, batch, layout[0], layout[1],
                lda=(m if layout[0] == "n" else k) + pad if pad else 0,
                ldb=(k if layout[1] == "n" else n) + pad if pad else 0,
                broadcast=self.broadcast if batched else "",
                beta=self.beta,
                bias=self.bias and lt,
                workspace_mib=self.workspace_mib if lt else -1,
            )  # fmt: skip
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
        if case.n * case.batch > MAX_DIMENSION:
            return None  # no one cuBLAS call is that wide: nothing to compare with
        return dataclasses.replace(
            case, n=case.n * case.batch, batch=1, broadcast="", strided=False, loop=False
        )


def parse_layouts(text: str) -> tuple[str, ...]:
    return tuple(parse_choices(text, "--layouts", LAYOUTS))


def parse_broadcast(text: str, what: str = "--broadcast") -> str:
    if text not in BROADCASTS:
        raise AuditError(f"{what}: {text!r} is not a or b (the operand with batch stride 0)")
    return text


def parse_beta(text: str, what: str = "--beta") -> float:
    try:
        beta = float(text)
    except ValueError:
        raise AuditError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(beta):
        raise AuditError(f"{what}: {text!r} is not a finite number")
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
    apis = list(apis)
    variants = (variants or Variants()).check(apis)
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
                        cases.append(check_fits(case))
    return list(dict.fromkeys(cases))


def check_fits(case: Case) -> Case:
    """The case itself, or a one-line error where its operands exceed MAX_CASE_BYTES: shared by
    the grid and by shape lists (planning.shapes_file)."""
    if case.bytes_needed > MAX_CASE_BYTES:
        raise AuditError(
            f"{case.case_id} needs {case.bytes_needed / 2**40:.0f} TiB of operands: no GPU holds it"
        )
    return case
