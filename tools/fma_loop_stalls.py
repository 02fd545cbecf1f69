"""Where an SGEMM's warp-state samples go, from an ncu source-page export: its FMA loop's size,
register-bank conflicts and instruction-fetch stalls, next to the shares of every stall reason.

    ncu --nvtx --nvtx-include ref/ --nvtx-include cublas/ --section WarpStateStats \\
        --section SourceCounters -o ref python3 benchmarks/reference_vs_cublas.py --profile 8192,8
    ncu --import ref.ncu-rep --page source --csv --print-source sass | gzip > source.csv.gz
    python -m tools.fma_loop_stalls source.csv.gz [--json FILE]

Needs pandas only (no GPU, no CUDA): it reads the export anywhere.

The FMA loop is the code run as often as most FFMAs. ncu's SASS leaves out the operand reuse
flags, so an FFMA operand counts as served by the reuse cache when the FFMA before it read the same
register in the same slot (what ptxas marks). A conflict: two or three of the registers read
from the register file in one bank (register number mod 2). Shares are of all samples of the
kernel; a line start is the first instruction of a 128-byte instruction-cache line. Dispatch
stalls per run of an FFMA (away from line starts) are split by conflict and by whether the FFMA
writes the accumulator it reads (in place) or moves it to another register.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd

REASONS = ("selected", "not_selected", "dispatch", "no_inst", "short_sb", "wait", "long_sb")
LINE_BYTES = 128


def stall_columns(frame: pd.DataFrame) -> list[str]:
    """The export's warp-state sample counts, one column per stall reason (all samples)."""
    return [c for c in frame.columns if c.startswith("stall_") and "Not Issued" not in c]


def kernels(path: Path) -> dict[str, pd.DataFrame]:
    """Each kernel's rows of the export: one per SASS instruction."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as stream:
        text = stream.read()
    found = {}
    for block in re.split(r'(?m)^"Kernel Name",', text)[1:]:
        name_line, body = block.split("\n", 1)
        name = next(csv.reader([name_line]))[0]
        frame = pd.read_csv(io.StringIO(body), thousands=",", low_memory=False)
        stalls = stall_columns(frame)
        frame[stalls] = frame[stalls].apply(pd.to_numeric, errors="coerce").fillna(0)
        frame["line_start"] = frame["Address"].map(lambda a: int(a, 16) % LINE_BYTES == 0)
        frame["sass"] = frame["Source"].str.strip()
        found[name] = frame
    return found


def bank_conflict(a: int, b: int, c: int, a_cached: bool, b_cached: bool) -> int:
    """How many of an FFMA's register-file reads share one bank (1: none)."""
    read = [r for r, cached in ((a, a_cached), (b, b_cached)) if not cached] + [c]
    banks = [r % 2 for r in read]
    return max(banks.count(0), banks.count(1))


def ffma_table(loop: pd.DataFrame) -> pd.DataFrame:
    """The loop's FFMAs: registers, in place or not, bank conflict, line start, dispatch stalls."""
    is_ffma = loop["sass"].str.startswith("FFMA")
    after_ffma = is_ffma.shift(1, fill_value=False)
    ffma = loop[is_ffma].copy()
    regs = ffma["sass"].str.findall(r"\bR(\d+)\b").map(lambda found: [int(r) for r in found])
    ffma = ffma[regs.map(len) == 4]
    regs = regs[ffma.index]
    for slot, name in enumerate("dabc"):
        ffma[name] = regs.map(lambda r, slot=slot: r[slot])
    follows = after_ffma[ffma.index]
    a_cached = follows & (ffma["a"] == ffma["a"].shift(1))
    b_cached = follows & (ffma["b"] == ffma["b"].shift(1))
    ffma["conflict"] = [
        bank_conflict(a, b, c, ac, bc)
        for a, b, c, ac, bc in zip(ffma["a"], ffma["b"], ffma["c"], a_cached, b_cached, strict=True)
    ]
    ffma["in_place"] = ffma["d"] == ffma["c"]
    return ffma


def dispatch_per_run(ffma: pd.DataFrame, runs: int) -> dict[str, dict[int, float]]:
    """Dispatch-stall samples per million runs of an FFMA, by bank conflict, for FFMAs that write
    the accumulator they read and for those that move it."""
    found = {}
    for kind, rows in (("in_place", ffma[ffma["in_place"]]), ("moved", ffma[~ffma["in_place"]])):
        means = rows.groupby("conflict")["stall_dispatch"].mean()
        if len(means):
            found[kind] = {
                int(level): round(float(mean) / runs * 1e6, 2)
                for level, mean in zip(means.index, means, strict=True)
            }
    return found


