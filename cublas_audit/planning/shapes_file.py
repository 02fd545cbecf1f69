"""A shape list (`--shapes-file`: CSV, or JSON) as cases, each row checked."""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError
from cublas_audit.planning.cases import LAYOUTS, Case
from cublas_audit.planning.grid import (
    check_fits,
    parse_apis,
    parse_beta,
    parse_broadcast,
    parse_choices,
    parse_modes,
    positive_int,
)

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

    m, n, k = (positive_int(text(dim, ""), dim) for dim in ("m", "n", "k"))
    batch = positive_int(text("batch", "1"), "batch")
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
            found.append(check_fits(case))
    return found
