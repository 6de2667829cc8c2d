// v3.2: v3.1 with Q, K and V loaded by Hopper's tensor memory accelerator (TMA), sm_90.
//
// Why: in v3.1 every thread issues the K/V copies itself: 16-byte cp.async (LDGSTS), each with
// its own 64-bit source address, a bounds test and a swizzled destination, ~8 instructions per
// 16 bytes, every K/V block (D=128, Bc=64: 16 copies per thread and block, about a tenth of all
// issued instructions), and their address registers are what pushes v3.1 past 255 registers at
// D=128.  Measured on an H200 by dropping v3.1's in-loop copies (wrong results, an upper bound):
// +12% at D=64, +15% at D=128.  On sm_90 a single thread can hand the copy engine a whole tile:
//  * cp.async.bulk.tensor.4d: one instruction per panel of a Q, K or V tile (64 columns, or a
//    last panel of 32 or 16), issued by thread 0, reading through a tensor map (dims D, N, heads,
//    batch with the tensor's strides; box = panel columns x Br or Bc rows) that api.py encodes per
//    input layout and passes by value (TmaMaps, a __grid_constant__ parameter, common.cuh).  The map's 128-, 64-
//    or 32-byte swizzle writes exactly the SwizzledTile layout the ldmatrix code already reads
//    (address bits 4-6 XOR bits 7-9, 4-5 XOR 7-8, 4 XOR 7, with 1024-byte aligned panels), so
//    the compute is unchanged.
//  * Rows past N and columns past HEAD_DIM lie outside the tensor and arrive as zeros: no tail
//    or padding code.
//  * Completion: each tile's bytes are announced on its mbarrier (arrive.expect_tx) and counted
//    down by the copy engine; waiting on the barrier's phase orders and publishes the data.
//    The mid-block __syncthreads of v3.1 (waiting for V_j) becomes a per-warp mbarrier wait;
//    the barrier at the top of each block stays (no warp may still read the stage that thread 0
//    is about to refill; replacing it by "the last warp done refills" measured +2% / -1%).
// Head dims: v3.1's up to 128 (two m16 row tiles per warp); above, v3.1 (one row tile) runs.
// Registers: 254-255 of 255.  At D=128 (non-causal) NVRTC 13.0, the release pip pairs with torch's
// CUDA 13.0 builds, spills 8 bytes: two 32-bit values stored before the K/V loop and read back
// (two 64-bit loads) in the epilogue, never inside the loop; NVRTC 13.5 spills none.  versions.py holds the rung to that budget.
//
// The compute (32 rows per warp, S and O in registers, P fed back as the A operand, ldmatrix,
// exp2 with the scale folded into one FFMA, two-level causal mask) is v3.1's, the same code
// (fa2_mma.cuh with TMA = true).  Shared memory: v3.1's plus 40 bytes of mbarriers.
#include "v3_1_mma.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_1_threads(HEAD_DIM, Br), v3_1_min_blocks(v3_1_threads(HEAD_DIM, Br)))
    v3_2_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  fa2_mma_body<T, HEAD_DIM, Br, Bc, CAUSAL, v3_1_mt(HEAD_DIM), v3_1_q_in_regs(HEAD_DIM, Bc), /*TMA=*/true>(
      TILEATTN_FWD_ARGS, &tmaps);
#endif
}

TILEATTN_SMEM_BYTES(v3_2_fwd, fa2_mma_smem_bytes(HEAD_DIM, Br, Bc, /*TMA=*/true));

}  // namespace tileattn
