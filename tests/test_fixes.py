"""Fix selection (judge.fixes) and fix.json (table.fix_file) on real runs recorded on the H100.

The follow-up of the FP32 map (reports/h100/maps/20261124-003639-fp32-64-8192/follow-up) confirmed
two better candidates: fp32 1856^3 batch 8, default algo 55 tile 64x64 at 2.31467 ms against
candidate #2 (algo 55, tile 128x128, stages 8x3) at 2.08907 ms, 1.108x then 1.113x; and
2112^3 batch 8. Its other problems' candidates did not beat their default twice.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.jobs.fix import collect
from cublas_audit.table.fix_file import (
    FixSet,
    Problem,
    from_json,
    read_fix_file,
    to_json,
    write_fix_file,
)

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "reports/h100/maps/20261124-003639-fp32-64-8192"
H100_BATCHED = ROOT / "reports/h100/20261123-145452-batched"
H200_BATCHED = ROOT / "reports/h200/20261123-083048-batched"


@pytest.fixture(scope="module")
def map_fixes() -> FixSet:
    return collect([MAP])


def test_a_map_is_fixed_through_its_follow_up_and_only_confirmed_gaps_get_a_fix(
    map_fixes: FixSet,
) -> None:
    assert [fix.id for fix in map_fixes.fixes] == [
        "fp32.1856x1856x1856.b8.nn",
        "fp32.2112x2112x2112.b8.nn",
    ]
    assert map_fixes.sources == (str(MAP / "follow-up"),)


def test_a_pin_carries_the_best_candidates_attributes_and_both_rounds(map_fixes: FixSet) -> None:
    fix = map_fixes.fixes[0]
    assert fix.kind == "pin" and fix.pin is not None
    assert (fix.pin.algo_id, fix.pin.tile, fix.pin.stages, fix.pin.split_k) == (
        55,
        "128x128",
        "8x3",
        1,
    )
    assert (fix.default.ms, fix.fixed.ms) == (2.31467, 2.08907)
    assert fix.speedup == pytest.approx(1.108, abs=1e-3)
    assert fix.confirm_speedup == pytest.approx(1.113, abs=1e-3)
    assert fix.timing == "call"  # a table of schema 1 timed calls with events
    assert "candidate #2" in fix.change


def test_a_table_without_layout_columns_says_the_layout_is_unknown(map_fixes: FixSet) -> None:
    problem = map_fixes.fixes[0].problem
    assert not problem.layout_known
    assert (problem.transa, problem.transb, problem.lda, problem.ldb) == ("n", "n", 1856, 1856)
    assert problem.stride_a == 1856 * 1856


def test_the_stamp_is_the_machine_env_json_recorded(map_fixes: FixSet) -> None:
    stamp = map_fixes.stamp
    assert (stamp.gpu_name, stamp.cc, stamp.cublas_version, stamp.driver_version) == (
        "NVIDIA H100 80GB HBM3",
        "9.0",
        "13.1.0",
        "580.159.04",
    )


def test_runs_of_two_machines_are_refused_in_one_fix_file() -> None:
    with pytest.raises(AuditError, match="different machines"):
        collect([H100_BATCHED, H200_BATCHED])


def test_a_fix_file_round_trips(map_fixes: FixSet, tmp_path: Path) -> None:
    path = write_fix_file(map_fixes, tmp_path / "fix.json")
    assert read_fix_file(path) == map_fixes
    data = json.loads(path.read_text())
    assert data["schema_version"] == 1 and data["fixes"][0]["speedup"] == pytest.approx(1.1080)


def _edited(fixes: FixSet, change: dict[str, object], where: str = "problem") -> dict[str, object]:
    data = json.loads(json.dumps(to_json(fixes)))
    data["fixes"][0][where].update(change)
    return data


@pytest.mark.parametrize(
    ("change", "where", "words"),
    [
        ({"lda": 100}, "problem", "smaller than the 1856 rows"),
        ({"stride_b": 7}, "problem", "stride_b do not describe one cuBLAS call"),
        ({"m": 0}, "problem", "m 0 is not in 1.."),
        ({"mode": "fp64x"}, "problem", "mode 'fp64x' is not one of"),
        ({"algo_id": "55"}, "pin", "algo_id: '55' is not a int"),
        ({"ms": 0}, "fixed", "ms 0 is not a positive time"),
        ({"color": 1}, "pin", "unknown field 'color'"),
    ],
)
def test_a_hand_edited_fix_is_refused_naming_what_is_wrong(
    map_fixes: FixSet, change: dict[str, object], where: str, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        from_json(_edited(map_fixes, change, where))


def test_a_truncated_or_foreign_file_is_one_line_naming_it(
    map_fixes: FixSet, tmp_path: Path
) -> None:
    text = json.dumps(to_json(map_fixes))
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(AuditError, match=r"cut\.json: not a fix file: not valid JSON"):
        read_fix_file(cut)
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**json.loads(text), "schema_version": 2}))
    with pytest.raises(AuditError, match="schema_version 2 is not 1"):
        read_fix_file(newer)


def test_problem_of_a_trace_linear_keeps_its_layout() -> None:
    """F.linear of x [4, 2048] and an LM head w [32000, 2048] is cuBLAS tn 32000x4x2048 with lda
    = ldb = 2048 and ldc = 32000: the row torch 2.14.1's TunableOp wrote for that model
    (tests/fixtures/tunableop: tn_32000_4_2048_ld_2048_2048_32000)."""
    from cublas_audit.planning.cases import Case

    problem = Problem.of_case(Case("cublasLt", "fp32", 32000, 4, 2048, 1, transa="t"))
    assert (problem.lda, problem.ldb, problem.ldc) == (2048, 2048, 32000)
    assert problem.case().case_id == "cublasLt.fp32.32000x4x2048.b1.tn"
    assert dataclasses.replace(problem, lda=2056).case().lda == 2056


# ----- the fix file the H100's random maps gave (reports/h100/fixes/20261125-092546) --------------

RECORDED = ROOT / "reports/h100/fixes/20261125-092546"


@pytest.mark.heavy
def test_fix_of_the_random_maps_gives_the_recorded_file(tmp_path: Path) -> None:
    """`fix` of the two maps (schema-2 candidates: layout known, kernel time) rebuilds the file
    that `verify` confirmed on the H100: 23 pins, all of them nn batch 1 with packed leading
    dimensions, every one carried by the TunableOp file. Heavy (two 3,000-problem maps judged,
    3 s of CPU): the quick suite fixes a map through its follow-up
    (test_a_map_is_fixed_through_its_follow_up_and_only_confirmed_gaps_get_a_fix), writes the
    TunableOp file (test_fix_inputs) and reads this recorded fix file (test_verify_inputs)."""
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    maps = [ROOT / f"reports/h100/maps/20261125-092546-{mode}-random" for mode in ("fp32", "bf16")]
    result = CliRunner().invoke(
        app, ["fix", *map(str, maps), "--torch-version", "2.14.1", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    made, recorded = read_fix_file(tmp_path / "fix.json"), read_fix_file(RECORDED / "fix.json")
    assert [f.id for f in made.fixes] == [f.id for f in recorded.fixes]
    assert all(f.problem.layout_known and f.timing == "kernel" for f in made.fixes)
    rows = (tmp_path / "tunableop0.csv").read_text().splitlines()
    assert len(rows) == 3 + 23 and rows[0] == "Validator,PT_VERSION,2.14.1"
    # hand-checked against the map's follow-up candidates.csv: fp32 2112x64x2112 default
    # 0.04394 ms of kernel time, candidate #2 (algo 55, tile 64x64 = 15, stages 8x3 = 31,
    # split-K 8, COMPUTE_TYPE = 2) 0.02013 ms
    assert (
        "GemmTunableOp_float_NN,nn_2112_64_2112_ld_2112_2112_2112,"
        "Gemm_Cublaslt_id_55_tile_15_stages_31_splitk_8_red_2_swizzle_0_custom_0_inner_0_cluster_0,"
        "0.020128" in rows
    )


def test_verify_on_the_h100_held_every_recorded_fix() -> None:
    data = json.loads((RECORDED / "verify.json").read_text())
    assert [item["status"] for item in data["fixes"]] == ["holds"] * 23
    assert all(item["fixed_error"] <= item["default_error"] * 4 + 1e-6 for item in data["fixes"])


def test_a_hand_edited_tile_is_refused_before_any_gpu_work(tmp_path: Path) -> None:
    from cublas_audit.jobs.verify import checked_input

    data = json.loads((RECORDED / "fix.json").read_text())
    data["fixes"][3]["pin"]["tile"] = "999x999"
    edited = tmp_path / "fix.json"
    edited.write_text(json.dumps(data))
    with pytest.raises(AuditError, match=r"fix fp32\.1600x64x896\.b1\.nn: tile '999x999' is not"):
        checked_input(edited)


def test_verify_without_a_gpu_is_exit_3_after_the_file_is_checked(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cublas_audit.cli import app
    from cublas_audit.observe import environment

    if environment.collect().has_gpu:
        pytest.skip("this machine has a GPU")
    result = CliRunner().invoke(
        app, ["verify", str(RECORDED / "fix.json"), "--out", str(tmp_path / "v.json")]
    )
    assert result.exit_code == 3, result.output
    assert "no NVIDIA GPU" in result.output and not (tmp_path / "v.json").exists()


# ----- a trace's tn problems: candidates of schema 2 give pins torch's TunableOp names alike ------

LLAMA = ROOT / "reports/h100/traces/20261125-093616-llama-v2"
TORCH_ROWS = ROOT / "tests/fixtures/tunableop/tunableop_h100_torch2.14.1_models.csv"


@pytest.mark.parametrize(
    ("case_id", "candidate"),
    [
        # F.linear of the Llama block's gate projection: cuBLASLt's default, which TunableOp's own
        # tuning also kept for that call
        ("cublasLt.bf16.5632x2048x2048.b1.tn", 0),
        # the fp32 LM head on the last token: candidate 2 is the GEMV TunableOp picked
        ("cublasLt.fp32.32000x4x2048.b1.tn", 2),
    ],
)
def test_a_trace_tn_candidate_is_the_row_torch_wrote_for_that_call(
    case_id: str, candidate: int
) -> None:
    """The trace's sweep audited each GEMM as PyTorch issues it (cuBLAS tn, leading dimensions
    of F.linear); a pin built from its candidate row is the very line torch 2.14.1's TunableOp
    wrote when it tuned the same model on the H100 (operator, parameters and solution)."""
    from cublas_audit.judge.fixes import pin_of, problem_of_candidates_row
    from cublas_audit.report.tunableop import tunable_row
    from cublas_audit.table.candidates_table import read_candidates

    frame = read_candidates(LLAMA)
    row = frame[(frame["case_id"] == case_id) & (frame["candidate"] == candidate)].iloc[0]
    problem = problem_of_candidates_row(row)
    assert problem.layout == "tn" and problem.layout_known
    line = tunable_row(problem, pin_of(row), 0.0).line
    ours = line.rsplit(",", 1)[0]  # without the time column
    theirs = [t.rsplit(",", 1)[0] for t in TORCH_ROWS.read_text().splitlines()]
    assert ours in theirs, ours


def test_a_fix_of_a_trace_problem_names_its_op_and_share() -> None:
    """The Llama trace's problems (its own problem table: aten::mm 2048x5632x2048 is 28.45 % of
    the GEMM time, the fp32 LM head 26.36 %) matched to fixes on the candidates rows the trace's
    sweep audited (cuBLAS tn 5632x2048x2048, 32000x4x2048)."""
    from cublas_audit.judge.fixes import pin_of, problem_of_candidates_row, with_torch_ops
    from cublas_audit.observe.torch_trace import problems, read_trace
    from cublas_audit.table.candidates_table import read_candidates
    from cublas_audit.table.fix_file import Fix, Stamp, Timed, TorchOp, from_json, to_json

    frame = read_candidates(LLAMA)
    fixes = []
    for case_id in ("cublasLt.bf16.5632x2048x2048.b1.tn", "cublasLt.fp32.32000x4x2048.b1.tn"):
        row = frame[frame["case_id"] == case_id].iloc[0]
        problem = problem_of_candidates_row(row)
        timed = Timed("", float(row["time_ms"]))
        fixes.append(Fix(case_id, "pin", problem, timed, timed, "call", "", "", pin_of(row)))
    stamp = Stamp("NVIDIA H100 80GB HBM3", "9.0", "13.1.0", "580.159.04")
    trace = problems(read_trace(ROOT / "tests/fixtures/torch_traces/llama.json.gz"))
    named = with_torch_ops(FixSet(stamp, tuple(fixes)), trace)
    assert [f.torch for f in named.fixes] == [
        TorchOp("aten::mm", "2048x5632x2048", 1, 0.2845),
        TorchOp("aten::mm", "4x32000x2048", 1, 0.2636),
    ]
    # fix.json holds the op as the object it was: read back equal, its four fields in order
    written = to_json(named)["fixes"][0]["torch"]
    assert json.dumps(written) == (
        '{"op": "aten::mm", "shape": "2048x5632x2048", "batch": 1, "share": 0.2845}'
    )
    assert from_json(json.loads(json.dumps(to_json(named)))) == named


@pytest.mark.parametrize(
    ("torch_version", "words"),
    [
        (None, "torch is not installed here"),
        ("2.11.0+cu130", "torch 2.11.0+cu130 predates TunableOp's cuBLASLt support"),
        ("2.15.0", "the TunableOp file is for torch 2.14.1, TunableOp refuses it under 2.15.0"),
        ("2.14.1+cu130", ""),
    ],
)
def test_verify_torch_says_why_it_cannot_run_the_file(
    torch_version: str | None, words: str
) -> None:
    from cublas_audit.run.torch_check import skip_reason

    reason = skip_reason(torch_version, "2.14.1")
    assert reason.startswith(words) if words else reason == ""


def test_verify_torch_needs_the_tunableop_file_before_any_gpu_work(tmp_path: Path) -> None:
    from cublas_audit.jobs.verify import tunable_file

    (tmp_path / "fix.json").write_text((RECORDED / "fix.json").read_text())
    with pytest.raises(AuditError, match=r"no tunableop0\.csv beside"):
        tunable_file(tmp_path / "fix.json")
    assert tunable_file(RECORDED / "fix.json").validator("PT_VERSION") == "2.14.1"


def test_the_torch_check_takes_the_pins_one_torch_call_issues() -> None:
    """All 23 recorded pins are packed nn batch 1: each is a torch.mm; a batched or padded
    problem is not (torch would issue another call)."""
    from cublas_audit.run.torch_check import runnable

    fixes = read_fix_file(RECORDED / "fix.json").fixes
    assert all(runnable(fix) for fix in fixes)
    padded = dataclasses.replace(fixes[0].problem, lda=fixes[0].problem.lda + 8)
    assert not runnable(dataclasses.replace(fixes[0], problem=padded))


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda d: d["fixes"][0]["pin"].update(tile="999x999"), "tile '999x999' is not"),
        (lambda d: d.update(schema_version=7), "schema_version 7 is not 1"),
        (lambda d: d["fixes"][1].pop("problem"), r"fixes\[1\]"),
    ],
)
def test_verify_of_a_bad_fix_file_is_exit_2_and_writes_nothing(
    tmp_path: Path, edit: Any, words: str
) -> None:
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    data = json.loads((RECORDED / "fix.json").read_text())
    edit(data)
    edited = tmp_path / "fix.json"
    edited.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["verify", str(edited)])
    assert result.exit_code == 2, result.output
    assert re.search(words, result.output) and len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fix.json"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["map", "--sizes", "64:256:64", "--fix"], "--fix needs --follow-up"),
        (["candidates", "--sizes", "256", "--fix"], "--fix needs --out DIR"),
        (["sweep", "--sizes", "256", "--devices", "0", "--replicate", "--fix"], "--fix takes one"),
    ],
)
def test_fix_of_a_measuring_command_is_refused_before_any_gpu_work(
    argv: list[str], words: str
) -> None:
    """Exit 2 (bad input), not 3 (no GPU here): the options are judged before the GPU is sought."""
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert words in result.output


@pytest.mark.parametrize("path", sorted((ROOT / "reports/h100/fixes").glob("*/fix.json")))
def test_a_committed_fix_file_reads_and_writes_back_byte_for_byte(path: Path) -> None:
    """Every committed fix.json read into its types (kinds FixKind, torch a TorchOp) and written
    again: every field it holds the same text, in its order (one written before `claimed` gains
    it)."""
    from cublas_audit.table.fix_file import read_fix_file, to_json
    from cublas_audit.vocabulary import FixKind

    fixes, raw = read_fix_file(path), json.loads(path.read_text())
    assert fixes.fixes and all(type(fix.kind) is FixKind for fix in fixes.fixes)
    written = to_json(fixes)
    pairs = zip(written["fixes"], raw["fixes"], strict=True)
    kept = {**written, "fixes": [{key: w[key] for key in r} for w, r in pairs]}
    assert json.dumps({k: kept[k] for k in raw}, indent=2) == json.dumps(raw, indent=2)
