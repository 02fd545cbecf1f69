"""Kernel-name normalization: family, tile, stages, arch prefix and pipe from what ncu prints.

cuBLAS kernel names are long and templated; the dispatch table keeps the full name and adds a
short one (`simt_256x128_8x4`, `xmma_128x128x8`) that the article and the reports use. The parser
is idempotent: a short name parses to itself, so published tables that only carry short names
normalize the same way.

ncu and CUPTI print the same kernel in several forms: demangled with its wrapper
(`void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)`), without
`void` or the parameters, mangled (`_ZN7cutlass7Kernel2I43cutlass_80_...EEvNT_6ParamsE`), and cut
anywhere (`void cutlass::Kernel2<cutlass_80_..._align2>(T1:`). `inner_name` finds the kernel
inside every form first: the first template argument of a wrapper (`cutlass::Kernel2`,
`cutlass::device_kernel`), else the function's own name; the families are read from that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

# Families older than any GPU this tool audits: their presence on a current GPU is a finding.
LEGACY_FAMILIES = frozenset({"magma", "legacy", "gemv"})


@dataclass(frozen=True)
class KernelInfo:
    name: str
    short: str
    family: str
    tile: str = ""
    stages: str = ""
    arch: str = ""
    layout: str = ""  # nvjet's layout suffix (NNT, TNT, ...): the same kernel serves each layout
    # The pipe the kernel computes on: "tensor" (HMMA/GMMA: tensorop, nvjet, tensor-core xmma,
    # cutlass3x), "fma" (FFMA: simt, FFMA xmma, magma, gemv/dot, split-K's FP32 reduction), None
    # where the name does not say (a short `xmma_...` name, another library's kernel).
    pipe: str | None = None


# Templates that wrap the real kernel: the kernel is their first template argument.
WRAPPERS = frozenset({"Kernel", "Kernel2", "device_kernel"})
# What a cut name may end on that no kernel name does: a bare wrapper, a return type, a parameter.
NOT_A_KERNEL = frozenset({"", "void", "T1", "Params", "cutlass", *WRAPPERS})


_SIMT = re.compile(
    r"(?:cutlass_(?P<arch>\d+)_)?simt_[sd]gemm_(?P<tile>\d+x\d+)_(?P<stages>\d+x\d+)"
)
_XMMA = re.compile(
    r"(?:sm(?P<arch>\d+)_)?xmma_gemm.*?tilesize(?P<tile>\d+x\d+x\d+)(?:.*?stage(?P<stages>\d+))?"
)
_XMMA_SHORT = re.compile(r"^xmma_(?P<tile>\d+x\d+x\d+)$")
_SIMT_SHORT = re.compile(r"^simt_(?P<tile>\d+x\d+)_(?P<stages>\d+x\d+)$")
# cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4, cutlass_80_tensorop_bf16_s16816gemm_relu_
# bf16_128x64_64x3_tn_align8, cutlass_75_wmma_tensorop_s161616gemm_f16_32x32_128x1_nt_align1,
# cutlass_75_tensorop_s1688gemm_bf16_64x64_nt_align1 (no stages): the data types are dropped.
_TENSOROP = re.compile(
    r"(?:cutlass_?(?P<arch>\d+)_)?(?:sm(?P<arch2>\d+)_)?(?:wmma_)?tensorop_"
    r"(?:[a-z0-9]+_)??(?P<op>[a-z0-9]+gemm)"
    r"(?:_[a-z0-9]+)*?_(?P<tile>\d+x\d+)(?:_(?P<stages>\d+x\d+))?(?=_|$)"
)
# cutlass3x_sm90_tensorop_s64x128x16gemm_f16_f16_f32_void_f16_128x256x64_2x1x1_0_tnn_align8_...
# (and CUTLASS 3.9's `tensorop_gemm_...`): CTA tile and cluster shape.
_CUTLASS3X = re.compile(
    r"cutlass3x_sm(?P<arch>\d+)_(?P<kind>[a-z]+)_(?P<op>[a-z0-9]*gemm)"
    r"(?:_[a-z0-9]+)*?_(?P<tile>\d+x\d+x\d+)_(?P<cluster>\d+x\d+x\d+)(?=_|$)"
)
# nvjet_sm90_tst_64x24_64x16_2x4_h_bz_TNT: arch, variant, tile, K tile x stages, cluster, then
# flags (h/v, bz = beta zero / bx) and the layout (op of A, op of B, output order).
_NVJET = re.compile(
    r"nvjet_(?:sm(?P<arch>\d+)_)?(?P<variant>[a-z]+)_(?P<tile>\d+x\d+)_(?P<stages>\d+x\d+)"
    r"(?:_(?P<cluster>\d+x\d+))?(?:.*_(?P<layout>[NT]{3}))?"
)
_MAGMA = re.compile(r"magma_(?P<what>[a-zA-Z]*gemm[a-zA-Z]*|Ex)")
# maxwell_sgemm_128x64_nn, volta_h884gemm_..., ampere_bf16_s16816gemm_bf16_128x64_ldg8_...
_LEGACY = re.compile(
    r"\b(?P<gen>maxwell|kepler|sm35|sm50|sm37|volta|turing|ampere)_(?:[a-z0-9]+_)?"
    r"(?P<op>[a-z]*\d*gemm)"
)
# Tensor-core kernels by their math: HMMA/IMMA shapes (s1688gemm, h884gemm, bf16_s16816gemm), the
# tensor instruction or warp-group (GMMA) of an xmma name, tensor-core input types.
_TENSOR_HINT = re.compile(
    r"[hsi]\d{3,}gemm|tensor\d|tensorop|warpgroupsize|gmma|hmma|imma|wgmma"
    r"|xmma_gemm_(?:[a-z0-9]+_){0,3}[a-z0-9]*(?:tf32|bf16|f16|e4m3|e5m2|i8)"
)
_FMA_HINT = re.compile(r"ffma|[sd]gemm")
_LEGACY_TILE = re.compile(r"_(?P<tile>\d+x\d+)_")
_GEMV = re.compile(r"gemv|gemvx|gemmSN|gemmk1|dot_kernel|reduce_1Block_kernel", re.IGNORECASE)
_SPLITK = re.compile(r"splitKreduce|split_k_kernel|reduce_kernel", re.IGNORECASE)
_REFERENCE = re.compile(r"cublas_audit_ref|reference_sgemm|tma_sgemm|cpasync_sgemm")


@lru_cache(maxsize=4096)
def normalize(name: str) -> KernelInfo:
    """Maps a kernel name as ncu or CUPTI prints it, in any of its forms, cut or not (or an
    already short name) to its family, tile and pipe; `name` stays the name as given."""
    name = name.strip()
    inner, cut = inner_name(name)
    # A name cut inside the kernel's own name may end on a partial number (`_8x` of `_8x4`):
    # its last `_` part is dropped before parsing, so a cut never yields a wrong tile.
    parsed = inner.rsplit("_", 1)[0] if cut and "_" in inner else inner
    # The whole name is read too where it was not cut: a family may show only outside the inner
    # name; a cut name is read only up to its last whole part.
    for candidate in dict.fromkeys((parsed,) if cut else (parsed, name)):
        for parse in (
            _reference, _splitk, _simt, _xmma, _cutlass3x, _tensorop, _nvjet, _magma, _legacy,
            _gemv,
        ):  # fmt: skip
            info = parse(candidate)
            if info is not None:
                return replace(info, name=name)
    short = inner if cut else _fallback_short(inner)
    if short in NOT_A_KERNEL:  # a name cut before its kernel: the wrapper is all there is
        short = name
    return KernelInfo(name=name, short=short, family="other")


def inner_name(name: str) -> tuple[str, bool]:
    """The kernel's own name inside a printed one, and whether the name was cut inside it: the
    first template argument of a wrapper, else the qualified function name without return type,
    template arguments, parameters or `(anonymous namespace)`. Mangled names are read too."""
    if name.startswith("_Z"):
        return _mangled_inner(name)
    text = name.replace("(anonymous namespace)::", "")
    head = re.split(r"[<(]", text, maxsplit=1)[0]
    words = head.split()
    function = words[-1] if words else ""
    rest = text[len(head) :]
    if function.rsplit("::", 1)[-1] in WRAPPERS and rest.startswith("<"):
        argument, closed = _first_argument(rest[1:])
        if argument:
            inner, cut = inner_name(argument)
            return inner, cut or not closed
    return function, False


def _first_argument(text: str) -> tuple[str, bool]:
    """A template's first argument (the text after its `<`) and whether it was closed."""
    depth = 0
    for index, char in enumerate(text):
        if char in "<(":
            depth += 1
        elif char in ">)" and depth:
            depth -= 1
        elif char in ">," and not depth:
            return text[:index].strip(), True
    return text.strip(), False


