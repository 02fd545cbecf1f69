"""Issue 25, the newcomer's trial: each defect found, pinned by a test of the correct behaviour.

Each test was committed marked `xfail(strict=True)` and seen failing for its defect's reason; the
commit that fixed the defect removed the marker (git log -p of this file shows both). Every table
is a real recorded one (tests/fixtures/h100-smoke, the H100's smoke run; the PyTorch trace
tests/fixtures/torch_traces/ops.json.gz, recorded on the H100), copied to tmp_path and changed
only as each defect needs: a kernel renamed, a label with an escape sequence, a file put where an
output will go.
"""

from __future__ import annotations

import builtins
import errno
import gzip
import io
import json
import os
import signal
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from cublas_audit.cli import app
from tests.conftest import FIXTURES

runner = CliRunner()
SMOKE = FIXTURES / "h100-smoke"
TRACE = FIXTURES / "torch_traces" / "ops.json.gz"
# The smallest recorded trace (6 problems): what `report --torch-trace` does with --out and
# --format holds for any trace, and the ops trace's 33 problems cost a second more to judge.
SMALL_TRACE = FIXTURES / "torch_traces" / "llama.json.gz"


# ----- helpers ------------------------------------------------------------------------------------


def smoke_table() -> pd.DataFrame:
    """The H100 smoke run's dispatch table, every cell as recorded (text)."""
    return pd.read_csv(SMOKE / "dispatch.csv", dtype=str, keep_default_na=False)


def write(frame: pd.DataFrame, path: Path) -> Path:
    frame.to_csv(path, index=False)
    return path


def refused(result: Any) -> None:
    """Bad input: exit 2 and one line on stderr, no traceback, no internal error."""
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


class TooSlow(BaseException):
    """Raised by `deadline`: a BaseException, so the CLI's exit-code wrapper (which turns every
    Exception into exit 4) lets it through to the test."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fails the test instead of hanging (or eating memory) past `seconds` of wall time."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TooSlow(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def as_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """`report` as in a terminal (no --format, stdout a TTY): CliRunner's stdout is no TTY, so the
    report job is told it is one. Its rich output goes to the CliRunner's stdout."""
    import cublas_audit.jobs.report as report_job  # internal: the job the CLI hands a TTY flag to

    real = report_job.run
    monkeypatch.setattr(report_job, "run", lambda job, terminal, echo: real(job, True, echo))
    # the pictures of the Markdown written beside it are tests/test_render.py's: here, seconds
    monkeypatch.setattr("cublas_audit.report.render.plot", lambda title, rows, plots: None)


# ----- diff --fail-on kernel-change: exact on the full kernel name --------------------------------

XMMA_32 = (
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_"
    "alignc4_execute_kernel__5x_cublas"
)
XMMA_128 = XMMA_32.replace("tilesize32x32x8", "tilesize128x64x8").replace(
    "warpsize1x2x1", "warpsize2x2x1"
)  # both recorded in the smoke run


def _renamed(frame: pd.DataFrame) -> pd.DataFrame:
    """Every recorded kernel renamed the ways cuBLAS's names differ while the short name stays:
    the arch prefix (sm80_ -> sm90_), the alignment (align1 -> align4), the stage count and warp
    arrangement (stage3 -> stage4, warpsize1x2x1 -> 2x1x1); kernel_short left to be derived."""
    out = frame.copy()
    for old, new in (
        ("sm80_", "sm90_"),
        ("_align1>", "_align4>"),
        ("stage3_warpsize1x2x1", "stage4_warpsize2x1x1"),
    ):
        assert out["kernel"].str.contains(old, regex=False).any(), old
        out["kernel"] = out["kernel"].str.replace(old, new, regex=False)
    out["kernel_short"] = ""
    return out


def _stale_short(frame: pd.DataFrame) -> pd.DataFrame:
    """One case's main kernel replaced by another kernel the run recorded (tile 128x64x8), its
    kernel_short column left as recorded (xmma_32x32x8): a stale short name."""
    out = frame.copy()
    row = (out["case_id"] == "cublas.fp32.256x256x256.b1.nn") & (out["role"] == "main")
    assert out.loc[row, "kernel"].tolist() == [XMMA_32]
    out.loc[row, "kernel"] = XMMA_128
    return out


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_renamed, id="arch-align-stage-warp-renamed"),
        pytest.param(_stale_short, id="stale-kernel_short-column"),
    ],
)
def test_diff_kernel_change_is_exact_on_the_full_kernel_name(tmp_path: Path, change: Any) -> None:
    frame = smoke_table()
    base = frame.copy()
    base["kernel_short"] = "" if change is not _stale_short else base["kernel_short"]
    a = write(base, tmp_path / "a.csv")
    changed = change(frame)
    assert not changed["kernel"].equals(base["kernel"])  # the change happened
    b = write(changed, tmp_path / "b.csv")
    gate = runner.invoke(app, ["diff", str(a), str(b), "--fail-on", "kernel-change"])
    assert gate.exit_code == 1, gate.output  # today: "0 kernel changes", exit 0
    listed = runner.invoke(app, ["diff", str(a), str(b), "--format", "json"])
    assert listed.exit_code == 0, listed.stderr
    assert json.loads(listed.stdout)["kernel_changes"], "no kernel change listed"


