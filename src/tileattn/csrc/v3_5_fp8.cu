// v3.5: FP8 (e4m3) attention on Hopper's warpgroup MMA (sm_90a), bf16 output.
//
// Why: wgmma.m64nNk32 with e4m3 operands runs at twice the rate of fp16/bf16 (H100/H200: ~1979
// against ~989 dense TFLOP/s, NVIDIA's Hopper datasheet), and the operands are half the bytes.
// Everything else is v3.3's body (v3_3_wgmma.cu: TMA producer, two consumer warpgroups of 64
// rows, setmaxnreg, the intra-warpgroup overlap of S_{j+1} with P_j V_j, the online softmax in
// FP32) walked as v3.6 walks it (persistent CTAs, one per SM, over persistent_tile's order, the
// next tile's Q and K/V loading under this one's last P V and stores), compiled with
// T = fp8_e4m3; its FP8 branches are:
//  * Inputs q, k, v e4m3 with descale factors (the room field `descale`: [B * H_kv][3], q's, k's,
//    v's factor for each (batch, KV head), FlashAttention-3's per-(batch, KV head) form): the
//    scores are S ds_q ds_k, folded into the exponent's one FFMA; O is multiplied by ds_v once,
//    at the end.  Any sign of ds_q ds_k softmax_scale works (S is negated when it is negative).
//  * S = Q K^T: both K-major, k32 steps (Q and K as the copy engine wrote them: rows of D bytes,
//    the 128-byte swizzle, or the 64-byte one at D = 64).
//  * P is rounded to e4m3 (round to nearest even) for P V; the row sums l_i add the FP32 P.  The
//    rebase is lazy at a threshold of 2 and P is lifted by 2^6 (fp8_lazy_rescale_log2 and
//    fp8_p_offset_log2 in softmax.cuh): P lies in [0, 2^8], within e4m3's 448, and the weights
//    down to 2^-12 of a row's max keep e4m3's 3 mantissa bits (subnormals below 2^-6).
//  * P V: 8-bit wgmma reads B K-major only, so the host hands in V^T, (B, H_kv, D, Nk padded to
//    a multiple of 32) e4m3, written per call by v3_5_v_transpose below (fp8.v_transposed).  P's A fragment
//    comes from S's accumulator without any shuffle: a thread holds keys 2t, 2t + 1 of each n8
//    tile where the A layout wants keys 4t .. 4t + 3 of a 32-key step, so V^T's keys are permuted
//    in each group of 32 to match (slot 16 h + 4 t + 2 a + b holds key 16 h + 8 a + 2 t + b;
//    fp8.key_permutation): the product sums over keys, the order is free.
//  * O (bf16) through the same epilogue, lse as v3.3's.
// Tiles: Br = 128 (two warpgroups of 64 rows), Bc = 128 (V^T in panels of 128 key bytes, the
// 128-byte swizzle), 256 at D = 64: shared memory Q Br D + 2 stages of K (Bc D) and V^T (D Bc)
// bytes, 80 KB at D = 128.  Head dims 64, 128, 256.
//
// Measured on an H200 (scripts/fp8_probe.py, B*N = 32768, H = 16, N = 8192, bench/NOTES.md): at
// D = 128 the kernel runs 1.2x tileattn's bf16, the MMAs themselves near the FP8 peak but not
// hidden under the D-independent softmax.  Tried and not kept: v3.4's ping-pong turns (-2% at
// D = 128, -10% at D = 64), every 4th or 2nd exponential on the FMA pipe as a polynomial (-3% /
// -7% at D = 128, -17% at D = 64 non-causal; neutral causal), the P V wait pinned behind the
// exponentials at D = 128 (within 1.5%), Bc = 256 at D = 128 (144 bytes of spills, -11%); on
// the persistent walk (H100, 2026-12-06): the ping-pong again (D = 128 +2% without a mask, -4%
// causal; D = 64 -12-19%), 3-4 K/V stages (within noise), and the row sums l_i by the tensor core
// against a block of ones (D = 128 +2-3%, D = 64 -7-11%, lse from e4m3 weights off by up to
// 2.5e-2).
#include "v3_3_wgmma.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1) v3_5_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  static_assert(sizeof(T) == 1, "v3.5 takes e4m3 inputs (tileattn::fp8_e4m3)");
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, false, /*PINGPONG=*/false, /*PERSISTENT=*/true>(TILEATTN_FWD_ARGS, &tmaps);
}

