"""Starting the probe child: its command line (a list argv, never a shell), its environment, the
cuBLAS it must load, and its output streamed line by line.

The probe (probes/gemm_probe.py, shipped as cublas_audit.probes.gemm_probe) runs in a child
process so that ncu can profile it, a crash loses one case, and another interpreter
(`--probe-python`) or another cuBLAS (`--cublas-lib`) can be audited. The child imports this
package from a view on its PYTHONPATH (resources.package_view), so the interpreter needs CuPy, not
cublas-audit.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.resources import PROBE_MODULE

# The probe's progress lines on stdout; everything else it prints goes to probe.log.
START_LINE, DONE_LINE = "@@start ", "@@done "
# Set in the probe's environment, it times with CUDA events alone (`sweep --observer events`).
NO_CUPTI_ENV = "CUBLAS_AUDIT_NO_CUPTI"
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The libraries --cublas-lib preloads, cuBLASLt first (libcublas links against it). CuPy opens
# its cuBLAS by absolute path, which LD_LIBRARY_PATH cannot redirect; LD_PRELOAD can.
CUBLAS_LIBRARIES = ("libcublasLt.so", "libcublas.so")


@dataclass(frozen=True)
class ProbeCommand:
    """How to start the probe: interpreter, the child's whole environment, and its working
    directory. `python -m` and `-c` put the working directory first on sys.path, so the child
    runs in the package view: a checkout's own cublas_audit/ (which lacks the mapped probes/)
    must not shadow the view when a sweep starts from the repository root."""

    python: str = sys.executable
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    cwd: Path | None = None

    def argv(self, args: Sequence[str]) -> list[str]:
        return [self.python, "-m", PROBE_MODULE, *args]


def parse_probe_env(items: Sequence[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise AuditError(f"--probe-env: {item!r} is not KEY=VALUE with a valid variable name")
        env[key] = value
    return env


def check_python(python: str) -> str:
    """--probe-python names an executable file (checked before the GPU is touched)."""
    path = Path(python)
    if os.sep not in python:
        from shutil import which

        found = which(python)
        if found is None:
            raise AuditError(f"--probe-python: {python!r} is not on the PATH")
        return found
    if not path.is_file() or not os.access(path, os.X_OK):
        raise AuditError(f"--probe-python: {python} is not an executable file")
    return str(path.absolute())  # the child runs elsewhere (ProbeCommand.cwd)


def cublas_preload(cublas_lib: Path) -> list[Path]:
    """The libcublasLt and libcublas of a --cublas-lib directory, in preload order."""
    if not cublas_lib.is_dir():
        raise AuditError(f"--cublas-lib: {cublas_lib} is not a directory")
    found = []
    for stem in CUBLAS_LIBRARIES:
        matches = sorted(p for p in cublas_lib.glob(stem + "*") if p.is_file())
        if not matches:
            raise AuditError(f"--cublas-lib: {cublas_lib} holds no {stem}*")
        found.append(matches[0].resolve())
    return found


def probe_environment(
    base: Mapping[str, str], extra: Mapping[str, str], cublas_lib: Path | None, view: Path
) -> dict[str, str]:
    """The child's environment: `base`, the user's additions, the package view on PYTHONPATH
    and, with a cuBLAS directory, its libraries preloaded."""
    env = dict(base)
    env.update(extra)
    if cublas_lib is not None:
        preload = [str(p) for p in cublas_preload(cublas_lib)]
        env["LD_PRELOAD"] = os.pathsep.join([*preload, *filter(None, [env.get("LD_PRELOAD")])])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(view), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def check_loaded_cublas(versions: Mapping[str, Any], cublas_lib: Path | None) -> None:
    """With --cublas-lib, the probe must have mapped that directory's cuBLAS and nothing else."""
    if cublas_lib is None:
        return
    wanted = cublas_lib.resolve()
    paths = [Path(p) for p in versions.get("cublas_paths") or []]
    foreign = [p for p in paths if p.resolve().parent != wanted]
    if not paths or foreign:
        shown = ", ".join(map(str, foreign or paths)) or "none"
        raise AuditError(
            f"--cublas-lib: the probe did not load the cuBLAS of {cublas_lib} "
            f"(libraries mapped: {shown})"
        )


def check_probe_imports(probe: ProbeCommand) -> None:
    """The probe's interpreter can import CuPy and this package (through the view), checked
    before a run directory exists: a missing [gpu] extra is one clear error, not a half-made run
    whose cause sits in probe.log."""
    argv = [probe.python, "-c", f"import cupy, cupy_backends.cuda.libs.cublas, {PROBE_MODULE}"]
    try:
        done = subprocess.run(
            argv,
            env=dict(probe.env),
            cwd=probe.cwd,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolMissingError(f"cannot run the probe interpreter {probe.python}: {exc}") from exc
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ToolMissingError(
            f"the probe interpreter {probe.python} cannot load the probe ({last[0]}); "
            "install CuPy there: pip install 'cublas-audit[gpu]'"
        )


def run_streaming(
    argv: list[str],
    env: Mapping[str, str],
    on_line: Callable[[str], None],
    cwd: Path | None = None,
) -> int:
    """Runs a child, handing each stdout line to `on_line`; Ctrl-C stops the child too."""
    try:
        child = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=dict(env),
            cwd=cwd,
            bufsize=1,
        )
    except OSError as exc:
        raise AuditError(f"cannot start {argv[0]}: {exc.strerror or exc}") from exc
    with child:
        assert child.stdout is not None
        try:
            for line in child.stdout:
                on_line(line.rstrip("\n"))
        except BaseException:
            child.kill()
            raise
        return child.wait()


def check_visible_devices(probe_env: Mapping[str, str]) -> None:
    """A --probe-env CUDA_VISIBLE_DEVICES that hides every GPU from the probe (empty, `none`,
    `-1`, or a first entry that is neither an index nor a UUID: CUDA stops at the first invalid
    entry) is refused before the probe starts: the probe would fail with no GPU, ncu with "error
    code (1)"."""
    if "CUDA_VISIBLE_DEVICES" not in probe_env:
        return
    value = probe_env["CUDA_VISIBLE_DEVICES"]
    first = value.split(",")[0].strip()
    if not (first.isdigit() or first.startswith(("GPU-", "MIG-"))):
        raise ToolMissingError(
            f"--probe-env CUDA_VISIBLE_DEVICES={value!r} leaves the probe no GPU: name one "
            "(an index or a UUID, as nvidia-smi -L lists them)"
        )
