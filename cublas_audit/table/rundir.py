"""The run directory: every file name in it, and its env.json and .jsonl I/O (the atomic writers
are cublas_audit.files).

    reports/<gpu-label>/<YYYYmmdd-HHMMSS>/
      env.json          environment, tool version, the exact command line, the probe settings
      plan.json         the cases
      plan-whole.json   a shard's (`--shard I/N`): the whole plan it is a part of
      trace.json        a trace audit's (`--torch-trace`): each problem's ops, calls and share of
                        the trace's GEMM time (table.trace_record)
      dispatch.csv      the dispatch table (docs/schema.md); a large one (COLUMNAR_ROWS rows or
                        more, where pyarrow is installed) is dispatch.parquet instead: columnar,
                        zstd, written and read in a tenth of the time (table_file finds either)
      candidates.csv    the cuBLASLt candidate audit (with --candidates), candidates.log beside it,
                        candidates.jsonl: each problem's rows as it finished (what resume keeps)
      profile.jsonl     the probe's results under ncu, one JSON line per finished case
      timing.jsonl      the probe's un-profiled results, likewise (.jsonl.gz: folded once a
                        shard finished, compact_results)
      probe.log         what the probe printed besides its progress lines
      ncu/              chunk-NNN.ncu-rep, its CSV export, its log and case list
      report.md         the rendered findings, plots/ beside it

A run directory is self-contained: it is what a user attaches to a bug ticket, and what `report`,
`diff` and `--resume` read back.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import json
import os
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from cublas_audit.errors import AuditError
from cublas_audit.files import write_file, write_text_atomic

if TYPE_CHECKING:
    import pandas as pd

ENV_FILE = "env.json"
PLAN_FILE = "plan.json"
WHOLE_PLAN_FILE = "plan-whole.json"  # a shard run's whole plan, before sharding
TRACE_FILE = "trace.json"  # a trace audit's shares of the trace's GEMM time
TABLE_FILE = "dispatch.csv"
TABLE_COLUMNAR = "dispatch.parquet"  # a large table's (table_target)
# Rows from which a run's table is columnar: a 262,144-problem map's dispatch.csv was 97 MB and
# took 40 s to write on two cores; as Parquet 4-20 MB and half a second. A smaller table stays
# CSV, to read in any editor.
COLUMNAR_ROWS = 20_000
CANDIDATES_FILE = "candidates.csv"
CANDIDATES_LOG = "candidates.log"
CANDIDATE_RESULTS = "candidates.jsonl"  # each audited problem's rows as it finished
PROFILE_RESULTS = "profile.jsonl"
TIME_RESULTS = "timing.jsonl"
PROBE_LOG = "probe.log"
RECHECKED = "rechecked.txt"  # the cases re-measured after an unsure comparison, once per run
NCU_DIR = "ncu"
REPORT_FILE = "report.md"
PLOTS_DIR = "plots"
FOLLOW_UP_DIR = "follow-up"  # a map's deep tier: a run directory inside the map's
FINDINGS_FILE = "findings.json"  # a map's findings, every one (report.md shows the largest)
FINDINGS_COMPACT = "findings.json.gz"  # the same, of a map with COMPACT_FINDINGS or more
# Findings from which findings.json is written gzipped, without indentation: a full map's 89,000
# (their messages and evidence much alike) took 71 MB as indented JSON.
COMPACT_FINDINGS = 10_000
# findings.json.gz is gzip members of this many findings each (one file, read as one by any gzip
# reader): a full map's report compresses its members in forked children at once
# (report.map_report), not its ~50 MB of text in one process after them; a fixed count, so that
# the same findings give the same bytes on any machine.
FINDINGS_MEMBER = 5_000
UNITS_REPORT = "units.md"  # a replicated run's comparison of its units, and its data:
UNITS_JSON = "units.json"


def table_file(run_dir: Path) -> Path:
    """A run directory's dispatch table: dispatch.parquet where the run wrote one, else
    dispatch.csv (whether or not it exists)."""
    columnar = Path(run_dir) / TABLE_COLUMNAR
    return columnar if columnar.is_file() else Path(run_dir) / TABLE_FILE


def has_table(run_dir: Path) -> bool:
    return table_file(run_dir).is_file()


def table_target(run_dir: Path, rows: int) -> Path:
    """Where a run's table of `rows` rows goes: columnar from COLUMNAR_ROWS rows where pyarrow
    (the `parquet` extra) is installed, else dispatch.csv."""
    columnar = rows >= COLUMNAR_ROWS and importlib.util.find_spec("pyarrow") is not None
    return Path(run_dir) / (TABLE_COLUMNAR if columnar else TABLE_FILE)


def write_run_table(frame: pd.DataFrame, run_dir: Path) -> Path:
    """A run's dispatch table into its directory (table_target), the other form's file of an
    earlier write removed: a run directory holds one table."""
    from cublas_audit.table.dispatch import write_table  # (pandas: not for the probe child)

    target = table_target(run_dir, len(frame))
    written = write_table(frame, target)
    other = Path(run_dir) / (TABLE_FILE if target.name == TABLE_COLUMNAR else TABLE_COLUMNAR)
    if other.is_file():
        other.unlink()
    return written


def findings_name(count: int) -> str:
    """The file a map's `count` findings go to."""
    return FINDINGS_COMPACT if count >= COMPACT_FINDINGS else FINDINGS_FILE


