"""`cublas-audit map`: the grid it plans, the fast pass it asks the probe for, streaming and
resume, the report and the follow-up.

End to end, the real dispatch_map.run runs with the fake probe of tests/fakeprobe.py replaying
the H100's recorded results of a dense FP32 map (reports/h100/maps/20261123-235543-fp32-64-4096:
M = N = K from 64 to 4096 in steps of 64, single and batch 8; kernel names and kernel times from
CUPTI), and environment.collect replaced by what it found on that H100.

Hand-checked facts of that map (tests/test_map_rules.py has the arithmetic): at batch 8, 2112^3
(xmma_64x64x8) takes 1.16x the kernel time of 2176^3 (xmma_128x128x8), the largest inversion;
single 2048 -> 2112 switches simt_256x128_8x4 -> xmma_64x64x8 with a 19 % drop in throughput.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.jobs import measure
from cublas_audit.judge.map_audit import map_findings
from cublas_audit.judge.rules import prepare
from cublas_audit.planning import map_grid
from cublas_audit.planning.cases import Case
from cublas_audit.planning.grid import Variants
from cublas_audit.report import map_plots
from cublas_audit.report.map_plots import switches
from cublas_audit.run import dispatch_map
from cublas_audit.run.sweep import Progress
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.table import rundir
from cublas_audit.table.inputs import load_one_gpu
from cublas_audit.table.rundir import FINDINGS_FILE, FOLLOW_UP_DIR
from tests.conftest import without_map_pictures
from tests.fakeprobe import H100_RUN, deadline, fake_probe, seen
from tests.test_resume import stand_in_machine

MAP = Path(__file__).resolve().parents[1] / "reports/h100/maps/20261123-235543-fp32-64-4096"
DEADLINE_S = 60


# ----- the grid ----------------------------------------------------------------------------------


def test_the_grid_is_squares_then_the_cross_product() -> None:
    grid = map_grid.Grid.parse("64:192:64", "1,2", "3", "4:6:1")
    assert grid.count == 3 + 2 * 1 * 3
    assert grid.problems() == sorted(
        [(64, 64, 64), (128, 128, 128), (192, 192, 192)]
        + [(m, 3, k) for m in (1, 2) for k in (4, 5, 6)]
    )


@pytest.mark.parametrize(
    ("sizes", "m", "n", "k", "said"),
    [
        ("", "64", "64", "", "--m, --n without --k"),
        ("", "", "", "", "nothing to map"),
        ("", "64:32:8", "1", "1", "--m"),
        ("64,0", "", "", "", "--sizes"),
    ],
)
def test_a_bad_grid_is_one_error_naming_it(sizes: str, m: str, n: str, k: str, said: str) -> None:
    with pytest.raises(AuditError, match=said):
        map_grid.Grid.parse(sizes, m, n, k)


def test_a_sample_is_drawn_from_the_grid_without_building_it() -> None:
    axis = "64:4096:64"
    grid = map_grid.Grid.parse("", axis, axis, axis)
    assert grid.count == 64**3
    picked = grid.problems(sample=10_000, seed=7)
    assert len(picked) == 10_000 and picked == sorted(set(picked))
    values = set(range(64, 4097, 64))
    assert all({m, n, k} <= values for m, n, k in picked)
    assert picked == grid.problems(sample=10_000, seed=7)
    assert picked != grid.problems(sample=10_000, seed=8)
    # every corner of the grid can be drawn: the index decoding covers it
    assert grid.problem(0) == (64, 64, 64) and grid.problem(grid.count - 1) == (4096,) * 3


def test_the_plan_has_no_loop_companions_and_batch_1_is_the_single_call() -> None:
    cases = map_grid.plan([(64, 64, 64), (128, 64, 32)], [1, 8], ["fp32"], ["cublas"])
    assert len(cases) == 4
    assert not any(c.loop for c in cases)
    assert {c.routine for c in cases} == {"cublasSgemm", "cublasSgemmStridedBatched"}
    layouts = map_grid.plan([(64, 64, 64)], [1], ["fp32"], ["cublas"], Variants(("nn", "tn")))
    assert [c.layout for c in layouts] == ["nn", "tn"]


def test_a_map_too_large_to_plan_asks_for_a_sample() -> None:
    problems = [(64, 64, 64)] * 600_000
    with pytest.raises(AuditError, match="take --sample N"):
        map_grid.plan(problems, [1, 8], ["fp32"], ["cublas"])


# ----- end to end, on the H100's recorded map -----------------------------------------------------


def map_cases() -> list[Case]:
    problems = map_grid.Grid.parse("64:4096:64", "", "", "").problems()
    return map_grid.plan(problems, [1, 8], ["fp32"], ["cublas"])


@pytest.fixture(scope="module")
def mapped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One map with --follow-up 2, run once for the tests below."""
    tmp_path = tmp_path_factory.mktemp("map")
    monkeypatch = pytest.MonkeyPatch()
    stand_in_machine(monkeypatch)  # no ncu: the follow-up observes with CUPTI, with a notice
    probe, _calls = fake_probe(tmp_path, replay=MAP, candidates=H100_RUN / rundir.CANDIDATES_FILE)
    notes: list[str] = []
    options = SweepOptions(
        cases=map_cases(),
        gpu_label="h100",
        out=tmp_path / "run",
        probe_python=probe.python,
        min_reps=dispatch_map.DEFAULT_REPS,
        reference=False,
        command=["cublas-audit", "map", "--sizes", "64:4096:64", "--batches", "1,8"],
    )
    try:
        with deadline(DEADLINE_S):
            result = measure.dispatch_map_run(options, 2, None, Progress(note=notes.append))
    finally:
        monkeypatch.undo()
    return {"result": result, "seen": seen(tmp_path), "notes": notes, "tmp": tmp_path}


