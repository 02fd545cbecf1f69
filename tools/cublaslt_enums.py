"""Writes cublas_audit/data/cublaslt_enums.json: the names and numbers of the four cuBLASLt enums
the candidates table records by name (planning.lt_enums.SPECS: tile, stages, reduction scheme,
cluster shape), with the names as the table spells them.

    python -m tools.cublaslt_enums                      # from the installed nvmath (GPU machine)
    python -m tools.cublaslt_enums --source PATH        # from nvmath's cycublasLt.pxd or cublasLt.h

The installed `nvmath.bindings.cublasLt` is what the probe reads names from, so it is the
source of truth; nvmath's .pxd (in its wheel) and cuBLAS's own cublasLt.h spell the same members
as `CUBLASLT_MATMUL_TILE_128x64 ... = 18`, which is what --source reads on a machine without a
GPU. tests/test_lt_enums.py checks the written file against the installed nvmath on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from cublas_audit.planning.lt_enums import ENUMS_FILE, SPECS, EnumSpec


def from_nvmath() -> tuple[str, dict[str, dict[str, int]]]:
    import nvmath
    from nvmath.bindings import cublasLt

    enums = {}
    for column, spec in SPECS.items():
        members = getattr(cublasLt, spec.nvmath_enum).__members__.items()
        enums[column] = {
            name.removeprefix(spec.nvmath_prefix): int(value) for name, value in members
        }
    return f"nvmath-python {nvmath.__version__}: nvmath.bindings.cublasLt", enums


def from_source(path: Path) -> tuple[str, dict[str, dict[str, int]]]:
    text = path.read_text()
    enums = {column: _members(text, spec) for column, spec in SPECS.items()}
    empty = [column for column, members in enums.items() if not members]
    if empty:
        raise SystemExit(f"{path}: no {', '.join(empty)} members found")
    return path.name, enums


def _members(text: str, spec: EnumSpec) -> dict[str, int]:
    """`PREFIX_NAME = 18,` (cublasLt.h) or `PREFIX_NAME "PREFIX_NAME" = 18` (.pxd); the header's
    `_END` sentinels carry no value and are no member."""
    pattern = re.compile(
        rf'^\s*{spec.c_prefix}(\w+)(?:\s+"\w+")?\s*=\s*(0x[0-9a-fA-F]+|\d+)', re.MULTILINE
    )
    return {name: int(value, 0) for name, value in pattern.findall(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="nvmath's cycublasLt.pxd or cublasLt.h")
    parser.add_argument("--label", help="where --source came from, recorded as the file's source")
    parser.add_argument("--out", type=Path, default=ENUMS_FILE)
    args = parser.parse_args()
    source, enums = from_source(args.source) if args.source else from_nvmath()
    source = args.label or source
    ordered = {
        column: dict(sorted(members.items(), key=lambda item: (item[1], item[0])))
        for column, members in enums.items()
    }
    data = {"source": source, "generated_by": "python -m tools.cublaslt_enums", "enums": ordered}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}: " + ", ".join(f"{c} {len(m)}" for c, m in ordered.items()))


if __name__ == "__main__":
    main()