def findings_file(run_dir: Path) -> Path:
    """A map run's findings: findings.json.gz where it wrote that, else findings.json (whether or
    not it exists)."""
    compact = Path(run_dir) / FINDINGS_COMPACT
    return compact if compact.is_file() else Path(run_dir) / FINDINGS_FILE


def write_findings(run_dir: Path, records: list[Any]) -> Path:
    """Every finding of a map (JSON-ready records) into findings_name's file, the other form's
    file of an earlier report removed."""
    name = findings_name(len(records))
    if name == FINDINGS_COMPACT:
        members = [
            findings_member(records[start : start + FINDINGS_MEMBER], start, len(records))
            for start in range(0, len(records), FINDINGS_MEMBER)
        ]
        return write_compact_findings(run_dir, members)
    written = write_text_atomic(Path(run_dir) / name, json.dumps(records, indent=1) + "\n")
    other = Path(run_dir) / FINDINGS_COMPACT
    if other.is_file():
        other.unlink()
    return written


def findings_member(part: Sequence[Any], start: int, total: int) -> bytes:
    """A gzip member of findings.json.gz: the JSON-ready records of the findings from `start` on
    (FINDINGS_MEMBER of them, fewer in the last member) of `total`, as compact JSON items of the
    whole list: opening it where `start` is 0, closing it in the last member."""
    text = json.dumps(part, separators=(",", ":"))[1:-1]
    opened = "[" if start == 0 else ","
    closed = "]\n" if start + len(part) >= total else ""
    # level 1 and no name or time in the header: a few times faster than the default, and the
    # same findings give the same bytes
    return gzip.compress((opened + text + closed).encode(), 1, mtime=0)


def write_compact_findings(run_dir: Path, members: Sequence[bytes]) -> Path:
    """findings.json.gz of COMPACT_FINDINGS or more findings from their gzip members in order
    (findings_member: write_findings', or a map report's made in forks), findings.json of an
    earlier report removed."""
    written = write_file(Path(run_dir) / FINDINGS_COMPACT, b"".join(members))
    other = Path(run_dir) / FINDINGS_FILE
    if other.is_file():
        other.unlink()
    return written


def read_findings(path: Path) -> Any:
    """A findings file's JSON (gzipped or not)."""
    data = Path(path).read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (EOFError, zlib.error) as exc:  # (a truncated or corrupt file: not the findings)
            raise ValueError(f"not gzip data ({exc})") from exc
    return json.loads(data)