def test_diff_of_identical_full_names_has_no_kernel_change(tmp_path: Path) -> None:
    """The counterpart (passes today, must keep passing): a run against itself is no change."""
    a = write(smoke_table(), tmp_path / "a.csv")
    gate = runner.invoke(app, ["diff", str(a), str(a), "--fail-on", "kernel-change"])
    assert gate.exit_code == 0, gate.output


# ----- inputs never overwritten -------------------------------------------------------------------


def test_report_out_hard_linked_to_the_input_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = write(smoke_table(), tmp_path / "t.csv")
    recorded = table.read_bytes()
    link = tmp_path / "r.md"
    os.link(table, link)  # another name of the same file
    monkeypatch.setattr(
        "cublas_audit.report.render.plot", lambda title, rows, plots: None
    )  # seconds
    result = runner.invoke(app, ["report", str(table), "--out", str(link)])
    assert table.read_bytes() == recorded, "the input table was overwritten by the report"
    refused(result)


def test_report_plots_never_replace_an_input(tmp_path: Path) -> None:
    table = write(smoke_table(), tmp_path / "t.csv")
    # Where the report puts this table's plot (plots/ beside --out): found by writing one.
    first = runner.invoke(app, ["report", str(table), "--out", str(tmp_path / "probe" / "r.md")])
    assert first.exit_code == 0, first.stderr
    (plot_name,) = [p.name for p in (tmp_path / "probe" / "plots").glob("*.png")]
    run = tmp_path / "run"
    (run / "plots").mkdir(parents=True)
    the_input = run / "plots" / plot_name  # a table at the plot's path (read as CSV)
    the_input.write_bytes(table.read_bytes())
    recorded = the_input.read_bytes()
    result = runner.invoke(app, ["report", str(the_input), "--out", str(run / "r.md")])
    assert the_input.read_bytes() == recorded, "the input table was replaced by a plot"
    refused(result)


@pytest.mark.parametrize("kind", ["fifo", "symlink-to-dev-null"])
def test_shapes_out_never_replaces_a_special_file(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "out.md"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/null")
    with deadline(10):  # writing into the FIFO would block: fail, do not hang
        result = runner.invoke(app, ["shapes", "--torch-trace", str(TRACE), "--out", str(target)])
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(target).st_mode), "the FIFO was replaced by a file"
    else:
        assert target.is_symlink() and os.readlink(target) == "/dev/null", "the link was replaced"
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    refused(result)


# ----- terminal escape injection ------------------------------------------------------------------

CLEAR_SCREEN = "\x1b[2J"
SET_TITLE = "\x1b]2;owned\x1b\\"


def test_terminal_report_prints_no_escape_sequence_from_a_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = smoke_table()
    frame["gpu_label"] = "h100" + SET_TITLE + CLEAR_SCREEN
    main = frame["kernel_short"] == "xmma_32x32x8"
    assert main.any()
    frame.loc[main, "kernel_short"] = "xmma_32x32x8" + CLEAR_SCREEN
    frame.loc[main, "kernel"] = frame.loc[main, "kernel"] + SET_TITLE
    table = write(frame, tmp_path / "t.csv")
    monkeypatch.chdir(tmp_path)  # the terminal path writes cublas-audit-report/report.md here
    as_terminal(monkeypatch)
    result = runner.invoke(app, ["report", str(table)])
    assert result.exit_code == 0, result.stderr
    shown = result.stdout
    assert "Findings:" in shown and "xmma_32x32x8" in shown  # the terminal path, the grid
    assert CLEAR_SCREEN not in shown, "ESC [2J (clear screen) reached the terminal"
    assert "\x1b]2;" not in shown, "ESC ]2; (set window title) reached the terminal"
    # The Markdown written beside it has none either (it already writes them out).
    written = (tmp_path / "cublas-audit-report" / "report.md").read_text()
    assert "\x1b" not in written


# ----- map counts its cases before building them --------------------------------------------------


def test_map_refuses_a_grid_over_the_case_limit_at_once(tmp_path: Path) -> None:
    # Warm up: the map command's imports, so the deadline times only the grid.
    assert runner.invoke(app, ["map"]).exit_code == 2
    grid = ["--m", "1:1000:1", "--n", "1:1000:1", "--k", "1:1000:1"]  # 10^9 problems
    with deadline(1.0):  # today: 41 s and a MemoryError; stopped after 1 s (~75 MB)
        result = runner.invoke(app, ["map", *grid, "--out", str(tmp_path / "run")])
    refused(result)
    assert "--sample" in result.stderr
    assert not (tmp_path / "run").exists()


# ----- report --torch-trace honours --out and --format json ---------------------------------------


