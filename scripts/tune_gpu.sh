#!/usr/bin/env bash
# `appliance tune` on the GPU with a random-weight model shape (default Llama-3-8B): tune starts
# `appliance serve --model llama-3-8b --load-format random` itself on a local port, searches the
# highest concurrency meeting the SLOs (p95 TTFT 1 s, p95 TPOT 50 ms), soaks it, stops the server.
#
#   scripts/tune_gpu.sh --prepare     here, once: the preset folder with the embedded tokenizer,
#                                      under .cache/appliance (git-ignored; copy it to the GPU
#                                      machine, which cannot download it)
#   scripts/tune_gpu.sh               on the GPU machine, .cache/appliance copied: ~6 min (H200)
#   SWEEP=adaptive_batching=off,on scripts/tune_gpu.sh    also sweep (about twice as long)
#   scripts/tune_gpu.sh --cpu-smoke   the same path on this CPU, embedded model, tiny durations
#
# Results: $OUT/tune (or ./out/tune): the profile TOML, tune.json, the main plots and
# tune-run.tar.gz with everything (all plots, the server logs, the console log).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export APPLIANCE_CACHE_DIR="${APPLIANCE_CACHE_DIR:-$PWD/.cache/appliance}"
PYTHON="${PYTHON:-python3}"
MODE="${1:-gpu}"

if [[ "$MODE" == "--prepare" ]]; then
    PYTHON="${PYTHON_PREPARE:-.venv/bin/python}"
    "$PYTHON" -c "from appliance.model_presets import preset_folder as f; print(f('${MODEL:-llama-3-8b}'))"
    du -sh "$APPLIANCE_CACHE_DIR/presets"
    exit 0
fi

if [[ "$MODE" == "--cpu-smoke" ]]; then
    [[ -x .venv/bin/python && "$PYTHON" == python3 ]] && PYTHON=.venv/bin/python
    MODEL="${MODEL:-embedded}"
    SERVE_ARGS="${SERVE_ARGS:---device cpu --max-model-len 512 --max-num-seqs 8}"
    SLO="${SLO:-ttft=3s,tpot=400ms}"
    INPUT_LEN="${INPUT_LEN:-uniform:16-48}" OUTPUT_LEN="${OUTPUT_LEN:-8}"
    START="${START:-1}" MAX_CONCURRENCY="${MAX_CONCURRENCY:-8}"
    STEP="${STEP:-3s}" SOAK="${SOAK:-4s}"
    NAME="${NAME:-smoke-embedded-cpu}"
else
    MODEL="${MODEL:-llama-3-8b}"
    SERVE_ARGS="${SERVE_ARGS:---device cuda --load-format random --max-queue 1024}"
    SLO="${SLO:-ttft=1s,tpot=50ms}"
    INPUT_LEN="${INPUT_LEN:-uniform:100-1000}" OUTPUT_LEN="${OUTPUT_LEN:-256}"
    START="${START:-16}" MAX_CONCURRENCY="${MAX_CONCURRENCY:-512}"
    STEP="${STEP:-15s}" SOAK="${SOAK:-60s}"
    NAME="${NAME:-$MODEL-random-h200}"
fi
RESULTS="${OUT:-$PWD/out}/tune"
WORK="$(mktemp -d /tmp/tune-run.XXXXXX)"
mkdir -p "$RESULTS"
sweep_flags=()
for s in ${SWEEP:-}; do sweep_flags+=(--sweep "$s"); done

echo "tune: model $MODEL, serve flags '$SERVE_ARGS', SLO $SLO, input $INPUT_LEN, output" \
     "$OUTPUT_LEN, probes $STEP from $START to $MAX_CONCURRENCY, soak $SOAK, sweep '${SWEEP:-}'"
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
start=$(date +%s)
set +e
"$PYTHON" -m appliance tune --serve "$MODEL" --serve-args "$SERVE_ARGS" "${sweep_flags[@]}" \
    --slo "$SLO" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" \
    --start "$START" --max-concurrency "$MAX_CONCURRENCY" --resolution 0.1 \
    --step-duration "$STEP" --soak "$SOAK" --name "$NAME" \
    --out "$WORK" --profile-out "$WORK/$NAME.toml" --no-progress 2>&1 | tee "$WORK/tune.log"
code=${PIPESTATUS[0]}
set -e
echo "tune: exit $code after $(( $(date +%s) - start ))s"
if [[ $code -ne 0 ]]; then
    for log in "$WORK"/servers/*.log; do
        [[ -f "$log" ]] && { echo "--- $log (last 40 lines)"; tail -n 40 "$log"; }
    done
fi
for f in "$NAME.toml" tune.json tune_search.png tune_sweep.png latency_vs_load.png \
         throughput_vs_load.png; do
    [[ -f "$WORK/$f" ]] && cp "$WORK/$f" "$RESULTS/"
done
tar -czf "$RESULTS/tune-run.tar.gz" -C "$WORK" .
echo "tune: results in $RESULTS: $(ls "$RESULTS" | tr '\n' ' ')"
[[ -f "$RESULTS/$NAME.toml" ]] && cat "$RESULTS/$NAME.toml"
rm -rf "$WORK"
exit "$code"
