// v3.6: v3.3 (v3.4 at D=64) as a persistent kernel: one CTA per SM walks a tile schedule, and
// the next tile's Q and first K/V blocks load while the current tile finishes (sm_90a).
//
// Why (v3.3's limits at short sequences, measured on an H200, bf16, docs/ladder.md): at N=1024
// a CTA of v3.3 (one per SM: 160 KB of shared memory at D=128) runs 8 K/V blocks, and each new
// CTA starts empty: Q and the first K/V block are loaded while both consumer warpgroups wait,
// and the last P V and the O stores run while the copy engine idles.  v3.3 runs 455 TFLOP/s
// there against 570 at N=8192 (0.83x cuDNN against 0.99x).  Here:
//  * The grid is min(tiles, SMs) CTAs, each taking tiles blockIdx.x, + gridDim.x, ... of
//    persistent_tile's order (common.cuh): a head's Q blocks side by side (its K and V shared in
//    L2); under the causal mask two at a time, a long and a short Q block of one head, so that
//    every CTA's pairs are equal work.
//  * The producer's K/V pipeline runs on across tiles (stages and phases count the CTA's K/V
//    blocks, not the tile's), and Q's buffer has an empty barrier: the consumers release it after
//    their last S = Q K^T of a tile, so the next tile's Q and its first two K/V blocks arrive
//    while they do the last P V, the epilogue and its O stores.
//  * Everything else is v3.3's body (PERSISTENT), with v3.4's ping-pong at D=64.
// Measured on an H200 (bf16 and fp16, H=16, B*N = 32768, `bench --suite mma` at 2826a65, against
// the same run): 1.01-1.21x the faster of v3.3 and v3.4 at every shape, 1.12-1.21x at N=1024;
// 0.81-1.00x cuDNN.  The default at D = 128 and 256, and at D = 64 for causal calls under 2048
// query rows (v3.7 takes the rest of D = 64).  At D = 256, (Br, Bc) = (128, 64) as v3.3's: 192 KB of
// Q and K/V stages and 34 KB of O's stage, one CTA per SM either way.
#include "v3_3_wgmma.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1) v3_6_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, false, /*PINGPONG=*/HEAD_DIM == 64, /*PERSISTENT=*/true>(TILEATTN_FWD_ARGS,
                                                                                                &tmaps);
}

// v3.3's Q, 2 stages of K and V, 9 mbarriers (KVBarriers<2>), Q's empty barrier and O's stage (v3_6_smem_bytes).
TILEATTN_SMEM_BYTES(v3_6_fwd, v3_6_smem_bytes<HEAD_DIM>(Br, Bc));

// The same walk with the score variants read from the room fields (sliding window, softcap, ALiBi:
// versions.V3_6_VARIANTS, flash_attn_func's dense calls with them on Hopper), without the
// ping-pong at D=64 (v3.3's variants kernel measured 7% slower with it, bench/NOTES.md).  Under a
// window the pairs of persistent_tile's causal order are no longer equal work: the early Q
// blocks see fewer than the window's keys, the rest see the same number.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1)
    v3_6_variants_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*VARIANTS=*/true, /*PINGPONG=*/false, /*PERSISTENT=*/true>(TILEATTN_FWD_ARGS,
                                                                                                    &tmaps);
}

TILEATTN_SMEM_BYTES(v3_6_variants_fwd, v3_6_smem_bytes<HEAD_DIM>(Br, Bc));

}  // namespace tileattn