// Q, 2 stages of K and V^T (bytes), 10 mbarriers (KVBarriers<2> and v3.6's Q empty).
TILEATTN_SMEM_BYTES(v3_5_fwd, (Br + 4 * Bc) * HEAD_DIM + 10 * 8);

// V^T as v3.5 reads it, from V (B, H_kv, Nk, D) e4m3 at any strides (elements = bytes) into
// vt (B, H_kv, D, Nk_pad) contiguous, Nk_pad a multiple of 32, zeros past Nk, the keys of each
// group of 32 in the order of the A fragment (slot 16 h + 4 t + 2 a + b <- key 16 h + 8 a + 2 t + b;
// fp8.key_permutation).  One block per (batch, KV head, VT_KEYS keys): the tile comes in by
// 16-byte loads into shared memory (rows of D + 16 bytes), then each thread takes one column d of
// one group of 32 keys (consecutive threads consecutive columns: byte reads of one shared row,
// conflict-free) and writes its 32 bytes of vt as two 16-byte stores.  (Measured on an H200 at
// 64 MB: torch's byte-wise permute-copy 0.35 ms; a thread per column reading bytes from global
// memory 0.115-0.17 ms.)
#define TILEATTN_VT_FIELDS(X, SEP)                                                              \
  X(const unsigned char* __restrict__, v) SEP X(unsigned char* __restrict__, vt) SEP              \
  X(const int, Nk) SEP X(const int, Nk_pad) SEP X(const int, H_kv) SEP                           \
  X(const long long, v_sb) SEP X(const long long, v_sh) SEP X(const long long, v_sn)
constexpr int VT_KEYS = 128, VT_THREADS = 128;

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(VT_THREADS) v3_5_v_transpose(TILEATTN_VT_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)) {
  constexpr int ROW = HEAD_DIM + 16, CHUNKS = HEAD_DIM / 16;
  __shared__ __align__(16) unsigned char tile[VT_KEYS * ROW];
  const int tiles = (Nk_pad + VT_KEYS - 1) / VT_KEYS;
  const long long bh = blockIdx.x / tiles;
  const int key0 = blockIdx.x % tiles * VT_KEYS, tid = threadIdx.x;
  const unsigned char* src = v + (bh / H_kv) * v_sb + (bh % H_kv) * v_sh;
#pragma unroll
  for (int i = tid; i < VT_KEYS * CHUNKS; i += VT_THREADS) {
    const int key = i / CHUNKS, c = i % CHUNKS;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key0 + key < Nk) x = *reinterpret_cast<const uint4*>(src + (key0 + key) * v_sn + 16 * c);
    *reinterpret_cast<uint4*>(tile + key * ROW + 16 * c) = x;
  }
  __syncthreads();
  const int groups = min(VT_KEYS, Nk_pad - key0) / 32;
#pragma unroll
  for (int i = tid; i < VT_KEYS / 32 * HEAD_DIM; i += VT_THREADS) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    if (g >= groups) break;
    const unsigned char* col = tile + 32 * g * ROW + d;
    unsigned w[8];  // word 4 h + t: slots 16 h + 4 t .. + 3 = keys 16 h + 2 t, + 1, + 8, + 9
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int k0 = 16 * (j / 4) + 2 * (j % 4);
      w[j] = col[k0 * ROW] | col[(k0 + 1) * ROW] << 8 | col[(k0 + 8) * ROW] << 16 | col[(k0 + 9) * ROW] << 24;
    }
    uint4* dst = reinterpret_cast<uint4*>(vt + (bh * HEAD_DIM + d) * Nk_pad + key0 + 32 * g);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}
TILEATTN_SMEM_BYTES(v3_5_v_transpose, 0);

}  // namespace tileattn
