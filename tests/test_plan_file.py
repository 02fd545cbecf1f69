"""plan.json stated, not listed (planning.plan_file; issue 40 item 3): a grid as its axes, other
plans as columns or runs, read back as the same cases with the same ids and fingerprint; every
committed plan (listed, as runs wrote them before) still reads as it did; recorded shards still
merge to the recorded merged run."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from cublas_audit.errors import AuditError
from cublas_audit.planning import plan_file
from cublas_audit.planning.cases import Case
from cublas_audit.planning.grid import Variants
from cublas_audit.planning.map_grid import Grid, grid_plan
from cublas_audit.planning.map_grid import plan as map_plan
from cublas_audit.planning.plan_file import plan_case_ids, read_plan
from cublas_audit.planning.shards import PlanPart, ShardSpec, fingerprint, shard

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted(
    path for folder in ("reports", "tests/fixtures") for path in (ROOT / folder).rglob("plan*.json")
)
SHARDS_CHECK = ROOT / "reports/h100/checks/20261125-101230-shards"


def grid_cases() -> list[Case]:
    """A map's grid over two modes and two layouts: 4 x 3 x 5 problems, 240 cases."""
    grid = Grid.parse("", "64:256:64", "64,128,4096", "64:320:64")
    return grid_plan(grid, [1], ["fp32", "bf16"], ["cublas"], Variants(layouts=("nn", "tn")))


def test_a_grid_is_written_as_its_axes_and_reads_back_as_its_cases(tmp_path: Path) -> None:
    cases = grid_cases()
    path = tmp_path / "plan.json"
    plan_file.write(cases, path)
    stated = json.loads(path.read_text())
    assert [name for name, _ in stated["axes"]] == ["m", "n", "k", "mode", "transa"]
    assert stated["constant"]["api"] == "cublas" and "columns" not in stated
    assert read_plan(path) == cases
    assert plan_case_ids(path) == [case.case_id for case in cases]
    assert plan_file.read(path).flops() == [case.flops for case in cases]


def test_ids_where_only_the_sizes_vary_are_the_cases_ids(tmp_path: Path) -> None:
    """(their fast path: the rest of each id is the same text)"""
    grid = Grid.parse("", "64,4096", "64:192:64", "128")
    cases = grid_plan(grid, [8], ["tf32"], ["cublasLt"], Variants(layouts=("tn",)))
    plan_file.write(cases, tmp_path / "plan.json")
    assert plan_case_ids(tmp_path / "plan.json") == [case.case_id for case in cases]
    assert cases[0].case_id == "cublasLt.tf32.64x64x128.b8.tn"


def test_a_map_grid_states_in_a_few_hundred_bytes(tmp_path: Path) -> None:
    """The 64..4096 grid at step 128 (32,768 cases; the full grid's 262,144 take the same
    bytes) stated from its axes, no case built: the product of the axes is the grid's cases in
    the map's order (m, then n, then k)."""
    axis = tuple(range(64, 4097, 128))
    constant = {"api": "cublas", "mode": "bf16", "batch": 1}
    full = plan_file.PlanFile(32**3, constant, (("m", axis), ("n", axis), ("k", axis)))
    path = tmp_path / "plan.json"
    plan_file.write(full, path)
    assert path.stat().st_size < 2_000
    ids = plan_case_ids(path)
    assert len(ids) == 32_768 and ids[1] == "cublas.bf16.64x64x192.b1.nn"
    assert ids[-1] == "cublas.bf16.4032x4032x4032.b1.nn"
    assert ids[1024] == "cublas.bf16.192x64x64.b1.nn"


def test_a_part_of_a_plan_is_written_as_columns_or_runs(tmp_path: Path) -> None:
    """A shard's part is no product: its varying fields listed, a sorted one as runs."""
    part = ShardSpec(2, 3).cases(grid_cases())
    path = tmp_path / "plan.json"
    plan_file.write(part, path)
    columns = json.loads(path.read_text())["columns"]
    assert "runs" in columns["m"] and "values" in columns["k"]
    assert read_plan(path) == part


def test_the_fingerprint_is_the_plans_not_its_files() -> None:
    """One plan, one fingerprint, stated or listed; another plan, another."""
    cases = grid_cases()
    listed = plan_file.from_json([case.to_json() for case in cases])
    assert listed.fingerprint() == plan_file.PlanFile.of(cases).fingerprint() == fingerprint(cases)
    assert fingerprint(cases[:-1]) != fingerprint(cases)
    assert listed.legacy_fingerprint() == plan_file.PlanFile.of(cases).legacy_fingerprint()


def test_split_by_flops_is_shard_by_cases() -> None:
    from cublas_audit.planning.shards import split

    cases = grid_cases()
    parts = split(plan_file.PlanFile.of(cases).flops(), 4)
    assert [[cases[p] for p in part] for part in parts] == shard(cases, 4)


def reads_as_written(path: Path) -> None:
    """A listed plan: its cases as each entry gives them, its ids as written."""
    items = json.loads(path.read_text())
    assert isinstance(items, list)
    assert read_plan(path) == [Case.from_json(item) for item in items]
    assert plan_case_ids(path) == [item["case_id"] for item in items]


def test_a_committed_plan_reads_as_it_was_written() -> None:
    reads_as_written(SHARDS_CHECK / "shard-2" / "plan.json")


@pytest.mark.heavy
def test_every_committed_plan_reads_as_it_was_written() -> None:
    """Each of the ~90 plans under reports/ and tests/fixtures (3 s of CPU)."""
    assert len(COMMITTED) > 80
    for path in COMMITTED:
        reads_as_written(path)


