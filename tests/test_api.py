"""The Python API example of docs/api.md runs as written, on the bundled audits, and says true
things."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

import cublas_audit as ca

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def api_example() -> str:
    section = API_DOC.read_text().split("# Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/api.md has no python block"
    return match.group(1)


@pytest.mark.heavy
def test_api_example_runs_and_prints_the_findings() -> None:
    """docs/api.md's example, run as written (it loads, judges, renders and diffs both bundled
    runs and plans a sweep: 2 s of CPU), in CI's second step; the quick suite calls the same API
    on the bundled H100 run (test_api_audit_matches_the_cli_findings)."""
    printed = io.StringIO()
    scope: dict[str, object] = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(api_example(), str(API_DOC), "exec"), scope)
    output = printed.getvalue()
    # Published in the source article and measured on both Hoppers here: cuBLASLt's default for
    # FP32 256^3 batch 8 (tile 32x32) leaves a faster candidate of its own list (tile 64x64).
    assert "medium better-candidate fp32 256x256x256 batch 8" in output
    # The H100 and H200 dispatch the same kernels in every bundled batched case (reports/README).
    assert "0 kernel changes" in output
    assert str(scope["markdown"]).startswith("# cuBLAS dispatch audit")
    cases = scope["cases"]
    # The batched call and its loop of single calls, the companion sweep times beside it.
    assert [c.case_id for c in cases] == [  # type: ignore[attr-defined]
        "cublas.fp32.1024x1024x1024.b8.nn",
        "loop.fp32.1024x1024x1024.b8.nn",
    ]


def test_api_audit_matches_the_cli_findings() -> None:
    h100, _h200 = ca.load()
    rules = sorted({f.rule for f in ca.audit(h100)})
    assert rules == ["better-candidate", "reference-faster"]
