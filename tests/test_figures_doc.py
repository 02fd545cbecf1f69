"""docs/figures.md states the fleet's figures as benchmarks/fleet_scaling.py recorded them: the
page reads its numbers from benchmarks/results/fleet_scaling_h100x4.json (issue 40 item 5); the
README and docs/development.md state the test suite's time as benchmarks/test_suite_time.py
recorded it (issue 38 item 4)."""

from __future__ import annotations

import json

from tests.conftest import REPO

FIGURES = REPO / "docs" / "figures.md"
FLEET = REPO / "benchmarks" / "results" / "fleet_scaling_h100x4.json"


def row_of(words: str) -> str:
    (row,) = [line for line in FIGURES.read_text().splitlines() if line.startswith(words)]
    return row


def test_the_fleet_row_is_the_recorded_benchmark() -> None:
    recorded = json.loads(FLEET.read_text())
    row = row_of("| the BF16 full grid (262,144 problems) on four H100s")
    assert f"one quarter alone (`--shard 1/4`) {recorded['quarter_shard_wall_s']:.1f} s" in row
    assert f"`--devices all` {recorded['devices_all_wall_s']:.1f} s" in row
    assert f"({recorded['devices_all_wall_s'] / recorded['quarter_shard_wall_s']:.2f}x)" in row
    assert f"`--ray auto` {recorded['ray_wall_s']:.1f} s" in row
    assert f"({recorded['ray_wall_s'] / recorded['quarter_shard_wall_s']:.2f}x)" in row
    assert f"after the GPUs {recorded['after_gpu_s']:.1f} s" in row
    assert f"run directory {recorded['run_dir_mb']:.1f} MB" in row
    # the target holds for both ways of spreading the grid
    limit = 1.25 * recorded["quarter_shard_wall_s"]
    met = max(recorded["devices_all_wall_s"], recorded["ray_wall_s"]) <= limit
    assert ("Not met" in row) is not met


def test_the_readme_states_the_fleets_figures_as_recorded() -> None:
    recorded = json.loads(FLEET.read_text())
    text = " ".join((REPO / "README.md").read_text().split())
    assert f"{recorded['devices_all_wall_s']:.1f} s with `--devices all`" in text
    assert f"{recorded['ray_wall_s']:.1f} s with `--ray auto`" in text
    assert f"against {recorded['quarter_shard_wall_s']:.1f} s for one quarter" in text
    assert f"the whole grid's mapping takes {recorded['bf16_full_grid_one_gpu_s']:.1f} s" in text


def test_the_one_gpu_row_is_the_recorded_benchmark() -> None:
    recorded = json.loads(FLEET.read_text())
    row = row_of("| the BF16 full grid on one H100, map time")
    assert f"| {recorded['bf16_full_grid_one_gpu_s']:.1f} s" in row
    one = recorded["bf16_full_grid_one_gpu"]
    final = one["final_tree"]
    assert f"the GPU spent {final['gpu_calls_s']:.1f} s in the problems' timed calls" in row
    assert f"{final['gpu_check_s']:.1f} s in the chunks' float64 checks" in row
    assert ("Not met" in row) is not (recorded["bf16_full_grid_one_gpu_s"] <= one["target_s"])


def test_the_readme_states_the_suites_time_as_measured() -> None:
    # README and docs/development.md give `pytest -q`'s CPU time as test_suite_time.py recorded it
    recorded = json.loads((REPO / "benchmarks" / "results" / "test_suite_time.json").read_text())
    run = min(recorded["runs"], key=lambda one: one["cpu_s"])
    cpu, wall = run["cpu_s"], run["wall_s"]
    stated = f"`pytest -q`: {cpu:.0f} s of CPU time (user + system), {wall:.0f} s wall"
    for page in (REPO / "README.md", REPO / "docs" / "development.md"):
        text = " ".join(page.read_text().split())
        assert stated in text, page
        assert ("the target of 80 s is met" in text) is (run["cpu_s"] <= recorded["target_cpu_s"])
