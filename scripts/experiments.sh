#!/usr/bin/env bash
# Device calls for what changed and has not yet run on a GPU in its committed form (bench/NOTES.md,
# "Next session"), one call each, about 3-4 minutes on an H100.  Installs nothing.  Writes
# $OUT/experiments.log (tee'd as it goes: a call cut short at its time limit still returns it).
#     bash scripts/experiments.sh mma         (the default: issue 13's H200 suite, ~4.5 min a dtype)
#     bash scripts/experiments.sh ncu         (issue 13's short rows by ncu beside cuDNN / bf16, ~1 min)
#     bash scripts/experiments.sh suites      (then: hf, fp8, the hf model's shapes; ~8 min)
#     bash scripts/experiments.sh window
#     bash scripts/experiments.sh alibi
# mma: `bench --suite mma --versions v3.6 v3.7 --steady --dtype D` for each D in $DTYPES (default
# bfloat16 float16), merged into $OUT/mma.json: bench/results/mma_steady.json on an H200, then
# `python -m tileattn report`.  Issue 13 asks for this suite on an H200; the last H200 run
# (291f0e7) predates the speculative softmax and the sorted tail.
# suites: `bench --suite hf --steady` (with the model's time without attention), `--suite fp8
# --steady`, then scripts/fwd_probe.py at the hf model's attention (D=64, H=32:8, causal, B*N =
# 16384) under the default dispatch, v3.6 and v3.7: at B=8 N=2048 the hf suite timed tileattn's
# attention at 0.94x cuDNN's (H100, 997296a), where the dispatch takes v3.7 (SHORT_CAUSAL_ROWS).
# window: v3.9 (a causal window alone on plain causal's kernel and tiles, built in the forty-first
# session, the default since the forty-second: 160 passed, racecheck 0 hazards, 1-2% faster than the
# variants kernel at 997296a): its float64 GPU tests, the racecheck of a sample, then
# scripts/variants_probe.py's rows ("window 4096" beside "window 4096, variants kernel" and plain causal).
# alibi: v3.8 after its walk from the diagonal and the speculative softmax became the default
# (b971373; measured at e641033: 300 tests passed, racecheck 0 hazards, variants suite 0.98x /
# 0.97x of plain causal): its GPU tests, racecheck and memcheck of its sample, the probe.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TILEATTN_CACHE_DIR=${TILEATTN_CACHE_DIR:-/tmp/tileattn-cache}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
LOG=$OUT/experiments.log
which=${*:-mma}
log() { tee -a "$LOG"; }
pytest_gpu() { timeout "$1" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short "${@:2}" 2>&1 | tail -4 | log; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | log
if [[ " $which " == *" window "* ]]; then
  python3 -m tileattn compile --jobs 16 --versions v3.9_window v3.6 v3.7 v3.6_variants v3.7_variants > /dev/null 2>&1
  echo "== v3.9's GPU tests" | log
  pytest_gpu 400 tests/test_variants.py -k "window_plain_kernel"  # 350 s on an H100 (997296a)
  echo "== compute-sanitizer racecheck, v3.9's sample" | log
  timeout 120 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 1 --print-limit 20 \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_variants.py \
    -k "window_plain_kernel and 300-457 and 127" 2>&1 | tail -3 | log
  echo "== variants_probe" | log
  timeout 120 python3 scripts/variants_probe.py 2>&1 | grep -E "plain causal|window|none on|softcap |alibi" | log
fi
if [[ " $which " == *" alibi "* ]]; then
  python3 -m tileattn compile --jobs 12 --versions v3.8_alibi v3.6 v3.7 v3.4 v3.6_variants v3.7_variants > /dev/null 2>&1
  echo "== v3.8's GPU tests" | log
  pytest_gpu 200 tests/test_variants.py -k alibi
  for tool in racecheck memcheck; do
    echo "== compute-sanitizer $tool, v3.8's sample" | log
    # memcheck without torch's caching allocator: an access past a tensor's end is then outside
    # any allocation (scripts/device_run.sh does the same); --report-api-errors no: its reason.
    env_extra=(); [[ $tool == memcheck ]] && env_extra=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    env "${env_extra[@]}" timeout 120 compute-sanitizer --tool "$tool" \
      --report-api-errors no --error-exitcode 1 --print-limit 20 \
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_variants.py \
      -k "(alibi_mma_matches and 300-457) or (alibi_row_max and 128)" 2>&1 | tail -3 | log
  done
  echo "== variants_probe" | log
  timeout 90 python3 scripts/variants_probe.py 2>&1 | grep -E "plain causal|alibi|window|none on|softcap " | log
fi
if [[ " $which " == *" mma "* ]]; then
  python3 -m tileattn compile --jobs 16 --versions v3.6 v3.7 > /dev/null 2>&1
  # One dtype at a time into $OUT/<dtype>/mma.json (about 4.5 min each on an H200), so a call cut
  # short at its limit still returns the first; both present -> merged into $OUT/mma.json.
  for dtype in ${DTYPES:-bfloat16 float16}; do
    echo "== mma suite, $dtype" | log
    timeout "${MMA_TIMEOUT:-285}" python3 -m tileattn bench --suite mma --versions v3.6 v3.7 --steady --dtype "$dtype" \
      --out-dir "$OUT/$dtype" 2>&1 | grep -E "^\| $dtype \|.*(1024|8192) \|" | log
  done
  [[ -f $OUT/bfloat16/mma.json && -f $OUT/float16/mma.json ]] && python3 scripts/merge_results.py "$OUT/mma.json" \
    "$OUT/bfloat16/mma.json" "$OUT/float16/mma.json" > /dev/null && echo "== merged: $OUT/mma.json" | log
fi
if [[ " $which " == *" ncu "* ]]; then
  # issue 13's short rows at the head: D=64 N=1024 causal (v3.6) and D=64 N=8192 causal (v3.7, the
  # hf model's attention) beside cuDNN, FP8 D=128 (v3.5) beside bf16 (v3.6); one launch each
  python3 -m tileattn compile --jobs 16 --versions v3.5 v3.6 v3.7 > /dev/null 2>&1
  timeout 400 bash scripts/ncu_pipes.sh "v3_6_fwd v3.6 64 32 16 1024 causal" "cudnn sdpa_cudnn 64 32 16 1024 causal" \
    "v3_7_fwd v3.7 64 4 16 8192 causal" "cudnn sdpa_cudnn 64 4 16 8192 causal" \
    "v3_5_fwd v3.5 128" "v3_6_fwd v3.6 128" > "$OUT/ncu_shortfalls.txt" 2>&1
  grep -E "===|time_duration|inst_executed.sum|issue_active|hmma|xu" "$OUT/ncu_shortfalls.txt" | log
fi
if [[ " $which " == *" suites "* ]]; then
  for suite in hf fp8; do
    echo "== $suite suite" | log
    timeout 220 python3 -m tileattn bench --suite $suite --steady --out-dir "$OUT" 2>&1 | tail -14 | log
  done
  for version in default v3.6 v3.7; do
    echo "== fwd_probe, the hf model's attention, $version" | log
    timeout 90 python3 scripts/fwd_probe.py --headdim 64 --seqlen 1024 2048 4096 8192 --heads 32 --kv-heads 8 \
      --tokens 16384 --causal 1 $([[ $version != default ]] && echo --version $version) 2>&1 | grep "D=" | log
  done
fi
