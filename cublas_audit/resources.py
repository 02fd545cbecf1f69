"""The folders the tool ships besides its code: the probe program (`probes/`), the reference
kernel sources (`reference_kernels/`) and the bundled real audits (`reports/`).

In the repository they stand at the top level; pyproject.toml maps each into the package at build
time (`cublas_audit.probes`, `cublas_audit.reference_kernels`, `cublas_audit.bundled`), so a wheel,
`pip install .` and `pip install -e .` all find them through importlib.resources. The probe child,
which may be another interpreter without this package installed, gets a view of the package (the
package's files and the mapped folders, as symbolic links) on its PYTHONPATH.
"""

from __future__ import annotations

import importlib.resources
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cublas_audit.errors import ToolMissingError

PACKAGE = "cublas_audit"
# subpackage -> the repository folder it is built from
SHIPPED = {"probes": "probes", "reference_kernels": "reference_kernels", "bundled": "reports"}
PROBE_MODULE = f"{PACKAGE}.probes.gemm_probe"


def shipped(name: str) -> Path:
    """The folder of a shipped subpackage on disk (`probes`, `reference_kernels`, `bundled`)."""
    try:
        return Path(str(importlib.resources.files(f"{PACKAGE}.{name}")))
    except ModuleNotFoundError as exc:
        raise ToolMissingError(
            f"this installation of cublas-audit lacks its {SHIPPED[name]}/ folder ({exc}); "
            "reinstall it (pip install cublas-audit, or pip install -e . in a checkout)"
        ) from exc


@contextmanager
def package_view() -> Iterator[Path]:
    """A temporary directory holding `cublas_audit/` alone, for a child's PYTHONPATH: links to the
    package's own files plus the shipped folders wherever the installation keeps them (inside the
    package in a wheel, at the checkout's top level in an editable install)."""
    root = Path(tempfile.mkdtemp(prefix="cublas-audit-view-"))
    try:
        package = Path(str(importlib.resources.files(PACKAGE)))
        view = root / PACKAGE
        view.mkdir()
        for entry in package.iterdir():
            (view / entry.name).symlink_to(entry.resolve())
        for name in SHIPPED:
            if not (view / name).exists():
                (view / name).symlink_to(shipped(name).resolve())
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
