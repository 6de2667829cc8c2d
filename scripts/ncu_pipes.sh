#!/usr/bin/env bash
# Where the time goes: pipe utilisation (tensor pipe: hmma for mma.sync, gmma for wgmma; the gmma
# name read n/a on the H200's ncu at 6ce5495) and issue-stall breakdown of one launch per kernel
# (bf16, B=4 H=16 N=8192), for the given "kernel-regex version[:dtype] D [B H N [causal]]" specs
# (default: v3.1, v3.2 and PyTorch's FA2 at D=64 and 128).  Usage:
#   bash scripts/ncu_pipes.sh ["v3_2_fwd v3.2 64" "v3_7_fwd v3.7 64 4 16 8192 causal" "v2_3 v2.3:float32 128" ...]
# (scripts/profile_one.py's versions, PyTorch's backends included: sdpa_flash, sdpa_cudnn, sdpa_efficient.)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
M=sm__cycles_active.avg,sm__cycles_elapsed.avg,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__warps_active.avg.per_cycle_active,launch__registers_per_thread,gpu__time_duration.sum
for r in math_pipe_throttle wait short_scoreboard mio_throttle barrier long_scoreboard not_selected dispatch_stall lg_throttle no_instruction branch_resolving; do
  M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
specs=("$@")
[ ${#specs[@]} -eq 0 ] && specs=("v3_1_fwd v3.1 64" "v3_2_fwd v3.2 64" "flash_fwd sdpa_flash 64" "v3_1_fwd v3.1 128" "v3_2_fwd v3.2 128" "flash_fwd sdpa_flash 128")
for spec in "${specs[@]}"; do set -- $spec
  ver=${2%%:*}; dtype=bfloat16; [[ $2 == *:* ]] && dtype=${2#*:}
  echo "=== $ver $dtype D=$3 ${*:4}"
  ncu --clock-control none -k regex:$1 --launch-skip 1 -c 1 --metrics $M python3 scripts/profile_one.py $ver $dtype "${@:3}" 2>&1 \
    | grep -E "^\s+(sm|smsp|launch|gpu)__" | awk '{print $1, $NF}' | sed 's/smsp__average_warps_issue_//; s/_per_issue_active.ratio//'
done