def phases(starts: list[dict[str, object]]) -> list[str]:
    found = []
    for start in starts:
        argv = list(start["argv"])  # type: ignore[call-overload]
        if "--phase" in argv:
            found.append(str(argv[argv.index("--phase") + 1]))
    return found


def test_the_map_is_one_fast_pass_of_the_probe_then_the_deep_tier(mapped) -> None:  # type: ignore[no-untyped-def]
    starts = mapped["seen"]
    # the map: one probe process for all 128 cases, phase map, 5 calls; no ncu, no recheck.
    # The follow-up: a sweep (its timing, the recheck it makes, the candidate audit).
    assert phases(starts)[0] == "map"
    assert phases(starts)[1:] == ["time", "recheck", "candidates"] or phases(starts)[1:] == [
        "time",
        "candidates",
    ]
    first = next(list(s["argv"]) for s in starts if "map" in s["argv"])
    assert first[first.index("--min-reps") + 1] == "5"
    assert "--reference" not in first
    env = rundir.read_env(mapped["result"].run_dir)
    assert (env["phase"], env["observer"], env["profiled"]) == ("map", "cupti", False)
    # where its time went before the probe and after it (benchmarks/fleet_scaling.py reads them)
    after = env["after_gpu_seconds"]
    assert set(after) == {"judge", "fold_wait", "report_load", "report"}
    assert all(seconds >= 0 for seconds in [env["setup_seconds"], *after.values()])


def test_the_map_table_has_the_sweep_schema_and_every_case(mapped) -> None:  # type: ignore[no-untyped-def]
    frame = mapped["result"].frame
    assert len(frame) == 128 and frame["status"].eq("ok").all()
    rows = prepare(frame).set_index("case_id")
    assert rows.loc["cublas.fp32.2112x2112x2112.b8.nn", "kernel_short"] == "xmma_64x64x8"


def test_the_report_names_the_hand_checked_inversion_and_cliff(mapped) -> None:  # type: ignore[no-untyped-def]
    result = mapped["result"]
    report = result.report.read_text()
    assert "2112 takes 1.16x the time of the larger 2176" in report
    assert "From 2048 to 2112 the kernel changes from simt\\_256x128\\_8x4" in report
    assert "| 2048 -> 2112 |" in report  # in the kernel-switch table
    found = json.loads((result.run_dir / FINDINGS_FILE).read_text())
    assert found[0]["effect"] >= found[-1]["effect"]
    pictures = sorted(p.name for p in (result.run_dir / rundir.PLOTS_DIR).glob("*.png"))
    assert pictures == [
        "cublas-cublasSgemm-fp32-b1-nn-size-axis.png",
        "cublas-cublasSgemmStridedBatched-fp32-b8-nn-size-axis.png",
    ]


def test_the_follow_up_measures_the_flagged_cases_and_their_neighbours(mapped) -> None:  # type: ignore[no-untyped-def]
    result = mapped["result"]
    assert result.follow_up == result.run_dir / FOLLOW_UP_DIR
    followed = {c.case_id for c in load_plan(result.follow_up)}
    # the two largest effects, a share of time lost: the single and batch-8 cliffs at 2048 ->
    # 2112 (19 %, 18 %) before the batch-8 inversion 2112 / 2176 (1 - 1/1.155 = 13 %); each
    # flagged case with the case it was compared with
    assert followed == {
        f"cublas.fp32.{size}x{size}x{size}.b{batch}.nn" for size in (2048, 2112) for batch in (1, 8)
    }
    assert any("observing with CUPTI instead" in note for note in mapped["notes"])
    report = result.report.read_text()
    assert "## Follow-up" in report
    assert "holds on the full-length measurement" in report