def test_recorded_shards_still_merge_to_the_recorded_merged_run() -> None:
    """The H100's three shards of a 400-problem map (listed plans, fingerprints of before):
    checked and merged, the recorded merged run's cases and rows."""
    from cublas_audit.table import shard_merge
    from cublas_audit.table.validation import read_table

    shards = [shard_merge.read_shard(SHARDS_CHECK / f"shard-{i}") for i in (1, 2, 3)]
    shard_merge.check_shards(shards)
    merged = shard_merge.merge(shards, ["merge"])
    recorded = read_table(SHARDS_CHECK / "merged")
    assert merged.plan.case_ids() == plan_case_ids(SHARDS_CHECK / "merged" / "plan.json")
    assert merged.table is not None
    assert merged.table["case_id"].tolist() == recorded["case_id"].tolist()
    assert merged.table["traced_kernels"].tolist() == recorded["traced_kernels"].tolist()


def test_a_plan_is_parsed_once_per_content_and_a_written_one_kept_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --devices map's merge, its report and its resume read one plan.json again and again:
    the statement written (its case ids made once) is the one read back, and a file of the same
    bytes is not parsed again; other bytes are another plan."""
    path = tmp_path / "plan.json"
    grid = [Case("cublas", "bf16", m, n, 64, 1) for m in (64, 128) for n in (64, 128, 192)]
    stated = plan_file.PlanFile.of(grid)
    plan_file.write(stated, path)
    assert plan_file.read(path) is stated
    parsed: list[object] = []
    parse = plan_file.from_json
    monkeypatch.setattr(plan_file, "from_json", lambda data: parsed.append(data) or parse(data))
    copy = tmp_path / "copy.json"
    copy.write_bytes(path.read_bytes())
    assert plan_file.read(copy) is stated and parsed == []
    other = grid[:5]  # (no product any more: listed)
    copy.write_text(json.dumps(plan_file.PlanFile.of(other).to_json()))
    assert plan_file.read(copy).case_ids() == [case.case_id for case in other] and len(parsed) == 1
    copy.write_text("{")
    with pytest.raises(AuditError, match="not a cublas-audit plan"):
        plan_file.read(copy)


@pytest.mark.parametrize(
    ("axes", "batches", "modes", "apis", "variants"),
    [
        (("", "64:256:64", "64,128,4096", "64:320:64"), [1], ["fp32", "bf16"], ["cublas"],
         Variants(layouts=("nn", "tn"))),
        (("64:192:64", "64,128", "64", "64:128:64"), [1, 8], ["fp32"], ["cublas", "cublasLt"],
         Variants(broadcast="b", beta=0.5)),
        (("", "128,64", "64", "64"), [4], ["tf32"], ["cublasLt"],
         Variants(bias=True, workspace_mib=8)),
    ],
)  # fmt: skip
def test_a_grid_map_is_made_as_its_statement_with_the_cases_plan_makes(
    axes: tuple[str, str, str, str],
    batches: list[int],
    modes: list[str],
    apis: list[str],
    variants: Variants,
) -> None:
    """A map whose problems are posed alike (squares and a product, batched with a broadcast B,
    two APIs, cuBLASLt's settings; unsorted sizes) is its statement, no case made until one is
    asked for: then the cases, the order and the statement `plan` makes."""
    grid = Grid.parse(*axes)
    made = grid_plan(grid, batches, modes, apis, variants)
    assert isinstance(made, plan_file.StatedCases) and made._made is None
    assert len(made) == made.stated.count and made._made is None
    expected = map_plan(grid.problems(), batches, modes, apis, variants)
    assert plan_file.PlanFile.of(made) is made.stated == plan_file.PlanFile.of(expected)
    assert made._made is None
    assert list(made) == expected and made[-1] == expected[-1] and made == expected


def test_a_map_posed_per_problem_is_made_case_by_case() -> None:
    """A padded leading dimension or a batched call folded (broadcast A) depends on each
    problem: those maps' cases are made as `plan` makes them."""
    grid = Grid.parse("", "64,128", "64", "64")
    for variants in (Variants(ld_pad=8), Variants(broadcast="a")):
        made = grid_plan(grid, [1, 4], ["fp32"], ["cublas"], variants)
        assert type(made) is list
        assert made == map_plan(grid.problems(), [1, 4], ["fp32"], ["cublas"], variants)


def test_a_rising_grid_is_its_product_and_any_other_sorted_once() -> None:
    """(the full grid's problems made in C)"""
    for axes in (("", "64:256:64", "64:128:64", "64"), ("", "128,64", "64", "64,64"),
                 ("64,128", "64:128:64", "64", "64")):  # fmt: skip
        grid = Grid.parse(*axes)
        every = sorted({grid.problem(i) for i in range(grid.count)})
        assert grid.problems() == every


def test_a_stated_plan_makes_its_cases_once_and_pickles_as_its_statement() -> None:
    grid = Grid.parse("", "64:4096:64", "64", "64")
    made = grid_plan(grid, [1], ["fp32"], ["cublas"])
    assert isinstance(made, plan_file.StatedCases)
    again = pickle.loads(pickle.dumps(made))
    assert again._made is None and again.stated == made.stated
    first = made[0]
    assert made[0] is first and next(iter(made)) is first  # (made once, kept)
    assert len(pickle.dumps(made)) < 1_000  # (its statement, not its 64 cases)
    part = PlanPart.of(ShardSpec(1, 2), made)
    assert part.given is None and part.cases() == shard(list(made), 2)[0]
