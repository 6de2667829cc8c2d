#!/usr/bin/env bash
# Device calls for what changed and has not yet run on a GPU in its committed form (bench/NOTES.md,
# "Next session"), one call each, about 3-4 minutes on an H100.  Installs nothing.  Writes
# $OUT/experiments.log (tee'd as it goes: a call cut short at its time limit still returns it).
#     bash scripts/experiments.sh window      (the default)
#     bash scripts/experiments.sh alibi
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
which=${*:-window}
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
