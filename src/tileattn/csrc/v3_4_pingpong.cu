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
// fragment layouts) is v3.3's body (v3_3_wgmma.cu), compiled with PINGPONG: the arithmetic is
// v3.3's, so is the output.
//
// v3.3's D=64 kernel pins the P V wait behind the softmax's exponentials (4% there); v3.4 leaves
// it to ptxas: pinned, v3.4 ran 0.98x of v3.3 at causal D=64, unpinned 1.16x.
//
// Measured on an H200 (bf16, scripts/variants_probe.py B=2 H=16 N=8192, 2026-12-02): causal D=64
// 0.723 ms against v3.3's 0.839 (1.16x), non-causal 1.355 ms against 1.485 with the pin (the
// pinned v3.4 was 1.07-1.10x v3.3 without a mask, bench/results/sweeps/mma_d64_f02bce0.json).
// At D=128 the ping-pong measured within 1.5% of v3.3 (6fbf194): the registry runs v3.4 at D=64.
#include "v3_3_wgmma.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1) v3_4_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, false, true>(TILEATTN_FWD_ARGS, &tmaps);
}

// v3.3's: Q, 2 stages of K and V, 9 mbarriers (KVBarriers<2>).
TILEATTN_SMEM_BYTES(v3_4_fwd, (Br + 4 * Bc) * HEAD_DIM * 2 + 9 * 8);

}  // namespace tileattn