def summary(frame: pd.DataFrame) -> dict[str, Any]:
    """One kernel's figures: the share of every stall reason, and its FMA loop's."""
    stalls = stall_columns(frame)
    total = float(frame[stalls].to_numpy().sum())
    executed = pd.to_numeric(frame["Instructions Executed"], errors="coerce").fillna(0)
    runs = executed[frame["sass"].str.startswith("FFMA")].mode()[0]
    loop = frame[executed == runs]
    ffma = ffma_table(loop)
    line_starts = loop[loop["line_start"]]
    plain = ffma[~ffma["line_start"]]
    dispatch_by_conflict = plain.groupby("conflict")["stall_dispatch"].mean()
    excess_conflicts = sum(
        (dispatch_by_conflict[level] - dispatch_by_conflict.get(1, 0.0))
        * int((ffma["conflict"] == level).sum())
        for level in dispatch_by_conflict.index
        if level > 1
    )
    excess_line_starts = (
        ffma.loc[ffma["line_start"], "stall_dispatch"].mean() - plain["stall_dispatch"].mean()
    ) * int(ffma["line_start"].sum())

    loads = loop[loop["sass"].str.startswith("LDS")]
    lds_count = len(loads)
    wavefronts = float(pd.to_numeric(loads["L1 Wavefronts Shared"], errors="coerce").sum())

    def share(samples: float) -> float:
        return round(float(samples) / total, 4)

    return {
        "samples": int(total),
        "stall_share": {
            c.removeprefix("stall_"): share(frame[c].sum())
            for c in sorted(stalls, key=lambda c: -frame[c].sum())
        },
        "loop": {
            "runs_per_instruction": int(runs),
            "instructions": len(loop),
            "bytes": 16 * len(loop),
            "ffma": len(ffma),
            "ffma_in_place": int(ffma["in_place"].sum()),
            "ffma_two_reads_one_bank": int((ffma["conflict"] == 2).sum()),
            "ffma_three_reads_one_bank": int((ffma["conflict"] == 3).sum()),
            "shared_wavefronts_per_lds": round(wavefronts / (lds_count * runs), 2),
            "shared_wavefronts_per_ffma": round(wavefronts / (len(ffma) * runs), 3),
            "no_inst_at_line_starts": share(line_starts["stall_no_inst"].sum()),
            "dispatch_on_ffma": share(ffma["stall_dispatch"].sum()),
            "dispatch_on_ffma_above_conflict_free": share(excess_conflicts),
            "dispatch_on_ffma_above_other_ffma_at_line_starts": share(excess_line_starts),
            "dispatch_per_ffma_run_x1e6": dispatch_per_run(plain, runs),
            "no_inst_per_line_start_run_x1e6": round(
                float(line_starts["stall_no_inst"].mean()) / runs * 1e6, 2
            ),
        },
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="ncu --page source --csv export (.csv or .gz)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    results = {name: summary(frame) for name, frame in kernels(args.export).items()}
    for name, figures in results.items():
        loop = figures["loop"]
        print(f"{name[:60]}: {figures['samples']} samples")
        print(f"  FMA loop: {loop['instructions']} instructions ({loop['bytes']} bytes)")
        print(
            f"  FFMAs: {loop['ffma']}, in place {loop['ffma_in_place']}, two / three reads in "
            f"one bank {loop['ffma_two_reads_one_bank']} / {loop['ffma_three_reads_one_bank']}"
        )
        print(
            f"  shared-memory wavefronts: {loop['shared_wavefronts_per_lds']} per load, "
            f"{loop['shared_wavefronts_per_ffma']} per FFMA"
        )
        shares = {k: figures["stall_share"].get(k, 0.0) for k in REASONS}
        print("  shares: " + ", ".join(f"{k} {v:.3f}" for k, v in shares.items()))
        print(
            f"  no_inst at loop line starts {loop['no_inst_at_line_starts']:.3f}, dispatch on "
            f"FFMAs {loop['dispatch_on_ffma']:.3f} (above conflict-free "
            f"{loop['dispatch_on_ffma_above_conflict_free']:.3f}, at line starts "
            f"{loop['dispatch_on_ffma_above_other_ffma_at_line_starts']:.3f})"
        )
    if args.json:
        args.json.write_text(json.dumps({"export": args.export.name, "kernels": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
