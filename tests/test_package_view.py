"""The package view (resources.package_view): what the probe child imports the package from.

Inside the view, a fresh interpreter whose PYTHONPATH is the one the child gets
(probe_process.probe_environment), started elsewhere than the checkout, imports the probe module
(cublas_audit.probes.gemm_probe) and finds the shipped folders: the reference kernel sources in
cublas_audit.reference_kernels and the bundled audits in cublas_audit.bundled. It finds them in
the view, not through this checkout's editable install: the child takes that finder out of
sys.meta_path first, standing for an interpreter without cublas-audit installed (the
`--probe-python` case). The view holds `cublas_audit/` alone and is removed when the context
exits, normally or on an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cublas_audit.resources import PACKAGE, PROBE_MODULE, package_view
from cublas_audit.run.probe_process import probe_environment

CHILD = f"""
import importlib, importlib.resources, json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in repr(f)]
probe = importlib.import_module({PROBE_MODULE!r})
kernels = importlib.resources.files("cublas_audit.reference_kernels")
bundled = importlib.resources.files("cublas_audit.bundled")
print(json.dumps({{
    "package": sys.modules["cublas_audit"].__file__,
    "probe": probe.__file__,
    "kernels": str(kernels),
    "sgemm_tma": (kernels / "sgemm_tma.cu").is_file(),
    "bundled": str(bundled),
    "dispatch": [str(p) for p in sorted(bundled.rglob("dispatch.csv"))],
}}))
"""


def test_a_fresh_interpreter_imports_the_probe_and_its_folders_from_the_view(
    tmp_path: Path,
) -> None:
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with package_view() as view:
        env = probe_environment(base, {}, None, view)
        done = subprocess.run(
            [sys.executable, "-c", CHILD],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        inside = view / PACKAGE
        assert found["package"] == str(inside / "__init__.py")
        assert found["probe"] == str(inside / "probes" / "gemm_probe.py")
        assert found["kernels"] == str(inside / "reference_kernels")
        assert found["sgemm_tma"] is True
        assert found["bundled"] == str(inside / "bundled")
        assert found["dispatch"], "no bundled dispatch.csv in the view"
        assert all(p.startswith(str(inside / "bundled") + os.sep) for p in found["dispatch"])
        assert os.listdir(view) == [PACKAGE]


def test_the_view_is_removed_when_the_context_exits(tmp_path: Path) -> None:
    with package_view() as view:
        assert (view / PACKAGE / "__init__.py").is_file()
    assert not view.exists()


def test_the_view_is_removed_on_an_error_too() -> None:
    with pytest.raises(RuntimeError, match="stopped"), package_view() as view:
        raise RuntimeError("stopped")
    assert not view.exists()


def test_the_child_runs_in_the_view_whatever_directory_the_sweep_starts_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m` and `-c` put the working directory first on sys.path: a sweep started from a
    checkout's root (whose cublas_audit/ lacks the mapped probes/) must not import that copy."""
    from cublas_audit.observe.environment import Environment
    from cublas_audit.run.sweep_options import SweepOptions
    from cublas_audit.run.sweep_setup import _config

    decoy = tmp_path / "checkout"
    (decoy / PACKAGE).mkdir(parents=True)
    (decoy / PACKAGE / "__init__.py").write_text("raise ImportError('the checkout, not the view')")
    monkeypatch.chdir(decoy)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    monkeypatch.setattr(os, "environ", base)
    with package_view() as view:
        options = SweepOptions(probe_python=sys.executable, out=Path("run"))
        config = _config(options, Environment(gpu_name="NVIDIA H100 80GB HBM3"), None, view)
        assert config.run_dir == decoy / "run"  # absolute: the child's directory is another
        done = subprocess.run(
            [config.probe.python, "-c", CHILD],
            env=dict(config.probe.env),
            cwd=config.probe.cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["package"] == str(view / PACKAGE / "__init__.py")


def test_every_package_of_the_source_tree_is_in_the_wheel() -> None:
    """pyproject.toml lists the packages a wheel holds: a stage folder left out of it is a
    wheel that cannot import itself (`No module named 'cublas_audit.jobs'`)."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(root).parts)
        for init in (root / "cublas_audit").rglob("__init__.py")
    }
    assert found - listed == set()
