"""report.fix_report and report.lt_snippet: a FixSet in Markdown and each pin as C, on the fixes
of one recorded run (tests/fix_examples.py). The C is compiled with nvcc where cuBLAS's header is
installed (tests/cublaslt_header.py), in the background while the other tests run."""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from cublas_audit.planning.cases import Case
from cublas_audit.report.fix_report import environment_lines, render_fix_report
from cublas_audit.report.lt_snippet import algo_attributes, c_comment, c_identifier, c_snippet
from cublas_audit.report.tunableop import tunableop_export
from cublas_audit.table.fix_file import Fix, Problem
from tests.conftest import background_result, table_under
from tests.cublaslt_header import NVCC, cublaslt_include
from tests.fix_examples import candidate_fix, candidate_row, fix_set, pin_of


def _posed_fixes() -> list[Fix]:
    """The recorded pins, and the same fixes posed as the other calls the C must express: the
    bias epilogue on a transposed fp16 call, a broadcast operand with beta 1, TF32 compute,
    split-K with the COMPUTE_TYPE reduction, and text that would break C if pasted in."""
    recorded = list(fix_set().pins())
    fix = recorded[0]
    bias = Problem.of_case(
        Case("cublasLt", "fp16", 768, 12608, 3072, 1, "t", "n", lda=3072, ldb=3072, bias=True)
    )
    broadcast = Problem.of_case(
        Case("cublasLt", "bf16", 128, 512, 512, 64, "n", "t", broadcast="b", beta=1.0)
    )
    split_k = candidate_fix("cublasLt.fp32.2048x2048x2048.b1.nn", 3, "split-k")
    hostile = replace(
        fix, id="pin */ #include\n", fixed=replace(fix.fixed, kernel="x */ int oops; /* \u202e")
    )
    return [
        *recorded,
        replace(fix, id="bias-fp16", problem=bias),
        replace(fix, id="broadcast-bf16", problem=broadcast),
        replace(fix, id="tf32", problem=replace(fix.problem, mode="tf32")),
        split_k,
        hostile,
    ]


def background_work() -> dict[str, tuple[int, str]] | None:
    """The snippets compiled with -Wall -Wextra -Werror, the first alone as C (each is
    standalone, made by one template), all of them in one C unit and in one C++ unit (nvcc
    spends over a second on cublasLt.h as C++: it runs beside the C, and conftest starts this
    beside the other tests): {'c': (status, stderr), 'c++': ...}; None without nvcc or
    cublasLt.h."""
    include = cublaslt_include()
    if NVCC is None or include is None:
        return None
    stamp = fix_set().stamp
    code = [c_snippet(fix, stamp) for fix in _posed_fixes()]
    flags = [NVCC, "-c", f"-I{include}", "-Xcompiler", "-Wall,-Wextra,-Werror"]
    with tempfile.TemporaryDirectory(prefix="cublas-audit-snippets-") as folder:
        (Path(folder) / "alone.c").write_text(code[0])
        (Path(folder) / "all.c").write_text("".join(code))
        (Path(folder) / "all.cpp").write_text("".join(code))
        c_plus_plus = _nvcc([*flags, "all.cpp"], folder)
        results = {"c": _finished(_nvcc([*flags, "alone.c"], folder), "alone.c")}
        if results["c"][0] == 0:
            results["c"] = _finished(_nvcc([*flags, "all.c"], folder), "all.c")
        results["c++"] = _finished(c_plus_plus, "all.cpp")
    return results


def _nvcc(argv: list[str], folder: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _finished(process: subprocess.Popen[str], name: str) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=600)
    return process.returncode, f"{name}: {stderr}"


@pytest.fixture(scope="module")
def compiled(request: pytest.FixtureRequest) -> dict[str, tuple[int, str]] | None:
    result: dict[str, tuple[int, str]] | None = background_result(request)
    return result


@pytest.mark.parametrize("language", ["c", "c++"])
def test_every_snippet_compiles(compiled: dict[str, tuple[int, str]] | None, language: str) -> None:
    if compiled is None:
        pytest.skip("needs nvcc and cuBLAS's cublasLt.h (tests/cublaslt_header.py)")
    status, stderr = compiled[language]
    assert status == 0, stderr


def test_the_pin_is_rebuilt_attribute_by_attribute() -> None:
    fix = fix_set().fixes[0]  # algo 55, tile 128x128, stages 8x3, split-K 1 (candidate #2)
    code = c_snippet(fix, fix_set().stamp)
    assert "CUDA_R_32F, CUDA_R_32F, 55, &algo));" in code
    assert "const uint32_t tile = 20;  /* CUBLASLT_MATMUL_TILE_128x128 */" in code
    assert "const uint32_t stages = 31;  /* CUBLASLT_MATMUL_STAGES_8x3 */" in code
    assert "const uint16_t cluster_shape = 0;  /* CUBLASLT_CLUSTER_SHAPE_AUTO */" in code
    for name in ("TILE_ID", "STAGES_ID", "SPLITK_NUM", "REDUCTION_SCHEME", "CTA_SWIZZLING",
                 "CUSTOM_OPTION", "INNER_SHAPE_ID", "CLUSTER_SHAPE_ID"):  # fmt: skip
        assert f"cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_{name}," in code
    assert code.index("cublasLtMatmulAlgoCheck(") < code.index("cublasLtMatmul(handle")
    # the batch: count and packed strides on all three layouts
    assert code.count("CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch") == 3
    assert "const int32_t batch = 8;" in code and "stride_b = 3444736;" in code
    assert "cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F)" in code


