"""Kernel-name normalization: family, tile, stages and arch prefix from what ncu prints.

cuBLAS kernel names are long and templated; the dispatch table keeps the full name and adds a
short one (`simt_256x128_8x4`, `xmma_128x128x8`) that the article and the reports use. The parser
is idempotent: a short name parses to itself, so published tables that only carry short names
normalize the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


_SIMT = re.compile(
    r"(?:cutlass_(?P<arch>\d+)_)?simt_[sd]gemm_(?P<tile>\d+x\d+)_(?P<stages>\d+x\d+)"
)
_XMMA = re.compile(
    r"(?:sm(?P<arch>\d+)_)?xmma_gemm.*?tilesize(?P<tile>\d+x\d+x\d+)(?:.*?stage(?P<stages>\d+))?"
)
_XMMA_SHORT = re.compile(r"^xmma_(?P<tile>\d+x\d+x\d+)$")
_SIMT_SHORT = re.compile(r"^simt_(?P<tile>\d+x\d+)_(?P<stages>\d+x\d+)$")
_TENSOROP = re.compile(
    r"(?:cutlass_?(?P<arch>\d+)x?_)?(?:sm(?P<arch2>\d+)_)?tensorop_(?P<op>[a-z0-9]+gemm)"
    r"(?:_[a-z0-9]+)*?_(?P<tile>\d+x\d+)_(?P<stages>\d+x\d+)"
)
# nvjet_sm90_tst_64x24_64x16_2x4_h_bz_TNT: arch, variant, tile, K tile x stages, cluster, then
# flags (h/v, bz = beta zero / bx) and the layout (op of A, op of B, output order).
_NVJET = re.compile(
    r"nvjet_(?:sm(?P<arch>\d+)_)?(?P<variant>[a-z]+)_(?P<tile>\d+x\d+)_(?P<stages>\d+x\d+)"
    r"(?:_(?P<cluster>\d+x\d+))?(?:.*_(?P<layout>[NT]{3}))?"
)
_MAGMA = re.compile(r"magma_(?P<what>[a-zA-Z]*gemm[a-zA-Z]*|Ex)")
_LEGACY = re.compile(r"\b(?P<gen>maxwell|kepler|sm35|sm50|sm37|volta|turing|ampere)_[a-z]*gemm")
_LEGACY_TILE = re.compile(r"_(?P<tile>\d+x\d+)_")
_GEMV = re.compile(r"gemv|gemvx|gemmSN|gemmk1|dot_kernel|reduce_1Block_kernel", re.IGNORECASE)
_SPLITK = re.compile(r"splitKreduce|split_k_kernel|reduce_kernel", re.IGNORECASE)
_REFERENCE = re.compile(r"cublas_audit_ref|reference_sgemm|tma_sgemm|cpasync_sgemm")


def normalize(name: str) -> KernelInfo:
    """Maps a kernel name as ncu prints it (or an already short name) to its family and tile."""
    name = name.strip()
    for parse in (_reference, _splitk, _simt, _xmma, _tensorop, _nvjet, _magma, _legacy, _gemv):
        info = parse(name)
        if info is not None:
            return info
    return KernelInfo(name=name, short=_fallback_short(name), family="other")


def _reference(name: str) -> KernelInfo | None:
    if not _REFERENCE.search(name):
        return None
    return KernelInfo(name, _fallback_short(name), "reference")


def _splitk(name: str) -> KernelInfo | None:
    if not _SPLITK.search(name):
        return None
    return KernelInfo(name, "splitKreduce", "splitk-reduce")


def _simt(name: str) -> KernelInfo | None:
    match = _SIMT.search(name) or _SIMT_SHORT.search(name)
    if match is None:
        return None
    tile, stages = match["tile"], match["stages"]
    arch = match.groupdict().get("arch") or ""
    return KernelInfo(
        name, f"simt_{tile}_{stages}", "simt", tile, stages, f"sm{arch}" if arch else ""
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
    )


def _tensorop(name: str) -> KernelInfo | None:
    match = _TENSOROP.search(name)
    if match is None:
        return None
    arch = match["arch"] or match["arch2"] or ""
    short = f"tensorop_{match['op']}_{match['tile']}_{match['stages']}"
    return KernelInfo(
        name, short, "tensorop", match["tile"], match["stages"], f"sm{arch}" if arch else ""
    )


def _nvjet(name: str) -> KernelInfo | None:
    match = _NVJET.search(name)
    if match is None:
        return None
    cluster = f"_{match['cluster']}" if match["cluster"] else ""
    short = f"nvjet_{match['variant']}_{match['tile']}_{match['stages']}{cluster}"
    arch = f"sm{match['arch']}" if match["arch"] else ""
    return KernelInfo(
        name, short, "nvjet", match["tile"], match["stages"], arch, match["layout"] or ""
    )


def _magma(name: str) -> KernelInfo | None:
    match = _MAGMA.search(name)
    if match is None:
        return None
    what = match["what"]
    short = "magma_Ex" if what.endswith("Ex") else f"magma_{what}"
    return KernelInfo(name, short, "magma")


def _legacy(name: str) -> KernelInfo | None:
    match = _LEGACY.search(name)
    if match is None:
        return None
    tile_match = _LEGACY_TILE.search(name[match.end() :])
    tile = tile_match["tile"] if tile_match else ""
    short = f"{match['gen']}_gemm_{tile}" if tile else f"{match['gen']}_gemm"
    return KernelInfo(name, short, "legacy", tile, "", match["gen"])


def _gemv(name: str) -> KernelInfo | None:
    """gemv / gemvx / dot kernels and their reductions: what cuBLAS runs for M or N = 1."""
    if not _GEMV.search(name):
        return None
    short = "gemvx_kernel" if "gemvx" in name else _fallback_short(name)
    return KernelInfo(name, short, "gemv")


def _fallback_short(name: str) -> str:
    """The function name without namespaces, template arguments or parameters."""
    base = re.split(r"[<(]", name, maxsplit=1)[0].split()
    return base[-1].rsplit("::", 1)[-1] if base else name
