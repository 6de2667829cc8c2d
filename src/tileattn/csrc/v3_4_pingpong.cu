// v3.4: v3.3 with the two consumer warpgroups taking turns at the tensor core (ping-pong), sm_90a.
//
// Why (v3.3's limit at D=64): a consumer warpgroup's softmax of a 64 x 128 block (64 MUFU.EX2 a
// thread, its row max and sums) costs about as long as its two MMAs at D=64, and in v3.3 the two
// warpgroups run in step, so both softmaxes and both pairs of MMAs contend at the same moments
// while the intra-warpgroup overlap hides only part of one under the other.  Here warpgroup w
// issues S_{j+1} = Q K_{j+1}^T and P_j V_j only on its turn (named barrier 3 + w) and hands the
// turn over right after issuing, so one warpgroup's softmax runs while the other's MMAs occupy
// the tensor core (FlashAttention-3's inter-warpgroup pingpong schedule; Shah et al. 2024, sec.
// 3.1).  Everything else (TMA producer, two stages, setmaxnreg, the intra-warpgroup overlap, the
// fragment layouts) is v3.3's body (v3_3_wgmma.cu), compiled with PINGPONG: the output is
// bitwise v3.3's.
//
// Measured on an H200 (bf16 B=2 H=16 N=8192, the same body before v3.3's D=64 wait pinning, 6fbf194):
// D=64 causal 1.116x, non-causal 1.059x of v3.3; D=128 1.014x / 1.008x.  The registry runs it
// at D=64 (versions.py).
#include "v3_3_wgmma.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(V3_3_WG * 3, 1) v3_4_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, false, true>(TILEATTN_FWD_ARGS, &tmaps);
}

// v3.3's: Q, 2 stages of K and V, 9 mbarriers (KVBarriers<2>).
TILEATTN_SMEM_BYTES(v3_4_fwd, (Br + 4 * Bc) * HEAD_DIM * 2 + 9 * 8);

}  // namespace tileattn
