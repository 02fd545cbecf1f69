"""Run-to-run noise of un-profiled timing: the default batched grid rerun back to back, the noise
model fitted on part of the reruns, and the diff gate judged on the rest.

    python benchmarks/noise.py collect --runs 10 --out reports/h100/noise/START   (on a GPU)
    python benchmarks/noise.py fit RUN... --model cublas_audit/data/noise_h100.json
    python benchmarks/noise.py evaluate --fitted RUN... --held-out RUN... [--other-start RUN...]
        [--planted A B] [--json benchmarks/results/noise_h100.json]
    python benchmarks/noise.py fit RUN... --map-pair tests/fixtures/h100-map-reruns/fp32-s0 ...
    python benchmarks/noise.py evaluate-maps tests/fixtures/h100-map-reruns/{fp32,bf16}-s{0,1,2} \
        --json benchmarks/results/noise_maps_h100.json   (the four folders there)

`evaluate` diffs every pair of runs with the shipped model (the fitting runs, the held-out runs,
reruns from another start of the machine, and each group against the others) and counts
regressions and improvements: on reruns of the same GPU every one is a false verdict. It then
plants real changes the gate must catch: each held-out run with one case of 2 ms or more made
15 % slower, and the `--planted` pair (two runs that really differ, e.g.
CUBLAS_WORKSPACE_CONFIG=:0:0 against the default). Every figure is printed and written to --json.

Each rerun is a complete `cublas-audit sweep --batched --no-profile --no-reference` into its own
run directory (OUT/run-NN), so every table the noise model is fitted and judged on is an ordinary
dispatch table with its distributions and clocks, and any pair of them can be diffed. Prints one
line per run (wall time, cases) and a JSON summary last; the run directories are the data.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cublas_audit.judge import diff, noise
from cublas_audit.planning.grid import DEFAULT_BATCHES, DEFAULT_SIZES, build_plan
from cublas_audit.run.sweep_options import SweepOptions
from cublas_audit.run.sweep_setup import sweep
from cublas_audit.table.inputs import Dataset, load_one_gpu
from cublas_audit.table.rundir import read_env


def collect(
    runs: int, out: Path, label: str, reference: bool = False, first: int = 0
) -> list[dict[str, object]]:
    cases = build_plan(
        sizes=DEFAULT_SIZES,
        batches=DEFAULT_BATCHES,
        modes=["fp32"],
        apis=["cublas", "cublasLt"],
        single=False,
        batched=True,
    )
    done = []
    for index in range(first, first + runs):
        run_dir = out / f"run-{index:02d}"
        command = ["cublas-audit", "sweep", "--batched", "--no-profile"]
        command.append("--reference" if reference else "--no-reference")
        options = SweepOptions(
            cases=cases,
            gpu_label=label,
            out=run_dir,
            profile=False,
            reference=reference,
            command=[*command, "--gpu-label", label, "--out", str(run_dir)],
        )
        start = time.perf_counter()
        result = sweep(options)
        seconds = time.perf_counter() - start
        done.append({"run": str(run_dir), "seconds": round(seconds, 2), "cases": len(result.frame)})
        print(f"run {index}: {len(result.frame)} rows in {seconds:.1f} s", flush=True)
    return done


def map_pair(folder: Path) -> tuple[Dataset, Dataset]:
    """Two runs of one map, as tests/fixtures/h100-map-reruns keeps them: a.parquet and
    b.parquet (the run directories' tables) beside a.env.json and b.env.json."""
    return tuple(  # type: ignore[return-value]
        dataclasses.replace(
            load_one_gpu(folder / f"{run}.parquet"),
            env=json.loads((folder / f"{run}.env.json").read_text()),
        )
        for run in "ab"
    )


def fit(runs: Sequence[Path], model_path: Path, map_pairs: Sequence[Path] = ()) -> noise.NoiseModel:
    env = read_env(runs[0])
    source = {
        "device": env.get("gpu_name"),
        "date": str(env.get("started", ""))[:10],
        "driver": env.get("driver_version"),
        "cublas": env.get("cublas_version"),
        "runs": [str(run) for run in runs],
        "map_reruns": [str(pair) for pair in map_pairs],
        "how": "benchmarks/noise.py fit: envelope of |log(t_i/t_j)| over every pair, by time per "
        f"launch, x{noise.MARGIN}, at least {noise.MIN_FLOOR}, for each kind the runs measure "
        "(call time; kernel time per pipe; the reference/call ratio timed interleaved); the map "
        "kinds over each map's pair of reruns, one floor below "
        f"{noise.POOLED_BELOW_MS:g} ms",
    }
    maps = [[side.frame for side in map_pair(pair)] for pair in map_pairs]
    model = noise.fit([load_one_gpu(run).frame for run in runs], source, maps=maps)
    model_path.write_text(json.dumps(model.to_json(), indent=1) + "\n")
    return model


def evaluate_maps(pairs: Sequence[Path]) -> dict[str, Any]:
    """Each map rerun pair diffed both ways (every verdict is false): under the shipped model,
    under its sweep floors alone (no map kinds), and under a model whose map kinds were fitted
    on the other pairs only (leave one out); then a real change planted in one run of each pair
    (its shortest problem of at least 0.1 ms made 2x slower, as a dispatch cliff of the atlas
    is) must be caught, and each time scale's smallest slowdown caught is listed."""
    shipped = noise.load()
    sweep_only = dataclasses.replace(
        shipped, others={k: v for k, v in shipped.others.items() if k not in noise.MAP_KINDS}
    )
    loaded = {pair: map_pair(pair) for pair in pairs}
    result: dict[str, Any] = {"model": shipped.to_json(), "pairs": {}}
    for pair, (a, b) in loaded.items():
        others = [[side.frame for side in loaded[p]] for p in pairs if p != pair]
        left_out = dataclasses.replace(
            sweep_only, others={**sweep_only.others, **noise.map_floors(others)}
        )
        judged = [diff.compare(a, b, model=shipped), diff.compare(b, a, model=shipped)]
        found: dict[str, Any] = {
            "shipped": count_verdicts(judged),
            **{name: false_verdicts([a, b], [(0, 1), (1, 0)], model)
               for name, model in (("sweep_floors", sweep_only), ("left_out", left_out))},
        }  # fmt: skip
        copy, case = slowed(b, 2.0, 0.1)
        caught = diff.compare(b, copy, model=shipped).rows("regression")
        found["findings"] = {
            name: _finding_agreement(a, b, model)
            for name, model in (("map_floors", shipped.for_maps()), ("sweep_floors", sweep_only))
        }
        named = [_case_id(row) for row in caught.to_dict("records")]
        found["planted_2x"] = {"case": case, "caught": named == [case]}
        found["detectable"] = [
            {key: _finite(value) for key, value in row.items()}
            for row in judged[0].floors.to_dict("records")
        ]
        result["pairs"][str(pair)] = found
    return result


def _finding_agreement(a: Dataset, b: Dataset, model: noise.NoiseModel) -> dict[str, Any]:
    """The map rules' findings of two reruns judged with `model`, those beyond its floors
    (`medium`; `info` ones are within the map's rerun noise): how many each run has, how many
    only one of them has (a finding a rerun does not repeat), and the largest effect of those."""
    from cublas_audit.judge.map_audit import MAP_RULES
    from cublas_audit.judge.rules import audit

    found = [audit(side.frame, rules=MAP_RULES, model=model) for side in (a, b)]
    runs = [
        {(f.rule, tuple(f.sizes)): f.effect for f in side if f.severity == "medium"}
        for side in found
    ]
    alone = set(runs[0]) ^ set(runs[1])
    largest = max((runs[0].get(key) or runs[1][key] for key in alone), default=0.0)
    return {"a": len(runs[0]), "b": len(runs[1]), "in_one_run_only": len(alone),
            "largest_effect_in_one_only": round(largest, 3)}  # fmt: skip


def false_verdicts(
    runs: Sequence[Dataset],
    pairs: Sequence[tuple[int, int]],
    model: noise.NoiseModel | None = None,
) -> dict[str, Any]:
    """Regressions and improvements over the given pairs of reruns (all of them false), judged
    with `model` (else the shipped one)."""
    return count_verdicts([diff.compare(runs[i], runs[j], model=model) for i, j in pairs])


def count_verdicts(results: Sequence[diff.Diff]) -> dict[str, Any]:
    """The verdicts of diffs between reruns, counted."""
    counts = {"pairs": len(results), "regressions": 0, "improvements": 0, "unsure": 0, "cases": 0}
    counts.update(host_slower=0, regressions_on_call_time=0, pairs_with_kernel_times=0)
    for result in results:
        counts["regressions"] += len(result.rows("regression"))
        counts["improvements"] += len(result.rows("improvement"))
        counts["unsure"] += len(result.rows("unsure"))
        counts["host_slower"] += len(result.host_slower)
        on_call = result.rows("regression")["kernel_verdict"].isna()
        counts["regressions_on_call_time"] += int(on_call.sum())
        counts["pairs_with_kernel_times"] += int(result.matched["kernel_verdict"].notna().any())
        counts["cases"] += len(result.matched)
    return counts


def slowed(run: Dataset, factor: float, at_least_ms: float) -> tuple[Dataset, str]:
    """A copy of the run with its shortest case of at least `at_least_ms` made slower."""
    frame = run.frame.copy()
    timed = frame[frame["time_ms"] >= at_least_ms]  # unprofiled runs: one row per case
    case = str(timed.sort_values("time_ms")["case_id"].iloc[0])
    rows = frame["case_id"] == case
    # The median and its quartiles, min and max: the whole distribution moves.
    columns = [
        c for c in frame.columns if c.startswith(("time_", "kernel_time_")) and c.endswith("_ms")
    ]
    frame.loc[rows, columns] = frame.loc[rows, columns].astype(float) * factor
    return Dataset(run.title, run.gpu_label, run.path, frame, run.env, None), case


def evaluate(
    fitted: Sequence[Path],
    held_out: Sequence[Path],
    other_start: Sequence[Path],
    planted: Sequence[Path],
) -> dict[str, Any]:
    runs = [load_one_gpu(run) for run in [*fitted, *held_out, *other_start]]
    first = range(len(fitted))
    rest = range(len(fitted), len(fitted) + len(held_out))
    other = range(len(fitted) + len(held_out), len(runs))
    result: dict[str, Any] = {
        "model": noise.load().to_json(),
        "fitted_pairs": false_verdicts(runs, list(itertools.combinations(first, 2))),
        "held_out_pairs": false_verdicts(runs, list(itertools.combinations(rest, 2))),
        "fitted_against_held_out": false_verdicts(runs, list(itertools.product(first, rest))),
        "other_start_pairs": false_verdicts(runs, list(itertools.combinations(other, 2))),
        "fitted_against_other_start": false_verdicts(
            runs, list(itertools.product([*first, *rest], other))
        ),
    }
    caught = []
    for index in rest:
        copy, case = slowed(runs[index], 1.15, 2.0)
        judged = diff.compare(runs[index], copy)
        found = judged.rows("regression")
        caught.append(
            {"run": str(runs[index].path), "case": case, "regressions": len(found),
             "caught": [_case_id(r) for r in found.to_dict("records")] == [case]}
        )  # fmt: skip
    result["slowed_15pct_at_2ms"] = caught
    # the last two held-out runs: the same grid, with kernel times where the runs traced them
    scales = diff.compare(runs[rest[-2]], runs[rest[-1]]).floors
    result["detectable"] = [
        {key: _finite(value) for key, value in row.items()} for row in scales.to_dict("records")
    ]
    if planted:
        a, b = (load_one_gpu(path) for path in planted)
        judged = diff.compare(a, b)
        result["planted"] = {
            "a": str(planted[0]),
            "b": str(planted[1]),
            "regressions": _cases(judged.rows("regression")),
            "kernel_changes": _cases(judged.kernel_changes),
            "unsure": len(judged.rows("unsure")),
        }
    return result


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: a number that is neither stays, else None."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _case_id(row: dict[Any, Any]) -> str:
    """A diff row's case id (the diff matches on the key, not on case_id)."""
    api = "loop" if row["routine"] == "sgemm-loop" else row["api"]
    return f"{api}.{row['mode']}.{row['m']}x{row['n']}x{row['k']}.b{row['batch']}.nn"


def _cases(rows: pd.DataFrame) -> list[str]:
    return [
        f"{r['api']} {r['routine']} {r['shape']} b{r['batch']}: {r.get('evidence', '')}"
        for r in rows.to_dict("records")
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gather = commands.add_parser("collect", help="rerun the default batched grid on this GPU")
    gather.add_argument("--runs", type=int, default=10)
    gather.add_argument("--out", type=Path, required=True)
    gather.add_argument("--gpu-label", default="h100")
    gather.add_argument("--reference", action="store_true", help="time the reference kernel too")
    gather.add_argument("--first", type=int, default=0, help="number of the first run directory")
    fitting = commands.add_parser("fit", help="fit the noise model on reruns")
    fitting.add_argument("runs", type=Path, nargs="+")
    fitting.add_argument("--model", type=Path, default=noise.DEFAULT_MODEL)
    fitting.add_argument("--map-pair", type=Path, action="append", default=[],
                         help="a folder of two map reruns (a/b.parquet, a/b.env.json)")  # fmt: skip
    judging_maps = commands.add_parser("evaluate-maps", help="judge the gate on map reruns")
    judging_maps.add_argument("pairs", type=Path, nargs="+")
    judging_maps.add_argument("--json", type=Path)
    judging = commands.add_parser("evaluate", help="judge the gate on fitted and held-out reruns")
    judging.add_argument("--fitted", type=Path, nargs="+", required=True)
    judging.add_argument("--held-out", type=Path, nargs="+", required=True)
    judging.add_argument("--other-start", type=Path, nargs="*", default=[])
    judging.add_argument("--planted", type=Path, nargs=2, default=[])
    judging.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.command == "collect":
        print(
            json.dumps(
                {"runs": collect(args.runs, args.out, args.gpu_label, args.reference, args.first)},
                indent=1,
            )
        )
    elif args.command == "fit":
        print(json.dumps(fit(args.runs, args.model, args.map_pair).to_json(), indent=1))
    elif args.command == "evaluate-maps":
        text = json.dumps(evaluate_maps(args.pairs), indent=1, default=str)
        print(text)
        if args.json:
            args.json.write_text(text + "\n")
    else:
        result = evaluate(args.fitted, args.held_out, args.other_start, args.planted)
        text = json.dumps(result, indent=1, default=str)
        print(text)
        if args.json:
            args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
