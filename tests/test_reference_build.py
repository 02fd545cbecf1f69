"""Every shipped reference-kernel variant compiles with nvcc, and ptxas spills no registers.

A variant is a strategy-table tile fitted to a problem the way `config.fit` fits it: an aligned
size (4096), a ragged one that TMA still describes (1000) and one that forces 4-byte cp.async
copies (1023). Each builds for the GPUs its table serves: the sm_80 table's for sm_89, the sm_90
table's (TMA, and cp.async for sizes TMA cannot describe) for sm_90a and sm_120. Plus every
accumulator layout of the large tile, and the pure-Python strategy and CLI checks.

Compiling all of them takes nvcc about 100 x 3 s (2.3 minutes on two cores), so the ptxas
reports are recorded in tests/golden/reference_ptxas.json, keyed by the sha256 of the exact
source and target and valid for the nvcc that made them. The compile test (default-on; it skips
without nvcc) compiles live, in parallel, only what it must: every variant the record lacks (a
changed kernel, table or fit) or all of them under another nvcc. That the record is what this
nvcc reports is checked by compiling one recorded variant per target (the one with the most
registers, nearest to spilling), a `heavy` test (8 s of nvcc: CI's second step,
`pytest -q -m heavy`). Regenerate the record, with the other golden files, after reviewing the
change:

    .venv/bin/python tests/regenerate_golden.py
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from cublas_audit.device.reference.bench import merged_table
from cublas_audit.device.reference.build import ZERO_KERNEL, source_for
from cublas_audit.device.reference.config import (
    ACC_LAYOUTS,
    DATA_DIR,
    KERNEL_NAMES,
    Config,
    fit,
    load_table,
    strategy_for,
    table_path,
)
from cublas_audit.errors import AuditError

from .conftest import REPO, background_result

NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")

# The GPUs each shipped table serves (config.table_path: the newest table not newer than the GPU):
# sm_80 serves Ampere and Ada, sm_90 Hopper and Blackwell, with TMA or, for sizes TMA cannot
# describe, the cp.async kernel.
TARGETS = {
    "80": ["arch=compute_89,code=sm_89"],
    "90": ["arch=compute_90a,code=sm_90a", "arch=compute_120,code=sm_120"],
}
PROBLEMS = [(4096, 4096, 4096), (1000, 1000, 1000), (1023, 1023, 1023)]
# The large tile's accumulator layouts: the named ones and a spelled one no named layout uses.
LAYOUTS = [*ACC_LAYOUTS, "8x4/cc"]
NVCC_FLAGS = ["-std=c++17", "-O3", "-cubin", "-Xptxas", "-v"]
PTXAS_RECORD = REPO / "tests" / "golden" / "reference_ptxas.json"

ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
REGISTERS = re.compile(r"Used (\d+) registers")


@dataclass(frozen=True)
class Variant:
    """One compile: a specialized source for one -gencode target."""

    name: str
    kernel: str  # the SGEMM entry point in the source
    source: str
    target: str

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.target}\n{self.source}".encode()).hexdigest()


# ptxas's report of one compile: function -> {"registers", "spill_stores", "spill_loads"}.
Report = dict[str, dict[str, int]]


def shipped_variants() -> dict[tuple[str, str], tuple[str, Config]]:
    """Distinct specialized sources of every shipped table entry, keyed by (source text, the
    table's architecture)."""
    variants: dict[tuple[str, str], tuple[str, Config]] = {}
    for table in sorted(DATA_DIR.glob("strategy_sm*.json")):
        arch = table.stem.removeprefix("strategy_sm")
        for _size, _batch, config in load_table(table):
            for m, n, k in PROBLEMS:
                fitted = fit(config, arch, m, n, k)
                source = source_for(fitted, m, n, k)
                variants.setdefault((source, arch), (f"{fitted.label()} @ {m}x{n}x{k}", fitted))
    return variants


def layout_variant(layout: str) -> Variant:
    """The 8192 batch-8 pick of the sm_90 table in another accumulator layout, for sm_90a."""
    large = replace(strategy_for("90", 8192, 8192, 8192, 8), acc_layout=layout)
    name = f"{large.label()} @ 8192x8192x8192"
    source = source_for(large, 8192, 8192, 8192)
    return Variant(name, KERNEL_NAMES[large.kernel], source, TARGETS["90"][0])


def compile_jobs() -> list[Variant]:
    """Every distinct (source, target) the tests prove: the shipped variants, then the layouts."""
    jobs = [
        Variant(name, KERNEL_NAMES[config.kernel], source, target)
        for (source, arch), (name, config) in shipped_variants().items()
        for target in TARGETS[arch]
    ]
    jobs += [layout_variant(layout) for layout in LAYOUTS]
    return list({job.key: job for job in jobs}.values())


def parse_ptxas(text: str) -> Report:
    """Per function of a ptxas -v report: registers and bytes spilled (stores, loads)."""
    report: Report = {}
    current = None
    for line in text.splitlines():
        if entry := ENTRY.search(line):
            current = report.setdefault(entry.group(1), {})
        elif current is not None and (spilled := SPILLS.search(line)):
            current["spill_stores"], current["spill_loads"] = map(int, spilled.groups())
        elif current is not None and (used := REGISTERS.search(line)):
            current["registers"] = int(used.group(1))
    return report


def ptxas(variant: Variant, workdir: Path) -> Report:
    """Compiles one variant to a cubin (no host code, no linking) and parses ptxas's report."""
    path = workdir / f"{variant.key[:16]}.cu"
    path.write_text(variant.source)
    cubin = path.with_suffix(".cubin")
    done = subprocess.run(
        [str(NVCC), *NVCC_FLAGS, f"-gencode={variant.target}", "-o", str(cubin), str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"{variant.name} {variant.target}: nvcc failed:\n{done.stderr}"
    report = parse_ptxas(done.stderr)
    assert is_complete(variant, report), f"{variant.name} {variant.target}: {done.stderr}"
    return report


def is_complete(variant: Variant, report: Report) -> bool:
    """The report names the SGEMM and the zero kernel, each with its registers and spills."""
    facts = {"registers", "spill_stores", "spill_loads"}
    return {variant.kernel, ZERO_KERNEL} <= set(report) and all(
        set(found) == facts for found in report.values()
    )


def compile_all(variants: Iterable[Variant]) -> dict[str, Report]:
    """Live ptxas reports, one nvcc per core at a time."""
    todo = list(variants)
    if not todo:
        return {}
    with (
        tempfile.TemporaryDirectory(prefix="cublas-audit-ptxas-") as workdir,
        ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool,
    ):
        reports = list(pool.map(lambda v: ptxas(v, Path(workdir)), todo))
    return {v.key: report for v, report in zip(todo, reports, strict=True)}


def nvcc_identity() -> dict[str, Any]:
    """What the record is valid for: the compiler's version and the flags."""
    version = subprocess.run(
        [str(NVCC), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return {"nvcc": version.splitlines()[-1], "flags": NVCC_FLAGS}


def build_record() -> dict[str, Any]:
    """The whole record, every variant compiled live (tests/regenerate_golden.py)."""
    jobs = compile_jobs()
    reports = compile_all(jobs)
    return {
        **nvcc_identity(),
        "variants": [
            {"name": v.name, "target": v.target, "sha256": v.key, "ptxas": reports[v.key]}
            for v in sorted(jobs, key=lambda v: (v.target, v.name, v.key))
        ],
    }


def recorded_reports() -> dict[str, Report]:
    """sha256 -> recorded report, if the record was made by this nvcc with these flags."""
    if not PTXAS_RECORD.exists():
        return {}
    record = json.loads(PTXAS_RECORD.read_text())
    identity = nvcc_identity()
    if {key: record.get(key) for key in identity} != identity:
        warnings.warn(
            f"{PTXAS_RECORD.name} was made by {record.get('nvcc')!r} with {record.get('flags')}; "
            f"this is {identity['nvcc']!r}: compiling every variant",
            stacklevel=2,
        )
        return {}
    return {entry["sha256"]: entry["ptxas"] for entry in record["variants"]}


def spot_checks(jobs: list[Variant], recorded: Mapping[str, Report]) -> list[Variant]:
    """Per target, the recorded variant whose SGEMM uses the most registers."""
    picked: dict[str, tuple[int, str, Variant]] = {}
    for job in jobs:
        if job.key in recorded:
            registers = recorded[job.key][job.kernel]["registers"]
            best = picked.get(job.target)
            if best is None or (registers, job.key) > best[:2]:
                picked[job.target] = (registers, job.key, job)
    return [job for _, _, job in picked.values()]


def background_work() -> dict[str, Report]:
    """sha256 -> ptxas report of every compile job: recorded, or compiled here (conftest starts
    this when the tests are collected, so nvcc runs beside the rest of the suite)."""
    if NVCC is None:
        return {}
    jobs = compile_jobs()
    recorded = recorded_reports()
    live = compile_all([job for job in jobs if job.key not in recorded])
    return {**recorded, **live}


@pytest.fixture(scope="module")
def ptxas_reports(request: pytest.FixtureRequest) -> dict[str, Report]:
    reports: dict[str, Report] = background_result(request)
    return reports


def spills(report: Report) -> list[tuple[int, int]]:
    """(stores, loads) spilled, per function."""
    return [(facts["spill_stores"], facts["spill_loads"]) for facts in report.values()]


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
    config = strategy_for(cc, m, 512, k, 3)
    assert (config.kernel, config.vec) == (kernel, vec)
    assert not config.problems()


def test_split_k_never_exceeds_the_k_tiles() -> None:
    config = fit(Config(bk=16, splitk=8), "90", 256, 256, 32)
    assert config.splitk == 2


def test_source_carries_the_problem_and_inlines_the_header() -> None:
    source = source_for(Config(), 1000, 999, 998)
    for define in ("#define M 1000", "#define N 999", "#define K 998"):
        assert define in source
    assert "BATCH" not in source  # the grid carries the batch: one module for every batch count
    assert "#include" not in source
    assert "cublas_audit_ref_tma_sgemm" in source


def test_unknown_architecture_is_a_one_line_error() -> None:
    with pytest.raises(AuditError):
        strategy_for("7.5", 1024, 1024, 1024, 1)


def test_shipped_tables_have_valid_tiles() -> None:
    for _source, (name, config) in shipped_variants().items():
        assert not config.problems(), f"{name}: {config.problems()}"


def test_the_shipped_sm90_table_was_tuned_on_the_h100_at_every_size() -> None:
    table = json.loads(table_path("90").read_text())
    # Two runs on the H100: all 24 problems, then 2048-8192 again once accumulator layouts were
    # searched.
    assert table["source"].startswith("cublas-audit reference --tune on 12 of 12 searched")
    problems = {(e["size"], e["batch"]) for e in table["entries"]}
    assert problems == {(2**p, b) for p in range(8, 14) for b in (1, 4, 8, 16)}
    # What the H100 measured: a 32-deep k tile at 8192 (128x256x32 171.2 ms against 128x256x16
    # 180.5 ms at batch 8) in the row-snake FMA order (175.5 ms in column order) with its
    # accumulators in 4 x 4 blocks (170.3 ms, row by row 171.2 ms), and at 1024 single a 128x64
    # tile split 4 ways along K (0.0787 ms, whole tiles 0.0842 ms).
    large = strategy_for("90", 8192, 8192, 8192, 8)
    assert (large.bk, large.order, large.acc_layout) == (32, 1, "blocks")
    small = strategy_for("90", 1024, 1024, 1024, 1)
    assert (small.bm, small.bn, small.splitk) == (128, 64, 4)


def test_tuning_refines_the_current_table() -> None:
    shipped = load_table(table_path("90"))
    picked = Config(bm=128, bn=64, tm=8, tn=8, swizzle=16)
    table = merged_table("90", {(4096, 8): picked}, [(4096, 8), (8192, 8)])
    entries = {(e["size"], e["batch"]): e["config"] for e in table["entries"]}
    assert len(entries) == len(shipped)  # nothing lost: unsearched entries stay
    assert entries[(4096, 8)] == picked.to_json()
    assert entries[(256, 1)] == next(c for s, b, c in shipped if (s, b) == (256, 1)).to_json()
    assert "on 1 of 2 searched problems (sizes 4096)" in table["source"]


def test_ptxas_report_parsing() -> None:
    text = (
        "ptxas info    : Compiling entry function 'cublas_audit_ref_tma_sgemm' for 'sm_90a'\n"
        "ptxas info    : Function properties for cublas_audit_ref_tma_sgemm\n"
        "    0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 16 bytes smem\n"
    )
    facts = {"registers": 168, "spill_stores": 8, "spill_loads": 12}
    assert parse_ptxas(text) == {"cublas_audit_ref_tma_sgemm": facts}


@needs_nvcc
def test_the_ptxas_record_covers_exactly_the_variants_of_this_checkout() -> None:
    record = json.loads(PTXAS_RECORD.read_text())
    if {key: record.get(key) for key in ("nvcc", "flags")} != nvcc_identity():
        pytest.skip(f"{PTXAS_RECORD.name} was made by another nvcc: {record['nvcc']}")
    recorded = {entry["sha256"]: entry["name"] for entry in record["variants"]}
    wanted = {job.key: f"{job.name} {job.target}" for job in compile_jobs()}
    missing = sorted(name for key, name in wanted.items() if key not in recorded)
    stale = sorted(name for key, name in recorded.items() if key not in wanted)
    assert not missing and not stale, (
        f"{PTXAS_RECORD.name} is out of date (run tests/regenerate_golden.py); "
        f"not recorded: {missing}; recorded but gone: {stale}"
    )


@needs_nvcc
@pytest.mark.heavy
def test_the_record_is_what_this_nvcc_reports() -> None:
    """One recorded variant per target compiled live: its ptxas report equals the record's."""
    recorded = recorded_reports()
    if not recorded:
        pytest.skip(f"{PTXAS_RECORD.name} was made by another nvcc: every variant compiles live")
    checks = spot_checks(compile_jobs(), recorded)
    live = compile_all(checks)
    for job in checks:
        assert live[job.key] == recorded[job.key], (
            f"{job.name} {job.target}: ptxas reports {live[job.key]} here, "
            f"{PTXAS_RECORD.name} {recorded[job.key]}"
        )


@needs_nvcc
def test_every_variant_compiles_without_spills(ptxas_reports: dict[str, Report]) -> None:
    failures = []
    for job in compile_jobs():
        report = ptxas_reports[job.key]
        assert is_complete(job, report), f"{job.name} {job.target}: no full ptxas report {report}"
        registers = report[job.kernel]["registers"]
        print(f"{job.name:55s} {job.target:32s} registers {registers:>3d} spills {spills(report)}")
        if any(stores or loads for stores, loads in spills(report)):
            failures.append(f"{job.name} {job.target}: spills {spills(report)}")
    assert not failures, "\n".join(failures)


@needs_nvcc
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_accumulator_layout_of_the_large_tile_compiles_without_spills(
    ptxas_reports: dict[str, Report], layout: str
) -> None:
    report = ptxas_reports[layout_variant(layout).key]
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
