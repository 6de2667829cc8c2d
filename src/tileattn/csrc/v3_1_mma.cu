// v3.1: v3 with two m16 row tiles per warp (32 query rows), so every K and V fragment that a
// warp loads from shared memory feeds two MMAs instead of one.
//
// Why: in v3 each warp owns 16 query rows, and every warp ldmatrix-loads the whole K_j and V_j
// tile once per K/V block: per m16n8k16 MMA it issues one ldmatrix.x4 per two MMAs, twice the
// shared-memory traffic of FlashAttention-2's forward, whose warps own 32 rows (kBlockM = 128
// over 4 warps).  That traffic is the known gap between v3 and FA2 (v3 reached ~0.72x of
// PyTorch's FA2 at D=64 and 128 on an H200).  v3.1 is the same algorithm, with
// MT = 2 row tiles per warp:
//  * A warp owns WROWS = 16 MT consecutive query rows (block = Br / WROWS warps).  Its row tile
//    mt covers rows warp_row + 16 mt .. + 15; a lane holds rows warp_row + 16 mt + g and + 8,
//    i.e. 2 MT rows, indexed r = 2 mt + h (h = 0: row g, h = 1: row g + 8) in m_i, l_i, key_end.
//  * S = Q_w K_j^T: for each k-step, each ldmatrix.x4 of K (two 8-key n-tiles) is used by the
//    MT row tiles' MMAs, 2 MT MMAs per ldmatrix (v3: 2).
//  * acc += P V_j: for each 16-key k-step, each ldmatrix.x4.trans of V (two 8-column n-tiles of
//    O) is used by the MT row tiles' MMAs with their own P fragments, again 2 MT MMAs per load.
//  * The warps' rows are contiguous (not FA2's interleaved warp layout), so the causal warp skip
//    ("none of my rows sees this block") still works at the granularity of a warp.
//  * Registers: a lane now holds MT times v3's accumulators (acc: MT * D_PAD/2 fp32) and scores
//    (S: MT * Bc/2 fp32).  MT = 2 therefore only up to D_PAD = 128 (acc = 128 registers); above,
//    acc alone would be >= 144 registers, so v3.1 falls back to MT = 1 there (= v3, as FA2 also
//    drops to 16 rows per warp with 8 warps at head dim 256).  Q stays in registers as A
//    fragments only when acc + S + Q leave room (v3_1_q_in_regs); otherwise it is re-read from
//    the shared Q tile by ldmatrix at every k-step, as FA2's forward does, and each such Q
//    fragment still feeds NT MMAs.
//
// Two register savings over v3, which bought D=128 its speed (bf16, N=8192, H200: 0.85x -> 0.93x
// of PyTorch's FA2 at Br=128, Bc=32; D=64 unchanged at 0.93x):
//  * The softmax scale is folded into the exponent, P = 2^(s S - m) as one FFMA + MUFU.EX2 per
//    score: S is never scaled on its own, and the row max is taken on the raw scores.
//  * ldmatrix addresses by XOR (SwizzledTile::ldsm_addr): one lane register per tile and an XOR
//    immediate per k-block, instead of one loop-resident register per (k-block, lane) offset.
//  * The visible-key bound of a row is recomputed in the (rare) masked blocks, not kept live.
//
// Unchanged from v3 (see v3_mma.cu for the reasoning): P fed back from the S accumulators as
// the A operand, swizzled shared tiles and conflict-free ldmatrix(.trans), log2-domain online
// softmax with quad reductions, two cp.async stages with K and V in separate commit groups (Q K^T
// starts as soon as K_j has landed), the two-level causal mask, heaviest-first causal schedule,
// O staged through the warp's own rows of the Q tile for 16-byte stores.
//
// Threads per block: NTHREADS = 32 * Br / (16 * MT) = 2 * Br / MT, with MT = v3_1_mt(HEAD_DIM)
// (2 when ceil(HEAD_DIM / 16) * 16 <= 128, else 1): Br threads at D <= 128, 2 Br above.
//
// Default tiles, spill-free on sm_80..sm_90a (NVRTC 13): D_PAD <= 80: Br=128, Bc=64 (4 warps,
// 128 threads, 2 blocks/SM by registers); D_PAD 96..128: Br=128, Bc=32; D_PAD > 128 (MT = 1): as
// v3, Br=128, Bc=32 up to 192, Br=64, Bc=32 above.  On Hopper (versions.py, arch_tiles), measured
// on an H200: Bc=128 at D <= 64 (acc 64 + S 128 registers, spill-free) and Bc=64 up to D=128.
// From D=88 that tile needs a few more registers than the 255 left after acc = 2 x D_PAD/2 and
// S = 64: ptxas spills 4-24 bytes, the per-lane ldmatrix offsets of one operand and the loop
// bound, reloaded from L1 a few times per K/V block (2-3 LDL among ~2000 instructions).  It is
// still 4-13% faster than the spill-free Bc=32 (halving the per-block barriers, row-max
// shuffles and rescales of acc), so Hopper takes it.
//
// Head dims: every multiple of 8 from 16 to 256, padded to D_PAD = ceil(D / 16) * 16 for the
// MMAs (the padding columns are zero-filled by cp.async and never written back).
//
// Shared memory (dynamic only), as v3: Q [Br][D_SMEM], K [2][Bc][D_SMEM], V [2][Bc][D_SMEM],
// 16-bit, D_SMEM = D_PAD, or D_PAD + 16 when D_PAD % 64 == 48:
//     smem_bytes = 2 * D_SMEM * (Br + 4 * Bc)
// e.g. D=64, Br=128, Bc=64: 48 KB;  D=128, Br=128, Bc=64: 96 KB;  D=128, Br=128, Bc=32: 64 KB.
//
// Numerics: identical to v3 at the same Bc (the same operations per element, in the same order).
#include "fa2_mma.cuh"

