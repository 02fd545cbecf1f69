"""CA201 low-utilization on tests/fixtures/h100-batched-cublas: 256^3 runs xmma_32x32x8 at
18.2718 % (batch 4: 262144 output elements) and 33.3562 % (batch 8: 524288), against the
table's best FP32 82.1128 %; no call that small fills the GPU at the default fill_min_elements."""

from __future__ import annotations

from cublas_audit.judge.roofline import machine_of
from cublas_audit.table.validation import read_table
from tests.rules.recorded import dataset, judged, path_of

H100 = "fixtures:h100-batched-cublas"


def test_nothing_that_fills_the_h100_is_low() -> None:
    assert judged(dataset(H100), "low-utilization") == []


def test_the_small_calls_once_they_count_as_filling() -> None:
    found = judged(dataset(H100), "low-utilization", fill_min_elements=262144)
    assert [(f.batch, f.sizes, f.severity) for f in found] == [
        (4, ["256"], "medium"),
        (8, ["256"], "medium"),
    ]
    # one element more and batch 4 no longer fills: only batch 8 is judged
    found = judged(dataset(H100), "low-utilization", fill_min_elements=262145)
    assert [(f.batch, f.sizes) for f in found] == [(8, ["256"])]


def test_against_the_tables_best() -> None:
    """33.3562 % is below 0.6 x 82.1128 = 49.27 %; at a fraction of 0.4 (32.85 %) it is not."""
    fill = {"fill_min_elements": 524288}
    assert [f.batch for f in judged(dataset(H100), "low-utilization", **fill)] == [8]
    assert judged(dataset(H100), "low-utilization", low_util_fraction=0.4, **fill) == []


def test_a_table_without_env_json_keeps_its_gpus_bandwidth() -> None:
    """The GPU's name from the table's own column finds its data sheet (the H100's 3.35 TB/s):
    its memory-bound calls are still judged on bandwidth."""
    table = read_table(path_of("h100/checks/20261125-074637-k140") / "dispatch.csv")
    machine = machine_of({}, table)
    assert machine is not None
    assert (machine.name, machine.dram_gbps) == ("NVIDIA H100 80GB HBM3", 3350.0)
    assert machine.dram_source == "data sheet of the NVIDIA H100 80GB HBM3"
