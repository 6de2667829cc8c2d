#!/usr/bin/env bash
# The forward's experiments behind defines, each against the default build in the same call (one
# H200): first their GPU tests (each runs its switched build in a process of its own), then
# scripts/fwd_probe.py / variants_probe.py once per build, so that every ratio to cuDNN is read
# beside the default's of the same call (bench/NOTES.md "Next session").  ~8 minutes in all.
# (WG_SKIP, CARRY, Q_PREFETCH and PINGPONG_128 were measured by this script and removed: bench/
# NOTES.md "The warpgroups' own blocks".)
#
#   bash scripts/experiments.sh [tests] [q_stages] [tail_split] [variants]   (default: all)
#
#   TILEATTN_Q_STAGES=2   Q in two buffers (the persistent rungs at D=64)
#   TILEATTN_TAIL_SPLIT   the persistent walk's last round split by K/V blocks (non-causal)
#   TILEATTN_WINDOW_ORDER the variants kernel's order under a causal left window
#   TILEATTN_SOFTCAP_RAW_MAX  the softcap's row max on the raw scores (variants kernels)
#
# Installs nothing; prints each probe's lines as they come.  Set TILEATTN_COMMIT as for
# device_run.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TILEATTN_CACHE_DIR=${TILEATTN_CACHE_DIR:-/tmp/tileattn-cache}
parts=${*:-tests q_stages tail_split variants}
has() { [[ " $parts " == *" $1 "* ]]; }
rc=0
run() {  # run DEFINES CMD...: one process under the defines ("" = the default build)
  echo "== ${1:-default}: ${*:2}"
  TILEATTN_DEFINES="$1" "${@:2}" || rc=1
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
if has tests; then
  run "" python3 -m pytest -q -m gpu tests/test_gpu.py -k "tail_split" -p no:cacheprovider
  run "TILEATTN_Q_STAGES=2" python3 -m pytest -q -m gpu tests/test_gpu.py -k "v3.6 or v3.7" -p no:cacheprovider
  run "TILEATTN_WINDOW_ORDER=1" python3 -m pytest -q -m gpu tests/test_variants.py -k window -p no:cacheprovider
  run "TILEATTN_SOFTCAP_RAW_MAX=1" python3 -m pytest -q -m gpu tests/test_variants.py -k softcap -p no:cacheprovider
fi
if has q_stages; then
  for defines in "" "TILEATTN_Q_STAGES=2"; do
    run "$defines" python3 scripts/fwd_probe.py --headdim 64 --seqlen 1024 4096 --version v3.6
    run "$defines" python3 scripts/fwd_probe.py --headdim 64 --seqlen 1024 4096 --version v3.7
  done
fi
if has tail_split; then
  for defines in "" "TILEATTN_TAIL_SPLIT=8" "" "TILEATTN_TAIL_SPLIT=8"; do  # twice each, interleaved
    run "$defines" python3 scripts/fwd_probe.py --headdim 128 256 --seqlen 1024 4096 8192
  done
fi
if has variants; then
  run "" python3 scripts/variants_probe.py
  run "" python3 scripts/variants_probe.py --define TILEATTN_WINDOW_ORDER=1
  run "" python3 scripts/variants_probe.py --define TILEATTN_SOFTCAP_RAW_MAX=1
fi
exit $rc
