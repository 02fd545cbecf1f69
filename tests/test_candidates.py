"""The cuBLASLt candidate audit on the CPU: ranking, left_on_table, confirmation, findings,
the candidates.csv schema, the Markdown section and repro, and the measuring loop driven by a
fake GPU (numpy arrays, a scripted cuBLASLt, scripted timings)."""

from __future__ import annotations

import ctypes
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from enum import IntEnum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit import candidates as cd
from cublas_audit import lt, timing
from cublas_audit.cases import Case
from cublas_audit.cli import app
from cublas_audit.errors import AuditError, ToolMissingError

CASE_ID = "cublasLt.fp32.256x256x256.b8.nn"


def candidate_row(
    index: int, time_ms: float | None, status: str = "ok", **extra: Any
) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "gpu_label": "h100",
        "case_id": CASE_ID,
        "mode": "fp32",
        "m": 256,
        "n": 256,
        "k": 256,
        "batch": 8,
        "candidate": index,
        "is_default": int(index == 0),
        "algo_id": 55,
        "tile": ["32x32", "64x64", "128x128", "64x128"][index % 4],
        "stages": "8x3",
        "split_k": 1,
        "reduction_scheme": "NONE",
        "cta_swizzling": 0,
        "cluster_shape": "1x1x1",
        "custom_option": 0,
        "inner_shape": 0,
        "workspace_bytes": 0,
        "waves_count": 1.5,
        "status": status,
        "reason": None if status == "ok" else "scripted",
        "time_ms": time_ms,
        **extra,
    }


def gap_case(confirm: float | None) -> list[dict[str, Any]]:
    """The DESIGN.md measurement: default (32x32) 1.2x the best (64x64); one wrong, one failed
    candidate (faster on paper: they must never count)."""
    confirmed: dict[str, Any] = {} if confirm is None else {"confirm_left_on_table": confirm}
    return [
        candidate_row(0, 0.012, confirm_time_ms=0.012, **confirmed),
        candidate_row(1, 0.010, confirm_time_ms=0.012 / confirm if confirm else None, **confirmed),
        candidate_row(2, 0.005, "wrong", **confirmed),
        candidate_row(3, None, "failed", **confirmed),
    ]


# ----- ranking and left_on_table --------------------------------------------------------------
def test_ranks_count_only_correct_timed_candidates() -> None:
    frame = cd.from_records(gap_case(1.19))
    assert frame["rank"].tolist() == [2, 1, pd.NA, pd.NA]
    assert frame["left_on_table"].iloc[0] == pytest.approx(1.2)
    assert frame["left_on_table"].nunique() == 1  # repeated on every row of the case


def test_no_left_on_table_when_the_default_is_wrong() -> None:
    rows = gap_case(1.19)
    rows[0]["status"] = "wrong"
    assert pd.isna(cd.from_records(rows)["left_on_table"].iloc[0])


def test_case_summary_names_default_rank_and_best() -> None:
    summary = cd.case_summary(cd.from_records(gap_case(1.19))).iloc[0]
    assert (summary["candidates"], summary["correct"]) == (4, 2)
    assert (summary["default_rank"], summary["best_candidate"]) == (2, 1)


def test_a_skipped_case_keeps_its_reason() -> None:
    skipped = {**candidate_row(0, None), "candidate": None, "status": "skipped", "reason": "OOM"}
    summary = cd.case_summary(cd.from_records([skipped])).iloc[0]
    assert (summary["status"], summary["reason"], summary["candidates"]) == ("skipped", "OOM", 0)


# ----- findings --------------------------------------------------------------------------------
def test_a_confirmed_gap_is_a_better_candidate_finding() -> None:
    (finding,) = cd.find_better_candidates(cd.from_records(gap_case(1.19)), 0.10)
    assert finding["rule"] == "better-candidate"
    assert (finding["api"], finding["mode"], finding["batch"]) == ("cublasLt", "fp32", 8)
    assert finding["sizes"] == ["256x256x256"]
    default, best = finding["evidence"]
    assert (default["role"], default["tile"], default["case_id"]) == ("default", "32x32", CASE_ID)
    assert (best["role"], best["tile"]) == ("best", "64x64")
    assert best["left_on_table"] == pytest.approx(1.2)
    assert finding["rows"] == [0, 1]
    assert "1.20x" in finding["message"]
    json.dumps(finding)  # plain Python values only


