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
// bytes, 80 KB at D = 128.  Head dims 64, 128, 256.  v3.5_wide (versions.py): Bc = 192 at D = 128 for
// long calls without a mask, V^T in 64-key panels under the 64-byte swizzle (v3_3_wgmma.cu's VT_PANEL).
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
// fp8.key_permutation).  One block per (batch, KV head, VT_KEYS keys), three steps through one
// shared tile:
//  1. V's rows come in by 16-byte loads (a warp reads whole 128-byte lines) as [key][d];
//  2. a task is 4 columns of one half-group of 16 keys (keys 16 half + k, half = 2 g + h): 16 word
//     reads (one key, 4 columns each) and four 4x4 byte transposes (transpose4x4, 8 PRMT each)
//     give each column's 16 slots as 4 words, kept in registers until every task has read;
//  3. the tile is rewritten as [d][slot] from those words, and leaves by 16-byte stores of which
//     8 consecutive lanes cover one 128-byte row of vt (whole lines, rows in order).
// Banks: in step 2 a warp's lanes take consecutive column words of one row (conflict-free at
// D = 128 and 256; at D = 64, rows of 16 banks, its two half-warps read the two halves of a group,
// and key r sits at row r ^ bit 4 of r, in the opposite bank half); in step 3 lane l writes rows
// 4 l + c, so the 16-byte chunk j of row d sits at chunk j ^ (d / 4 mod 8) (vt_slot_offset).
// (Measured on an H100, 64 MB at D = 128: the copy that read a byte a key from shared memory and
// stored 32 bytes a thread in rows 1 apart 0.086 ms; step 2 storing its 16-byte words straight to
// global memory, rows 4 apart, 0.126 ms (0.032 against 0.048 at D = 64); bench/NOTES.md.)
#define TILEATTN_VT_FIELDS(X, SEP)                                                              \
  X(const unsigned char* __restrict__, v) SEP X(unsigned char* __restrict__, vt) SEP              \
  X(const int, Nk) SEP X(const int, Nk_pad) SEP X(const int, H_kv) SEP                           \
  X(const long long, v_sb) SEP X(const long long, v_sh) SEP X(const long long, v_sn)
constexpr int VT_KEYS = 128, VT_THREADS = 128;

// Rows a, b, c, d of 4 bytes each (byte i = column i) -> column i as the word (a_i, b_i, c_i, d_i),
// byte 0 first: interleave pairs of rows, then pairs of pairs (__byte_perm(x, y, s): byte n of the
// result is byte (s >> 4n) & 7 of y:x, x's bytes 0-3 and y's 4-7).
__device__ __forceinline__ void transpose4x4(unsigned a, unsigned b, unsigned c, unsigned d, unsigned (&col)[4]) {
  const unsigned ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);  // a0 b0 a1 b1 / a2 b2 a3 b3
  const unsigned cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
  col[0] = __byte_perm(ab_lo, cd_lo, 0x5410);  // a0 b0 c0 d0
  col[1] = __byte_perm(ab_lo, cd_lo, 0x7632);
  col[2] = __byte_perm(ab_hi, cd_hi, 0x5410);
  col[3] = __byte_perm(ab_hi, cd_hi, 0x7632);
}

// Step 3's layout: byte offset of slots 16 j .. 16 j + 15 of column d in the [d][slot] tile.
__device__ __forceinline__ int vt_slot_offset(int d, int j) { return d * VT_KEYS + 16 * (j ^ (d >> 2 & 7)); }

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(VT_THREADS) v3_5_v_transpose(TILEATTN_VT_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)) {
  constexpr int CHUNKS = HEAD_DIM / 16, WORDS = HEAD_DIM / 4, TASKS = VT_KEYS / 16 * WORDS / VT_THREADS;
  __shared__ __align__(16) unsigned char tile[VT_KEYS * HEAD_DIM];
  auto row = [](int key) { return HEAD_DIM == 64 ? key ^ (key >> 4 & 1) : key; };  // the D = 64 row swap
  const int tiles = (Nk_pad + VT_KEYS - 1) / VT_KEYS;
  const long long bh = blockIdx.x / tiles;
  const int key0 = blockIdx.x % tiles * VT_KEYS, tid = threadIdx.x;
  const unsigned char* src = v + (bh / H_kv) * v_sb + (bh % H_kv) * v_sh;
#pragma unroll
  for (int i = tid; i < VT_KEYS * CHUNKS; i += VT_THREADS) {
    const int key = i / CHUNKS, c = i % CHUNKS;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key0 + key < Nk) x = *reinterpret_cast<const uint4*>(src + (key0 + key) * v_sn + 16 * c);
    *reinterpret_cast<uint4*>(tile + row(key) * HEAD_DIM + 16 * c) = x;
  }
  __syncthreads();
  const int halves = min(VT_KEYS, Nk_pad - key0) / 16;
  unsigned col[TASKS][4][4];  // task n, column c, word t: slots 4 t .. 4 t + 3 = keys 2 t, 2 t + 1, 2 t + 8, 2 t + 9
#pragma unroll
  for (int n = 0; n < TASKS; ++n) {
    const int task = tid + n * VT_THREADS, cw = task % WORDS, half = task / WORDS;  // columns 4 cw + c
    if (half >= halves) continue;
    unsigned w[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) w[k] = *reinterpret_cast<const unsigned*>(tile + row(16 * half + k) * HEAD_DIM + 4 * cw);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      unsigned x[4];
      transpose4x4(w[2 * t], w[2 * t + 1], w[2 * t + 8], w[2 * t + 9], x);
#pragma unroll
      for (int c = 0; c < 4; ++c) col[n][c][t] = x[c];
    }
  }
  __syncthreads();  // every key read: the tile now takes the output, [d][slot]
#pragma unroll
  for (int n = 0; n < TASKS; ++n) {
    const int task = tid + n * VT_THREADS, cw = task % WORDS, half = task / WORDS;
    if (half >= halves) continue;
#pragma unroll
    for (int c = 0; c < 4; ++c)
      *reinterpret_cast<uint4*>(tile + vt_slot_offset(4 * cw + c, half)) =
          make_uint4(col[n][c][0], col[n][c][1], col[n][c][2], col[n][c][3]);
  }
  __syncthreads();
#pragma unroll
  for (int i = tid; i < HEAD_DIM * (VT_KEYS / 16); i += VT_THREADS) {
    const int d = i / (VT_KEYS / 16), j = i % (VT_KEYS / 16);
    if (j < halves)
      *reinterpret_cast<uint4*>(vt + (bh * HEAD_DIM + d) * Nk_pad + key0 + 16 * j) =
          *reinterpret_cast<const uint4*>(tile + vt_slot_offset(d, j));
  }
}
TILEATTN_SMEM_BYTES(v3_5_v_transpose, 0);

}  // namespace tileattn
