"""PyTorch profiler traces recorded on the H100 with PyTorch 2.11 (tests/fixtures/torch_traces/,
made by record.py there). Every expected value below is read off record.py's calls by hand (and,
for cuBLAS's terms, off PyTorch's Blas.cpp rules the module docstring states), never copied from
the code's output; attribution is checked against the raw JSON independently."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.observe import torch_trace
from cublas_audit.observe.torch_trace import cases_of, gemm_calls, problems, read_trace

TRACES = Path(__file__).resolve().parent / "fixtures" / "torch_traces"
OPS, BLOCK = TRACES / "ops.json.gz", TRACES / "block.json.gz"
DTYPES = ("fp32", "bf16", "fp16")
runner = CliRunner()


@pytest.fixture(scope="module")
def ops() -> pd.DataFrame:
    return problems(read_trace(OPS))


@pytest.fixture(scope="module")
def block() -> pd.DataFrame:
    return problems(read_trace(BLOCK))


def one(table: pd.DataFrame, **where: Any) -> pd.Series:
    rows = table
    for column, value in where.items():
        rows = rows[rows[column].map(lambda cell, value=value: cell == value)]
    assert len(rows) == 1, (where, len(rows))
    return rows.iloc[0]


def cublas(row: pd.Series) -> tuple[Any, ...]:
    names = ("m", "n", "k", "transa", "transb", "lda", "ldb", "stride_a", "stride_b")
    return tuple(row[f"cublas_{name}"] for name in names)


@pytest.mark.parametrize("mode", DTYPES)
def test_each_dtype_has_the_plain_and_the_transposed_mm(ops: pd.DataFrame, mode: str) -> None:
    # torch.mm(a, b): a 512 x 256, b 256 x 384, both row-major: cuBLAS 384 x 512 x 256, nn
    row = one(ops, op="aten::mm", mode=mode, a_strides=(256, 1), b_strides=(384, 1))
    assert (row.M, row.N, row.K, row.batch, row.calls) == (512, 384, 256, 1, 1)
    assert cublas(row) == (384, 512, 256, "n", "n", 384, 256, 0, 0)
    # torch.mm(a, w.t()), w 384 x 256: torch's B (strides [1, 256]) is cuBLAS's A: transa t
    row = one(ops, op="aten::mm", mode=mode, b_strides=(1, 256))
    assert cublas(row) == (384, 512, 256, "t", "n", 256, 256, 0, 0)
    # torch.mm(x.t(), b), x 256 x 512: torch's A (strides [1, 512]) is cuBLAS's B: transb t
    row = one(ops, op="aten::mm", mode=mode, a_strides=(1, 512))
    assert cublas(row) == (384, 512, 256, "n", "t", 384, 512, 0, 0)


@pytest.mark.parametrize("mode", DTYPES)
def test_odd_layouts_of_record_py(ops: pd.DataFrame, mode: str) -> None:
    # randn(20000, 7).t() @ randn(20000, 100) (pytorch#106469): A is column-major with ld 7
    row = one(ops, op="aten::mm", mode=mode, M=7)
    assert (row.N, row.K, row.a_strides) == (100, 20000, (1, 7))
    assert cublas(row) == (100, 7, 20000, "n", "t", 100, 7, 0, 0)
    # bmm(x, w.expand(4, 256, 192)): the shared weight is torch's B, so cuBLAS's A: stride_a 0
    row = one(ops, op="aten::bmm", mode=mode, b_strides=(0, 192, 1))
    assert (row.M, row.N, row.K, row.batch) == (128, 192, 256, 4)
    assert cublas(row) == (192, 128, 256, "n", "n", 192, 256, 0, 128 * 256)
    assert row.cublas_broadcast == "a"
    # the plain bmm: each operand's batch stride is its matrix size
    row = one(ops, op="aten::bmm", mode=mode, b_strides=(256 * 192, 192, 1))
    assert (row.cublas_stride_a, row.cublas_stride_b) == (256 * 192, 128 * 256)
    # pytorch#114911: bmm of batch 1, M = N = 1, K = 131072; an output with N == 1 is not
    # swapped (m = M, cuBLAS's A is torch's A), and both operands are then read transposed
    row = one(ops, op="aten::bmm", mode=mode, M=1)
    assert (row.N, row.K, row.batch) == (1, 131072, 1)
    assert cublas(row)[:7] == (1, 1, 131072, "t", "t", 131072, 1)
    assert "dot_kernel" in row.kernel_short  # cuBLAS runs it as a dot product


@pytest.mark.parametrize("mode", DTYPES)
def test_bias_beta_and_the_containers(ops: pd.DataFrame, mode: str) -> None:
    # addmm(bias, a, b): a bias vector of 384 with beta 1 goes to cuBLASLt's epilogue
    row = one(ops, op="aten::addmm", mode=mode, via="")
    assert (row.bias, row.beta, row.cublas_bias, row.cublas_beta) == (True, 1.0, True, 0.0)
    assert (row.cublas_transa, row.cublas_transb) == ("n", "n")
    # linear(a, w, bias) is the addmm it calls on w.t(): layout tn
    row = one(ops, op="aten::addmm", mode=mode, via="aten::linear")
    assert (row.M, row.N, row.K, row.bias, row.cublas_bias) == (512, 384, 256, True, True)
    assert (row.cublas_transa, row.cublas_lda) == ("t", 256)
    # baddbmm(c, x, y, beta=0.5): C is copied into the output first (aux), then scaled by beta
    row = one(ops, op="aten::baddbmm", mode=mode)
    assert (row.batch, row.beta, row.cublas_beta, row.cublas_bias) == (4, 0.5, 0.5, False)
    assert "DtoD" in row.aux_kernels and row.aux_gpu_ms > 0
    # matmul of [4, 128, 256] by [256, 192] is the mm PyTorch folds it into: M = 4 * 128
    row = one(ops, op="aten::mm", mode=mode, via="aten::matmul")
    assert (row.M, row.N, row.K, row.calls) == (4 * 128, 192, 256, 1)
    assert not ops["op"].isin(["aten::matmul", "aten::linear"]).any()


def test_every_gemm_op_is_found_once(ops: pd.DataFrame) -> None:
    # per dtype: 3 mm + addmm + linear's addmm + bmm + baddbmm + matmul's mm + the expanded
    # bmm + the column-major mm + the 114911 bmm = 11 GEMMs, each a distinct problem
    assert len(ops) == 3 * 11 and set(ops["calls"]) == {1}
    assert sorted(ops["mode"].value_counts().to_dict().items()) == [
        ("bf16", 11), ("fp16", 11), ("fp32", 11),
    ]  # fmt: skip
    assert ops["share"].sum() == pytest.approx(1.0)
    assert list(ops["total_gpu_ms"]) == sorted(ops["total_gpu_ms"], reverse=True)


def _raw(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return events


def holds_op(call: torch_trace.GemmCall, launch: dict[str, Any]) -> bool:
    return call.op.start <= round(launch["ts"] * 1000) <= call.op.end


@pytest.mark.parametrize("path", [OPS, BLOCK])
def test_kernels_come_through_correlation_ids_and_count_once(path: Path) -> None:
    """Checked on the raw JSON: each attributed kernel's correlation id belongs to a launch on
    the op's thread inside the op's time span, no kernel is attributed twice, and the GEMM time
    is exactly the kernels launched inside the leaf GEMM ops (mm, addmm, bmm, baddbmm)."""
    events = _raw(path)
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    calls = gemm_calls(read_trace(path))
    attributed = [k.correlation for call in calls for k in (*call.kernels, *call.aux)]
    assert len(attributed) == len(set(attributed))
    gemm_ops = [e for e in events if e.get("cat") == "cpu_op" and e["name"] in torch_trace.GEMM_OPS]

    def holds(op: dict[str, Any], launch: dict[str, Any]) -> bool:
        return bool(op["tid"] == launch["tid"] and op["ts"] <= launch["ts"] <= op["ts"] + op["dur"])

    for call in calls:
        assert call.kernels, call.problem
        for kernel in call.kernels:  # launched inside the op itself
            launch = launches[kernel.correlation]
            assert launch["tid"] == call.op.thread[1]
            assert call.op.start <= round(launch["ts"] * 1000) <= call.op.end
        for kernel in call.aux:  # inside the op or the container (matmul) that called it
            launch = launches[kernel.correlation]
            outer = [op for op in gemm_ops if holds(op, launch) and op["name"] in call.via]
            assert holds_op(call, launch) or any(
                op["ts"] <= call.op.start / 1000 <= op["ts"] + op["dur"] for op in outer
            )
    leaf_ops = [e for e in gemm_ops if e["name"] in torch_trace.LEAF_OPS]
    inside: dict[int, float] = {}
    for event in events:
        if event.get("cat") != "kernel" or "at::native" in event["name"]:
            continue
        launch = launches[event["args"]["correlation"]]
        if any(op["ts"] <= launch["ts"] <= op["ts"] + op["dur"] for op in leaf_ops):
            inside[event["args"]["correlation"]] = event["dur"]
    total_us = problems(read_trace(path))["total_gpu_ms"].sum() * 1e3
    assert total_us == pytest.approx(sum(inside.values()))
    assert sorted(k.correlation for call in calls for k in call.kernels) == sorted(inside)


def test_the_block_runs_its_linear_layers_as_addmm_with_bias(block: pd.DataFrame) -> None:
    addmm = block[block["op"] == "aten::addmm"]
    # qkv (512 -> 1536), out (512 -> 512), up (512 -> 2048), down (2048 -> 512) on 4 x 256 tokens
    assert sorted(zip(addmm["N"], addmm["K"], strict=True)) == [
        (512, 512), (512, 2048), (1536, 512), (2048, 512),
    ]  # fmt: skip
    assert set(addmm["M"]) == {4 * 256} and set(addmm["calls"]) == {3}  # 3 steps
    assert addmm["calls"].sum() == 3 * 4
    assert addmm["bias"].all() and addmm["cublas_bias"].all() and set(addmm["mode"]) == {"bf16"}
    assert set(addmm["via"]) == {"aten::linear"} and set(addmm["cublas_transa"]) == {"t"}


def test_the_attention_matmuls_are_bmm_with_their_copies_apart(block: pd.DataFrame) -> None:
    bmm = block[block["op"] == "aten::bmm"].set_index("K")
    # q @ k^T: 4 x 8 heads of [256, 64] @ [64, 256]; softmax @ v: [256, 256] @ [256, 64]
    assert (bmm.loc[64, "M"], bmm.loc[64, "N"], bmm.loc[64, "batch"]) == (256, 256, 32)
    assert (bmm.loc[256, "M"], bmm.loc[256, "N"], bmm.loc[256, "batch"]) == (256, 64, 32)
    assert set(bmm["via"]) == {"aten::matmul"} and set(bmm["calls"]) == {3}
    # the transposed heads are made contiguous (reshape -> clone) inside matmul, before the bmm:
    # PyTorch's elementwise copies are the bmm's aux work, never its GEMM time
    assert set(bmm["aux_kernels"]) == {"elementwise_kernel"} and (bmm["aux_gpu_ms"] > 0).all()
    assert not bmm["kernel_short"].str.contains("elementwise").any()
    assert block["share"].sum() == pytest.approx(1.0)


def test_plain_json_and_small_chunks_read_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Magic bytes, not the suffix, tell gzip apart; a chunk boundary anywhere changes nothing."""
    plain = tmp_path / "trace.json.gz"  # plain JSON under a gzip suffix
    plain.write_bytes(gzip.decompress(OPS.read_bytes()))
    expected = problems(read_trace(OPS))
    pd.testing.assert_frame_equal(problems(read_trace(plain)), expected)
    monkeypatch.setattr(torch_trace.reader, "_CHUNK_CHARS", 997)
    pd.testing.assert_frame_equal(problems(read_trace(OPS)), expected)


