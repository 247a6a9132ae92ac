#!/usr/bin/env bash
# The GPU checks in parts of under ten minutes each; everything a part measures lands in $OUT
# (or ./out) and a short summary is printed last.
#
#   scripts/gpu_check.sh tests      # engine + kernel `-m gpu` tests, one timeout each (~5 min)
#   scripts/gpu_check.sh tests-kv   # INT8 KV cache kernels (real shapes, 8k contexts)  (~5 min)
#   scripts/gpu_check.sh tests-mem  # quantized load memory, planner vs measured       (~6 min)
#   scripts/gpu_check.sh bench      # bench_gpu A-D + profile --measure, 24 GiB cap    (~6 min)
#   scripts/gpu_check.sh quant      # bench_quant + bench_kv_int8                       (~5 min)
#   scripts/gpu_check.sh models     # Gemma 3/4, Qwen3-MoE, gpt-oss, Qwen3.5, MoE + GDN kernels
#   scripts/gpu_check.sh moe        # MoE kernel tests, bench_moe, decode-step kernel profiles
#   scripts/gpu_check.sh serve-moe  # serve gpt-oss-20b, qwen3-30b-a3b: 64 streams, compiles, plan
#   scripts/gpu_check.sh bench-models  # bench_gpu G3,GPTOSS,G4,G4MOE,Q35,Q35MOE rows
#   scripts/gpu_check.sh hybrid     # bench_gdn (with fla where installed), bench_state_memory
#   scripts/gpu_check.sh spec       # bench_spec_gpu: cost table, forced acceptance, 64 at once
#
# (All of `-m gpu` in one run took more than ten minutes on the H200, 2026-11-29.) The logs are
# packed into $OUT/logs.tgz at the end.
#
# Where bitsandbytes or pydantic is not installed (the H200 test machine has neither: pydantic
# needs pydantic_core, annotated_types, typing_inspection and typing_extensions>=4.16 beside
# it), put the wheels in .whl/ and this script installs them into /tmp/site first. Run from the
# repository root.
set -uo pipefail
PART="${1:-tests}"
PY="${PYTHON:-python3}"  # the H200's python3 holds torch
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
summary=()

run_part() {  # name, seconds, command...
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local code=$?
    summary+=("$(printf '%-28s rc=%-3s %4ss  %s' "$name" "$code" $((SECONDS - start)) \
        "$(grep -E 'passed|failed|error|skipped|no tests ran' "$OUT/$name.txt" | tail -n 1)")")
}

run_tests() {  # limit, test files...
    local limit=$1
    shift
    for f in "$@"; do
        run_part "pytest_$(basename "$f" .py)" "$limit" \
            "$PY" -m pytest -m gpu -q -s -rf -p no:cacheprovider "$f"
    done
}

serve_check() {  # preset: serve it with random weights, 64 streams, then /v1/stats
    local model=$1 port=8011 start=$SECONDS
    "$PY" -m appliance serve --model "$model" --load-format random --port $port \
        > "$OUT/serve_$model.txt" 2>&1 &
    local pid=$!
    "$PY" - "$port" <<'PY'
import sys, time, urllib.request
for _ in range(300):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2)
        break
    except Exception:
        time.sleep(1)
PY
    run_part "bench_64_$model" 200 "$PY" -m appliance bench --url "http://127.0.0.1:$port" \
        --concurrency 64 --num-requests 192 --input-len uniform:100-1000 --output-len 128 \
        --out "/tmp/bench_64_$model" --no-progress
    "$PY" - "$port" "$OUT/stats_$model.json" <<'PY'
import json, sys, urllib.request
stats = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v1/stats", timeout=10))
json.dump(stats, open(sys.argv[2], "w"), indent=1)
print("compiles_after_warmup:", (stats.get("engine") or {}).get("compiles_after_warmup"))
PY
    kill "$pid"
    wait "$pid"
    summary+=("$(printf '%-28s %4ss  %s' "serve_$model" $((SECONDS - start)) \
        "$(grep -c ' 200 ' "$OUT/serve_$model.txt") lines with 200 in the log")")
}

