// v3: FlashAttention-2's warp-level forward on tensor cores (mma.sync m16n8k16), fp16 and bf16.
//
// What changes from v2 (same loop nest: Q blocks outer, K/V streamed inner, online softmax,
// deferred normalisation, two-level causal mask), each a named idea of the FA2 paper (section 3.3)
// or of its CUDA implementation:
//  * One warp per 16 query rows instead of one thread per row: block = Br / 16 warps, and the
//    warps of a block share only the K/V tiles (no inter-warp reduction: FA2's "split Q", not
//    FA1's "split K").  Per warp and K/V block:  S (16 x Bc) = Q_w K_j^T  and  acc += P V_j,
//    both as m16n8k16 MMAs with fp32 accumulators that stay in registers.
//  * P never touches shared memory: the C fragment of S (fp32) maps element for element onto the
//    A fragment of the P V MMA (see mma.cuh), so P is exponentiated, packed to T and fed back.
//  * Q is copied once (cp.async) and held in registers as A fragments for the whole loop.  K
//    fragments come from ldmatrix, V fragments from ldmatrix.trans (V is row-major keys x D, the
//    MMA wants it "col"), both from XOR-swizzled shared tiles, so ldmatrix is conflict-free.
//  * Online softmax in the log2 domain: the scale times log2(e) is folded into the exponent, so
//    every weight is one FFMA and one ex2 (MUFU.EX2).  Row max and sum are reduced over the 4 lanes
//    of a quad (the lanes that share a row) with __shfl_xor_sync; the sum is reduced only once,
//    at the end, because every lane of a quad rescales its partial sum by the same factor.
//  * cp.async pipeline, two stages for K and two for V: block j+1 is copied while block j is
//    computed, and K and V are separate commit groups, so Q K_j^T starts as soon as K_j has
//    landed, while V_j is still in flight.
//  * Causal: K/V blocks entirely above the diagonal are never loaded; a warp whose 16 rows see
//    none of a (straddling) block skips its MMAs; element masks only where a block straddles the
//    diagonal or passes Nk.  Causal Q blocks are scheduled heaviest (last) first.
//
// Head dims: every multiple of 8 from 16 to 256.  The MMAs run over D_PAD = ceil(D / 16) * 16
// head-dim columns (an m16n8k16 k-step is 16); the padding columns are zero-filled by cp.async,
// so they add 0 to Q K^T, and the matching O columns are never written.  The shared tiles are
// D_SMEM = D_PAD columns wide, or D_PAD + 16 when D_PAD % 64 == 48 (see D_SMEM below).
//
// Shared memory (dynamic only): Q [Br][D_SMEM], K [2][Bc][D_SMEM], V [2][Bc][D_SMEM], 16-bit:
//     smem_bytes = 2 * D_SMEM * (Br + 4 * Bc)
// e.g. D=64, Br=128, Bc=32: 32 KB;  D=128, Br=128, Bc=64: 96 KB;  D=256, Br=64, Bc=32: 96 KB.
// The Q tile is reused at the end to stage O for coalesced 16-byte stores.
//
// Registers per thread (fp32 unless noted): acc D_PAD/2, S Bc/2, P Bc/4 (packed T), Q fragments
// D_PAD/4 (packed T).  At D_PAD > 128 the Q fragments would not fit next to acc, so there they
// are re-read from shared memory by ldmatrix at every k-step (as FA2's forward does at every D).
//
// The kernel body (fa2_mma.cuh) is shared with v3.1 and v3.2; v3 instantiates it with one row tile
// per warp, Q in registers up to D_PAD = 128 and cp.async loads.
#include "fa2_mma.cuh"

namespace tileattn {

// Registers: ptxas is told the minimum number of resident blocks per SM, which caps it at
// 65536 / (threads * MIN_BLOCKS) registers (and at 255).  Left to itself (thread count only) it
// was seen to stop at an occupancy step (80 or 128 registers) and spill, so the cap is explicit:
// 2 blocks when the fragments a thread keeps live (acc + S + P + Q: v3_frag_regs) leave room
// under 128 registers at 256 threads, otherwise 1.  With the threshold 72, every recommended
// tile compiles without spills on sm_80 and sm_90a (NVRTC 13.5); D=64, Bc=32 uses 124-127.
__host__ __device__ constexpr int v3_frag_regs(int d_pad, int Bc) {
  return d_pad / 2 + Bc / 2 + Bc / 4 + (d_pad <= 128 ? d_pad / 4 : 0);
}
__host__ __device__ constexpr int v3_min_blocks(int head_dim, int Bc) {
  return v3_frag_regs((head_dim + 15) / 16 * 16, Bc) <= 72 ? 2 : 1;
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(2 * Br, v3_min_blocks(HEAD_DIM, Bc)) v3_fwd(TILEATTN_FWD_PARAMS(T)) {
  // One row tile (16 rows) per warp, Q in registers up to D_PAD = 128 (v3_frag_regs assumes the same).
  fa2_mma_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*MT=*/1, /*Q_IN_REGS=*/(HEAD_DIM + 15) / 16 * 16 <= 128,
               /*TMA=*/false>(TILEATTN_FWD_ARGS);
}

TILEATTN_SMEM_BYTES(v3_fwd, fa2_mma_smem_bytes(HEAD_DIM, Br, Bc, /*TMA=*/false));

}  // namespace tileattn