def test_findings_have_the_fields_of_a_finding_record() -> None:
    from cublas_audit.findings import Finding

    (finding,) = cd.find_better_candidates(cd.from_records(gap_case(1.19)), 0.10)
    assert Finding(**finding).to_json() == finding


@pytest.mark.parametrize(
    ("confirm", "threshold", "flagged"),
    [(1.19, 0.10, True), (1.05, 0.10, False), (None, 0.10, False), (1.19, 0.25, False)],
)
def test_findings_need_both_rounds_above_the_threshold(
    confirm: float | None, threshold: float, flagged: bool
) -> None:
    frame = cd.from_records(gap_case(confirm))
    assert bool(cd.find_better_candidates(frame, threshold)) is flagged


def test_exactly_at_the_threshold_counts() -> None:
    assert cd.is_better(1.10, 1.10, 0.10)
    assert not cd.is_better(1.10, pd.NA, 0.10)


# ----- timing plan -----------------------------------------------------------------------------
def test_finalists_are_the_default_and_those_near_the_best() -> None:
    medians = {"0": 3.0, "1": 1.0, "2": 1.2, "3": 1.3}
    assert cd.finalist_keys(medians, "0") == ["0", "1", "2"]


def scripted_timing(
    monkeypatch: pytest.MonkeyPatch, medians: Mapping[str, float], reps: Callable[[int], int]
) -> list[list[str]]:
    """timing.time_interleaved replaced by fixed medians; returns the contenders of each call."""
    calls: list[list[str]] = []

    def fake(launchers: Mapping[str, Any], min_reps: int = 20) -> dict[str, timing.Timing]:
        calls.append(list(launchers))
        return {key: timing.Timing(medians[key], medians[key], reps(min_reps)) for key in launchers}

    monkeypatch.setattr(timing, "time_interleaved", fake)
    return calls


def test_short_calls_need_one_round(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = scripted_timing(monkeypatch, {"0": 1.0, "1": 2.0}, lambda _: 200)
    times = cd.time_candidates(dict.fromkeys(("0", "1"), lambda: None), "0", 20)
    assert calls == [["0", "1"]]
    assert {how for _, how in times.values()} == {"full"}


def test_long_calls_get_a_full_round_for_the_finalists(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = scripted_timing(monkeypatch, {"0": 5.0, "1": 1.0, "2": 9.0}, lambda n: n)
    times = cd.time_candidates(dict.fromkeys(("0", "1", "2"), lambda: None), "0", 20)
    assert calls == [["0", "1", "2"], ["0", "1"]]
    assert times["2"][1] == "screen"
    assert times["0"][0].reps == 20


# ----- candidates.csv --------------------------------------------------------------------------
def test_csv_round_trip(tmp_path: Path) -> None:
    frame = cd.from_records(gap_case(1.19))
    cd.write_candidates(frame, tmp_path / cd.CANDIDATES_FILE)
    back = cd.read_candidates(tmp_path)
    pd.testing.assert_frame_equal(frame, back, check_exact=False, rtol=1e-5)
    assert list(back.columns) == list(cd.COLUMNS)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("m", "big", "column 'm': expected an integer, got 'big'"),
        ("time_ms", "fast", "column 'time_ms': expected a number"),
        ("status", "great", "column 'status': unknown value 'great'"),
        ("mode", "fp64", "column 'mode': unknown value 'fp64'"),
    ],
)
def test_bad_values_are_one_line_errors(
    tmp_path: Path, column: str, value: str, message: str
) -> None:
    frame = cd.from_records(gap_case(1.19)).astype(object)
    frame.loc[1, column] = value
    frame.to_csv(tmp_path / "candidates.csv", index=False)
    with pytest.raises(AuditError, match="row 2, " + message):
        cd.read_candidates(tmp_path)


def test_missing_columns_and_files(tmp_path: Path) -> None:
    pd.DataFrame({"case_id": ["x"]}).to_csv(tmp_path / "candidates.csv", index=False)
    with pytest.raises(AuditError, match="missing required column"):
        cd.read_candidates(tmp_path)
    with pytest.raises(AuditError, match="no such file"):
        cd.read_candidates(tmp_path / "nowhere.csv")


