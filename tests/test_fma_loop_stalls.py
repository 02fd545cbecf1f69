"""tools/fma_loop_stalls.py on the committed ncu source export of 8192^3 batch 8 (H100).

The tool is not part of the package (tools/ is not shipped): it is loaded from its file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
RESULTS = TOOLS / "results"
EXPORT = RESULTS / "reference_ncu_source_8192b8_h100.csv.gz"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    path = TOOLS / "fma_loop_stalls.py"
    spec = importlib.util.spec_from_file_location("fma_loop_stalls", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def figures(script: ModuleType) -> dict[str, Any]:
    return {name: script.summary(frame) for name, frame in script.kernels(EXPORT).items()}


def test_bank_conflict_counts_only_reads_from_the_register_file(script: ModuleType) -> None:
    assert script.bank_conflict(2, 4, 6, False, False) == 3
    assert script.bank_conflict(2, 4, 6, True, False) == 2
    assert script.bank_conflict(2, 3, 5, False, False) == 2
    assert script.bank_conflict(2, 3, 5, False, True) == 1


def test_finds_each_kernels_fma_loop(figures: dict[str, Any]) -> None:
    reference = figures["cublas_audit_ref_tma_sgemm"]["loop"]
    (cublas_name,) = (name for name in figures if name.startswith("sm80_xmma_gemm_f32f32"))
    cublas = figures[cublas_name]["loop"]
    # 32 k of a 16 x 8 register tile per stage, against cuBLAS's 8 k of 8 x 16.
    assert reference["ffma"] == 4096 and cublas["ffma"] == 1024
    assert reference["bytes"] == 16 * reference["instructions"] > 3 * cublas["bytes"]
    # cuBLAS's kernel keeps every accumulator in its register; ptxas moves most of ours.
    assert cublas["ffma_in_place"] == 1024
    assert reference["ffma_in_place"] < reference["ffma"] / 4
    # Every LDS.128 of ours takes four shared-memory wavefronts; a third of cuBLAS's take two.
    assert reference["shared_wavefronts_per_lds"] == 4.0
    assert cublas["shared_wavefronts_per_ffma"] < reference["shared_wavefronts_per_ffma"]
    # FFMAs wait longer to dispatch the more reads share a bank, and longer when they move the
    # accumulator than when they write it in place.
    waits = reference["dispatch_per_ffma_run_x1e6"]
    assert waits["moved"][1] < waits["moved"][2] < waits["moved"][3]
    assert all(waits["in_place"][level] < waits["moved"][level] for level in (1, 2, 3))


def test_shares_cover_every_sample(figures: dict[str, Any]) -> None:
    for kernel in figures.values():
        assert sum(kernel["stall_share"].values()) == pytest.approx(1.0, abs=0.01)
        loop = kernel["loop"]
        assert 0 < loop["no_inst_at_line_starts"] <= kernel["stall_share"]["no_inst"]
        assert loop["dispatch_on_ffma"] <= kernel["stall_share"]["dispatch"]


def test_committed_figures_are_this_scripts_output(figures: dict[str, Any]) -> None:
    committed = json.loads((RESULTS / "reference_stalls_h100.json").read_text())
    for name, kernel in figures.items():
        stored = committed["kernels"][name]
        assert stored["stall_share"] == kernel["stall_share"]
        assert stored["loop"] == json.loads(json.dumps(kernel["loop"]))
