"""--devices' syntax is bad input, checked before any GPU is looked up (issue 38, item 3): on a
host with GPUs or none, `--devices gpu0` or `--devices -1` is exit 2 and one line, never the
"no NVIDIA GPU" (3) a GPU lookup gives first."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError, ToolMissingError
from cublas_audit.observe.environment import Gpu
from cublas_audit.run import multi_gpu

runner = CliRunner()
H100S = [
    Gpu(0, "GPU-aaaa-0", "NVIDIA H100 80GB HBM3"),
    Gpu(1, "GPU-bbbb-1", "NVIDIA H100 80GB HBM3"),
]


@pytest.fixture
def no_gpu_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any GPU lookup fails the test (as an internal error, exit 4, never the 2 expected)."""

    def looked_up(*_: object, **__: object) -> None:
        raise AssertionError("a GPU was looked up before --devices' syntax was checked")

    monkeypatch.setattr(multi_gpu, "list_gpus", looked_up)
    monkeypatch.setattr("cublas_audit.observe.environment.list_gpus", looked_up)
    monkeypatch.setattr("cublas_audit.observe.environment.collect", looked_up)


@pytest.mark.parametrize(
    "command", [["sweep"], ["map", "--sizes", "256"], ["candidates", "--sizes", "256"]]
)
@pytest.mark.parametrize("devices", ["gpu0", "-1", "0,,1", "1.5", "0,0", ""])
@pytest.mark.usefixtures("no_gpu_lookup")
def test_bad_devices_are_bad_input_before_any_gpu_lookup(command: list[str], devices: str) -> None:
    result = runner.invoke(app, [*command, "--devices", devices])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("error: --devices: ")


def test_the_syntax_alone() -> None:
    assert multi_gpu.device_indices("all") is None
    assert multi_gpu.device_indices(" 1, 0 ") == [1, 0]
    for bad in ("gpu0", "-1", "", "0,", "²"):
        with pytest.raises(AuditError, match="is not a GPU index"):
            multi_gpu.device_indices(bad)
    with pytest.raises(AuditError, match="named twice"):
        multi_gpu.device_indices("3,3")
    with pytest.raises(AuditError, match="is not a GPU index"):
        multi_gpu.Spread("gpu0")  # the library's way in is checked on construction too


def test_a_well_formed_index_still_needs_the_gpu() -> None:
    with pytest.raises(ToolMissingError, match="no NVIDIA GPU found here"):
        multi_gpu.parse_devices("0", [])
    with pytest.raises(AuditError, match="'2' is not a GPU of this host"):
        multi_gpu.parse_devices("0,2", H100S)
    assert multi_gpu.parse_devices("1,0", H100S) == [H100S[1], H100S[0]]
