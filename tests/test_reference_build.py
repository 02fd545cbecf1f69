"""Every shipped reference-kernel variant compiles with nvcc, and ptxas spills no registers.

A variant is a strategy-table tile fitted to a problem the way `reference.prepare` fits it: an
aligned size (4096), a ragged one that TMA still describes (1000) and one that forces 4-byte
cp.async copies (1023). Each builds for the GPUs its table serves: the sm_80 table's for sm_89,
the sm_90 table's (TMA, and cp.async for sizes TMA cannot describe) for sm_90a and sm_120. Plus
the pure-Python strategy and CLI checks. The compile test skips without nvcc.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from cublas_audit import reference
from cublas_audit.errors import AuditError

NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")

# The GPUs each shipped table serves (reference.table_path: the newest table not newer than the
# GPU): sm_80 serves Ampere and Ada, sm_90 Hopper and Blackwell, with TMA or, for sizes TMA cannot
# describe, the cp.async kernel.
TARGETS = {
    "80": ["arch=compute_89,code=sm_89"],
    "90": ["arch=compute_90a,code=sm_90a", "arch=compute_120,code=sm_120"],
}
PROBLEMS = [(4096, 4096, 4096), (1000, 1000, 1000), (1023, 1023, 1023)]
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
REGISTERS = re.compile(r"Used (\d+) registers")


def shipped_variants() -> dict[tuple[str, str], tuple[str, reference.Config]]:
    """Distinct specialized sources of every shipped table entry, keyed by (source text, the
    table's architecture)."""
    variants: dict[tuple[str, str], tuple[str, reference.Config]] = {}
    for table in sorted(reference.DATA_DIR.glob("strategy_sm*.json")):
        arch = table.stem.removeprefix("strategy_sm")
        for _size, _batch, config in reference.load_table(table):
            for m, n, k in PROBLEMS:
                fitted = reference.fit(config, arch, m, n, k)
                source = reference.source_for(fitted, m, n, k)
                variants.setdefault((source, arch), (f"{fitted.label()} @ {m}x{n}x{k}", fitted))
    return variants


def spills(report: str) -> list[tuple[int, int]]:
    """(stores, loads) spilled, per function of a ptxas -v report."""
    return [(int(stores), int(loads)) for stores, loads in SPILLS.findall(report)]


def ptxas_report(source: str, target: str, workdir: Path) -> str:
    path = workdir / f"v{abs(hash((source, target)))}.cu"
    path.write_text(source)
    cmd = [str(NVCC), "-std=c++17", "-O3", "-cubin", "-Xptxas", "-v", f"-gencode={target}"]
    done = subprocess.run(
        [*cmd, "-o", str(path.with_suffix(".cubin")), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"{target}: nvcc failed:\n{done.stderr}"
    return done.stderr


@pytest.mark.parametrize(
    ("cc", "m", "k", "kernel", "vec"),
    [
        ("90", 4096, 4096, "tma", 4),
        ("90", 1000, 1000, "tma", 4),
        ("90", 1023, 1024, "cpasync", 1),
        ("9.0", 1024, 1022, "cpasync", 1),
        ("89", 4096, 4096, "cpasync", 4),
        ("86", 1023, 1023, "cpasync", 1),
    ],
)
def test_strategy_fits_the_gpu_and_the_strides(
    cc: str, m: int, k: int, kernel: str, vec: int
) -> None:
    config = reference.strategy_for(cc, m, 512, k, 3)
    assert (config.kernel, config.vec) == (kernel, vec)
    assert not config.problems()


def test_split_k_never_exceeds_the_k_tiles() -> None:
    config = reference.fit(reference.Config(bk=16, splitk=8), "90", 256, 256, 32)
    assert config.splitk == 2


def test_source_carries_the_problem_and_inlines_the_header() -> None:
    source = reference.source_for(reference.Config(), 1000, 999, 998)
    for define in ("#define M 1000", "#define N 999", "#define K 998"):
        assert define in source
    assert "BATCH" not in source  # the grid carries the batch: one module for every batch count
    assert "#include" not in source
    assert "cublas_audit_ref_tma_sgemm" in source


def test_unknown_architecture_is_a_one_line_error() -> None:
    with pytest.raises(AuditError):
        reference.strategy_for("7.5", 1024, 1024, 1024, 1)


def test_shipped_tables_have_valid_tiles() -> None:
    for _source, (name, config) in shipped_variants().items():
        assert not config.problems(), f"{name}: {config.problems()}"


def test_the_shipped_sm90_table_was_tuned_on_the_h100_at_every_size() -> None:
    table = json.loads(reference.table_path("90").read_text())
    # Two runs on the H100, logged in benchmarks/results/: all 24 problems (tune_h100.log), then
    # 2048-8192 again once accumulator layouts were searched (tune_layouts_h100.log).
    assert table["source"].startswith("cublas-audit reference --tune on 12 of 12 searched")
    problems = {(e["size"], e["batch"]) for e in table["entries"]}
    assert problems == {(2**p, b) for p in range(8, 14) for b in (1, 4, 8, 16)}
    # What the H100 measured: a 32-deep k tile at 8192 (128x256x32 171.2 ms against 128x256x16
    # 180.5 ms at batch 8) in the row-snake FMA order (175.5 ms in column order) with its
    # accumulators in 4 x 4 blocks (170.3 ms, row by row 171.2 ms), and at 1024 single a 128x64
    # tile split 4 ways along K (0.0787 ms, whole tiles 0.0842 ms).
    large = reference.strategy_for("90", 8192, 8192, 8192, 8)
    assert (large.bk, large.order, large.acc_layout) == (32, 1, "blocks")
    small = reference.strategy_for("90", 1024, 1024, 1024, 1)
    assert (small.bm, small.bn, small.splitk) == (128, 64, 4)


def test_tuning_refines_the_current_table() -> None:
    shipped = reference.load_table(reference.table_path("90"))
    picked = reference.Config(bm=128, bn=64, tm=8, tn=8, swizzle=16)
    table = reference.merged_table("90", {(4096, 8): picked}, [(4096, 8), (8192, 8)])
    entries = {(e["size"], e["batch"]): e["config"] for e in table["entries"]}
    assert len(entries) == len(shipped)  # nothing lost: unsearched entries stay
    assert entries[(4096, 8)] == picked.to_json()
    assert entries[(256, 1)] == next(c for s, b, c in shipped if (s, b) == (256, 1)).to_json()
    assert "on 1 of 2 searched problems (sizes 4096)" in table["source"]


@needs_nvcc
def test_every_variant_compiles_without_spills(tmp_path: Path) -> None:
    jobs = [
        (name, source, target)
        for (source, arch), (name, _config) in shipped_variants().items()
        for target in TARGETS[arch]
    ]
    with ThreadPoolExecutor() as pool:
        reports = list(pool.map(lambda job: ptxas_report(job[1], job[2], tmp_path), jobs))
    failures = []
    for (name, _source, target), report in zip(jobs, reports, strict=True):
        spilled = spills(report)
        registers = REGISTERS.findall(report)
        assert spilled and registers, f"{name} {target}: no ptxas report:\n{report}"
        print(f"{name:55s} {target:32s} registers {registers[-1]:>3s} spills {spilled[-1]}")
        if any(stores or loads for stores, loads in spilled):
            failures.append(f"{name} {target}: spills {spilled}")
    assert not failures, "\n".join(failures)


@needs_nvcc
@pytest.mark.parametrize("layout", [*reference.ACC_LAYOUTS, "8x4/cc"])
def test_every_accumulator_layout_of_the_large_tile_compiles_without_spills(
    tmp_path: Path, layout: str
) -> None:
    large = reference.strategy_for("90", 8192, 8192, 8192, 8)
    config = replace(large, acc_layout=layout)
    report = ptxas_report(
        reference.source_for(config, 8192, 8192, 8192), TARGETS["90"][0], tmp_path
    )
    spilled = spills(report)
    assert spilled and all(found == (0, 0) for found in spilled), report


def test_reference_command_says_what_is_missing_in_one_line() -> None:
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    try:
        import cupy  # noqa: F401
    except ImportError:
        result = CliRunner().invoke(app, ["reference", "--sizes", "256", "--batches", "1"])
        assert result.exit_code == 3
        assert result.output.strip().splitlines() == [
            "error: the reference kernel needs cupy (No module named 'cupy')"
        ]
    else:
        pytest.skip("cupy is installed here")