def _mangled_inner(name: str) -> tuple[str, bool]:
    """`_ZN7cutlass7Kernel2I43cutlass_80_simt_sgemm_256x128_8x4_nn_align1EEvNT_6ParamsE` ->
    the template argument; `_Z10dot_kernelIf...` -> `dot_kernel` (Itanium length-prefixed names)."""
    nested = name.startswith("_ZN")
    pos = 3 if nested else 2
    parts: list[str] = []
    while pos < len(name) and name[pos].isdigit():
        ident, pos, cut = _mangled_ident(name, pos)
        parts.append(ident)
        if cut:
            return ident, True
        if not nested:
            break
    if not parts:
        return name, False
    if parts[-1] in WRAPPERS and name[pos : pos + 1] == "I" and name[pos + 1 : pos + 2].isdigit():
        ident, _, cut = _mangled_ident(name, pos + 1)
        return ident, cut
    return "::".join(parts), False


def _mangled_ident(name: str, pos: int) -> tuple[str, int, bool]:
    digits = re.match(r"\d+", name[pos:])
    assert digits is not None
    start = pos + len(digits[0])
    end = start + int(digits[0])
    return name[start:end], end, end > len(name)


def _reference(name: str) -> KernelInfo | None:
    if not _REFERENCE.search(name):
        return None
    return KernelInfo(name, _fallback_short(name), "reference", pipe="fma")