def read_env(run_dir: Path) -> dict[str, Any]:
    """env.json of a run directory, {} where there is none; a broken one is a one-line error."""
    path = Path(run_dir) / ENV_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AuditError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise AuditError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def write_env(run_dir: Path, data: Mapping[str, Any]) -> None:
    write_text_atomic(Path(run_dir) / ENV_FILE, json.dumps(data, indent=2, default=str) + "\n")


def add_interrupted_part(run_dir: Path, seconds: float, phases: Mapping[str, float]) -> None:
    """Keeps an interrupted part's time in env.json (`earlier`), for the finished run's times."""
    env = read_env(run_dir)
    earlier = dict(env.get("earlier") or {})
    earlier["parts"] = int(earlier.get("parts") or 0) + 1
    earlier["sweep_seconds"] = round(float(earlier.get("sweep_seconds") or 0) + seconds, 2)
    kept = dict(earlier.get("phase_seconds") or {})
    for name, spent in phases.items():
        kept[name] = round(float(kept.get(name) or 0) + spent, 2)
    earlier["phase_seconds"] = kept
    write_env(run_dir, {**env, "earlier": earlier})


def with_earlier_parts(
    env: Mapping[str, Any], seconds: float, phases: Mapping[str, float]
) -> dict[str, Any]:
    """The finished run's times in env.json: its own plus those of the parts interrupted before
    it (`--resume`), so that a map resumed twice reports all of its measuring time; `parts`
    counts the runs that made it."""
    earlier = env.get("earlier") or {}
    before = earlier.get("phase_seconds") or {}
    total = {name: round(spent + float(before.get(name) or 0), 2) for name, spent in phases.items()}
    return {
        **{key: value for key, value in env.items() if key != "earlier"},
        "sweep_seconds": round(seconds + float(earlier.get("sweep_seconds") or 0), 2),
        "phase_seconds": total,
        "parts": int(earlier.get("parts") or 0) + 1,
    }


