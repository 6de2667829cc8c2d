// bwd_v2.3: the FP32-accurate backward on Hopper's wgmma (sm_90a), every FP32 operand as two fp16
// halves under a power-of-two scale and three fp16 products summed (3xFP16): bwd_v6's
// warp-specialised CTA at head dims 64 and 128.
//
// Why: bwd_v2.2 (3xTF32 on mma.sync) runs 44-58 TFLOP/s on an H200, 1.2-1.66x PyTorch's
// memory-efficient FP32 backward (bench/results/bwd_fp32.json).  The tensor core's TF32 rate is
// half its fp16 rate, and TF32 wgmma takes K-major operands only, so Q, dO and K would each need a
// transposed hi / lo copy in shared memory beside the plain one (more than 227 KB at Bc = 64).
// fp16 has TF32's 11-bit significand, so x = hi + lo in fp16 carries 22 bits as TF32 pairs do,
// at twice the rate, and fp16 wgmma reads transposed (MN-major) tiles: the bf16 rungs' layouts
// apply as they are.  What fp16 lacks is TF32's exponent range; power-of-two scales (exact in
// both directions) put each operand's values near 2^15:
//   * q, k, v, dO: 2^e per block of 64 rows, e from the block's max |x| (split_halves.cu's
//     split_blocks writes the scaled halves, (B, 2 x heads, N, D) fp16: head h's hi at h, its lo
//     at heads + h; and the maxima).  A 64-row block is a CTA's K/V block and one Q block here,
//     so every product below is of one q (dO) block and one k (v) block, and its unscale a
//     per-block factor: folded into the softmax's scale (S), dP's unscale, dQ's add, and the
//     FFMA that sums dK's and dV's blocks;
//   * P in [0, 1]: 2^15;
//   * dS = P (dP - D_i) of a block: |dS| <= |dP| + |D_i| < 2^E1 + 2^E2, E1 from D and dO's and
//     v's block maxima, E2 from the block's max |D_i| (D_i = dO_i . O_i: O mixes every V block,
//     so the block's v bounds dP only); 2^f from that bound.
// A value then keeps 22 bits down to 2^-3 of its block's scale, and below that loses at most
// 2^-25 of the scale (fp16's subnormal step): ~2^-40 of the block's max, far under FP32's own
// error for any value that is not 2^-17 times smaller than its block's largest entry.  The products
// a b ~= a_hi b_hi + a_hi b_lo + a_lo b_hi drop a_lo b_lo (~2^-22 relative), as 3xTF32 does.
//
// Numerics of the sums: the tensor core's FP32 accumulation is not round-to-nearest (v2_2_tf32x3.cu:
// error grew with N when a sum ran inside the MMAs across all blocks).  So each product runs from
// zero over one block (S^T, dP^T over D; dQ over 64 keys; dV, dK over 64 query rows; small terms
// first), dV and dK are summed across Q blocks in FP32 FADD, dQ's blocks add in L2 (red).
//
// One CTA per (K/V block j of Bc = 64 keys, batch * head), bwd_v6's pipeline: a producer warp
// streams K_j, V_j once and Q_i, dO_i per block (TMA, hi and lo tiles: four copies) and lse_i,
// D_i into two stages; two consumer warpgroups split each block's query rows for S^T and dP^T
// (m64n32, keys as M), store P^T and dS^T as hi / lo [query row][key] tiles, meet, and then:
//   D=128: warpgroup w owns columns 64 w .. 64 w + 63 of dK_j, dV_j and dQ_i (bwd_v6's split);
//   D=64:  warpgroup 0 owns dV_j, warpgroup 1 dK_j, and each computes dQ_i over half the keys
//          (32 w ..) and adds it (a column split would need 32-column MN-major operands, half a
//          128-byte swizzle panel).
// Registers (240 a consumer thread): at D=128 dK, dV of a block and their sums (4 x 32), dQ (32),
// S^T and dP^T (2 x 16); at D=64 one of dK, dV and its sum, dQ, S^T, dP^T.
// Shared memory: K_j, V_j hi / lo, two stages of Q_i, dO_i hi / lo, the P / dS hi / lo tiles (one
// set at D=128: 224 KB; two at D=64: 160 KB), lse_i, D_i, mbarriers.
// Not deterministic (dQ's adds land in any order): deterministic=True runs bwd_v2.2.
// Measured on an H200 (bench/results/bwd_fp32.json, B*N = 32768, H = 8): 78-160 TFLOP/s, 2.65-4.28x
// SDPA efficient and 1.6-3.2x bwd_v2.2 at N = 1024 and 8192, error 0.8-4.0e-6 vs float64.
#include "bwd_common.cuh"
#include "bwd_wgmma.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace tileattn {

