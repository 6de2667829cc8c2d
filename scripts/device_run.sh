#!/usr/bin/env bash
# One call on a GPU machine: compile every rung (parallel), GPU tests, `check`, the host-overhead
# breakdown, compute-sanitizer (memcheck, racecheck, synccheck, initcheck), the 10,000-case fuzz
# run, benchmark.
# Installs nothing: runs the working tree with the machine's own python3 (torch, triton,
# cuda.core, nvrtc wheels).  Stages: any of  compile tests check sanitize fuzz bench  (default:
# all; `ncu`, the serving kernels' profile, only when named).  SANITIZERS picks the compute-sanitizer tools (default: all four).  Set TILEATTN_COMMIT to the commit under test, spelled out on this side: the device's copy may carry a stale .git (a `$(git rev-parse HEAD)` evaluated there named an earlier commit).
# Writes at most 8 files under $OUT (default ./out): summary.json, logs.tar.gz, fuzz.json and the
# benchmark JSON/PNG; prints a short table last.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TILEATTN_CACHE_DIR=${TILEATTN_CACHE_DIR:-/tmp/tileattn-cache}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
LOGS=$OUT/logs; mkdir -p "$LOGS"  # in $OUT: a call cut short at its time limit still returns its logs
stages=${*:-compile tests check profile sanitize fuzz bench}
SANITIZERS=${SANITIZERS:-memcheck racecheck synccheck initcheck}
SANITIZE_ARGS=${SANITIZE_ARGS:-}  # "--backward" / "--serving": those cases instead of the forward's
SUITES=${SUITES:-ladder_fp32}  # which `bench --suite` to run
TEST_FILES=${TEST_FILES:-tests/}  # e.g. TEST_FILES=tests/test_fp8.py for one file
TEST_WORKERS=${TEST_WORKERS:-8}    # pytest-xdist processes sharing the GPU (the image has xdist)
BENCH_ARGS=${BENCH_ARGS:-}      # e.g. "--seqlen 8192 --headdim 64 128"
FUZZ_CASES=${FUZZ_CASES:-10000}
TESTS_TIMEOUT=${TESTS_TIMEOUT:-3600}  # seconds for the GPU tests: a hang fails the stage instead of the call
rc=0
declare -A result
has() { [[ " $stages " == *" $1 "* ]]; }
stage() {  # stage NAME LOG CMD...: run, record pass/fail and the log's last line
  local name=$1 log=$LOGS/$2; shift 2
  local t0=$SECONDS
  "$@" > "$log" 2>&1; local s=$?
  [[ $s -ne 0 ]] && rc=1
  result[$name]="$([[ $s -eq 0 ]] && echo ok || echo FAILED) ($((SECONDS - t0)) s): $(grep -v '^\s*$' "$log" | tail -1)"
  printf '%s\t%s\n' "$name" "${result[$name]}" >> "$LOGS/stages.tsv"
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
python3 -m tileattn info > "$LOGS/info.log" 2>&1; head -4 "$LOGS/info.log"
has compile && stage compile compile.log python3 -m tileattn compile --jobs 16
# faulthandler_timeout: a test still running after 120 s prints every thread's stack (it found a
# hang in the packed path at 2826a65 that a bare timeout would only have shown as a stopped count).
# TEST_WORKERS: one process left the GPU idle between small cases (76% of the 3562 tests in 470 s on
# an H100 at 70427a3); eight pytest-xdist workers ran all of them in 234 s at dc890ce.  The kernel
# cache is safe to share (atomic writes, one compile per key across processes).
# shellcheck disable=SC2086
has tests && stage tests pytest.log timeout "$TESTS_TIMEOUT" python3 -m pytest -q -m gpu -n "$TEST_WORKERS" $TEST_FILES -p no:cacheprovider \
  -o faulthandler_timeout=120
has check && stage check check.log python3 -m tileattn check
has profile && stage profile profile.log python3 scripts/profile_overhead.py
has ncu && stage ncu ncu.log bash scripts/ncu_serving.sh
if has sanitize; then
  for tool in $SANITIZERS; do
    env_extra=()
    # Without torch's caching allocator every tensor is its own allocation, so memcheck and
    # initcheck see an access past a tensor's end (inside a cached pool it would go unnoticed).
    [[ $tool == memcheck || $tool == initcheck ]] && env_extra=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    # --report-api-errors no: cuda.bindings resolves optional driver entry points through
    # cuGetProcAddress on first use, and the ones this driver lacks return INVALID_VALUE, which
    # memcheck would count as errors.  A failed call of ours raises in Python and fails the case.
    stage "sanitize-$tool" "sanitize_$tool.log" env "${env_extra[@]}" compute-sanitizer --tool "$tool" \
      --report-api-errors no --error-exitcode 1 --print-limit 20 python3 scripts/sanitize.py ${SANITIZE_ARGS:-}
  done
fi
has fuzz && stage fuzz fuzz.log python3 -m tileattn fuzz --cases "$FUZZ_CASES" --seed "${FUZZ_SEED:-20261130}" \
  --time-limit 420 --out "$OUT/fuzz.json"
if has bench; then
  # shellcheck disable=SC2086
  stage bench bench.log python3 -m tileattn bench --suite $SUITES $BENCH_ARGS --out-dir "$OUT"
fi

tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
python3 - "$OUT/summary.json" "$LOGS/stages.tsv" <<'EOF'
import json, os, sys
stages = dict(line.rstrip("\n").split("\t", 1) for line in open(sys.argv[2]) if "\t" in line)
json.dump(dict(commit=os.environ.get("TILEATTN_COMMIT"), stages=stages), open(sys.argv[1], "w"), indent=1)
EOF
echo
grep -E "^(FAILED|ERROR)" "$LOGS/pytest.log" 2>/dev/null | head -20
grep -h "FAIL" "$LOGS"/check.log "$LOGS"/sanitize_*.log 2>/dev/null | head -20
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$LOGS"/sanitize_*.log 2>/dev/null
has profile && cat "$LOGS/profile.log"
has ncu && cp "$LOGS/ncu.log" "$OUT/ncu.log" && cat "$LOGS/ncu.log"
has bench && grep -A40 "^| impl\|^| call" "$LOGS/bench.log" | head -80
echo; printf '%-20s %s\n' stage result
for k in compile tests check profile ncu sanitize-memcheck sanitize-racecheck sanitize-synccheck sanitize-initcheck fuzz bench; do
  [[ -n "${result[$k]:-}" ]] && printf '%-20s %s\n' "$k" "${result[$k]}"
done
exit $rc
