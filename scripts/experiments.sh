#!/usr/bin/env bash
# Device calls for the experiments that are off by default (v3_3_wgmma.cu; bench/NOTES.md,
# "Next session"): their GPU tests under each define, then each probe beside the default build of
# the same call.  Each part takes about 5 minutes on an H100: one call each.  Installs nothing.
# Writes $OUT/experiments.log (tee'd as it goes: a call cut short at its time limit still returns it).
#     bash scripts/experiments.sh alibi      (then, in a second call)      bash scripts/experiments.sh fp8
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TILEATTN_CACHE_DIR=${TILEATTN_CACHE_DIR:-/tmp/tileattn-cache}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
LOG=$OUT/experiments.log
which=${*:-alibi fp8}
log() { tee -a "$LOG"; }
pytest_gpu() { timeout "$1" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short "${@:2}" 2>&1 | tail -4 | log; }
defines_args() { for d in $1; do echo --define "$d"; done; }  # variants_probe.py: one --define a macro

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | log
if [[ " $which " == *" alibi "* ]]; then
  # scripts/alibi_spec_model.py expects most of the walk from the diagonal with the speculation in
  # every head (BOTH), some of the walk alone; the gated speculation left to right (G = 8) trails.
  BOTH="TILEATTN_ALIBI_REVERSE=1 TILEATTN_SPEC_ALIBI=1000000"
  builds=("" "$BOTH" "TILEATTN_ALIBI_REVERSE=1" "TILEATTN_SPEC_ALIBI=8")
  for d in "${builds[@]}"; do  # every build's kernels at once, 4 NVRTC jobs each
    TILEATTN_DEFINES="$d" python3 -m tileattn compile --jobs 4 \
      --versions v3.8_alibi v3.6 v3.7 v3.4 v3.6_variants v3.7_variants > /dev/null 2>&1 &
  done
  wait
  echo "== ALiBi tests, default build" | log
  pytest_gpu 120 tests/test_variants.py -k "alibi_row_max or alibi_mma"
  for d in "$BOTH" "TILEATTN_ALIBI_REVERSE=1"; do
    echo "== ALiBi tests under $d" | log
    TILEATTN_DEFINES="$d" pytest_gpu 120 tests/test_variants.py -k "alibi_row_max or alibi_mma"
  done
  for d in "${builds[@]}"; do
    echo "== variants_probe [$d]" | log
    # shellcheck disable=SC2046
    timeout 80 python3 scripts/variants_probe.py $(defines_args "$d") 2>&1 | grep -E "plain causal|alibi" | log
  done
fi
if [[ " $which " == *" fp8 "* ]]; then
  for d in "" TILEATTN_SPEC_FP8=1; do
    TILEATTN_DEFINES="$d" python3 -m tileattn compile --jobs 8 --versions v3.5 v3.5_wide v3.5_vt > /dev/null 2>&1 &
  done
  wait
  echo "== FP8 tests, default build" | log
  pytest_gpu 120 tests/test_fp8.py -k "jumps or matches"
  echo "== FP8 tests under TILEATTN_SPEC_FP8=1" | log
  TILEATTN_DEFINES=TILEATTN_SPEC_FP8=1 pytest_gpu 150 tests/test_fp8.py
  for d in "" TILEATTN_SPEC_FP8=1; do
    echo "== fp8_probe [$d]" | log
    TILEATTN_DEFINES="$d" timeout 90 python3 scripts/fp8_probe.py --no-bf16 --headdim 128 64 256 --seqlen 8192 1024 \
      2>&1 | grep "^D=" | log
  done
fi