def load_plan(run_dir: Path) -> list[Case]:
    from cublas_audit.planning.plan_file import read_plan

    return read_plan(run_dir / rundir.PLAN_FILE)


def test_follow_up_cases_pair_each_finding_with_its_comparison() -> None:
    frame = load_one_gpu(MAP).frame
    cases = map_cases()
    followed = map_findings(frame)[:10]
    picked = {c.case_id for c in dispatch_map.follow_up_cases(frame, cases, followed)}
    assert {"cublas.fp32.2112x2112x2112.b8.nn", "cublas.fp32.2176x2176x2176.b8.nn"} <= picked
    assert {"cublas.fp32.2048x2048x2048.b1.nn", "cublas.fp32.2112x2112x2112.b1.nn"} <= picked


def test_an_interrupted_map_resumes_only_the_missing_cases(
    mapped, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(mapped["result"].run_dir, run_dir, ignore=shutil.ignore_patterns("follow-up"))
    lines = (run_dir / rundir.TIME_RESULTS).read_text().splitlines()
    kept = lines[: len(lines) // 2]  # a map stopped halfway (its last case half-written)
    (run_dir / rundir.TIME_RESULTS).write_text("\n".join(kept) + '\n{"event": "do')
    done = set(rundir.read_results(run_dir / rundir.TIME_RESULTS))
    stand_in_machine(monkeypatch)
    monkeypatch.setattr(map_plots, "drawing", without_map_pictures)  # drawn above
    monkeypatch.setattr(rundir, "COLUMNAR_ROWS", 100)  # a large run, as a full map is
    parsed: list[Path] = []  # the probe's records read whole again (not as it wrote them)
    parse = rundir._parsed
    monkeypatch.setattr(rundir, "_parsed", lambda path, gz: parsed.append(path) or parse(path, gz))
    with deadline(DEADLINE_S):  # the recorded probe: the fake one of the fixture's map
        result = measure.dispatch_map_run(SweepOptions(resume=run_dir))
    assert run_dir / rundir.TIME_RESULTS not in parsed  # (rundir.following, the torn line too)
    plan = str(run_dir / rundir.PLAN_FILE)
    starts = [list(s["argv"]) for s in seen(mapped["tmp"]) if plan in s["argv"]]
    assert len(starts) == 1 and starts[0][starts[0].index("--phase") + 1] == "map"
    only = Path(starts[0][starts[0].index("--only") + 1]).read_text().split()
    assert set(only) == {c.case_id for c in map_cases()} - done
    assert len(result.frame) == 128 and result.frame["status"].eq("ok").all()
    # finished large: its table columnar, the probe's records folded and still every case's
    assert rundir.table_file(run_dir).name == rundir.TABLE_COLUMNAR
    assert not (run_dir / rundir.TIME_RESULTS).exists()
    assert len(rundir.read_results(run_dir / rundir.TIME_RESULTS)) == 128


def test_switches_along_the_size_axis_match_the_table() -> None:
    rows = prepare(load_one_gpu(MAP).frame)
    single = rows[(rows["routine"] == "cublasSgemm")]
    found = switches(single)
    at = found.set_index("to_size").loc[2112]
    assert (at["from_size"], at["from_kernel"], at["to_kernel"]) == (
        2048,
        "simt_256x128_8x4",
        "xmma_64x64x8",
    )
    # a switch is where the kernel differs from the size before, never elsewhere
    kernels = single.sort_values("m")["kernel_short"].tolist()
    assert len(found) == sum(a != b for a, b in itertools.pairwise(kernels))


def test_a_huge_grid_is_counted_not_built_and_a_sample_of_it_is_planned() -> None:
    grid = map_grid.Grid.parse("", "1:1000:1", "1:1000:1", "1:1000:1")  # 10^9 problems
    with pytest.raises(AuditError, match=r"the map has 2,000,000,000 cases .*--sample"):
        map_grid.grid_plan(grid, [1, 8], ["fp32"], ["cublas"])
    sampled = map_grid.grid_plan(grid, [1, 8], ["fp32"], ["cublas"], sample=50, seed=3)
    assert len(sampled) == 100  # 50 problems x batch 1 and 8, each problem drawn once
    # the limit counts the cases, not the problems: 500,010 problems x 2 batches is over it
    over = map_grid.Grid.parse("", "1:50001:1", "1:10:1", "1")
    with pytest.raises(AuditError, match="1,000,020 cases"):
        map_grid.grid_plan(over, [1, 8], ["fp32"], ["cublas"])