namespace tileattn {

// Row tiles per warp: 2 up to D_PAD = 128 (acc = 2 * D_PAD / 2 = 128 fp32 registers at most),
// 1 above, where 2 would leave no registers for S, P and addresses under the 255 cap.
__host__ __device__ constexpr int v3_1_mt(int head_dim) {
  return (head_dim + 15) / 16 * 16 <= 128 ? 2 : 1;
}
// Threads per block: one warp per 16 MT query rows.
__host__ __device__ constexpr int v3_1_threads(int head_dim, int Br) {
  return 32 * Br / (16 * v3_1_mt(head_dim));
}
// Registers: ptxas is capped at 65536 / (threads * MIN_BLOCKS).  With MT = 2 a thread needs
// well over 128 registers (acc + S alone are MT (D_PAD + Bc) / 2), so the cap is the ISA's 255:
// MIN_BLOCKS = 2 at 128 threads (65536 / 256 = 256), 4 at 64, 1 at 256 threads and more.
__host__ __device__ constexpr int v3_1_min_blocks(int nthreads) {
  return nthreads <= 128 ? 256 / nthreads : 1;
}
// Q fragments in registers (MT * D_PAD / 4 packed) only when acc + S + Q stay within 160 of the
// 255 registers, leaving the rest for P, the softmax state and addresses (e.g. D=64, Bc=64:
// 64 + 64 + 32); otherwise they are re-read from shared memory at every k-step.
__host__ __device__ constexpr int v3_1_q_in_regs(int head_dim, int Bc) {
  return v3_1_mt(head_dim) * ((head_dim + 15) / 16 * 16 * 3 / 4 + Bc / 2) <= 160;
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_1_threads(HEAD_DIM, Br), v3_1_min_blocks(v3_1_threads(HEAD_DIM, Br)))
    v3_1_fwd(TILEATTN_FWD_PARAMS(T)) {
  fa2_mma_body<T, HEAD_DIM, Br, Bc, CAUSAL, v3_1_mt(HEAD_DIM), v3_1_q_in_regs(HEAD_DIM, Bc), /*TMA=*/false>(
      TILEATTN_FWD_ARGS);
}

TILEATTN_SMEM_BYTES(v3_1_fwd, fa2_mma_smem_bytes(HEAD_DIM, Br, Bc, /*TMA=*/false));

// Variable-length batches (fa2_mma.cuh: each block's sequence as a batch of one).
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_1_threads(HEAD_DIM, Br), v3_1_min_blocks(v3_1_threads(HEAD_DIM, Br)))
    v3_1_varlen_fwd(TILEATTN_FWD_PARAMS(T)) {
  fa2_mma_varlen_body<T, HEAD_DIM, Br, Bc, CAUSAL, v3_1_mt(HEAD_DIM), v3_1_q_in_regs(HEAD_DIM, Bc)>(
      TILEATTN_FWD_ARGS);
}

TILEATTN_SMEM_BYTES(v3_1_varlen_fwd, fa2_mma_smem_bytes(HEAD_DIM, Br, Bc, /*TMA=*/false));

// The score variants (sliding window, softcap, ALiBi; common.cuh) on the mma.sync path: the
// varlen kernel's body compiled with VARIANTS, for packed sequences (cu_seqlens) and dense
// batches (cu_seqlens null) alike; flash_attn_func and flash_attn_varlen_func run it off Hopper
// and at the head dims v3.3 has not.  A separate instantiation, so that v3_1_fwd and
// v3_1_varlen_fwd keep their instructions.  Blocks outside every row's window are skipped
// (fa2_mma.cuh); softcap costs a MUFU.TANH per score beside the MUFU.EX2.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_1_threads(HEAD_DIM, Br), v3_1_min_blocks(v3_1_threads(HEAD_DIM, Br)))
    v3_1_variants_fwd(TILEATTN_FWD_PARAMS(T)) {
  fa2_mma_varlen_body<T, HEAD_DIM, Br, Bc, CAUSAL, v3_1_mt(HEAD_DIM), v3_1_q_in_regs(HEAD_DIM, Bc),
                      /*VARIANTS=*/true>(TILEATTN_FWD_ARGS);
}

TILEATTN_SMEM_BYTES(v3_1_variants_fwd, fa2_mma_smem_bytes(HEAD_DIM, Br, Bc, /*TMA=*/false));

}  // namespace tileattn
