"""The probe's candidate phase (probes/gemm_probe.py --phase candidates): the cuBLASLt candidate
audit of every problem (device.candidate_audit), its settings' defaults read here, where it runs
(they live beside pandas, which the other phases' start-up never imports)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from cublas_audit.planning.cases import Case
from cublas_audit.run.probe_process import DONE_LINE, NO_CUPTI_ENV, START_LINE
from cublas_audit.table.rundir import CANDIDATE_RESULTS


def candidates(cases: list[Case], run_dir: Path, args: argparse.Namespace) -> int:
    """The cuBLASLt candidate audit of every problem, into run_dir/candidates.csv; the problems
    candidates.jsonl already holds (an interrupted audit's) are not measured again."""
    from cublas_audit.device.candidate_audit import run_candidates
    from cublas_audit.judge.candidates import DEFAULT_THRESHOLD, ScreenJudge
    from cublas_audit.table.candidates_table import DEFAULT_LIMIT, DEFAULT_MIN_REPS

    def given(value: Any, default: Any) -> Any:
        return default if value is None else value

    run_candidates(
        cases,
        run_dir,
        given(args.limit, DEFAULT_LIMIT),
        screen=ScreenJudge(given(args.threshold, DEFAULT_THRESHOLD)),
        min_reps=given(args.candidate_min_reps, DEFAULT_MIN_REPS),
        workspace_bytes=args.workspace_bytes,
        gpu_label=args.gpu_label,
        progress=lambda line: print(line, flush=True),
        journal=run_dir / CANDIDATE_RESULTS,
        started=lambda case_id: print(START_LINE + case_id, flush=True),
        finished=lambda case_id: print(DONE_LINE + case_id, flush=True),
        trace=not os.environ.get(NO_CUPTI_ENV),  # --observer events: event times alone
        cold=not args.warm,
    )
    return 0
