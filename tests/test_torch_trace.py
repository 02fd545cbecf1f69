"""PyTorch profiler traces recorded on the H100 (tests/fixtures/torch_traces/, made by record.py
there): every GEMM op found, its kernels attributed through correlation ids, its cuBLAS terms as
record.py's calls imply them (checked by hand below), and bad files as one-line errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.torch_trace import cases_of, gemm_calls, problems, read_trace

TRACES = Path(__file__).resolve().parent / "fixtures" / "torch_traces"
OPS, BLOCK = TRACES / "ops.json.gz", TRACES / "block.json.gz"


@pytest.fixture(scope="module")
def ops():  # type: ignore[no-untyped-def]
    return problems(read_trace(OPS))


def one(table, **where):  # type: ignore[no-untyped-def]
    rows = table
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1, where
    return rows.iloc[0]


def test_every_gemm_of_record_py_is_found_with_its_kernels() -> None:
    trace = read_trace(OPS)
    calls = gemm_calls(trace)
    # per dtype: 4 mm + addmm + linear (an addmm) + 2 bmm + baddbmm + matmul (an mm) + expanded
    # bmm + the column-major mm + the 114911 bmm = 11 GEMMs, in fp32, bf16 and fp16
    assert len(calls) == 33
    assert all(call.kernels for call in calls)
    # no kernel counted twice: every attributed kernel is a distinct event
    kernels = [id(k) for call in calls for k in call.kernels]
    assert len(kernels) == len(set(kernels))
    assert trace.sm_count == 132


def test_cublas_terms_of_record_py_calls(ops) -> None:  # type: ignore[no-untyped-def]
    # torch.mm(a, w.t()): w (384 x 256) transposed is cuBLAS's A stored k x m: transa t, lda 256
    row = one(ops, op="aten::mm", mode="fp32", M=512, N=384, K=256, cublas_transa="t")
    assert (row.cublas_m, row.cublas_n, row.cublas_k, row.cublas_lda) == (384, 512, 256, 256)
    # torch.mm(x.t(), b): the transposed A is cuBLAS's B: transb t, ldb 512
    row = one(ops, op="aten::mm", mode="bf16", M=512, N=384, K=256, cublas_transb="t")
    assert row.cublas_ldb == 512
    # the column-major 7 x 20000 A of pytorch#106469: cuBLAS's B, transb t, ldb 7
    row = one(ops, op="aten::mm", mode="fp16", M=7, N=100, K=20000)
    assert (row.cublas_transb, row.cublas_ldb, row.cublas_transa) == ("t", 7, "n")
    # torch.bmm(x, w.expand(4, ...)): the shared weight is cuBLAS's A, batch stride 0
    row = one(ops, op="aten::bmm", mode="fp32", batch=4, cublas_broadcast="a")
    assert (row.M, row.N, row.K) == (128, 192, 256)
    # pytorch#114911: bmm of batch 1, M = N = 1, K = 131072, on a dot kernel
    row = one(ops, op="aten::bmm", mode="fp32", M=1, N=1, K=131072)
    assert row.batch == 1 and "dot_kernel" in row.kernel_short
    # matmul of [4, 128, 256] by [256, 192] is the mm PyTorch folds it into: M = 4 * 128
    assert one(ops, op="aten::mm", mode="fp32", M=512, N=192, K=256).calls == 1
    # baddbmm(..., beta=0.5) keeps its beta; addmm with a bias vector is a bias
    assert one(ops, op="aten::baddbmm", mode="fp16").beta == 0.5
    assert one(ops, op="aten::addmm", mode="bf16", cublas_transa="n").bias


def test_shares_add_up_and_the_block_runs_its_linear_layers_three_times() -> None:
    table = problems(read_trace(BLOCK))
    assert table["share"].sum() == pytest.approx(1.0)
    addmm = table[table["op"] == "aten::addmm"]
    # qkv (512 -> 1536), out (512 -> 512), up (512 -> 2048), down (2048 -> 512); 4 x 256 tokens
    assert sorted(zip(addmm["N"], addmm["K"], strict=True)) == [
        (512, 512), (512, 2048), (1536, 512), (2048, 512),
    ]  # fmt: skip
    assert set(addmm["M"]) == {1024} and set(addmm["calls"]) == {3} and addmm["bias"].all()
    assert set(addmm["mode"]) == {"bf16"} and set(addmm["cublas_transa"]) == {"t"}


def test_trace_problems_become_sweep_cases() -> None:
    ids = [c.case_id for c in cases_of(read_trace(OPS))]
    assert "cublas.fp32.384x512x256.b1.tn" in ids  # x @ w.t()
    assert "cublas.fp32.192x128x256.b4.nn.bcast-a" in ids  # the expanded weight
    assert "cublas.fp32.1x1x131072.b1.nn.strided" in ids  # bmm of batch 1
    assert "cublas.fp16.192x128x256.b4.nn.beta0p5" in ids  # baddbmm, beta 0.5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such trace file"),
        (gzip.compress(b'{"traceEvents": [')[:-6], "cannot read the trace"),
        (b"{not json", "not a JSON trace"),
        (b'{"schemaVersion": 1}', "no traceEvents list"),
    ],
)
def test_bad_traces_are_one_line_errors(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "trace.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(AuditError, match=message):
        read_trace(path)
    result = CliRunner().invoke(app, ["shapes", "--torch-trace", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_shapes_command_in_markdown_and_json() -> None:
    runner = CliRunner()
    md = runner.invoke(app, ["shapes", "--torch-trace", str(BLOCK)])
    assert md.exit_code == 0, md.output
    assert "6 distinct problems, 18 calls" in md.output
    assert "aten\\:\\:addmm" in md.output and "1024x512x2048" in md.output
    js = runner.invoke(app, ["shapes", "--torch-trace", str(BLOCK), "--format", "json"])
    assert js.exit_code == 0 and '"cublas_transa": "t"' in js.output


def test_sweep_plans_exactly_the_trace_or_the_shape_list(tmp_path: Path) -> None:
    from cublas_audit.cli import _listed_cases

    from_trace = _listed_cases(None, BLOCK, "fp32", "cublas,cublasLt")
    assert {c.api for c in from_trace} == {"cublas", "cublasLt"}
    assert {c.mode for c in from_trace} == {"bf16"}  # the trace's own modes, not --modes
    assert any(c.bias for c in from_trace if c.api == "cublasLt")
    listed = tmp_path / "shapes.csv"
    listed.write_text("m,n,k,batch,layout,mode,ldb,broadcast\n7,100,100000,1,tn,bf16,,\n"
                      "8192,512,8192,4,nn,fp16,,a\n1,1,131072,1,nn,,,\n")  # fmt: skip
    ids = [c.case_id for c in _listed_cases(listed, None, "fp32", "cublas")]
    assert ids == [
        "cublas.bf16.7x100x100000.b1.tn",
        "cublas.fp16.8192x512x8192.b4.nn.bcast-a",
        "cublas.fp32.1x1x131072.b1.nn",  # --modes where the row names none
    ]
    with pytest.raises(AuditError, match="both"):
        _listed_cases(listed, BLOCK, "fp32", "cublas")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m,n\n1,2\n", "missing column"),
        ("m,n,k,colour\n1,2,3,red\n", "unknown column"),
        ("m,n,k\n1,2,-3\n", "row 1: k: '-3' is not a positive integer"),
        ("m,n,k,layout\n4,4,4,xy\n", "row 1: layout: unknown value 'xy'"),
        ("m,n,k,lda\n64,4,4,8\n", "row 1: .*lda 8 is smaller than the 64 rows"),
    ],
)
def test_bad_shape_lists_name_the_row(tmp_path: Path, text: str, message: str) -> None:
    from cublas_audit.cases import read_shapes_file

    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(AuditError, match=message):
        read_shapes_file(path, ["fp32"], ["cublas"])


def test_report_audits_the_trace_and_weights_findings_by_share() -> None:
    runner = CliRunner()
    plain = runner.invoke(app, ["report", "--torch-trace", str(OPS)])
    assert plain.exit_code == 0, plain.output
    assert "## Findings (0)" in plain.output  # nothing reaches the default thresholds
    # FP32 x @ w.t() (cuBLAS tn) took 0.008672 ms, the same mm as tn's mirror nt 0.007872 ms:
    # 1.10x, a layout penalty once the threshold is lowered to 1.05
    lowered = runner.invoke(
        app, ["report", "--torch-trace", str(OPS), "--threshold", "layout_penalty_ratio=1.05"]
    )
    assert lowered.exit_code == 0, lowered.output
    line = next(x for x in lowered.output.splitlines() if "1.10x the time of layout nt" in x)
    assert "`layout-penalty` · 4.8 % of GEMM time" in line
    both = runner.invoke(app, ["report", str(OPS), "--torch-trace", str(OPS)])
    assert both.exit_code == 2


def test_reference_takes_the_shape_list_rows_it_can_compute(tmp_path: Path) -> None:
    from cublas_audit.cli import _reference_problems

    listed = tmp_path / "shapes.csv"
    listed.write_text(
        "m,n,k,batch,layout,beta\n4096,1024,512,8,nn,\n64,64,64,1,tn,\n8,8,8,1,nn,1\n"
    )
    assert _reference_problems(listed) == [(4096, 1024, 512, 8)]
    listed.write_text("m,n,k,layout\n64,64,64,tn\n")
    result = CliRunner().invoke(app, ["reference", "--shapes-file", str(listed)])
    assert result.exit_code == 2 and "all the reference computes" in result.output
