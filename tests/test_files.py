"""files.write_file, the one writer of output files: a temporary file of its own and a rename over
a regular file only, never over an input (by inode), every OS failure one line."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

import pandas as pd
import pytest

from cublas_audit.errors import AuditError
from cublas_audit.files import never_replacing, write_csv_atomic, write_file, write_text_atomic
from cublas_audit.judge.audited import audit_all
from cublas_audit.report.render import write_report
from cublas_audit.table.inputs import load_inputs
from tests.conftest import FIXTURES

SMOKE_TABLE = FIXTURES / "h100-smoke" / "dispatch.csv"


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_writes_text_as_a_new_file_made_as_open_would(tmp_path: Path) -> None:
    out = tmp_path / "new" / "r.md"  # its directory made too
    assert write_text_atomic(out, "— a report\n") == out
    assert out.read_text(encoding="utf-8") == "— a report\n"
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask  # not mkstemp's 0600
    assert leftovers(out.parent) == []


def test_a_table_round_trips(tmp_path: Path) -> None:
    frame = pd.read_csv(SMOKE_TABLE, dtype=str, keep_default_na=False)
    out = write_csv_atomic(frame, tmp_path / "dispatch.csv")
    assert pd.read_csv(out, dtype=str, keep_default_na=False).equals(frame)


def test_replaces_a_regular_file_and_a_symlink_to_one(tmp_path: Path) -> None:
    old = tmp_path / "old.md"
    old.write_text("before\n")
    write_file(old, b"after\n")
    assert old.read_text() == "after\n"
    target = tmp_path / "target.md"
    target.write_text("kept\n")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    write_file(link, "written\n")  # the link is replaced, what it pointed to is not written
    assert not link.is_symlink() and link.read_text() == "written\n"
    assert target.read_text() == "kept\n"


def test_the_temporary_file_is_its_own_not_a_fixed_name(tmp_path: Path) -> None:
    """The old writer wrote through r.md.tmp: a symlink put there redirected the write."""
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    (tmp_path / "r.md.tmp").symlink_to(victim)
    write_text_atomic(tmp_path / "r.md", "report\n")
    assert victim.read_text() == "mine\n"
    assert (tmp_path / "r.md").read_text() == "report\n"


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink-to-fifo"])
def test_never_replaces_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "out.md"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    else:
        os.mkfifo(tmp_path / "fifo")
        target.symlink_to(tmp_path / "fifo")
    before = os.lstat(target)
    with pytest.raises(AuditError, match=r"out\.md"):
        write_text_atomic(target, "x\n")
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert leftovers(tmp_path) == []


def test_never_replaces_an_input_under_another_name(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_bytes(SMOKE_TABLE.read_bytes())
    (tmp_path / "hard.md").hardlink_to(table)
    (tmp_path / "soft.md").symlink_to(table)
    with never_replacing([table]):
        for name in ("t.csv", "hard.md", "soft.md"):
            with pytest.raises(AuditError, match="would overwrite an input"):
                write_text_atomic(tmp_path / name, "report\n")
    assert table.read_bytes() == SMOKE_TABLE.read_bytes()
    write_text_atomic(tmp_path / "hard.md", "report\n")  # outside: another file, replaced
    assert table.read_bytes() == SMOKE_TABLE.read_bytes()


def test_a_plot_is_refused_at_write_time_where_an_input_is(tmp_path: Path) -> None:
    """Without the CLI's check up front: the plot writer itself refuses the input's inode."""
    table = tmp_path / "t.csv"
    table.write_bytes(SMOKE_TABLE.read_bytes())
    datasets = load_inputs([table])
    (tmp_path / "plots").mkdir()
    picture = tmp_path / "plots" / "h100-NVIDIA-H100-80GB-HBM3.png"  # the smoke run's plot
    picture.hardlink_to(table)
    with never_replacing([table]), pytest.raises(AuditError, match="would overwrite an input"):
        write_report(audit_all(datasets), tmp_path / "r.md")
    assert table.read_bytes() == SMOKE_TABLE.read_bytes()
    assert not (tmp_path / "r.md").exists()


def test_a_full_disk_mid_write_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    out.write_text("before\n")

    def full(handle: BinaryIO) -> None:
        handle.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(AuditError, match=r"r\.md: no space left on device$"):
        write_file(out, full)
    assert out.read_text() == "before\n"
    assert leftovers(tmp_path) == []


def test_a_name_too_long_and_a_file_in_the_way_are_refused(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="file name too long"):
        write_text_atomic(tmp_path / ("r" * 256), "x\n")
    blocker = tmp_path / "afile"
    blocker.write_text("")
    with pytest.raises(AuditError, match="afile is not a directory"):
        write_text_atomic(blocker / "sub" / "r.md", "x\n")
    assert blocker.read_text() == ""


# ----- report's check up front: refused before anything is read or written -----------------------


def test_report_refuses_a_plot_path_holding_an_input_before_writing(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    table = tmp_path / "t.csv"
    table.write_bytes(SMOKE_TABLE.read_bytes())
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "h100-NVIDIA-H100-80GB-HBM3.png").hardlink_to(table)
    result = CliRunner().invoke(app, ["report", str(table), "--out", str(tmp_path / "r.md")])
    assert result.exit_code == 2 and "would overwrite an input" in result.stderr
    assert result.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "h100-NVIDIA-H100-80GB-HBM3.png",
        "plots",
        "t.csv",
    ]  # no report, no temporary file
    assert table.read_bytes() == SMOKE_TABLE.read_bytes()


def test_report_json_out_ignores_a_plots_file_beside_it(tmp_path: Path) -> None:
    """JSON writes no plots: a file named plots beside --out is no obstacle."""
    from typer.testing import CliRunner

    from cublas_audit.cli import app

    (tmp_path / "plots").write_text("mine\n")
    out = tmp_path / "findings.json"
    argv = ["report", str(SMOKE_TABLE), "--format", "json", "--out", str(out)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.stderr
    assert out.read_text().startswith("[")


def test_terminal_report_refused_before_the_summary_is_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file where cublas-audit-report/ goes: refused up front, not after the findings print."""
    from typer.testing import CliRunner

    from cublas_audit.cli import app
    from tests.test_output_paths_and_inputs import as_terminal

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cublas-audit-report").write_text("mine\n")
    as_terminal(monkeypatch)
    result = CliRunner().invoke(app, ["report", str(SMOKE_TABLE)])
    assert result.exit_code == 2 and "cublas-audit-report is not a directory" in result.stderr
    assert result.stdout == ""