def _splitk(name: str) -> KernelInfo | None:
    if not _SPLITK.search(name):
        return None
    return KernelInfo(name, "splitKreduce", "splitk-reduce", pipe="fma")  # FP32 adds


def _simt(name: str) -> KernelInfo | None:
    match = _SIMT.search(name) or _SIMT_SHORT.search(name)
    if match is None:
        return None
    tile, stages = match["tile"], match["stages"]
    arch = match.groupdict().get("arch") or ""
    return KernelInfo(
        name, f"simt_{tile}_{stages}", "simt", tile, stages, f"sm{arch}" if arch else "", pipe="fma"
    )


def _xmma(name: str) -> KernelInfo | None:
    match = _XMMA.search(name) or _XMMA_SHORT.search(name)
    if match is None:
        return None
    groups = match.groupdict()
    arch = groups.get("arch") or ""
    return KernelInfo(
        name,
        f"xmma_{match['tile']}",
        "xmma",
        match["tile"],
        groups.get("stages") or "",
        f"sm{arch}" if arch else "",
        pipe=_xmma_pipe(name),
    )


def _xmma_pipe(name: str) -> str | None:
    """An xmma kernel names its math: `_ffma_` (sm80 FP32 kernels) or a tensor instruction,
    warp-group or tensor-core input type; a short `xmma_...` name says neither."""
    if "ffma" in name:
        return "fma"
    return "tensor" if _TENSOR_HINT.search(name) else None


def _tensorop(name: str) -> KernelInfo | None:
    match = _TENSOROP.search(name)
    if match is None:
        return None
    arch = match["arch"] or match["arch2"] or ""
    stages = match["stages"] or ""
    short = f"tensorop_{match['op']}_{match['tile']}" + (f"_{stages}" if stages else "")
    return KernelInfo(
        name, short, "tensorop", match["tile"], stages, f"sm{arch}" if arch else "", pipe="tensor"
    )


def _cutlass3x(name: str) -> KernelInfo | None:
    match = _CUTLASS3X.search(name)
    if match is None:
        return None
    short = f"cutlass3x_{match['kind']}_{match['op']}_{match['tile']}_{match['cluster']}"
    pipe = "tensor" if match["kind"] == "tensorop" else "fma" if match["kind"] == "simt" else None
    return KernelInfo(name, short, "cutlass3x", match["tile"], "", f"sm{match['arch']}", "", pipe)


def _nvjet(name: str) -> KernelInfo | None:
    match = _NVJET.search(name)
    if match is None:
        return None
    cluster = f"_{match['cluster']}" if match["cluster"] else ""
    short = f"nvjet_{match['variant']}_{match['tile']}_{match['stages']}{cluster}"
    arch = f"sm{match['arch']}" if match["arch"] else ""
    return KernelInfo(
        name, short, "nvjet", match["tile"], match["stages"], arch, match["layout"] or "", "tensor"
    )


def _magma(name: str) -> KernelInfo | None:
    match = _MAGMA.search(name)
    if match is None:
        return None
    what = match["what"]
    short = "magma_Ex" if what.endswith("Ex") else f"magma_{what}"
    return KernelInfo(name, short, "magma", pipe="fma")


def _legacy(name: str) -> KernelInfo | None:
    match = _LEGACY.search(name)
    if match is None:
        return None
    tile_match = _LEGACY_TILE.search(name[match.end() :])
    tile = tile_match["tile"] if tile_match else ""
    # sgemm/dgemm keep the published `maxwell_gemm_128x64`; a tensor-core op names itself.
    op = "gemm" if re.fullmatch(r"[a-z]*gemm", match["op"]) else match["op"]
    short = f"{match['gen']}_{op}_{tile}" if tile else f"{match['gen']}_{op}"
    pipe = "tensor" if _TENSOR_HINT.search(name) else "fma" if _FMA_HINT.search(name) else None
    return KernelInfo(name, short, "legacy", tile, "", match["gen"], pipe=pipe)


def _gemv(name: str) -> KernelInfo | None:
    """gemv / gemvx / dot kernels and their reductions: what cuBLAS runs for M or N = 1."""
    if not _GEMV.search(name):
        return None
    short = "gemvx_kernel" if "gemvx" in name else _fallback_short(inner_name(name)[0])
    return KernelInfo(name, short, "gemv", pipe="fma")


def _fallback_short(name: str) -> str:
    """The function name without namespaces, template arguments or parameters."""
    base = re.split(r"[<(]", name.replace("(anonymous namespace)::", ""), maxsplit=1)[0].split()
    return base[-1].rsplit("::", 1)[-1] if base else name