def test_the_call_each_posed_fix_makes() -> None:
    fixes = {fix.id: fix for fix in _posed_fixes()}
    stamp = fix_set().stamp
    bias = c_snippet(fixes["bias-fp16"], stamp)
    assert "transa = CUBLAS_OP_T, transb = CUBLAS_OP_N" in bias
    assert "CUBLASLT_EPILOGUE_BIAS" in bias and "const void *bias," in bias
    assert "cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, 3072, 768, 3072)" in bias
    assert "BATCH_COUNT" not in bias
    broadcast = c_snippet(fixes["broadcast-bf16"], stamp)
    assert "const int64_t stride_b = 0;  /* shared by the batch */" in broadcast
    assert "beta = 1.0f;" in broadcast and "CUDA_R_16BF" in broadcast
    assert "CUBLAS_COMPUTE_32F_FAST_TF32" in c_snippet(fixes["tf32"], stamp)
    split_k = c_snippet(fixes["split-k"], stamp)
    assert "const int32_t split_k = 5;" in split_k
    assert "reduction = 2;  /* CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE */" in split_k
    assert "#define FIX_SPLIT_K_WORKSPACE_BYTES ((size_t)16779423)" in split_k


def test_fix_file_text_stays_in_comments() -> None:
    assert c_identifier("pin */ #include\n") == "fix_pin_____include_"
    assert c_comment("x */ y /* \nz") == "x * / y / * \\nz"
    hostile = c_snippet(_posed_fixes()[-1], fix_set().stamp)
    assert hostile.count("*/") == hostile.count("/*")
    assert "\u202e" not in hostile


def test_a_tile_the_binding_did_not_name() -> None:
    pin = replace(pin_of(candidate_row("cublasLt.fp32.1856x1856x1856.b8.nn", 2)), tile="9999")
    (tile, *_) = algo_attributes(pin)
    assert (tile.value, tile.comment) == (9999, "tile 9999: a number the binding did not name")


def test_the_report() -> None:
    fixes = fix_set()
    markdown = render_fix_report(fixes, tunableop_export(fixes, "2.14.1"), Path("out"))
    table = table_under(markdown, "## Fixes")
    assert table[0][:4] == ["fix", "problem", "PyTorch", "kind"]
    row = next(r for r in table[1:] if r[0] == "pin-1856")
    assert row[2] == "—"  # no trace named
    # the claim is the confirmation round's (Fix.claimed): candidates.csv's kernel_confirm_ms
    # 2.42381 -> 2.1783, and the screening round's 2.31467 / 2.08907 beside it
    assert row[5] == "2.424" and row[7] == "2.178"
    assert row[8] == "1.11x (screen 1.11x)"
    assert next(r for r in table[1:] if r[0] == "pad-1856")[8] == "1.07x"  # no confirmation
    env = re.search(r"```sh\n(.*?)\n```", markdown, re.S)
    assert env is not None
    assert env[1] == environment_lines(tunableop_export(fixes, "2.14.1").environment(Path("out")))
    assert f"PYTORCH_TUNABLEOP_FILENAME={Path('out').resolve() / 'tunableop.csv'}" in env[1]
    assert "`out/tunableop0.csv` carries 2 of the 3 fixes for torch 2.14.1" in markdown
    carried = table_under(markdown, "Not carried by the file:")
    assert [r[0] for r in carried[1:]] == ["pad-1856"]
    assert markdown.count("```c\n") == 2  # one C function per pin, none for the pad
    assert "#### pin-2112: fp32 2112x2112x2112 nn batch 8" in markdown


def test_the_report_without_a_tunableop_file_says_why() -> None:
    markdown = render_fix_report(fix_set(), None, Path("out"), "no torch version known")
    assert "No TunableOp file: no torch version known" in markdown
    assert "PYTORCH_TUNABLEOP" not in markdown


def test_every_fix_file_text_is_escaped() -> None:
    fixes = fix_set()
    fix = replace(fixes.fixes[2], id="pad|<b>", change="**pad** | [x](y)")
    markdown = render_fix_report(replace(fixes, fixes=(fix,)), None, Path("out"))
    assert "pad\\|\\<b\\>" in markdown and "\\*\\*pad\\*\\* \\| \\[x\\](y)" in markdown
    assert "<b>" not in markdown
