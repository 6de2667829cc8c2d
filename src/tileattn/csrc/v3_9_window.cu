// v3.9: a causal sliding window (Mistral's, Gemma's) on the plain causal kernel, v3.6's walk.
//
// Why: the window ran on the variants kernels (v3.6 / v3.7 _variants), which carry softcap's and
// ALiBi's run-time branches and state beside it: with nothing on they took 0.93x (D=64) and 0.96x
// (D=128) of plain causal's rate, and a window of 4096 keys 0.88x / 0.91x at the same work (H100,
// bench/results/variants_h100.json).  Under a causal mask the window adds only a left edge:
//  * the walk's first block is the window's (j_lo from window_left, as the variants kernels'), so
//    blocks left of every row's window are skipped, not masked;
//  * the blocks that cross the left edge (at most two with Br = Bc = 128) mask the keys left of
//    each row's window (mma.cuh fragment_window_left) and take the ordinary softmax; every other
//    block is the plain kernel's, the speculative softmax included (v3_3_wgmma.cu).
// Both head dims at (128, 128), two consumer warpgroups without the ping-pong: v3.7's 192 rows
// ran 5% slower with a window (their left edge spans more keys; v3_7_three_consumers.cu).
#include "v3_3_wgmma.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1)
    v3_9_window_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*VARIANTS=*/false, /*PINGPONG=*/false,
            /*PERSISTENT=*/true, /*ALIBI=*/false, /*WINDOW=*/true>(TILEATTN_FWD_ARGS, &tmaps);
}

TILEATTN_SMEM_BYTES(v3_9_window_fwd, v3_6_smem_bytes<HEAD_DIM>(Br, Bc));

}  // namespace tileattn
