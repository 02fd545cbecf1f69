"""The same map on one GPU and on several: wall time and the ratio (CPU, over two run directories).

    python benchmarks/multi_gpu_speed.py ONE_GPU_RUN ALL_GPUS_RUN [--json FILE]

Target (issue 19, on nvidia-h200-x2): a 2,000-case map on 2 GPUs in at most 0.55x the time on
one (on 4 GPUs, at most 0.3x). Each run's env.json says how long its cases took from the first
probe start to the merged table (`sweep_seconds`); a sharded run also says each shard's. Both
maps must hold the same cases, and every case must have dispatched the same kernel on both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cublas_audit.judge.rules import prepare  # noqa: E402
from cublas_audit.table import rundir  # noqa: E402
from cublas_audit.table.inputs import load_run  # noqa: E402

TARGETS = {2: 0.55, 4: 0.30}


def compare(one: Path, many: Path) -> dict[str, Any]:
    env_one, env_many = rundir.read_env(one), rundir.read_env(many)
    a = prepare(load_run(one).frame).set_index("case_id")
    b = prepare(load_run(many).frame).set_index("case_id")
    if set(a.index) != set(b.index):
        raise SystemExit("the two maps do not hold the same cases")
    same = (a["kernel_short"] == b.loc[a.index, "kernel_short"]).sum()
    gpus = len(env_many.get("devices") or [])
    ratio = float(env_many["sweep_seconds"]) / float(env_one["sweep_seconds"])
    return {
        "gpu": env_one.get("gpu_name"),
        "cases": len(a),
        "gpus": gpus,
        "one_gpu_seconds": env_one["sweep_seconds"],
        "all_gpus_seconds": env_many["sweep_seconds"],
        "shard_seconds": env_many.get("shard_seconds"),
        "ratio": round(ratio, 3),
        "target": TARGETS.get(gpus),
        "same_kernel": int(same),
        "command_one": env_one.get("command"),
        "command_all": env_many.get("command"),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("one", type=Path)
    parser.add_argument("many", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    found = compare(args.one, args.many)
    print(json.dumps(found, indent=2))
    print(
        f"{found['cases']} cases: {found['one_gpu_seconds']} s on 1 GPU, "
        f"{found['all_gpus_seconds']} s on {found['gpus']}: {found['ratio']}x "
        f"(target <= {found['target']}); same kernel on {found['same_kernel']} cases"
    )
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
