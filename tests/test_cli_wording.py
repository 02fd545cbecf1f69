"""What the command line says where a newcomer met words that pointed the wrong way (issue 38,
item 6): a terminal report in a read-only directory, `sweep --help`'s --workspace-mib, and
`report` of an atlas directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from cublas_audit.errors import AuditError
from cublas_audit.jobs import report
from cublas_audit.report import output
from tests.conftest import REPORTS

runner = CliRunner()
RUN = REPORTS / "h100" / "20261123-094558-batched"
ATLAS = REPORTS / "h100" / "atlas" / "fp32"


def test_a_terminal_report_in_a_read_only_directory_names_where_it_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --out was given: the error says where the full report would have gone, that the
    directory is not writable, and what to give instead; never `--out: ...`."""
    here = tmp_path / "read-only"
    here.mkdir()
    here.chmod(stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.chdir(here)
    if os.geteuid() == 0:  # root writes anywhere: the directory is refused as a user's would be
        real = os.access
        denied = here.resolve()

        def access(path: object, mode: int) -> bool:
            return not (mode & os.W_OK and Path(str(path)).resolve() == denied) and real(path, mode)

        monkeypatch.setattr(output.os, "access", access)
    with pytest.raises(AuditError) as refused:
        report.run(report.ReportJob([RUN]), terminal=True, echo=lambda *_, **__: None)
    said = str(refused.value)
    assert not said.startswith("--out")
    assert said.startswith(
        f"cannot write the full report to {here.resolve() / output.TERMINAL_REPORT}"
    )
    assert f"{here.resolve()} is not writable" in said
    assert "give --out FILE" in said
    assert not (here / output.TERMINAL_REPORT).parent.exists()


def test_a_given_out_is_still_named_as_given() -> None:
    with pytest.raises(AuditError, match=r"^--out: .* would overwrite the input"):
        output.check_output(RUN / "dispatch.csv", [RUN])


def test_sweep_help_shows_one_workspace_default() -> None:
    text = runner.invoke(app, ["sweep", "--help"], terminal_width=200).output
    (line,) = [line for line in text.splitlines() if "--workspace-mib" in line]
    assert "default: 32 MiB" in line
    assert "[default: -1" not in line and "-1" not in line
    refused = runner.invoke(app, ["sweep", "--workspace-mib", "-1"])
    assert refused.exit_code == 2 and "--workspace-mib" in refused.stderr


def test_report_of_an_atlas_says_what_it_is_and_what_reads_it() -> None:
    result = runner.invoke(app, ["report", str(ATLAS)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {ATLAS}: an atlas directory")
    assert "no such file" not in line
    assert f"{ATLAS / 'atlas.md'}" in line and "`diff`" in line