case "$PART" in
tests)
    run_tests 150 tests/test_gpu_engine.py tests/test_kernels.py tests/test_fused_kernels.py \
        tests/test_gemv.py tests/test_wq_gemv.py tests/test_rope_store.py tests/test_pdl.py \
        tests/test_dequant.py tests/test_wq_gemm.py tests/test_quant_engine_gpu.py \
        tests/test_quant_linear.py tests/test_quant_dispatch.py
    ;;
tests-kv)
    run_tests 280 tests/test_kv_int8.py tests/test_kv_int8_engine.py
    ;;
tests-mem)
    run_tests 180 tests/test_quant_load_memory.py tests/test_memory_gpu.py
    ;;
bench)
    run_part bench_gpu 330 "$PY" scripts/bench_gpu.py --out "$OUT/bench" --time-budget 300
    run_part profile_h200 90 "$PY" -m appliance profile --model llama-3-8b --measure
    APPLIANCE_MEMORY_CAP_GIB=24 run_part profile_h200_cap24 90 \
        "$PY" -m appliance profile --model llama-3-8b --measure
    ;;
quant)
    run_part bench_quant 330 "$PY" scripts/bench_quant.py --out "$OUT/quant"
    run_part bench_kv_int8 200 "$PY" -m benchmarks.kernels.bench_kv_int8 \
        --out "$OUT/bench_kv_int8.json"
    ;;
models)
    run_tests 100 tests/test_gemma3.py tests/test_gemma4.py tests/test_gemma4_moe_kernel.py \
        tests/test_qwen3_moe.py tests/test_moe_kernel.py tests/test_moe_block_kernel.py \
        tests/test_gpt_oss.py tests/test_qwen3_5.py tests/test_qwen3_5_moe.py \
        tests/test_gdn_kernels.py
    ;;
moe)
    run_tests 150 tests/test_moe_kernel.py tests/test_moe_block_kernel.py
    run_part bench_moe 150 "$PY" -m benchmarks.kernels.bench_moe --tokens 1,2,4,8 \
        --weights bf16,int8,int4 --out "$OUT/bench_moe.json"
    run_part bench_moe_sorted 100 "$PY" -m benchmarks.kernels.bench_moe --tokens 1,2,4 \
        --configs '[[16, 32, 128, 4, 3]]'  # the grouped GEMMs at the same sizes, to compare
    for preset in qwen3-30b-a3b gpt-oss-20b gemma-4-26b-a4b; do
        run_part "profile_$preset" 120 "$PY" -m benchmarks.profile_step --preset "$preset" \
            --kernels 30 --steps 20
    done
    ;;
serve-moe)
    for model in gpt-oss-20b qwen3-30b-a3b; do
        serve_check "$model"
        run_part "profile_measure_$model" 100 "$PY" -m appliance profile --model "$model" --measure
    done
    ;;
bench-models)
    run_part bench_gpu_models 560 "$PY" scripts/bench_gpu.py --out "$OUT/bench" \
        --workloads Q3MOE,GPTOSS,G4MOE,G3,G4,Q35,Q35MOE --time-budget 520
    ;;
hybrid)
    run_part bench_gdn 300 "$PY" -m benchmarks.kernels.bench_gdn --out "$OUT/bench_gdn.json"
    run_part bench_state_memory 240 "$PY" -m benchmarks.bench_state_memory \
        --out "$OUT/bench_state_memory.json"
    ;;
spec)
    run_part bench_spec_gpu 560 "$PY" -m benchmarks.bench_spec_gpu --out "$OUT/spec"
    ;;
*)
    echo "usage: scripts/gpu_check.sh tests|tests-kv|tests-mem|bench|quant|models|moe|bench-models|hybrid|spec" >&2
    exit 2
    ;;
esac
for f in "$OUT"/*.txt; do
    grep -E "FAILED|Error" "$f" | head -n 5 | sed "s|^|$(basename "$f"): |"
done
printf '%s\n' "${summary[@]}"
(cd "$OUT" && tar czf logs.tgz ./*.txt && rm -f ./*.txt)