constexpr int BWD_V2_3_WG = 128;
constexpr int BWD_V2_3_STAGES = 2;
constexpr float BWD_V2_3_P_SCALE = 32768.0f;  // 2^15: P in [0, 1] as fp16 halves
// P / dS tile sets: two (a warpgroup one block ahead writes the other) where they fit.
__host__ __device__ constexpr int bwd_v2_3_tile_sets(int D) { return D <= 64 ? 2 : 1; }

// K_j, V_j hi + lo (Bc x D each), the stages' Q_i, dO_i hi + lo (Br x D), the P / dS hi + lo tile
// sets (Br x Bc), all fp16 SwizzledTiles of whole 1024-byte multiples; lse_i, D_i; the mbarriers.
__host__ __device__ constexpr int bwd_v2_3_smem(int D, int Br, int Bc) {
  return (2 * 2 * Bc * D + BWD_V2_3_STAGES * 2 * 2 * Br * D + bwd_v2_3_tile_sets(D) * 4 * Br * Bc) * 2 +
         BWD_V2_3_STAGES * 2 * Br * 4 + (1 + 2 * BWD_V2_3_STAGES) * 8;
}

// bwd_p_ds_step's P^T and dS^T for 3xFP16 (MASK as there): P = 2^(scale_log2 S - log2(e) lse)
// (scale_log2 holds q's and k's unscale), dS = P (dP dp_unscale - D_i); P 2^15 and dS ds_scale
// split into hi / lo halves and written by stmatrix.trans into the four [query row][key] tiles
// (tiles: P hi, then P lo, dS hi, dS lo, T_BYTES apart).
template <typename STile, int Br, bool CAUSAL, bool MASK>
__device__ __forceinline__ void bwd_v2_3_p_ds_step(float (&S)[Br / 2], float (&dP)[Br / 2], unsigned tiles,
                                                   int T_BYTES, const float* lse_i, const float* Di_i, int kv_start,
                                                   int warp_key0, int q_start, int Nk, int causal_offset,
                                                   float scale_log2, float dp_unscale, float ds_scale, int lane) {
  constexpr int NS = Br / 2;
  const int key0 = warp_key0 + lane / 4, t = lane % 4;
  unsigned frag[4][Br / 16][4];  // P hi, P lo, dS hi, dS lo as 8x8 matrices (bwd_p_ds_step's order)
#pragma unroll
  for (int i = 0; i < NS; i += 2) {
    float p[2], ds[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = acc_key(i + e, kv_start + key0), r = acc_col(i + e, 2 * t);  // (value i + e)
      const float l = lse_i[r];
      const bool seen = !MASK || (l != TILEATTN_NEG_INF && key < key_end<CAUSAL>(q_start + r, Nk, causal_offset));
      p[e] = seen ? softmax_weight(S[i + e], scale_log2, l * TILEATTN_LOG2E) : 0.0f;
      ds[e] = p[e] * (dP[i + e] * dp_unscale - Di_i[r]);
    }
    const int n8 = i / 4, j = (n8 % 2) * 2 + (i % 4) / 2;
    split_half2(p[0] * BWD_V2_3_P_SCALE, p[1] * BWD_V2_3_P_SCALE, frag[0][n8 / 2][j], frag[1][n8 / 2][j]);
    split_half2(ds[0] * ds_scale, ds[1] * ds_scale, frag[2][n8 / 2][j], frag[3][n8 / 2][j]);
  }
#pragma unroll
  for (int m = 0; m < 4; ++m)
    bwd_store_rows_trans<STile, Br, 1>([&](int) { return tiles + m * T_BYTES; },
                                       [&](int, int ks) -> const unsigned(&)[4] { return frag[m][ks]; }, warp_key0, lane);
  fence_proxy_async_smem();  // this thread's stores, before the tensor core reads them
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(3 * BWD_V2_3_WG, 1)
    bwd_v2_3(TILEATTN_BWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(T) == 4, "bwd_v2.3 is an FP32 rung (its tiles are fp16 halves)");
  static_assert(Br == 64 && Bc == 64, "wgmma's M = the CTA's 64 keys; two warpgroups of 32 query rows");
  static_assert(Br == SPLIT_BLOCK_ROWS && Bc == SPLIT_BLOCK_ROWS, "a Q block, a K/V block: one exponent each");
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "whole 64-column panels; 224 KB at D=128");
  using H16 = Wgmma16<__half>;
  constexpr bool COLSPLIT = HEAD_DIM == 128;  // warpgroup w: 64 columns of dK, dV, dQ (else: dV or dK)
  constexpr int STAGES = BWD_V2_3_STAGES, SETS = bwd_v2_3_tile_sets(HEAD_DIM);
  constexpr int RW = Br / 2;                         // query rows of S^T, dP^T a warpgroup
  constexpr int DW = COLSPLIT ? HEAD_DIM / 2 : 64;   // columns of a warpgroup's dQ, dK / dV
  constexpr int Q_BYTES = Br * HEAD_DIM * 2, KV_BYTES = Bc * HEAD_DIM * 2, T_BYTES = Br * Bc * 2;
  using STile = SwizzledTile<Br, Bc>;  // P and dS, [query row][key]: one 64-key panel

  // Every tile is a hi tile followed by its lo tile.
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned s_k = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned s_v = s_k + 2 * KV_BYTES;
  auto s_q = [&](int st) { return s_k + 4 * KV_BYTES + st * 4 * Q_BYTES; };
  auto s_do = [&](int st) { return s_q(st) + 2 * Q_BYTES; };
  auto s_tiles = [&](int set) { return s_q(STAGES) + set * 4 * T_BYTES; };  // P hi, P lo, dS hi, dS lo
  constexpr int STATS = 4 * KV_BYTES + STAGES * 4 * Q_BYTES + SETS * 4 * T_BYTES;
  float* const stats = reinterpret_cast<float*>(smem + STATS);
  auto lse_s = [&](int st) { return stats + st * 2 * Br; };
  auto Di_s = [&](int st) { return stats + st * 2 * Br + Br; };
  const unsigned bar_kv = s_k + STATS + STAGES * 2 * Br * 4;
  auto bar_full = [&](int st) { return bar_kv + 8 * (1 + st); };
  auto bar_empty = [&](int st) { return bar_kv + 8 * (1 + STAGES + st); };
  if (threadIdx.x == 0) {
    bwd_init_pipeline<STAGES, 2 * BWD_V2_3_WG, 4>(bar_kv, bar_full, bar_empty);
    mbar_fence_init();
  }
  __syncthreads();

  const BwdTile cta = bwd_tile<CAUSAL>(bh_offset);
  const int bh = cta.bh;
  const int b = bh / H, h = bh % H, hk = h / h_per_kv;
  const int kv_start = cta.j * Bc;
  const int q_first = first_q_start<CAUSAL, Br>(kv_start, causal_offset);
  const int n_blocks = q_first < Nq ? (Nq - q_first + Br - 1) / Br : 0;

  if (threadIdx.x < BWD_V2_3_WG) {
    // ---------------- producer: warp 0 (lane 0 issues the tensor copies) ----------------
    setmaxnreg_dec<BWD_V4_PRODUCER_REGS>();
    if (threadIdx.x >= 32) return;
    bwd_produce<HEAD_DIM, Br, Bc, STAGES, true>(&tmaps, s_k, s_v, s_q, s_do, lse_s, Di_s, bar_kv, bar_full,
                                                 bar_empty, lse + (long long)bh * Nq, Di + (long long)bh * Nq,
                                                 kv_start, q_first, n_blocks, Nq, h, hk, b, threadIdx.x, H + h,
                                                 H / h_per_kv + hk);
    return;
  }

  // ---------------- consumers ----------------
  setmaxnreg_inc<BWD_V4_CONSUMER_REGS>();
  const int tid = threadIdx.x - BWD_V2_3_WG, w = tid / BWD_V2_3_WG;
  const int warp = tid / 32 % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  // The block maxima split_blocks wrote (api._split_blocks: per batch, q's (H, TQ), k's and v's
  // (H_kv, TK), dO's (H, TQ) in turn): the CTA's k and v exponents here, q's and dO's per Q block
  // (loaded one block ahead).
  const int TQ = (Nq + SPLIT_BLOCK_ROWS - 1) / SPLIT_BLOCK_ROWS, TK = (Nk + SPLIT_BLOCK_ROWS - 1) / SPLIT_BLOCK_ROWS;
  const int H_kv = H / h_per_kv;
  const float* const amax_b = split_amax + (long long)b * (2 * H * TQ + 2 * H_kv * TK);
  const float* const amax_q = amax_b + h * TQ;
  const float* const amax_do = amax_b + H * TQ + 2 * H_kv * TK + h * TQ;
  const int ek = split_exponent(amax_b[H * TQ + hk * TK + cta.j]);
  const int ev = split_exponent(amax_b[H * TQ + H_kv * TK + hk * TK + cta.j]);
  float amax_qn = n_blocks > 0 ? amax_q[q_first / Br] : 0.0f, amax_don = n_blocks > 0 ? amax_do[q_first / Br] : 0.0f;
  constexpr int LOG2_D = HEAD_DIM == 64 ? 6 : 7;  // |dP| <= D max|dO| max|v| < 2^(LOG2_D + 15 - edo + 15 - ev)

  // Descriptors (16-byte units for the lo offsets).  K-major: A = K_j, V_j; B = Q_i, dO_i rows
  // RW w.. (S^T's, dP^T's); A = dS (dQ's).  MN-major: A = the P / dS tiles read as keys x rows
  // (dV's, dK's); B = dO_i, Q_i, K_j column panels.
  constexpr unsigned KV_LO = KV_BYTES >> 4, Q_LO = Q_BYTES >> 4, T_LO = T_BYTES >> 4;
  const unsigned long long k_desc = wgmma_desc_sw128(s_k), v_desc = wgmma_desc_sw128(s_v);
  // dQ's B: K_j's columns DW w.. (D=128) or all 64 (D=64: the k steps of keys 32 w..).
  const unsigned long long kn_desc = wgmma_desc_sw128(s_k + (COLSPLIT ? w : 0) * Bc * 128, Bc * 128);
  constexpr int KSTEP = (16 * 128) >> 4;  // 16 rows of a panel, in the descriptor's 16-byte units

  // Per Q block from zero (the tensor core), summed here in FP32.  D=128: dK, dV of columns DW w..;
  // D=64: warpgroup 0's dV, warpgroup 1's dK (in G; G2 unused).
  constexpr int NG = COLSPLIT ? 2 : 1;
  float G[NG][DW / 2], G_sum[NG][DW / 2];