def test_trace_problems_become_sweep_cases() -> None:
    ids = [c.case_id for c in cases_of(read_trace(OPS))]
    assert "cublas.fp32.384x512x256.b1.tn" in ids  # x @ w.t()
    assert "cublas.fp32.192x128x256.b4.nn.bcast-a" in ids  # the expanded weight
    assert "cublas.fp32.100x7x20000.b1.nt" in ids  # ldb 7 is packed for a 7-row op(B)
    assert "cublas.fp32.1x1x131072.b1.tt" in ids  # batch 1: PyTorch calls gemm, not bgemm
    assert "cublas.fp16.192x128x256.b4.nn.beta0p5" in ids  # baddbmm, beta 0.5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such trace file"),
        (OPS.read_bytes()[:9000], "cannot read the trace"),
        (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1', "not a JSON trace"),
        (b"{not json", "not a PyTorch profiler trace"),
        (b"\xff\xfe\x00binary", "not a JSON trace"),
        (b'{"schemaVersion": 1}', "no traceEvents list"),
        (b'[{"ph": "X"}]', "not a JSON object"),
        (b'{"traceEvents": 7}', "expected '\\['"),
    ],
)
def test_bad_traces_are_one_line_errors(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "trace.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(AuditError, match=message) as raised:
        read_trace(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)
    result = runner.invoke(app, ["shapes", "--torch-trace", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_shapes_command_in_markdown_json_and_to_a_file(tmp_path: Path) -> None:
    md = runner.invoke(app, ["shapes", "--torch-trace", str(BLOCK)])
    assert md.exit_code == 0, md.output
    assert "6 distinct problems, 18 calls" in md.output
    assert "aten\\:\\:addmm (in aten\\:\\:linear)" in md.output and "1024x512x2048" in md.output
    js = runner.invoke(app, ["shapes", "--torch-trace", str(BLOCK), "--format", "json"])
    assert js.exit_code == 0, js.output
    records = json.loads(js.output)
    assert len(records) == 6 and {r["cublas_transa"] for r in records if r["bias"]} == {"t"}
    assert {tuple(r["b_strides"]) for r in records if r["op"] == "aten::addmm"} == {
        (1, 512), (1, 2048),
    }  # fmt: skip
    out = tmp_path / "shapes.md"
    written = runner.invoke(app, ["shapes", "--torch-trace", str(OPS), "--out", str(out)])
    assert written.exit_code == 0 and out.read_text().startswith("# GEMMs of a PyTorch trace")
    refused = runner.invoke(app, ["shapes", "--torch-trace", str(OPS), "--out", str(OPS)])
    assert refused.exit_code == 2 and "would overwrite the input" in refused.output


def test_sweep_plans_exactly_the_trace_or_the_shape_list(tmp_path: Path) -> None:
    from cublas_audit.cli.options import Listed, listed_cases

    from_trace = listed_cases(Listed(None, BLOCK, "fp32", "cublas,cublasLt"))
    assert {c.api for c in from_trace} == {"cublas", "cublasLt"}
    assert {c.mode for c in from_trace} == {"bf16"}  # the trace's own modes, not --modes
    assert any(c.bias for c in from_trace if c.api == "cublasLt")
    listed = tmp_path / "shapes.csv"
    listed.write_text("m,n,k,batch,layout,mode,ldb,broadcast\n7,100,100000,1,tn,bf16,,\n"
                      "8192,512,8192,4,nn,fp16,,a\n1,1,131072,1,nn,,,\n")  # fmt: skip
    ids = [c.case_id for c in listed_cases(Listed(listed, None, "fp32", "cublas"))]
    assert ids == [
        "cublas.bf16.7x100x100000.b1.tn",
        "cublas.fp16.8192x512x8192.b4.nn.bcast-a",
        "cublas.fp32.1x1x131072.b1.nn",  # --modes where the row names none
    ]
    with pytest.raises(AuditError, match="both"):
        listed_cases(Listed(listed, BLOCK, "fp32", "cublas"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m,n\n1,2\n", "missing column"),
        ("m,n,k,colour\n1,2,3,red\n", "unknown column"),
        ("m,n,k\n1,2,-3\n", "row 1: k: '-3' is not a positive integer"),
        ("m,n,k,layout\n4,4,4,xy\n", "row 1: layout: unknown value 'xy'"),
        ("m,n,k,lda\n64,4,4,8\n", "row 1: .*lda 8 is smaller than the 64 rows"),
        ("m,n,k,lda\n64,4,4,x\n", "row 1: lda: 'x' is not an integer"),
        ("m,n,k,bias\n4,4,4,maybe\n", "row 1: bias: 'maybe' is not one of 1, true"),
        ("m,n,k,broadcast\n4,4,4,c\n", "row 1: broadcast: 'c' is not a or b"),
        ("m,n,k,mode\n4,4,4,fp64\n", "row 1: mode: unknown value 'fp64'"),
    ],
)
def test_bad_shape_lists_name_the_row(tmp_path: Path, text: str, message: str) -> None:
    from cublas_audit.planning.shapes_file import read_shapes_file

    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(AuditError, match=message):
        read_shapes_file(path, ["fp32"], ["cublas"])


def test_a_json_shape_list_reads_each_object_as_written(tmp_path: Path) -> None:
    """A key one object lacks takes its default, and the others' numbers stay integers (a table
    built from the list would make the batch column 4.0 and NaN)."""
    from cublas_audit.planning.shapes_file import read_shapes_file

    path = tmp_path / "shapes.json"
    path.write_text(json.dumps([{"m": 256, "n": 256, "k": 256, "batch": 4}, {"m": 7, "n": 100,
                                "k": 100000, "beta": 0.5}]))  # fmt: skip
    ids = [c.case_id for c in read_shapes_file(path, ["fp32"], ["cublas"])]
    assert ids == ["cublas.fp32.256x256x256.b4.nn", "cublas.fp32.7x100x100000.b1.nn.beta0p5"]


def test_threads_are_kept_apart() -> None:
    """A launch on another thread inside a GEMM op's span is not that op's."""
    trace = read_trace(OPS)
    moved = [launch._replace(thread=(launch.thread[0], -1)) for launch in trace.launches]
    trace.launches = moved
    calls = gemm_calls(trace)
    assert len(calls) == 33 and not any(call.kernels or call.aux for call in calls)


@pytest.mark.heavy
def test_report_audits_the_trace_and_weights_findings_by_share() -> None:
    """Heavy (the ops trace's 33 problems judged twice: 2 s of CPU): the quick suite reports the
    ops trace at the lowered layout_penalty_ratio in JSON (test_trace_impact's
    test_a_small_worth_is_info_on_a_call_the_model_makes: the same finding, its share of the GEMM
    time) and every other recorded trace in Markdown (test_missing_counters)."""
    runner = CliRunner()
    plain = runner.invoke(app, ["report", "--torch-trace", str(OPS)])
    assert plain.exit_code == 0, plain.output
    assert "## Findings (0)" in plain.output  # nothing reaches the default thresholds
    # FP32 x @ w.t() (cuBLAS tn) took 0.008672 ms, the plain mm with the transposed A (cuBLAS nt)
    # 0.007872 ms: 1.10x, a layout penalty once the threshold is lowered to 1.05
    lowered = runner.invoke(
        app, ["report", "--torch-trace", str(OPS), "--threshold", "layout_penalty_ratio=1.05"]
    )
    assert lowered.exit_code == 0, lowered.output
    line = next(x for x in lowered.output.splitlines() if "1.10x the time of layout nt" in x)
    assert "`layout-penalty` · 4.8 % of GEMM time" in line
    both = runner.invoke(app, ["report", str(OPS), "--torch-trace", str(OPS)])
    assert both.exit_code == 2


def test_reference_takes_the_shape_list_rows_it_can_compute(tmp_path: Path) -> None:
    from cublas_audit.cli.measure_commands import reference_problems

    listed = tmp_path / "shapes.csv"
    listed.write_text(
        "m,n,k,batch,layout,beta\n4096,1024,512,8,nn,\n64,64,64,1,tn,\n8,8,8,1,nn,1\n"
    )
    assert reference_problems(listed) == [(4096, 1024, 512, 8)]
    listed.write_text("m,n,k,layout\n64,64,64,tn\n")
    result = CliRunner().invoke(app, ["reference", "--shapes-file", str(listed)])
    assert result.exit_code == 2 and "all the reference computes" in result.output


@pytest.mark.parametrize(
    ("category", "key", "value"),
    [("cpu_op", "dur", -1.0), ("cpu_op", "ts", float("inf")), ("kernel", "dur", float("nan"))],
)
def test_times_that_are_no_measurement_are_refused(
    tmp_path: Path, category: str, key: str, value: float
) -> None:
    """The recorded trace with one event's time made impossible: a one-line error naming the
    event, never a silent read (nor an OverflowError, exit 4, on an infinite start time)."""
    with gzip.open(OPS, "rt") as stream:
        trace = json.load(stream)
    event = next(e for e in trace["traceEvents"] if e.get("cat") == category)
    event[key] = value
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    with pytest.raises(AuditError, match=rf"\({key}\) is {value!r}") as raised:
        read_trace(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)
    assert event["name"][:40] in str(raised.value)


def test_kernel_grids_and_ctas_are_the_recorded_ones(ops: pd.DataFrame) -> None:
    """Each kernel's grid and block as the raw JSON records them (read here with gzip + json,
    not through the reader), and a problem's `ctas` the largest grid of its kernels: checked on
    every single-call problem whose kernels each ran once in the trace (a split-K GEMM and its
    reduction among them)."""
    with gzip.open(OPS, "rt") as stream:
        raw = [e for e in json.load(stream)["traceEvents"] if e.get("cat") == "kernel"]
    trace = read_trace(OPS)
    for event in raw:
        read = trace.activities[event["args"]["correlation"]]
        assert [(a.grid, a.block) for a in read if a.name == event["name"]] == [
            (tuple(event["args"]["grid"]), tuple(event["args"]["block"]))
        ]
    grids: dict[str, list[int]] = {}
    for event in raw:
        x, y, z = event["args"]["grid"]
        grids.setdefault(event["name"], []).append(x * y * z)
    checked = 0
    for row in ops[ops["calls"] == 1].itertuples():
        names = row.kernels.split(" + ")
        if all(len(grids[name]) == 1 for name in names):
            assert row.ctas == max(grids[name][0] for name in names), row.kernels
            checked += 1
    assert checked >= 10  # the nvjet, xmma and split-K cutlass kernels of record.py's calls
