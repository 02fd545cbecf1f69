"""verify --torch's child on whatever torch the GPU machine has (run on a GPU):

    python benchmarks/torch_check_smoke.py FIX.json OUT.json

Runs run.torch_check.check on every runnable pin of FIX.json, bypassing the torch-version gate
(skip_reason), and writes each verdict. With a torch older than 2.14 TunableOp cannot run the
pins on CUDA, so every pinned side runs torch's own kernel and reads `not applied`: what this
proves is the child itself (the calls, the L2 flush kept out of the kernels, the alternating
processes with and without TunableOp, the float64 check) on a real GPU. With torch 2.14+ it is
`verify --torch`'s leg.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from cublas_audit.judge.candidates import DEFAULT_THRESHOLD
from cublas_audit.report.tunableop import tunableop_export
from cublas_audit.run import torch_check
from cublas_audit.table.fix_file import read_fix_file


def main(fix_file: Path, out: Path) -> None:
    import torch

    fixes = read_fix_file(fix_file)
    environment = tunableop_export(fixes, torch.__version__.split("+")[0]).environment(
        fix_file.parent
    )
    found = torch_check.check(fixes, fix_file, environment, DEFAULT_THRESHOLD)
    for item in found:
        print(f"{item.fix_id}: {item.status}: {item.line}", flush=True)
    result = {"torch": torch.__version__, "checked": [asdict(item) for item in found]}
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
