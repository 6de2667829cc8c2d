#!/usr/bin/env bash
# One call on a GPU machine: compile every rung (parallel), GPU tests, `check`, benchmark.
# Installs nothing: runs the working tree with the machine's own python3 (torch, triton,
# cuda.core, nvrtc wheels).  Stages: any of  compile tests check bench  (default: all).
# Set TILEATTN_COMMIT to the commit under test when the copy has no .git.
# Writes logs and results JSON/PNG under $OUT (default ./out); prints the tables last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TILEATTN_CACHE_DIR=${TILEATTN_CACHE_DIR:-/tmp/tileattn-cache}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
stages=${*:-compile tests check bench}
SUITES=${SUITES:-ladder_fp32}  # which `bench --suite` to run
rc=0
has() { [[ " $stages " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
python3 -m tileattn info
if has compile; then python3 -m tileattn compile --jobs 16 > "$OUT/compile.log" 2>&1 || rc=1; tail -3 "$OUT/compile.log"; fi
if has tests; then
  python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --junitxml="$OUT/pytest.xml" > "$OUT/pytest.log" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20; tail -1 "$OUT/pytest.log"
fi
if has check; then
  python3 -m tileattn check > "$OUT/check.log" 2>/dev/null || rc=1
  grep FAIL "$OUT/check.log" | head -20; tail -1 "$OUT/check.log"
fi
if has bench; then
  python3 -m tileattn bench --suite $SUITES --out-dir "$OUT" 2> "$OUT/bench.err" || rc=1
  tail -5 "$OUT/bench.err"
fi
exit $rc
