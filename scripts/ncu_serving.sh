#!/usr/bin/env bash
# Where the serving kernels' time goes (scripts/profile_serving.py's launches): DRAM throughput,
# occupancy, pipe utilisation and the issue-stall breakdown of each kernel launched.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,sm__warps_active.avg.per_cycle_active,sm__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
for r in math_pipe_throttle wait short_scoreboard mio_throttle barrier long_scoreboard not_selected dispatch_stall lg_throttle no_instruction branch_resolving membar sleeping; do
  M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
ncu --profile-from-start off --clock-control none --metrics "$M" python3 scripts/profile_serving.py 2>&1 \
  | grep -E "^===|^  [a-zA-Z_].*\(|^\s+(sm|smsp|launch|gpu|dram|lts)__" \
  | awk '/^===/ {print; next} /\(/ {print "--", $1; next} {print $1, $NF}' \
  | sed 's/smsp__average_warps_issue_//; s/_per_issue_active.ratio//'
