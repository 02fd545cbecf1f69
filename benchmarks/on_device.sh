#!/usr/bin/env bash
# The GPU half of the figures and bundled audits, in one unattended run on a lent GPU:
#
#   benchmarks/on_device.sh OUT STEP...
#
# Steps run in the order given, each bounded by its own time limit and by DEADLINE_S (default
# 560 s) for the whole script, each logged to OUT/<step>.log; one failing step never stops the
# next, since a partial run is still worth bringing back:
#   audit       the default batched sweep with its cuBLASLt candidate audit, and the single FP32
#               sweep, into reports/<label>/<timestamp>-{batched,single}/
#   speed       benchmarks/sweep_speed.py sweep: `python -m cublas_audit sweep --batched` timed
#               twice, on an empty CuPy kernel cache (a fresh machine's first sweep), then warm
#               (the cold run kept as reports/<label>/<ts>-batched, unless the audit step made it)
#   candidates  benchmarks/candidates_speed.py, three runs (the first kept in that run directory)
#   reference   benchmarks/reference_vs_cublas.py --tune (tuned table to OUT/strategy.json)
#   gpu-tests   pytest -m gpu
#   observer    benchmarks/observer_overhead.py: CUPTI kernel times against CUDA events at >= 1 ms
#   map-speed   the map engine's speed: the FP32 grid 64..1024 step 64, then 10,000 problems of
#               64..4096 step 64 in FP32 (twice) and BF16, into $MAPS (default /tmp/maps), then
#               benchmarks/map_speed.py over them (with the rerun's agreement)
#   map-reruns  four pairs of 10,000-problem maps run back to back (FP32 seeds 0 and 2, BF16 seeds
#               1 and 2) into tests/fixtures/h100-map-reruns/<mode>-s<seed>/{a,b}.parquet and
#               {a,b}.env.json, what the noise model's map kinds are fitted on (benchmarks/noise.py)
#   atlas-fp32, atlas-bf16  the full 3-D map of that mode (64..4096 step 64, 262,144 problems)
#               with --follow-up into $MAPS/atlas-<mode> (resumed when run again), then
#               `cublas-audit atlas` of it into reports/<label>/atlas/<mode>/
#   map-full    the FP32 map 64..8192 step 64, single and batch 8, with --follow-up, into
#               reports/<label>/maps/<timestamp>-fp32-64-8192/
#   fleet       benchmarks/fleet_scaling.py: the BF16 full grid as a quarter shard alone (--shard 1/4),
#               on every GPU (--devices all) and through a local Ray (--ray auto, where Ray imports),
#               end to end, into benchmarks/results/fleet_scaling_<label>x<GPUs>.json (maps in $MAPS)
#   multi-map   a 2,000-case FP32 map on one GPU, then the same on every GPU (--devices all), into
#               benchmarks/results/map-2k-<label>-{1gpu,all}/, then benchmarks/multi_gpu_speed.py
#   replicate   the default batched sweep on every GPU (--devices all --replicate) into
#               reports/<label>/checks/<timestamp>-batched-replicate/
#   multi-candidates  the default batched candidate audit sharded over every GPU (`candidates
#               --batched --devices all`) into reports/<label>/checks/<timestamp>-candidates-devices/
#   roofline    the PyTorch traces of tests/fixtures/torch_traces/record.py into OUT/traces/, then
#               `sweep --torch-trace llama.json.gz --candidates` into reports/<label>/traces/ and the
#               bf16 K=140 batch 8 problem packed (ldb 140: 280-byte rows), with ldb 144, and K padded
#               to 144
#               (benchmarks/shapes/k140.csv) into reports/<label>/checks/<timestamp>-k140/
#   fix-loop    random FP32 and BF16 maps with --follow-up, `fix` of both (TunableOp rows for torch
#               2.14.1) into reports/<label>/fixes/<timestamp>/, `verify` there, and
#               examples/pinned_torch.py (a torch GEMM before and after through PinnedGemm)
#   verify      `verify $VERIFY_FIX` (a fresh machine re-measuring a fix file), verify-fresh.json
#   pinned      benchmarks/pinned_overhead.py: PinnedGemm's host time per call, eager and graph
#   k140-layouts the bf16 K=140 batch 8 problem beside its padded and nt companions
#   truth       the ViT-B/16 and decode traces (record.py vit decode, into $TRACES, default
#               /tmp/traces, and OUT), framework_agreement.py, benchmarks/shapes/cold_warm.csv
#               swept --warm and cold into reports/<label>/checks/<timestamp>-{warm,cold}
#   truth-audits both traces swept with --candidates into reports/<label>/traces/<timestamp>-*
#               (the traces copied to tests/fixtures/torch_traces/)
#   torch-smoke verify --torch's child on this machine's torch (benchmarks/torch_check_smoke.py)
#   rerun-gate  two cold default batched sweeps back to back, diffed with --fail-on regression
#   torch214    PyTorch 2.14.1 from parts in $TP, then fix + verify --torch of the committed maps
#   odd-sizes   bf16 2073^3, both APIs, with candidates, into reports/<label>/checks/<ts>-2073
#   no-ncu      `sweep --batched` with no ncu to be found (a user and mount namespace hides
#               /usr/local/cuda/bin and /opt/nvidia/nsight-compute; PATH without them)
# What the steps made is packed into OUT/results.tgz after each step (without the binary .ncu-rep
# reports), paths relative to the repository, ready to unpack over a checkout.
#
# The project need not be installed: the checkout goes on PYTHONPATH, and the subpackages that
# pyproject.toml maps in at build time (cublas_audit.probes, .reference_kernels, .bundled from
# probes/, reference_kernels/, reports/) come from an editable install made offline (no index, no
# build isolation: the setuptools already there builds it; the log is OUT/install.log), or, where
# that cannot be made (no pip, no wheel support, an externally managed Python), from links inside
# the checkout's cublas_audit/ that stand in for the mapping and are removed at exit.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath "$1")
shift
mkdir -p "$out" benchmarks/results
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# As the steps import it: from the repository root, the checkout's package first.
mapped='import cublas_audit.probes, cublas_audit.reference_kernels, cublas_audit.bundled'
importable() { $py -c "$mapped" 2>/dev/null; }

