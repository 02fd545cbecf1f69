"""A shape list (`--shapes-file`: CSV, or JSON) as cases, each row checked.

Each column gets the check its command-line option gets (planning.grid's parsers, positive_int,
Variants.check), named as the file names it: a bad value is a one-line error naming the file, the
row and the column.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import APIS, LAYOUTS, Case
from cublas_audit.planning.grid import (
    Variants,
    check_fits,
    parse_beta,
    parse_broadcast,
    parse_choices,
    positive_int,
)
from cublas_audit.planning.modes import MODE_NAMES

SHAPE_FILE_COLUMNS = ("m", "n", "k", "batch", "layout", "mode", "api", "lda", "ldb",
                      "broadcast", "beta", "bias", "workspace_mib", "strided")  # fmt: skip
_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def read_shapes_file(path: Path, modes: Sequence[str], apis: Sequence[str]) -> list[Case]:
    """A shape list (CSV, or JSON: a list of objects) as cases, in cuBLAS's column-major terms
    (docs/schema.md): m, n, k required; batch (1), layout (nn), mode and api (each row in every
    --modes / --api value when absent), and lda, ldb, broadcast, beta, bias, workspace_mib,
    strided optional. A bad row is a one-line error naming the file, the row and the column."""
    rows, columns = _rows(path)
    unknown = [c for c in columns if c not in SHAPE_FILE_COLUMNS]
    missing = [c for c in ("m", "n", "k") if c not in columns]
    if unknown or missing or not rows:
        why = f"unknown column(s) {', '.join(unknown)}" if unknown else "no rows"
        why = f"missing column(s) {', '.join(missing)}" if missing else why
        raise AuditError(f"--shapes-file {path}: {why} (columns: {', '.join(SHAPE_FILE_COLUMNS)})")
    cases: list[Case] = []
    for number, row in enumerate(rows, start=1):
        try:
            cases += _shape_row(row, modes, apis)
        except (AuditError, ValueError, KeyError) as exc:
            message = str(exc).removeprefix("AuditError: ")
            raise AuditError(f"--shapes-file {path}, row {number}: {message}") from None
    return list(dict.fromkeys(cases))


def _rows(path: Path) -> tuple[Sequence[Mapping[Hashable, Any]], list[str]]:
    """The file's rows (each column's value as written) and its columns, in order. A JSON list
    is read as it is (no table: a key one row lacks stays absent, never NaN)."""
    import pandas as pd

    try:
        if path.suffix.lower() == ".json":
            rows = json.loads(path.read_text())
            if not isinstance(rows, list):
                raise ValueError("a JSON shape list is a list of objects")
        else:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
            return frame.to_dict("records"), [str(c) for c in frame.columns]
    except (OSError, ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise AuditError(f"--shapes-file {path}: cannot read it ({why})") from None
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise AuditError(
                f"--shapes-file {path}, row {number}: {json.dumps(row)[:40]} is not an object "
                '(a JSON shape list is a list of objects: {"m": 256, "n": 256, "k": 256})'
            )
    columns = list(dict.fromkeys(str(key) for row in rows for key in row))
    return rows, columns


def _shape_row(
    row: Mapping[Hashable, Any], modes: Sequence[str], apis: Sequence[str]
) -> list[Case]:
    def text(name: str, default: str) -> str:
        value = row.get(name)
        return default if value is None or str(value).strip() == "" else str(value).strip()

    m, n, k = (positive_int(text(dim, ""), dim) for dim in ("m", "n", "k"))
    batch = positive_int(text("batch", "1"), "batch")
    layout = parse_choices(text("layout", "nn"), "layout", LAYOUTS)[0]
    row_modes = parse_choices(text("mode", ""), "mode", MODE_NAMES) if text("mode", "") else modes
    row_apis = parse_choices(text("api", ""), "api", APIS) if text("api", "") else apis
    settings = Variants(
        broadcast=parse_broadcast(text("broadcast", ""), "broadcast"),
        beta=parse_beta(text("beta", "0"), "beta"),
        bias=_flag(text("bias", "0"), "bias"),
        workspace_mib=_integer(text("workspace_mib", "-1"), "workspace_mib"),
    ).check(row_apis, name=lambda column: column)
    lda, ldb = _integer(text("lda", "0"), "lda"), _integer(text("ldb", "0"), "ldb")
    strided = _flag(text("strided", "0"), "strided")
    found = []
    for mode in row_modes:
        for api in row_apis:
            lt = api == "cublasLt"
            case = Case(
                api, mode, m, n, k, batch, layout[0], layout[1],
                lda=lda,
                ldb=ldb,
                broadcast=settings.broadcast,
                beta=settings.beta,
                strided=strided,
                bias=settings.bias and lt,
                workspace_mib=settings.workspace_mib if lt else -1,
            )  # fmt: skip
            found.append(check_fits(case))
    return found


def _integer(text: str, column: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise AuditError(f"{column}: {text!r} is not an integer") from None


def _flag(text: str, column: str) -> bool:
    flag = _FLAGS.get(text.lower())
    if flag is None:
        raise AuditError(f"{column}: {text!r} is not one of {', '.join(_FLAGS)}")
    return flag