# ----- Markdown ---------------------------------------------------------------------------------
def test_markdown_flags_the_case_and_carries_a_repro() -> None:
    text = cd.render_markdown(cd.from_records(gap_case(1.19)), 0.10)
    assert "## cuBLASLt heuristic candidates" in text
    assert "### better-candidate: fp32 256x256x256 batch 8" in text
    assert "set_(C.TILE_ID, lt.MatmulTile.TILE_64x64)" in text
    assert "set_(C.STAGES_ID, lt.MatmulStages.STAGES_8x3)" in text
    code = text.split("```python\n")[1].split("```")[0]
    compile(code, "repro.py", "exec")


def test_unflagged_cases_have_no_repro() -> None:
    text = cd.render_markdown(cd.from_records(gap_case(1.02)), 0.10)
    assert "```python" not in text


def test_bf16_repro_stores_bf16_bits() -> None:
    row = cd.from_records([candidate_row(1, 1.0, mode="bf16")]).iloc[0]
    code = cd.repro(row)
    assert "COMPUTE_32F" in code and "CUDA_R_16BF" in code and "cp.uint16" in code
    compile(code, "repro.py", "exec")


# ----- the measuring loop on a fake GPU --------------------------------------------------------
class DevArray(np.ndarray):
    """A numpy array that answers `.data.ptr` like a cupy array."""

    @property
    def data(self) -> Any:
        return SimpleNamespace(ptr=0)


class FakeGemm:
    """cuBLASLt scripted per candidate: 'ok' writes A @ B, 'wrong' writes garbage, 'raise'
    fails like an unsupported configuration."""

    script: ClassVar[dict[int, str]] = {}
    workspace: ClassVar[dict[int, int]] = {2: 64 << 20}  # more than the default 32 MiB
    arrays: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, mode: str, *shape_and_ptrs: int, workspace_bytes: int = 0) -> None:
        self.workspace_bytes = workspace_bytes

    def heuristics(self, limit: int) -> list[lt.LtCandidate]:
        return [self._candidate(i) for i in sorted(self.script)[:limit]]

    def default(self) -> lt.LtCandidate:
        return self._candidate(0)

    def _candidate(self, index: int) -> lt.LtCandidate:
        algo = np.array([index], dtype=np.uint64)
        attributes = (55, "64x64", "8x3", 1, "NONE", 0, "1x1x1", 0, 0)
        return lt.LtCandidate(index, algo, *attributes, self.workspace.get(index, 0), 1.0)

    def run(self, cand: lt.LtCandidate) -> None:
        a, b, c = (self.arrays[x] for x in "abc")
        action = self.script[cand.index]
        if action == "raise":
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
        c[...] = b @ a if action == "ok" else 7.0

    def __enter__(self) -> FakeGemm:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeGemm]]:
    def operands(mode: str, m: int, n: int, k: int, batch: int) -> tuple[Any, Any, Any]:
        if m > 1000:
            raise MemoryError("out of memory allocating 4 GB")
        rng = np.random.default_rng(0)
        arrays = {
            "a": rng.standard_normal((batch, k, m)).view(DevArray),
            "b": rng.standard_normal((batch, n, k)).view(DevArray),
            "c": np.zeros((batch, n, m)).view(DevArray),
        }
        FakeGemm.arrays = arrays
        return arrays["a"], arrays["b"], arrays["c"]

    def normwise(got: Any, want: Any) -> float:
        return float(np.linalg.norm(got - want) / np.linalg.norm(want))

    fake_cupy = SimpleNamespace(
        cuda=SimpleNamespace(get_current_stream=lambda: SimpleNamespace(synchronize=lambda: None)),
        get_default_memory_pool=lambda: SimpleNamespace(free_all_blocks=lambda: None),
    )
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(lt, "bindings", lambda: None)
    monkeypatch.setattr(lt, "operands", operands)
    monkeypatch.setattr(lt, "LtGemm", FakeGemm)
    monkeypatch.setattr(lt, "poison", lambda c, mode: c.fill(np.nan))
    monkeypatch.setattr(lt, "normwise_error", normwise)
    monkeypatch.setattr(lt, "reference", lambda a, b: b @ a)
    FakeGemm.script = {0: "ok", 1: "ok", 2: "ok", 3: "wrong", 4: "raise"}
    yield FakeGemm