def test_report_torch_trace_writes_to_out(tmp_path: Path) -> None:
    out = tmp_path / "trace-report.md"
    result = runner.invoke(app, ["report", "--torch-trace", str(SMALL_TRACE), "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert out.is_file(), "--out was not written"
    assert out.read_text().startswith("# cublas-audit: a PyTorch trace")
    assert "# cublas-audit: a PyTorch trace" not in result.stdout  # the path, not the report


def test_report_torch_trace_format_json_is_json() -> None:
    result = runner.invoke(app, ["report", "--torch-trace", str(SMALL_TRACE), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    try:
        data = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"--format json printed no JSON: {result.stdout[:80]!r}")
    assert isinstance(data, (dict, list)) and data


# ----- bad input is exit 2 with one line, never exit 4 --------------------------------------------


@pytest.mark.parametrize(
    "rows",
    [[[256, 256, 256, 1]], ["256x256x256"], [256]],  # the smoke run's first problem
    ids=["lists", "strings", "numbers"],
)
def test_a_json_shape_list_of_non_objects_is_bad_input(tmp_path: Path, rows: list[Any]) -> None:
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps(rows))
    result = runner.invoke(
        app, ["sweep", "--shapes-file", str(shapes), "--out", str(tmp_path / "run")]
    )
    refused(result)
    assert "shapes.json" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["report", "report-json", "shapes"])
def test_out_under_a_regular_file_is_bad_input(tmp_path: Path, command: str) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("")
    result = runner.invoke(app, _writing(command, blocker / "r.md"))
    refused(result)
    assert blocker.is_file() and blocker.read_text() == ""


@pytest.mark.parametrize("command", ["report", "report-json", "shapes"])
def test_an_over_long_out_file_name_is_bad_input(tmp_path: Path, command: str) -> None:
    result = runner.invoke(app, _writing(command, tmp_path / ("r" * 300 + ".md")))
    refused(result)


def test_a_file_where_the_terminal_report_directory_goes_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cublas-audit-report").write_text("mine\n")  # a file, where the directory goes
    as_terminal(monkeypatch)
    result = runner.invoke(app, ["report", str(SMOKE)])
    refused(result)
    assert (tmp_path / "cublas-audit-report").read_text() == "mine\n"


def test_out_whose_plots_directory_is_a_file_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "plots").write_text("mine\n")
    result = runner.invoke(app, ["report", str(SMOKE), "--out", str(tmp_path / "r.md")])
    refused(result)
    assert (tmp_path / "plots").read_text() == "mine\n"


@pytest.mark.parametrize("command", ["shapes", "report"])
def test_a_trace_nested_too_deep_is_bad_input(tmp_path: Path, command: str) -> None:
    recorded = gzip.decompress(TRACE.read_bytes()).decode()
    assert recorded.lstrip().startswith("{")
    nested = "[" * 100_000 + "]" * 100_000
    deep = tmp_path / "deep.json"  # the recorded trace with one more, deeply nested, key
    deep.write_text(recorded.replace("{", '{"nested": ' + nested + ", ", 1))
    result = runner.invoke(app, [command, "--torch-trace", str(deep)])
    refused(result)
    assert "deep.json" in result.stderr


@contextmanager
def _disk_full(monkeypatch: pytest.MonkeyPatch, under: Path) -> Iterator[None]:
    """Every file created or opened for writing under `under` fails as on a full disk (ENOSPC, as
    open(2) reports when there is no room for a new file); reading and other paths are untouched.
    Patched at io.open / builtins.open / os.open, which every Python-level writer goes through."""
    real_open, real_os_open = io.open, os.open
    root = under.resolve()

    def inside(path: Any) -> bool:
        if isinstance(path, int):
            return False
        return Path(os.path.abspath(os.fsdecode(path))).is_relative_to(root)

    def full(path: Any) -> OSError:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsdecode(path))

    def fake_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if any(flag in mode for flag in "wax+") and inside(file):
            raise full(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and inside(path):
            raise full(path)
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    with monkeypatch.context() as patch:
        patch.setattr(io, "open", fake_open)
        patch.setattr(builtins, "open", fake_open)
        patch.setattr(os, "open", fake_os_open)
        yield


@pytest.mark.parametrize("command", ["report", "report-json", "shapes"])
def test_a_full_disk_is_no_space_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    target = tmp_path / "full"
    target.mkdir()
    argv = _writing(command, target / "r.md")
    with _disk_full(monkeypatch, target):
        result = runner.invoke(app, argv)
    refused(result)
    assert "no space left" in result.stderr.lower()


def _writing(command: str, out: Path) -> list[str]:
    """A command of recorded inputs that writes its output to `out`."""
    return {
        "report": ["report", str(SMOKE), "--out", str(out)],
        "report-json": ["report", str(SMOKE), "--format", "json", "--out", str(out)],
        "shapes": ["shapes", "--torch-trace", str(TRACE), "--out", str(out)],
    }[command]
