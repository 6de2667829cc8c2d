// v3.5: FP8 (e4m3) attention on Hopper's warpgroup MMA (sm_90a), bf16 output.
//
// Why: wgmma.m64nNk32 with e4m3 operands runs at twice the rate of fp16/bf16 (H100/H200: ~1979
// against ~989 dense TFLOP/s, NVIDIA's Hopper datasheet), and the operands are half the bytes.
// Everything else is v3.3's body (v3_3_wgmma.cu: TMA producer, two consumer warpgroups of 64
// rows, setmaxnreg, the intra-warpgroup overlap of S_{j+1} with P_j V_j, the online softmax in
// FP32), compiled with T = fp8_e4m3; its FP8 branches are:
//  * Inputs q, k, v e4m3 with descale factors (the room field `descale`: [B * H_kv][3], q's, k's,
//    v's factor for each (batch, KV head), FlashAttention-3's per-(batch, KV head) form): the
//    scores are S ds_q ds_k, folded into the exponent's one FFMA; O is multiplied by ds_v once,
//    at the end.  Any sign of ds_q ds_k softmax_scale works (S is negated when it is negative).
//  * S = Q K^T: both K-major, k32 steps (Q and K as the copy engine wrote them: rows of D bytes,
//    the 128-byte swizzle, or the 64-byte one at D = 64).
//  * P is rounded to e4m3 (round to nearest even; P lies in [0, 1], where e4m3 keeps 3 mantissa
//    bits down to 2^-6 and subnormals to 2^-9) for P V; the row sums l_i add the FP32 P.
//  * P V: 8-bit wgmma reads B K-major only, so the host hands in V^T, (B, H_kv, D, Nk padded to
//    a multiple of 32) e4m3, written by one copy per call (api-side: fp8.py).  P's A fragment
//    comes from S's accumulator without any shuffle: a thread holds keys 2t, 2t + 1 of each n8
//    tile where the A layout wants keys 4t .. 4t + 3 of a 32-key step, so V^T's keys are permuted
//    in each group of 32 to match (slot 16 h + 4 t + 2 a + b holds key 16 h + 8 a + 2 t + b;
//    reference.fp8_key_permutation): the product sums over keys, the order is free.
//  * O (bf16) through the same epilogue, lse as v3.3's.
// Tiles: Br = 128 (two warpgroups of 64 rows), Bc = 128 (V^T rows of 128 key bytes, the 128-byte
// swizzle): shared memory Q 128 D + 2 stages of K (128 D) and V^T (D x 128) bytes, 80 KB at
// D = 128.  Head dims 64, 128, 256.
#include "v3_3_wgmma.cu"

namespace tileattn {

#ifdef TILEATTN_FP8_PINGPONG  // experiment: v3.4's turns at the tensor core
constexpr bool V3_5_PINGPONG = true;
#else
constexpr bool V3_5_PINGPONG = false;
#endif

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(V3_3_WG * 3, 1) v3_5_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  static_assert(sizeof(T) == 1, "v3.5 takes e4m3 inputs (tileattn::fp8_e4m3)");
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, false, V3_5_PINGPONG>(TILEATTN_FWD_ARGS, &tmaps);
}

// Q, 2 stages of K and V^T (one byte an element), 9 mbarriers (KVBarriers<2>).
TILEATTN_SMEM_BYTES(v3_5_fwd, (Br + 4 * Bc) * HEAD_DIM + 9 * 8);

// V^T as v3.5 reads it, from V (B, H_kv, Nk, D) e4m3 at any strides (elements = bytes) into
// vt (B, H_kv, D, Nk_pad) contiguous, Nk_pad a multiple of 32, zeros past Nk, the keys of each
// group of 32 in the order of the A fragment (slot 16 h + 4 t + 2 a + b <- key 16 h + 8 a + 2 t + b;
// fp8.key_permutation).  One block per (batch, KV head, VT_GROUPS groups of 32 keys), thread d =
// column d: a warp reads 32 consecutive bytes of each key row (one sector), and each thread
// writes VT_GROUPS x 32 consecutive bytes of its row of vt, a whole 128-byte line (written one
// 32-byte sector per block, as in the first version, it ran at ~0.75 TB/s: 0.17 ms for 64 MB on
// an H200; torch's byte-wise permute-copy took 0.35 ms).
#define TILEATTN_VT_FIELDS(X, SEP)                                                              \
  X(const unsigned char* __restrict__, v) SEP X(unsigned char* __restrict__, vt) SEP              \
  X(const int, Nk) SEP X(const int, Nk_pad) SEP X(const int, H_kv) SEP                           \
  X(const long long, v_sb) SEP X(const long long, v_sh) SEP X(const long long, v_sn)
constexpr int VT_GROUPS = 4;

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(HEAD_DIM) v3_5_v_transpose(TILEATTN_VT_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)) {
  const int groups = Nk_pad / 32, chunks = (groups + VT_GROUPS - 1) / VT_GROUPS;
  const long long bh = blockIdx.x / chunks;
  const int d = threadIdx.x;
  const unsigned char* src = v + (bh / H_kv) * v_sb + (bh % H_kv) * v_sh + d;
  unsigned char* dst_row = vt + (bh * HEAD_DIM + d) * Nk_pad;
#pragma unroll
  for (int i = 0; i < VT_GROUPS; ++i) {
    const int g = blockIdx.x % chunks * VT_GROUPS + i;
    if (g >= groups) break;
    unsigned x[32];
#pragma unroll
    for (int k = 0; k < 32; ++k) x[k] = 32 * g + k < Nk ? src[(32LL * g + k) * v_sn] : 0u;
    unsigned w[8];  // word 4 h + t: slots 16 h + 4 t .. + 3 = keys 16 h + 2 t, + 1, + 8, + 9
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int k0 = 16 * (j / 4) + 2 * (j % 4);
      w[j] = x[k0] | x[k0 + 1] << 8 | x[k0 + 8] << 16 | x[k0 + 9] << 24;
    }
    uint4* dst = reinterpret_cast<uint4*>(dst_row + 32 * g);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}
TILEATTN_SMEM_BYTES(v3_5_v_transpose, 0);

}  // namespace tileattn