def test_audit_records_every_kind_of_candidate(
    fake_gpu: type[FakeGemm], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Candidate 1 is 1.25x faster than the default in both rounds.
    calls = scripted_timing(monkeypatch, {"0": 1.25, "1": 1.0}, lambda _: 50)
    cases = [Case("cublas", "fp32", 8, 8, 8, 2), Case("cublasLt", "fp32", 2048, 8, 8, 2)]
    lines: list[str] = []
    frame = cd.run_candidates(cases, tmp_path, 32, progress=lines.append)
    small = frame[frame["m"] == 8].set_index("candidate")
    assert small["status"].tolist() == ["ok", "ok", "unsupported", "wrong", "unsupported"]
    assert "workspace" in str(small.loc[2, "reason"])
    assert small.loc[0, "is_default"] == 1 and small.loc[0, "rank"] == 2
    assert calls == [["0", "1"], ["0", "1"]]  # audit round, then the confirmation round
    assert small.loc[1, "confirm_left_on_table"] == pytest.approx(1.25)
    big = frame[frame["m"] == 2048]
    assert big["status"].tolist() == ["skipped"]
    assert "MemoryError: out of memory" in big["reason"].iloc[0]
    assert (tmp_path / cd.CANDIDATES_FILE).exists()
    assert "MemoryError" in (tmp_path / cd.LOG_FILE).read_text()
    assert len(lines) == 2 and "left on table 1.250" in lines[0]
    assert cd.find_better_candidates(frame)[0]["evidence"][1]["candidate"] == 1


def test_no_confirmation_round_without_a_gap(
    fake_gpu: type[FakeGemm], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = scripted_timing(monkeypatch, {"0": 1.0, "1": 1.05}, lambda _: 50)
    fake_gpu.script = {0: "ok", 1: "ok"}
    frame = cd.run_candidates([Case("cublasLt", "fp32", 8, 8, 8, 2)], None)
    assert calls == [["0", "1"]]
    assert frame["confirm_left_on_table"].isna().all()
    assert frame["left_on_table"].iloc[0] == pytest.approx(1.0)


def test_problems_merge_the_apis_and_loop_rows() -> None:
    cases = [
        Case("cublas", "fp32", 256, 256, 256, 8),
        Case("cublasLt", "fp32", 256, 256, 256, 8),
        Case("cublas", "fp32", 256, 256, 256, 8, loop=True),
        Case("cublas", "tf32", 256, 256, 256, 8),
    ]
    assert [c.case_id for c in cd.problems(cases)] == [
        "cublasLt.fp32.256x256x256.b8.nn",
        "cublasLt.tf32.256x256x256.b8.nn",
    ]


# ----- errors and the command line -------------------------------------------------------------
def test_missing_nvmath_names_the_gpu_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvmath.bindings", None)
    with pytest.raises(ToolMissingError) as raised:
        lt.bindings()
    assert str(raised.value) == "nvmath-python is not installed: pip install 'cublas-audit[gpu]'"


def test_a_missing_dependency_of_nvmath_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class Importer:
        def find_spec(self, name: str, *args: Any) -> None:
            if name.startswith("nvmath"):
                raise ModuleNotFoundError("No module named 'cuda.bindings'", name="cuda.bindings")

    monkeypatch.delitem(sys.modules, "nvmath.bindings", raising=False)
    monkeypatch.delitem(sys.modules, "nvmath", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Importer(), *sys.meta_path])
    with pytest.raises(ToolMissingError, match=r"installed \(No module named 'cuda.bindings'\)"):
        lt.bindings()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sizes", "0"], "--sizes: '0' is not a positive integer"),
        (["--modes", "fp64"], "--modes: unknown value 'fp64'"),
        (["--shapes", "4x4"], "--shapes: '4x4' is not MxNxK"),
    ],
)
def test_bad_candidates_arguments_are_one_line_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["candidates", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_candidates_help_works_without_a_gpu() -> None:
    result = CliRunner().invoke(app, ["candidates", "--help"])
    assert result.exit_code == 0 and "--limit" in result.output


@pytest.mark.gpu
def test_audit_on_the_gpu(tmp_path: Path) -> None:
    pytest.importorskip("nvmath")
    frame = cd.run_candidates([Case("cublasLt", "fp32", 256, 256, 256, 8)], tmp_path, 8)
    assert frame["is_default"].sum() == 1
    assert set(frame["status"]) <= {"ok", "wrong", "failed", "unsupported"}
    default = frame[frame["is_default"] == 1].iloc[0]
    assert default["status"] == "ok" and default["time_ms"] > 0
    assert frame["left_on_table"].iloc[0] >= 1.0
    assert cd.read_candidates(tmp_path)["case_id"].nunique() == 1


# ----- lt.LtGemm's plumbing against a fake nvmath.bindings.cublasLt ----------------------------
class FakeLt:
    """Records every call; answers the heuristic with three results whose first algo word is
    the result's number, and decodes attributes from that word."""

    Layout = IntEnum("Layout", ["BATCH_COUNT", "STRIDED_BATCH_OFFSET"])
    Pref = IntEnum("Pref", ["MAX_WORKSPACE_BYTES", *(f"MIN_ALIGNMENT_{x}_BYTES" for x in "ABCD")])
    # No CLUSTER_SHAPE_ID: an older library; SPLITK_NUM raises: an attribute it rejects.
    Config = IntEnum("Config", ["ID", "TILE_ID", "STAGES_ID", "SPLITK_NUM", "REDUCTION_SCHEME",
                                "CTA_SWIZZLING", "CUSTOM_OPTION", "INNER_SHAPE_ID"])  # fmt: skip
    MatmulTile = IntEnum("MatmulTile", {"TILE_32x32": 10, "TILE_64x64": 11, "TILE_128x128": 12})
    MatmulStages = IntEnum("MatmulStages", {"STAGES_8x3": 5})
    ReductionScheme = IntEnum("ReductionScheme", {"NONE": 0, "INPLACE": 1})
    algo_dtype = np.dtype([("data_", "<u8", (8,))])
    result_dtype = np.dtype(
        [("algo", algo_dtype), ("workspace_size", "<u8"), ("state", "<i4"),
         ("waves_count", "<f4"), ("reserved", "<i4", (4,))]
    )  # fmt: skip

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.MatrixLayoutAttribute = self.Layout
        self.MatmulPreferenceAttribute = self.Pref
        self.MatmulAlgoConfigAttribute = self.Config
        self.matmul_heuristic_result_dtype = self.result_dtype

    def __getattr__(self, name: str) -> Any:  # create / *_destroy / matmul: just record
        return lambda *args: self.calls.append((name, *args)) or 7

    @staticmethod
    def _memory(ptr: int, dtype: Any, count: int = 1) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        return np.frombuffer((ctypes.c_char * size).from_address(ptr), dtype=dtype)

    def get_matrix_layout_attribute_dtype(self, attr: Any) -> Any:
        return np.int32 if attr.name == "BATCH_COUNT" else np.int64

    def get_matmul_preference_attribute_dtype(self, attr: Any) -> Any:
        return np.uint64 if attr.name == "MAX_WORKSPACE_BYTES" else np.uint32

    def get_matmul_algo_config_attribute_dtype(self, attr: Any) -> Any:
        return np.uint32

    def matrix_layout_create(self, *args: int) -> int:
        self.calls.append(("layout", *args))
        return 100 + len(self.calls)

    def matrix_layout_set_attribute(self, layout: int, attr: Any, ptr: int, size: int) -> None:
        dtype = self.get_matrix_layout_attribute_dtype(attr)
        self.calls.append(("layout_attr", layout, attr.name, int(self._memory(ptr, dtype)[0])))

    def matmul_preference_set_attribute(self, pref: int, attr: Any, ptr: int, size: int) -> None:
        dtype = self.get_matmul_preference_attribute_dtype(attr)
        self.calls.append(("pref", attr.name, int(self._memory(ptr, dtype)[0])))

    def matmul_algo_get_heuristic(self, *args: int) -> None:
        limit, results_ptr, count_ptr = args[7:]
        found = min(limit, 3)
        results = self._memory(results_ptr, self.result_dtype, found).copy()
        for i in range(found):
            results[i]["algo"]["data_"][0] = i
            results[i]["workspace_size"] = i << 20
            results[i]["waves_count"] = 0.5 + i
        ctypes.memmove(results_ptr, results.ctypes.data, results.nbytes)
        ctypes.memmove(count_ptr, np.array([found], np.int32).ctypes.data, 4)

    def matmul_algo_config_get_attribute(
        self, algo_ptr: int, attr: Any, buf: int, size: int, written: int
    ) -> None:
        number = int(self._memory(algo_ptr, np.uint64)[0])
        if attr.name == "SPLITK_NUM":
            raise RuntimeError("CUBLAS_STATUS_INVALID_VALUE")
        value = {"ID": 55, "TILE_ID": 10 + number, "STAGES_ID": 5, "REDUCTION_SCHEME": 99}
        data = np.array([value.get(attr.name, number)], np.uint32)
        ctypes.memmove(buf, data.ctypes.data, 4)


@pytest.fixture
def fake_lt(monkeypatch: pytest.MonkeyPatch) -> FakeLt:
    fake = FakeLt()
    nvmath = SimpleNamespace(CudaDataType=IntEnum("D", {"CUDA_R_32F": 0, "CUDA_R_16F": 2}))
    cublas = SimpleNamespace(ComputeType=IntEnum("C", {"COMPUTE_32F": 68}))
    bindings = SimpleNamespace(cublasLt=fake, cublas=cublas)
    cupy = SimpleNamespace(
        cuda=SimpleNamespace(
            runtime=SimpleNamespace(getDevice=lambda: 0), alloc=lambda n: SimpleNamespace(ptr=9)
        )
    )
    for name, module in (("nvmath", nvmath), ("nvmath.bindings", bindings), ("cupy", cupy)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublasLt", fake)
    monkeypatch.setattr(lt, "_handles", {})
    return fake


def test_lt_gemm_describes_the_problem_to_cublaslt(fake_lt: FakeLt) -> None:
    with lt.LtGemm("fp16", 64, 32, 16, 4, 1024, 2048, 4096 + 64) as gemm:
        candidates = gemm.heuristics(8)
        gemm.run()
    calls = fake_lt.calls
    assert ("matmul_desc_create", 68, 0) in calls  # COMPUTE_32F, FP32 scale
    layouts = [c[1:] for c in calls if c[0] == "layout"]
    assert layouts == [(2, 64, 16, 64), (2, 16, 32, 16), (2, 64, 32, 64)]  # R_16F, column-major
    attrs = [c[2:] for c in calls if c[0] == "layout_attr"]
    assert attrs[:2] == [("BATCH_COUNT", 4), ("STRIDED_BATCH_OFFSET", 64 * 16)]
    prefs = dict(c[1:] for c in calls if c[0] == "pref")
    assert prefs["MAX_WORKSPACE_BYTES"] == 32 << 20
    assert prefs["MIN_ALIGNMENT_A_BYTES"] == 256
    assert prefs["MIN_ALIGNMENT_C_BYTES"] == 64  # C starts 64 bytes into an allocation
    assert [c.tile for c in candidates] == ["32x32", "64x64", "128x128"]
    first = candidates[0].attributes()
    assert (first["algo_id"], first["stages"], first["split_k"]) == (55, "8x3", None)
    assert (first["cluster_shape"], first["reduction_scheme"]) == (None, "99")
    assert candidates[2].workspace_bytes == 2 << 20 and candidates[2].waves_count == 2.5
    (launch,) = [c for c in calls if c[0] == "matmul"]
    assert launch[4] == 1024 and launch[9] == launch[11] == 4096 + 64  # A; C is D, in place
    assert launch[14:] == (9, 32 << 20, 0)  # workspace pointer and size, stream
    destroyed = [c[0] for c in calls if c[0].endswith("destroy")]
    assert (
        sorted(destroyed)
        == ["matmul_desc_destroy", "matmul_preference_destroy"] + ["matrix_layout_destroy"] * 3
    )


def test_lt_refuses_a_candidate_over_the_workspace(fake_lt: FakeLt) -> None:
    with lt.LtGemm("fp32", 64, 64, 64, 1, 0, 0, 0, workspace_bytes=1 << 20) as gemm:
        big = gemm.heuristics(3)[2]
        with pytest.raises(ValueError, match="workspace"):
            gemm.run(big)