if ! importable; then
    echo "== install: pip install -e . (offline)"
    $py -m pip install -q --no-deps --no-build-isolation --no-index --disable-pip-version-check \
        -e . >"$out/install.log" 2>&1
fi
if ! importable; then
    echo "== install: not possible here (OUT/install.log); linking the mapped folders instead"
    links=()
    for pair in probes:probes reference_kernels:reference_kernels bundled:reports; do
        link=cublas_audit/${pair%%:*}
        [[ -e $link || -L $link ]] || { ln -s "../${pair#*:}" "$link" && links+=("$link"); }
    done
    ((${#links[@]})) && trap 'rm -f "${links[@]}"' EXIT
fi
if ! importable; then
    echo "cublas_audit and its probes/, reference_kernels/, reports/ cannot be imported:" >&2
    $py -c "$mapped"
    exit 1
fi

label=$($py -c 'from cublas_audit.observe import environment as e; from cublas_audit.planning import grid as c
print(c.label_from_gpu_name(e.collect().gpu_name or ""))')
stamp=$(date -u +%Y%m%d-%H%M%S)
run="reports/$label/$stamp"
deadline=${DEADLINE_S:-560}
made=()

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    local left=$((deadline - SECONDS - 20))
    ((limit > left)) && limit=$left
    if ((limit < 30)); then
        echo "== $name: skipped, the deadline is near"
        return
    fi
    local start=$SECONDS
    echo "== $name (limit ${limit}s)"
    timeout --signal=INT --kill-after=15 "$limit" "$@" >"$out/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - start)) s"
    tail -n 25 "$out/$name.log"
}

pack() {
    local existing=()
    for path in "${made[@]}"; do [[ -e $path ]] && existing+=("$path"); done
    ((${#existing[@]})) && tar czf "$out/results.tgz" --exclude='*.ncu-rep' "${existing[@]}"
}

for what in "$@"; do
    case $what in
    audit)
        step audit-batched 300 $py -m cublas_audit sweep --batched --candidates \
            --gpu-label "$label" --out "$run-batched"
        step audit-single 200 $py -m cublas_audit sweep --single --gpu-label "$label" \
            --out "$run-single"
        made+=("$run-batched" "$run-single")
        ;;
    speed)
        # The cold sweep is kept as the batched audit unless an audit step already made one. Two
        # sweeps (114 s cold, 109 s warm on the H100); the JSON is written after each run.
        keep=()
        [[ -e $run-batched ]] || keep=(--keep "$run-batched")
        step speed 300 $py benchmarks/sweep_speed.py sweep "${keep[@]}" \
            --json "benchmarks/results/sweep_speed_$label.json"
        made+=("$run-batched" "benchmarks/results/sweep_speed_$label.json")
        ;;
    candidates)
        step candidates 300 $py benchmarks/candidates_speed.py --runs 3 --keep "$run-batched" \
            --json "benchmarks/results/candidates_speed_$label.json"
        made+=("$run-batched" "benchmarks/results/candidates_speed_$label.json")
        ;;
    reference)
        step reference 330 $py benchmarks/reference_vs_cublas.py --tune ${TUNE_ARGS:-} \
            --skip-check --table-out "$out/strategy.json" \
            --json "benchmarks/results/reference_$label.json"
        made+=("benchmarks/results/reference_$label.json")
        ;;
    roofline)
        step traces 150 $py tests/fixtures/torch_traces/record.py "$out/traces"
        step llama-sweep 300 $py -m cublas_audit sweep --torch-trace "$out/traces/llama.json.gz" \
            --candidates --gpu-label "$label" --out "reports/$label/traces/$stamp-llama"
        step k140 200 $py -m cublas_audit sweep --shapes-file benchmarks/shapes/k140.csv \
            --candidates --gpu-label "$label" --out "reports/$label/checks/$stamp-k140"
        made+=("reports/$label/traces/$stamp-llama" "reports/$label/checks/$stamp-k140")
        ;;
    fix-loop)
        # From finding to fix (issue 31): random FP32 and BF16 maps with follow-up, their fixes
        # in one file (TunableOp rows for torch 2.14.1), verified here, and a torch program's
        # GEMM before and after through PinnedGemm.
        fixes="reports/$label/fixes/$stamp"
        for mode in fp32 bf16; do
            axis=64:4096:64
            [[ $mode == bf16 ]] && axis=64:8192:64
            step "map-$mode" 240 $py -m cublas_audit map --m $axis --n $axis --k $axis \
                --sample ${FIX_SAMPLE:-3000} --seed 1 --modes $mode --follow-up \
                --follow-up-limit 12 --gpu-label "$label" --out "reports/$label/maps/$stamp-$mode-random"
            made+=("reports/$label/maps/$stamp-$mode-random")
        done
        step fix 60 $py -m cublas_audit fix "reports/$label/maps/$stamp-fp32-random" \
            "reports/$label/maps/$stamp-bf16-random" --torch-version 2.14.1 --out "$fixes"
        step verify 240 $py -m cublas_audit verify "$fixes/fix.json"
        step pinned-torch 150 $py examples/pinned_torch.py "$fixes/fix.json" \
            --out "$fixes/pinned_torch.json"
        made+=("$fixes")
        ;;
    verify)
        # A fix file re-measured on a fresh machine: VERIFY_FIX names it.
        step verify-fresh 300 $py -m cublas_audit verify "$VERIFY_FIX" \
            --out "$(dirname "$VERIFY_FIX")/verify-fresh.json"
        made+=("$(dirname "$VERIFY_FIX")")
        ;;
    pinned)
        step pinned-overhead 200 $py benchmarks/pinned_overhead.py --out
        made+=("benchmarks/results/pinned_overhead_$label.json")
        ;;
    k140-layouts)
        step k140-layouts 200 $py -m cublas_audit sweep --batched --sizes "" \
            --shapes 1024x1024x140 --batches 8 --modes bf16 --api cublas,cublasLt \
            --gpu-label "$label" --out "reports/$label/checks/$stamp-k140-layouts"
        made+=("reports/$label/checks/$stamp-k140-layouts")
        ;;
    gpu-tests)
        step gpu-tests 240 $py -m pytest -q -m gpu -n 0 -p no:cacheprovider ${GPU_TESTS:-}
        ;;
    observer)
        step observer 150 $py benchmarks/observer_overhead.py \
            --json "benchmarks/results/observer_overhead_$label.json"
        made+=("benchmarks/results/observer_overhead_$label.json")
        ;;
    map-speed)
        # Issue 28: the map engine's rate on small problems (the whole 64..1024 step 64 grid),
        # on 10,000 problems of the full 64..4096 grid in FP32 (twice: the rerun must agree)
        # and BF16; the maps stay in $MAPS (default /tmp/maps), the figures are committed.
        maps=${MAPS:-/tmp/maps}
        small=64:1024:64
        axis=64:4096:64
        step map-small 120 $py -m cublas_audit map --m $small --n $small --k $small \
            --gpu-label "$label" --out "$maps/small-fp32"
        for name in fp32 fp32-rerun bf16; do
            step "map-10k-$name" 120 $py -m cublas_audit map --m $axis --n $axis --k $axis \
                --sample 10000 --modes "${name%-rerun}" --gpu-label "$label" --out "$maps/10k-$name"
        done
        $py benchmarks/map_speed.py "$maps/small-fp32" "$maps/10k-fp32" "$maps/10k-bf16" \
            --rerun "$maps/10k-fp32" "$maps/10k-fp32-rerun" \
            --json "benchmarks/results/map_speed_$label.json" >"$out/map-speed-summary.log" 2>&1
        tail -n 12 "$out/map-speed-summary.log"
        made+=("benchmarks/results/map_speed_$label.json")
        ;;
    map-reruns)
        maps=${MAPS:-/tmp/maps}
        axis=64:4096:64
        for pair in fp32:0 fp32:2 bf16:1 bf16:2; do
            mode=${pair%:*} seed=${pair#*:}
            keep="tests/fixtures/$label-map-reruns/$mode-s$seed"
            mkdir -p "$keep"
            for side in a b; do
                run="$maps/rerun-$mode-s$seed-$side"
                step "map-rerun-$mode-s$seed-$side" 90 $py -m cublas_audit map --m $axis \
                    --n $axis --k $axis --sample 10000 --seed "$seed" --modes "$mode" \
                    --gpu-label "$label" --out "$run"
                [[ -e $run/dispatch.csv ]] && $py -c 'import sys; from pathlib import Path
from cublas_audit.table.validation import read_table
read_table(Path(sys.argv[1])).to_parquet(sys.argv[2], compression="zstd")' \
                    "$run" "$keep/$side.parquet" && cp "$run/env.json" "$keep/$side.env.json"
            done
            made+=("$keep")
        done
        ;;
    atlas-fp32 | atlas-bf16)
        # Issue 28: the full 3-D map of one mode (M, N, K in 64..4096 step 64) with follow-up,
        # resumed where $MAPS/atlas-<mode> holds a started one (a call's limit can stop it:
        # run the step again on the same machine), then its atlas into reports/<label>/atlas
        mode=${what#atlas-}
        axis=64:4096:64
        dir="${MAPS:-/tmp/maps}/atlas-$mode"
        if [[ -e $dir/plan.json ]]; then
            step "$what" 540 $py -m cublas_audit map --resume "$dir" --follow-up
        else
            step "$what" 540 $py -m cublas_audit map --m $axis --n $axis --k $axis --modes "$mode" \
                --follow-up --gpu-label "$label" --out "$dir"
        fi
        if [[ -e $dir/dispatch.csv ]]; then
            step "$what-atlas" 90 $py -m cublas_audit atlas "$dir" --out "reports/$label/atlas"
            made+=("reports/$label/atlas/$mode")
        fi
        ;;
    map-full)
        full="reports/$label/maps/$stamp-fp32-64-8192"
        step map-full 480 $py -m cublas_audit map --sizes 64:8192:64 --batches 1,8 \
            --follow-up --gpu-label "$label" --out "$full"
        made+=("$full")
        ;;
    fleet)
        # Issue 40 items 4-5: each leg one `map` process timed from start to exit; the figures
        # are committed, the maps stay in $MAPS/fleet
        gpus=$(nvidia-smi -L | wc -l)
        legs=quarter,all
        $py -c 'import ray' 2>/dev/null && legs+=,ray
        step fleet 540 $py benchmarks/fleet_scaling.py \
            "benchmarks/results/fleet_scaling_${label}x$gpus.json" --legs "$legs" \
            --maps "${MAPS:-/tmp/maps}/fleet" --gpu-label "$label"
        made+=("benchmarks/results/fleet_scaling_${label}x$gpus.json")
        ;;
    multi-map)
        axis=64:4096:64
        two="benchmarks/results/map-2k-$label"
        for where in 1gpu all; do
            devices=()
            [[ $where == all ]] && devices=(--devices all)
            step "map-2k-$where" 240 $py -m cublas_audit map --m $axis --n $axis --k $axis \
                --sample 2000 --seed 1 --gpu-label "$label" --out "$two-$where" "${devices[@]}"
            made+=("$two-$where")
        done
        $py benchmarks/multi_gpu_speed.py "$two-1gpu" "$two-all" \
            --json "benchmarks/results/multi_gpu_speed_$label.json" >"$out/multi.log" 2>&1
        tail -n 5 "$out/multi.log"
        made+=("benchmarks/results/multi_gpu_speed_$label.json")
        ;;
    replicate)
        step replicate 420 $py -m cublas_audit sweep --batched --devices all --replicate \
            --gpu-label "$label" --out "reports/$label/checks/$stamp-batched-replicate"
        made+=("reports/$label/checks/$stamp-batched-replicate")
        ;;
    multi-candidates)
        where="reports/$label/checks/$stamp-candidates-devices"
        step multi-candidates 300 $py -m cublas_audit candidates --batched --devices all \
            --out "$where"
        made+=("$where")
        ;;
    no-ncu)
        hidden=$(mktemp -d)
        bare_path=$(tr ':' '\n' <<<"$PATH" | grep -v -e cuda -e nsight | paste -sd:)
        step no-ncu 300 unshare --user --map-root-user --mount sh -c \
            "for d in /usr/local/cuda/bin /opt/nvidia/nsight-compute; do \
                [ -d \$d ] && mount --bind $hidden \$d; done; \
             PATH=$bare_path; command -v ncu; \
             $py -m cublas_audit sweep --batched --gpu-label $label --out $run-batched-no-ncu"
        made+=("$run-batched-no-ncu")
        ;;
    truth)
        # Claims as the user's program sees them (issue 37): the ViT-B/16 and decode traces (kept
        # in $TRACES for truth-audits, which may run in the next call of a warm machine), the
        # tool's default against PyTorch's own call (benchmarks/framework_agreement.py), and the
        # same problems timed warm and cold.
        traces=${TRACES:-/tmp/traces}
        step truth-traces 120 $py tests/fixtures/torch_traces/record.py "$traces" vit decode
        cp "$traces"/*.json.gz "$out/" 2>/dev/null
        step agreement 240 $py benchmarks/framework_agreement.py "$out/agreement.json"
        for temp in warm cold; do
            flag=()
            [[ $temp == warm ]] && flag=(--warm)
            step "pair-$temp" 150 $py -m cublas_audit sweep --shapes-file \
                benchmarks/shapes/cold_warm.csv --observer cupti --no-reference "${flag[@]}" \
                --gpu-label "$label" --out "reports/$label/checks/$stamp-$temp"
            made+=("reports/$label/checks/$stamp-$temp")
        done
        ;;
    truth-audits)
        # Both traces swept with their candidates, cold (the default), as `sweep --torch-trace`.
        traces=${TRACES:-/tmp/traces}
        [[ -e $traces/vit.json.gz ]] ||
            step truth-traces 120 $py tests/fixtures/torch_traces/record.py "$traces" vit decode
        mkdir -p tests/fixtures/torch_traces && cp "$traces"/{vit,decode}.json.gz tests/fixtures/torch_traces/
        made+=(tests/fixtures/torch_traces/vit.json.gz tests/fixtures/torch_traces/decode.json.gz)
        for trace in vit decode; do
            step "trace-$trace" 240 $py -m cublas_audit sweep --torch-trace \
                "$traces/$trace.json.gz" --candidates --observer cupti --gpu-label "$label" \
                --out "reports/$label/traces/$stamp-$trace"
            made+=("reports/$label/traces/$stamp-$trace")
        done
        ;;
    odd-sizes)
        # One cause, many observations (issue 37): bf16 2073^3 (no dimension a multiple of 8, so
        # no Hopper kernel is eligible) on both APIs, with the cause-removed companions.
        where="reports/$label/checks/$stamp-2073"
        step odd-sizes 200 $py -m cublas_audit sweep --shapes 2073x2073x2073 --batches 1 \
            --single --modes bf16 --api cublas,cublasLt --candidates --gpu-label "$label" \
            --out "$where"
        made+=("$where")
        ;;
    torch-smoke)
        # verify --torch's child on this machine's torch (benchmarks/torch_check_smoke.py)
        step torch-smoke 200 $py benchmarks/torch_check_smoke.py \
            "${SMOKE_FIX:-reports/$label/fixes/20261125-092546/fix.json}" "$out/torch_smoke.json"
        ;;
    rerun-gate)
        # The same GPU rerun must never fail the gate, cold timing included: two default batched
        # sweeps back to back, then diff --fail-on regression (exit 1 would be a false verdict).
        for side in a b; do
            step "rerun-$side" 240 $py -m cublas_audit sweep --batched --gpu-label "$label" \
                --out "reports/$label/checks/$stamp-rerun-$side"
            made+=("reports/$label/checks/$stamp-rerun-$side")
        done
        step rerun-diff 60 $py -m cublas_audit diff "reports/$label/checks/$stamp-rerun-a" \
            "reports/$label/checks/$stamp-rerun-b" --fail-on regression
        ;;
    torch214)
        # PyTorch 2.14.1 carried in parts into $TP (default /tmp/tp: part-*, torch214.sha256;
        # ../shared/DESIGN.md has the recipe), made importable in /tmp/t214 beside the image's
        # CUDA libraries, then the committed maps' pins through `fix --torch-version 2.14.1` and
        # `verify --torch`: every pin run by an unchanged torch.mm through the TunableOp file.
        tp=${TP:-/tmp/tp}
        if [[ ! -e /tmp/t214/torch/__init__.py ]]; then
            (cd "$tp" && cat part-* >/tmp/torch214.tar.xz && cd /tmp && sha256sum -c "$tp/torch214.sha256") ||
                { echo "torch214: the parts do not reassemble"; continue; }
            mkdir -p /tmp/t214 && xz -dc /tmp/torch214.tar.xz | tar xf - -C /tmp/t214 && rm /tmp/torch214.tar.xz
            mkdir -p /tmp/t214/torch/bin && printf '#!/bin/sh\nexit 0\n' >/tmp/t214/torch/bin/torch_shm_manager
            chmod +x /tmp/t214/torch/bin/torch_shm_manager
            image=$($py -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
            ln -sfn "$image/nvidia" /tmp/t214/nvidia
            nccl=$(find "$image/nvidia/" -name 'libnccl.so*' | head -1)
            missing=$(comm -23 <(nm -D --undefined-only /tmp/t214/torch/lib/libtorch_cuda.so | grep -o 'nccl[A-Za-z0-9_]*' | sort -u) \
                <(nm -D --defined-only "$nccl" | grep -o 'nccl[A-Za-z0-9_]*' | sort -u))
            for sym in $missing; do echo "int $sym(void) { return 5; }"; done >/tmp/ncclstub.c
            gcc -shared -fPIC -o /tmp/ncclstub.so /tmp/ncclstub.c && echo "nccl stub: $(echo $missing | wc -w) symbols"
        fi
        libs=$(ls -d /tmp/t214/nvidia/*/lib | paste -sd:)
        export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LD_PRELOAD=/tmp/ncclstub.so
        export PYTHONPATH="/tmp/t214:$PYTHONPATH"
        $py -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
        fixes="$out/fixes214"
        step fix214 120 $py -m cublas_audit fix "reports/$label/maps/20261125-092546-fp32-random" \
            "reports/$label/maps/20261125-092546-bf16-random" --torch-version 2.14.1 --out "$fixes"
        step verify214 400 $py -m cublas_audit verify "$fixes/fix.json" --torch
        cp "$fixes/verify.json" "$out/verify214.json" 2>/dev/null
        cp "$fixes/fix.json" "$out/fix214.json" 2>/dev/null
        ;;
    *) echo "unknown step $what" ;;
    esac
    pack
done
ls -la "$out"