#pragma unroll
  for (int a = 0; a < NG; ++a)
#pragma unroll
    for (int i = 0; i < DW / 2; ++i) G_sum[a][i] = 0.0f;

  const long long q_blocks = (Nq + Br - 1) / Br;
  float* const dq_bh = dq_accum + ((long long)bh * q_blocks + q_first / Br) * Br * HEAD_DIM;
  mbar_wait(bar_kv, 0);
  for (int n = 0; n < n_blocks; ++n) {
    const int st = n % STAGES, q_start = q_first + n * Br, q_w = RW * w, set = SETS == 2 ? n % 2 : 0;
    mbar_wait(bar_full(st), (n / STAGES) & 1);

    // This block's scales: S's and dP's unscale, dS's scale 2^f (|dS| < 2^E1 + 2^E2 <= 2^(14 - f)),
    // the unscales of its dQ, dK, dV products.  All powers of two.
    const int eq = split_exponent(amax_qn), edo = split_exponent(amax_don);
    if (n + 1 < n_blocks) amax_qn = amax_q[q_start / Br + 1], amax_don = amax_do[q_start / Br + 1];
    int E2 = -4 * SPLIT_EXP_MAX;  // no |D_i| > 0 in the block: the dP bound alone
    {
      const float d_max = lanes_max<32>(fmaxf(fabsf(Di_s(st)[lane]), fabsf(Di_s(st)[lane + 32])));
      if (d_max > 0.0f && isfinite(d_max)) frexpf(d_max, &E2);
    }
    const int f = min(max(14 - max(LOG2_D + 30 - edo - ev, E2), -SPLIT_EXP_MAX), SPLIT_EXP_MAX);
    const float scale_log2 = scalbnf(softmax_scale, -(eq + ek)) * TILEATTN_LOG2E;  // any sign: no max folded here
    const float s_vdo = scalbnf(1.0f, -(ev + edo)), ds_scale = scalbnf(1.0f, f);
    const float u_dq = scalbnf(softmax_scale, -(f + ek)), u_dk = scalbnf(1.0f, -(f + eq));
    const float u_dv = scalbnf(1.0f, -(15 + edo));

    // 1. S^T, dP^T over this warpgroup's rows q_w.. (k = D): lo products first, then hi hi.
    float S[RW / 2], dP[RW / 2];
    bwd_scores<__half, HEAD_DIM, RW, Bc, true, Br, 3>(S, dP, k_desc, v_desc, wgmma_desc_sw128(s_q(st) + q_w * 128),
                                                      wgmma_desc_sw128(s_do(st) + q_w * 128), KV_LO, Q_LO);

    // 2. P^T, dS^T hi / lo into rows q_w.. of the tile set.  One set (D=128): both warpgroups must
    //    be done with the last block's dQ, dV, dK, which read it.
    if constexpr (SETS == 1)
      if (n > 0) named_barrier_sync<2 * BWD_V2_3_WG>(2);
    {
      const unsigned tiles = s_tiles(set) + q_w * 128;  // (a multiple of 8 rows: the swizzle is unchanged)
      const float* lse_i = lse_s(st) + q_w;
      const float* Di_i = Di_s(st) + q_w;
      if (bwd_block_unmasked<CAUSAL>(q_start + q_w, RW, Nq, kv_start, Bc, Nk, causal_offset))
        bwd_v2_3_p_ds_step<STile, RW, CAUSAL, false>(S, dP, tiles, T_BYTES, lse_i, Di_i, kv_start, 16 * warp,
                                                     q_start + q_w, Nk, causal_offset, scale_log2, s_vdo, ds_scale,
                                                     lane);
      else
        bwd_v2_3_p_ds_step<STile, RW, CAUSAL, true>(S, dP, tiles, T_BYTES, lse_i, Di_i, kv_start, 16 * warp,
                                                    q_start + q_w, Nk, causal_offset, scale_log2, s_vdo, ds_scale,
                                                    lane);
    }

    // 3. Both warpgroups' rows in the tiles.
    named_barrier_sync<2 * BWD_V2_3_WG>(1);

    // 4. dQ_w (one commit group), then dV / dK (another), each from zero.
    const unsigned long long pt_desc = wgmma_desc_sw128(s_tiles(set));
    const unsigned long long dst_desc = wgmma_desc_sw128(s_tiles(set) + 2 * T_BYTES);
    const unsigned long long do_ndesc = wgmma_desc_sw128(s_do(st) + (COLSPLIT ? w : 0) * Br * 128, Br * 128);
    const unsigned long long q_ndesc = wgmma_desc_sw128(s_q(st) + (COLSPLIT ? w : 0) * Br * 128, Br * 128);
    float dq[DW / 2];
    constexpr int DQ_STEPS = COLSPLIT ? Bc / 16 : Bc / 32;  // D=64: keys 32 w .. 32 w + 31
    const int dq_step0 = COLSPLIT ? 0 : DQ_STEPS * w;
    wgmma_fence();
#pragma unroll
    for (int pass = 0; pass < 3; ++pass)
#pragma unroll
      for (int s = 0; s < DQ_STEPS; ++s) {
        const int ks = dq_step0 + s;
        H16::ss_bt(dq, dst_desc + (sw128_k_step(ks, Br) >> 4) + x3_a_lo(pass, T_LO),
                   kn_desc + ks * KSTEP + x3_b_lo(pass, KV_LO), pass > 0 || s > 0);
      }
    wgmma_commit();
    if constexpr (COLSPLIT) {
#pragma unroll
      for (int pass = 0; pass < 3; ++pass)
#pragma unroll
        for (int ks = 0; ks < Br / 16; ++ks) {
          const unsigned a = ks * KSTEP + x3_a_lo(pass, T_LO), b = ks * KSTEP + x3_b_lo(pass, Q_LO);
          H16::ss_tt(G[1], pt_desc + a, do_ndesc + b, pass > 0 || ks > 0);
          H16::ss_tt(G[0], dst_desc + a, q_ndesc + b, pass > 0 || ks > 0);
        }
    } else {  // warpgroup 0: dV = P^T dO; warpgroup 1: dK = dS^T Q
      const unsigned long long a_desc = w == 0 ? pt_desc : dst_desc, b_desc = w == 0 ? do_ndesc : q_ndesc;
#pragma unroll
      for (int pass = 0; pass < 3; ++pass)
#pragma unroll
        for (int ks = 0; ks < Br / 16; ++ks)
          H16::ss_tt(G[0], a_desc + ks * KSTEP + x3_a_lo(pass, T_LO), b_desc + ks * KSTEP + x3_b_lo(pass, Q_LO),
                     pass > 0 || ks > 0);
    }
    wgmma_commit();
    wgmma_wait<1>();  // dQ; dV and dK still run under the adds below
    fence_operands(dq);

    // 5. dQ_w into the block's chunk of the blocked accumulator (bwd_v5's layout, tile DW / 64 w
    //    at D=128; at D=64 both warpgroups add into the one tile).  Rows past Nq add zeros.
    float* const chunk = dq_bh + (long long)n * Br * HEAD_DIM + (COLSPLIT ? w : 0) * 64 * 64 + 4 * (tid % BWD_V2_3_WG);
#pragma unroll
    for (int n8 = 0; n8 < DW / 8; ++n8)
      red_add4(chunk + (n8 % 8) * 4 * BWD_V2_3_WG, u_dq * dq[4 * n8], u_dq * dq[4 * n8 + 1], u_dq * dq[4 * n8 + 2],
               u_dq * dq[4 * n8 + 3]);

    wgmma_wait<0>();
#pragma unroll
    for (int a = 0; a < NG; ++a) {
      fence_operands(G[a]);
      // G[a] is dK (its unscale u_dk) for a = 0 at D=128 and warpgroup 1 at D=64, else dV.
      const float u = (COLSPLIT ? a == 0 : w == 1) ? u_dk : u_dv;
#pragma unroll
      for (int i = 0; i < DW / 2; ++i) G_sum[a][i] = fmaf(G[a][i], u, G_sum[a][i]);
    }
    mbar_arrive(bar_empty(st));  // dV, dK have read the stage
  }

  // dK (scaled by softmax_scale in bwd_store_dkdv), dV: keys kv_start + 16 warp + g (+ 8), columns
  // col0 + 8 (i / 4) + 2t (+ 1).  D=64: warpgroup 1 hands its dK to warpgroup 0 through the stage
  // buffers (the pipeline is drained: the producer issues no copy past the last block).
  float dK[DW / 2], dV[DW / 2];
  if constexpr (COLSPLIT) {
#pragma unroll
    for (int i = 0; i < DW / 2; ++i) {
      dK[i] = G_sum[0][i];
      dV[i] = G_sum[1][i];
    }
  } else {
    float* const xchg = reinterpret_cast<float*>(smem + 4 * KV_BYTES) + (tid % BWD_V2_3_WG);
    named_barrier_sync<2 * BWD_V2_3_WG>(2);  // every product has read the stages
    if (w == 1) {
#pragma unroll
      for (int i = 0; i < DW / 2; ++i) xchg[i * BWD_V2_3_WG] = G_sum[0][i];
    }
    named_barrier_sync<2 * BWD_V2_3_WG>(1);
    if (w == 1) return;
#pragma unroll
    for (int i = 0; i < DW / 2; ++i) {
      dK[i] = xchg[i * BWD_V2_3_WG];
      dV[i] = G_sum[0][i];
    }
  }
  bwd_store_dkdv(dK, dV, TILEATTN_DKDV_DEST, nullptr, b, h, H, h_per_kv, Nk, kv_start + 16 * warp + g,
                 (COLSPLIT ? DW * w : 0) + 2 * t, HEAD_DIM, softmax_scale);
#endif
}

TILEATTN_SMEM_BYTES(bwd_v2_3, bwd_v2_3_smem(HEAD_DIM, Br, Bc));

}  // namespace tileattn