def records(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a .jsonl file, those folded into its .gz first (compact_results); a
    torn last line (a crash mid-write) is skipped. Parsed once while the files stay as they are
    (their sizes and times): a sweep reads its probe's records several times over (what is done,
    what was in flight, the probe's versions, the table), which for a full map's 262,144 records
    cost seconds each. The records are shared between readers: read them, never change them."""
    path = Path(path)
    folded = path.with_name(path.name + ".gz")
    state = (_file_state(folded), _file_state(path))
    cached = _PARSED.get(path)
    if cached is None or cached[0] != state:
        cached = (state, list(_parsed(path, folded)))
        _PARSED[path] = cached
    yield from cached[1]


def forget_records() -> None:
    """Lets the parsed records go (at the end of a sweep: the judge reads the table instead)."""
    _PARSED.clear()


_PARSED: dict[Path, tuple[tuple[Any, Any], list[dict[str, Any]]]] = {}


def _file_state(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def _parsed(path: Path, folded: Path) -> Iterator[dict[str, Any]]:
    lines = _folded_lines(folded)
    if path.exists():
        lines += path.read_text().splitlines()
    return _objects(lines)


def _folded_lines(folded: Path) -> list[str]:
    return gzip.decompress(folded.read_bytes()).decode().splitlines() if folded.is_file() else []


def _objects(lines: list[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


FOLLOW_S = 0.25  # how often `following` reads what was appended


@contextlib.contextmanager
def following(path: Path) -> Iterator[None]:
    """`path`'s records parsed in a thread as they are appended while the block runs (a probe
    writing them: a full map's shard appends 131,072, ~2.7 s of CPU here to parse once it has
    ended), then kept for `records` as it would have read them, where the files are as the
    thread last read them (else `records` reads them again)."""
    follower = _Follower(Path(path))
    thread = threading.Thread(target=follower.run, name="records", daemon=True)
    thread.start()
    try:
        yield
    finally:
        follower.stop.set()
        thread.join()
        follower.close()
    follower.settle()


class _Follower:
    """Reads a .jsonl file from its start as it grows, parsing each complete line once."""

    def __init__(self, path: Path) -> None:
        self.path, self.stop = path, threading.Event()
        self.parsed: list[dict[str, Any]] = []
        self.pending = b""  # (the bytes after the last line break read)
        self.read_bytes, self.inode = 0, -1
        self.handle: BinaryIO | None = None
        self.failed = False

    def run(self) -> None:
        while not self.stop.wait(FOLLOW_S):
            self.read()

    def read(self) -> None:
        """What was appended since, its complete lines parsed (once a read fails: nothing)."""
        if self.failed:
            return
        try:
            if self.handle is None:
                if not self.path.exists():
                    return
                self.handle = self.path.open("rb")
                self.inode = os.fstat(self.handle.fileno()).st_ino
            data = self.pending + self.handle.read()
            self.read_bytes += len(data) - len(self.pending)
            cut = data.rfind(b"\n") + 1
            self.parsed += _objects(data[:cut].decode().splitlines())
            self.pending = data[cut:]
        except Exception:  # (records reads it all again, and meets it there)
            self.failed = True

    def close(self) -> None:
        self.read()  # (the writer has ended: the rest)
        if self.handle is not None:
            self.handle.close()

    def settle(self) -> None:
        """The records kept for `records`: the folded member's, then the file's as read."""
        now = _file_state(self.path)
        if self.failed or now is None or now[:2] != (self.inode, self.read_bytes):
            return
        folded = self.path.with_name(self.path.name + ".gz")
        state = (_file_state(folded), now)
        try:
            before = list(_objects(_folded_lines(folded)))
            tail = list(_objects(self.pending.decode().splitlines()))  # (a torn line: skipped)
        except Exception:  # (as in read)
            return
        _PARSED[self.path] = (state, [*before, *self.parsed, *tail])


def compact_results(run_dir: Path) -> None:
    """A finished run's raw streams folded: each probe results file gzipped onto its .gz (a new
    gzip member: read back by `records` before anything appended later, so --resume still
    knows every finished case), and the probe's last lists of cases (*.cases) removed. A full
    map's timing.jsonl was ~1 KB a problem (285 MB), about an eighth gzipped."""
    run_dir = Path(run_dir)
    for name in (PROFILE_RESULTS, TIME_RESULTS):
        plain = run_dir / name
        if plain.is_file():
            folded = run_dir / (name + ".gz")
            before = folded.read_bytes() if folded.is_file() else b""
            write_file(folded, before + gzip.compress(plain.read_bytes(), 6, mtime=0))
            plain.unlink()
    for listed in run_dir.glob("*.cases"):
        listed.unlink()


@contextlib.contextmanager
def folding(run_dirs: Sequence[Path]) -> Iterator[None]:
    """The run directories' raw streams folded (compact_results), each in a thread, while the
    block runs (zlib compresses, and the files are read and written, outside Python's lock); the
    block's end waits for them and raises the first error of theirs. A map folds its shards (a
    full map's ~70 MB each) so beside its merge and judging instead of before them."""
    import concurrent.futures  # (not for the probe child, which imports this module)

    with concurrent.futures.ThreadPoolExecutor(max(1, len(run_dirs)), "fold") as pool:
        folds = [pool.submit(compact_results, run_dir) for run_dir in run_dirs]
        yield
        for fold in folds:
            fold.result()


def append_record(path: Path, record: Mapping[str, Any]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")


def read_results(path: Path) -> dict[str, dict[str, Any]]:
    """case_id -> its `done` record."""
    return {r["case_id"]: r for r in records(path) if r.get("event") == "done" and "case_id" in r}


def env_value(value: Any) -> str:
    """An env.json value as one line of text (a mapping as sorted KEY=VALUE pairs)."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "none"
    return str(value)


def is_candidates_run(path: Path) -> bool:
    """A run directory of the candidate audit alone (`candidates --devices`, `--shard`, `--ray`):
    candidates.csv and no dispatch table."""
    path = Path(path)
    return path.is_dir() and not (path / TABLE_FILE).exists() and (path / CANDIDATES_FILE).exists()
