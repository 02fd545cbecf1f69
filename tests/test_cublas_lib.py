"""`sweep --cublas-lib DIR` audits DIR's cuBLAS, and nothing else.

The probe child preloads DIR's libcublasLt then libcublas (LD_PRELOAD: CuPy opens its cuBLAS by
absolute path, which LD_LIBRARY_PATH cannot redirect); a DIR without them is refused (exit 2)
before the machine is looked at; and the libraries the child really mapped (its `probe` record's
cublas_paths) must all lie in DIR, symbolic links resolved, or the sweep stops with an error that
names DIR.

A DIR here is a real directory in tmp_path holding files named as CUDA names them (empty: only
their names matter until a child maps them). End to end, the real sweep.run starts the fake probe
of tests/fakeprobe.py with the config sweep_setup builds, and the fake reports the cuBLAS it
"mapped".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.observe import environment
from cublas_audit.planning.plan_file import read_plan
from cublas_audit.resources import package_view
from cublas_audit.run import sweep, sweep_setup
from cublas_audit.run.probe_process import check_loaded_cublas, probe_environment
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.run.sweep_setup import checked, start_run
from cublas_audit.table import rundir
from tests.fakeprobe import (
    SMOKE,
    Recorded,
    call_records,
    cublas_dir,
    deadline,
    fake_probe,
    h100_environment,
)

runner = CliRunner()
DEADLINE_S = 30
SYSTEM_CUBLAS = "/usr/local/cuda-13.1/targets/x86_64-linux/lib/libcublas.so.13.1.0.3"


def preloaded(lib: Path, *names: str) -> list[str]:
    return [str(lib.resolve() / name) for name in names]


def mapped(*paths: Path | str) -> dict[str, Any]:
    """A `probe` record as probes/gemm_probe.py writes it (cuBLAS 13.1.0 on the H100)."""
    return {"event": "probe", "cublas_version_int": 130100, "cublas_paths": [str(p) for p in paths]}


# ----- the child's environment ---------------------------------------------------------------


def test_the_child_preloads_dirs_cublaslt_then_cublas(tmp_path: Path) -> None:
    lib = cublas_dir(tmp_path / "cublas")
    env = probe_environment(
        {"PATH": "/usr/bin"}, {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, lib, tmp_path / "view"
    )
    want = preloaded(lib, "libcublasLt.so.13", "libcublas.so.13")
    assert env["LD_PRELOAD"] == os.pathsep.join(want)
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["PYTHONPATH"] == str(tmp_path / "view")


def test_a_preload_the_user_had_stays_after_dirs_cublas(tmp_path: Path) -> None:
    lib = cublas_dir(tmp_path / "cublas")
    base = {"LD_PRELOAD": "/opt/trace/libtrace.so"}
    env = probe_environment(base, {}, lib, tmp_path / "view")
    assert env["LD_PRELOAD"].split(os.pathsep) == [
        *preloaded(lib, "libcublasLt.so.13", "libcublas.so.13"),
        "/opt/trace/libtrace.so",
    ]
    assert probe_environment(base, {}, None, tmp_path / "view")["LD_PRELOAD"] == (
        "/opt/trace/libtrace.so"
    )  # without --cublas-lib, nothing is preloaded


def test_the_preload_names_the_files_behind_cudas_links(tmp_path: Path) -> None:
    # as CUDA installs it: libcublas.so -> libcublas.so.13 -> libcublas.so.13.1.0.3
    lib = cublas_dir(tmp_path / "cublas", cuda_layout=True)
    env = probe_environment({}, {}, lib, tmp_path / "view")
    real = preloaded(lib, "libcublasLt.so.13.1.0.3", "libcublas.so.13.1.0.3")
    assert env["LD_PRELOAD"].split(os.pathsep) == real
    check_loaded_cublas(mapped(*real), lib)


@pytest.mark.parametrize(
    ("holds", "said"),
    [
        ((), "holds no libcublasLt.so*"),
        (("libcublasLt.so.13",), "holds no libcublas.so*"),
        (("libcublas.so.13",), "holds no libcublasLt.so*"),
        (None, "is not a directory"),
    ],
)
def test_a_dir_without_cublas_is_exit_2_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holds: tuple[str, ...] | None, said: str
) -> None:
    lib = tmp_path / "lib"
    if holds is not None:
        lib.mkdir()
        for name in holds:
            (lib / name).touch()
    looked: list[object] = []
    monkeypatch.setattr(environment, "collect", lambda ncu=None, device=None: looked.append(ncu))
    out = tmp_path / "run"
    args = ["sweep", "--no-batched", "--sizes", "256", "--cublas-lib", str(lib), "--out", str(out)]
    with deadline(DEADLINE_S):
        result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"error: --cublas-lib: {lib} {said}" in result.output.splitlines()
    assert looked == []  # the machine was not even looked at
    assert not out.exists()


# ----- what the child mapped -----------------------------------------------------------------


def test_a_child_that_mapped_dirs_cublas_passes(tmp_path: Path) -> None:
    lib = cublas_dir(tmp_path / "cublas")
    check_loaded_cublas(mapped(lib / "libcublasLt.so.13", lib / "libcublas.so.13"), lib)


def test_a_dir_given_through_a_symlink_passes(tmp_path: Path) -> None:
    lib = cublas_dir(tmp_path / "cublas-13.1")
    link = tmp_path / "cublas"
    link.symlink_to(lib, target_is_directory=True)
    # /proc/self/maps names the real files; the user named the link
    check_loaded_cublas(mapped(lib / "libcublasLt.so.13", lib / "libcublas.so.13"), link)
    # and the other way round
    check_loaded_cublas(mapped(link / "libcublasLt.so.13", link / "libcublas.so.13"), lib)


@pytest.mark.parametrize(
    ("record", "shown"),
    [
        (mapped(SYSTEM_CUBLAS), SYSTEM_CUBLAS),
        (mapped(), "none"),
        ({"event": "probe", "cublas_version_int": 130100}, "none"),  # a probe that records none
    ],
)
def test_a_child_that_mapped_another_cublas_or_none_is_refused(
    tmp_path: Path, record: dict[str, Any], shown: str
) -> None:
    lib = cublas_dir(tmp_path / "cublas")
    with pytest.raises(AuditError) as raised:
        check_loaded_cublas(record, lib)
    assert str(raised.value) == (
        f"--cublas-lib: the probe did not load the cuBLAS of {lib} (libraries mapped: {shown})"
    )


def test_one_foreign_library_among_dirs_is_refused_and_named(tmp_path: Path) -> None:
    lib = cublas_dir(tmp_path / "cublas")
    with pytest.raises(AuditError) as raised:
        check_loaded_cublas(mapped(lib / "libcublasLt.so.13", SYSTEM_CUBLAS), lib)
    assert str(raised.value).endswith(f"(libraries mapped: {SYSTEM_CUBLAS})")


def test_without_cublas_lib_any_cublas_is_fine() -> None:
    check_loaded_cublas(mapped(SYSTEM_CUBLAS), None)
    check_loaded_cublas(mapped(), None)


# ----- end to end: sweep.run with the fake probe ----------------------------------------------


def started_run(
    tmp_path: Path, reports: str | list[str], view: Path
) -> tuple[sweep.SweepConfig, Path, Path]:
    """A new run under --cublas-lib as sweep_setup.sweep starts it; the fake probe reports
    `reports` as the cuBLAS it mapped. Returns the config, the DIR and the probe's call file."""
    probe, calls = fake_probe(tmp_path, replay=SMOKE, cublas_paths=reports)
    lib = cublas_dir(tmp_path / "cublas")
    options = checked(
        SweepOptions(
            cases=read_plan(SMOKE / rundir.PLAN_FILE), out=tmp_path / "run", profile=False,
            probe_python=probe.python, cublas_lib=lib,
        )
    )  # fmt: skip
    machine = h100_environment()
    config = sweep_setup._config(options, machine, None, view)
    start_run(config, machine, options)
    return config, lib, calls


def test_the_sweep_measures_with_dirs_cublas(tmp_path: Path) -> None:
    with package_view() as view, deadline(DEADLINE_S):
        config, lib, calls = started_run(tmp_path, "preloaded", view)  # mapped what it preloaded
        frame = sweep.run(config, Recorded().progress())
    assert len(call_records(calls)) == 1
    assert len(frame) == len(config.cases)
    assert rundir.read_env(config.run_dir)["probe"]["cublas_paths"] == preloaded(
        lib, "libcublasLt.so.13", "libcublas.so.13"
    )


def test_the_sweep_stops_when_the_child_mapped_another_cublas(tmp_path: Path) -> None:
    with package_view() as view, deadline(DEADLINE_S):
        config, lib, calls = started_run(tmp_path, [SYSTEM_CUBLAS], view)
        with pytest.raises(AuditError) as raised:
            sweep.run(config, Recorded().progress())
    assert str(raised.value) == (
        f"--cublas-lib: the probe did not load the cuBLAS of {lib} "
        f"(libraries mapped: {SYSTEM_CUBLAS})"
    )
    assert len(call_records(calls)) == 1  # stopped after the first child, no retry
    assert not (config.run_dir / rundir.TABLE_FILE).exists()  # no table of the wrong cuBLAS
