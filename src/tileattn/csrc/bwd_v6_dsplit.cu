// bwd_v6: the head dim split between the consumer warpgroups, for D=256 on Hopper (sm_90a, fp16 /
// bf16): bwd_v5's warp-specialised CTA where each consumer warpgroup owns half of the columns of
// dK_j, dV_j and dQ_i instead of half of the keys.
//
// Why: bwd_v4 / bwd_v5 give each consumer warpgroup 64 keys and their whole rows of dK and dV in
// registers, 2 x 64 x D / 128 = D floats a thread: 256 at D=256, more than a thread holds.  bwd_v2
// (mma.sync, 64 keys a CTA) ran D=256 at 151 TFLOP/s on an H200, 0.58x FA2 and 0.42x cuDNN
// (bench/NOTES.md).  FlashAttention-3 also runs head dim 256 with its own tile shape there
// (hopper/flash_bwd_launch_template.h: 64 query rows x 80 keys, one Q / dO stage, dK and dV with
// the operands swapped so that the head dim is wgmma's M).
//
// One CTA per (K/V block j of Bc = 64 keys, batch * head): a producer warp streams Q_i, dO_i (TMA)
// and lse_i, D_i into two stages, as bwd_v4's; consumer warpgroup w (w = 0, 1) owns columns
// DW w .. DW w + DW - 1 (DW = D / 2 = 128) of dK_j and dV_j (64 registers each).  Per Q block of
// Br = 64 rows, with the keys as wgmma's M throughout:
//   1. S^T = K_j Q_w^T and dP^T = V_j dO_w^T over warpgroup w's 32 query rows RW w .. (SS, m64n32,
//      k over all D columns): the warpgroups split the rows, so no product is computed twice;
//   2. P^T and dS^T of those rows (bwd_p_ds, as bwd_v4), stored by stmatrix.trans into the P and
//      dS tiles ([query row][key], 64 x 64, double-buffered so that a warpgroup running one block
//      ahead writes the other pair);
//   3. the two warpgroups meet (named barrier 1): both halves of each tile are in shared memory;
//   4. dQ_w = dS K_j[:, w] (SS, A the dS tile K-major, B K's two column panels N-major), one
//      commit group; dV_w += P^T dO_i[:, w] and dK_w += dS^T Q_i[:, w] (SS, A the P / dS tile read
//      transposed: keys as M, rows as k; B N-major, 16 rows a k-step), another;
//   5. while dV and dK run, dQ_w (64 x 128, 64 registers) is added into the blocked dq_accum
//      (bwd_v5's layout: 64 x 64 tiles in the accumulator's order, which backward.py's
//      bwd_dq_convert puts back) by 16 red.global.add.v4 a thread, 512 contiguous bytes a warp;
//      once dV and dK are done the stage is released.
// Shared memory: K_j, V_j (32 KB each), two stages of Q_i, dO_i (64 KB a stage), two pairs of P /
// dS tiles (8 KB each): 224 KB of the 227.  bwd_v5's dQ tiles (64 KB here) do not fit beside
// them, hence the red adds.
// Not deterministic (the dQ adds land in any order): deterministic=True runs bwd_v2 at D=256
// (TILEATTN_BWD_V6_ORDERED, below, is the mode, not yet run).
#include "bwd_common.cuh"
#include "bwd_wgmma.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace tileattn {

constexpr int BWD_V6_WG = 128;

// TILEATTN_BWD_V6_ORDERED (an experiment, default 0; built, not yet run on a GPU): deterministic
// mode's dQ adds (bwd_common.cuh's order: K/V block j adds into a Q block's dQ after blocks 0 ..
// j - 1).  Each warpgroup adds its own columns, so one thread of each waits for the turn and the
// count moves on once both have added.  Until it has run, versions.py keeps bwd_v6 out of
// deterministic mode (deterministic=True runs bwd_v2 at D=256); with it on, the dQ adds of a
// block no longer overlap the next block's wait.
#ifndef TILEATTN_BWD_V6_ORDERED
#define TILEATTN_BWD_V6_ORDERED 0
#endif
constexpr int BWD_V6_STAGES = 2;  // Q_i / dO_i / lse_i / D_i stages (two fill 224 KB at D=256)

// K_j, V_j (Bc x D), the stages' Q_i and dO_i (Br x D), two pairs of P / dS tiles (Br x Bc), all
// 16-bit SwizzledTiles of whole 1024-byte multiples; the stages' lse_i and D_i; the mbarriers.
__host__ __device__ constexpr int bwd_v6_smem(int D, int Br, int Bc) {
  return (2 * Bc * D + BWD_V6_STAGES * 2 * Br * D + 2 * 2 * Br * Bc) * 2 + BWD_V6_STAGES * 2 * Br * 4 +
         (1 + 2 * BWD_V6_STAGES) * 8;
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(3 * BWD_V6_WG, 1)
    bwd_v6(TILEATTN_BWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(T) == 2, "bwd_v6 takes 16-bit (fp16 / bf16) inputs");
  static_assert(Br == 64 && Bc == 64, "wgmma's M = the CTA's 64 keys; two warpgroups of 32 query rows");
  static_assert(HEAD_DIM % 128 == 0 && HEAD_DIM <= 256, "two halves of whole 64-column panels; 224 KB at D=256");
  constexpr int STAGES = BWD_V6_STAGES;
  constexpr int RW = Br / 2;        // query rows of S^T, dP^T a warpgroup
  constexpr int DW = HEAD_DIM / 2;  // columns of dK, dV, dQ a warpgroup
  constexpr int Q_BYTES = Br * HEAD_DIM * 2, KV_BYTES = Bc * HEAD_DIM * 2, T_BYTES = Br * Bc * 2;
  using STile = SwizzledTile<Br, Bc>;  // P and dS, [query row][key]: one 64-key panel

  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned s_k = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned s_v = s_k + KV_BYTES;
  auto s_q = [&](int st) { return s_k + 2 * KV_BYTES + st * 2 * Q_BYTES; };
  auto s_do = [&](int st) { return s_q(st) + Q_BYTES; };
  auto s_p = [&](int buf) { return s_q(STAGES) + buf * 2 * T_BYTES; };
  auto s_ds = [&](int buf) { return s_p(buf) + T_BYTES; };
  float* const stats = reinterpret_cast<float*>(smem + 2 * KV_BYTES + STAGES * 2 * Q_BYTES + 4 * T_BYTES);
  auto lse_s = [&](int st) { return stats + st * 2 * Br; };
  auto Di_s = [&](int st) { return stats + st * 2 * Br + Br; };
  // mbarriers, as bwd_v4's: kv (K_j, V_j), full[st] (Q_i, dO_i by the copy engine, lse_i, D_i by
  // the producer's 32 lanes), empty[st] (the 256 consumer threads).
  const unsigned bar_kv = s_k + 2 * KV_BYTES + STAGES * 2 * Q_BYTES + 4 * T_BYTES + STAGES * 2 * Br * 4;
  auto bar_full = [&](int st) { return bar_kv + 8 * (1 + st); };
  auto bar_empty = [&](int st) { return bar_kv + 8 * (1 + STAGES + st); };
  if (threadIdx.x == 0) {
    bwd_init_pipeline<STAGES, 2 * BWD_V6_WG>(bar_kv, bar_full, bar_empty);
    mbar_fence_init();
  }
  __syncthreads();

  const BwdTile cta = bwd_tile<CAUSAL>(bh_offset);
  const int bh = cta.bh;
  const int b = bh / H, h = bh % H, hk = h / h_per_kv;
  const int kv_start = cta.j * Bc;
  const int q_first = first_q_start<CAUSAL, Br>(kv_start, causal_offset);
  const int n_blocks = q_first < Nq ? (Nq - q_first + Br - 1) / Br : 0;

  if (threadIdx.x < BWD_V6_WG) {
    // ---------------- producer: warp 0 (lane 0 issues the tensor copies) ----------------
    setmaxnreg_dec<BWD_V4_PRODUCER_REGS>();
    if (threadIdx.x >= 32) return;
    bwd_produce<HEAD_DIM, Br, Bc, STAGES>(&tmaps, s_k, s_v, s_q, s_do, lse_s, Di_s, bar_kv, bar_full, bar_empty,
                                           lse + (long long)bh * Nq, Di + (long long)bh * Nq, kv_start, q_first,
                                           n_blocks, Nq, h, hk, b, threadIdx.x);
    return;
  }

  // ---------------- consumers: warpgroup w owns columns DW w .. of dK, dV and dQ ----------------
  setmaxnreg_inc<BWD_V4_CONSUMER_REGS>();
  const int tid = threadIdx.x - BWD_V6_WG, w = tid / BWD_V6_WG;
  const int warp = tid / 32 % 4, lane = tid % 32, g = lane / 4, t = lane % 4;

  // Descriptors.  K-major: A = K_j, V_j (all 64 keys), B = Q_i, dO_i rows RW w.. (S^T's, dP^T's;
  // 32 rows of each Br-row panel); A = dS (dQ's).  MN-major: A = the P / dS tiles read as keys x
  // rows (dV's, dK's), B = dO_i, Q_i columns DW w.. (panels 2w, 2w + 1), B = K_j's the same.
  const unsigned long long k_desc = wgmma_desc_sw128(s_k), v_desc = wgmma_desc_sw128(s_v);
  const unsigned long long kn_desc = wgmma_desc_sw128(s_k + (DW / 64) * w * Bc * 128, Bc * 128);
  constexpr int KSTEP = (16 * 128) >> 4;  // 16 rows of a panel, in the descriptor's 16-byte units

  float dK[DW / 2], dV[DW / 2];
#pragma unroll
  for (int i = 0; i < DW / 2; ++i) dK[i] = dV[i] = 0.0f;

  const float scale_log2 = softmax_scale * TILEATTN_LOG2E;  // any sign: no max is folded here
  const long long q_blocks = (Nq + Br - 1) / Br;
  float* const dq_bh = dq_accum + ((long long)bh * q_blocks + q_first / Br) * Br * HEAD_DIM;
  mbar_wait(bar_kv, 0);
  for (int n = 0; n < n_blocks; ++n) {
    const int st = n % STAGES, q_start = q_first + n * Br, q_w = RW * w;
    mbar_wait(bar_full(st), (n / STAGES) & 1);

    // 1. S^T, dP^T over this warpgroup's rows q_w.. (waited for).  (Issuing block n + 1's behind
    //    block n's dV and dK instead, bwd_v4's PIPE order, measured 1-3% slower on an H200:
    //    bench/NOTES.md.)
    float S[RW / 2], dP[RW / 2];
    bwd_scores<T, HEAD_DIM, RW, Bc, true, Br>(S, dP, k_desc, v_desc, wgmma_desc_sw128(s_q(st) + q_w * 128),
                                              wgmma_desc_sw128(s_do(st) + q_w * 128));

    // 2. P^T, dS^T into rows q_w.. of this block's P and dS tiles.
    unsigned p_frag[RW / 16][4], ds_frag[RW / 16][4];
    const unsigned rows = q_w * 128;  // (a multiple of 8 rows: the swizzle is unchanged)
    bwd_p_ds<T, STile, RW, CAUSAL, true>(S, dP, p_frag, ds_frag, s_ds(n % 2) + rows, lse_s(st) + q_w, Di_s(st) + q_w,
                                         kv_start, Bc, 16 * warp, q_start + q_w, Nq, Nk, causal_offset, scale_log2,
                                         lane, s_p(n % 2) + rows);

    // 3. Both warpgroups' rows in the tiles.
    named_barrier_sync<2 * BWD_V6_WG>(1);

    // 4. dQ_w (k = the 64 keys), then dV_w, dK_w (k = the block's 64 rows): two commit groups.
    const unsigned long long pt_desc = wgmma_desc_sw128(s_p(n % 2)), dst_desc = wgmma_desc_sw128(s_ds(n % 2));
    const unsigned long long do_ndesc = wgmma_desc_sw128(s_do(st) + (DW / 64) * w * Br * 128, Br * 128);
    const unsigned long long q_ndesc = wgmma_desc_sw128(s_q(st) + (DW / 64) * w * Br * 128, Br * 128);
    float dq[DW / 2];
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Bc / 16; ++ks)
      Wgmma16<T>::ss_bt(dq, dst_desc + (sw128_k_step(ks, Br) >> 4), kn_desc + ks * KSTEP, ks > 0);
    wgmma_commit();
#pragma unroll
    for (int ks = 0; ks < Br / 16; ++ks) {
      Wgmma16<T>::ss_tt(dV, pt_desc + ks * KSTEP, do_ndesc + ks * KSTEP, 1);
      Wgmma16<T>::ss_tt(dK, dst_desc + ks * KSTEP, q_ndesc + ks * KSTEP, 1);
    }
    wgmma_commit();
    wgmma_wait<1>();  // dQ; dV and dK still run under the adds below (dQ first: 381 -> 413 TFLOP/s
                      // at N=8192 on an H200 against dV, dK first and the adds after both)
    fence_operands(dq);

    // 5. dQ_w into its two 64 x 64 tiles of the block's chunk (tile DW / 64 w + n8 / 8), each
    //    thread's four values of n8 at [n8 % 8][thread], the order bwd_dq_convert reads.  Rows past
    //    Nq add zeros (their dS is 0) into the chunk's padding.
    float* const chunk = dq_bh + (long long)n * Br * HEAD_DIM + (DW / 64) * w * 64 * 64 + 4 * (tid % BWD_V6_WG);
#if TILEATTN_BWD_V6_ORDERED
    int* const count = dq_count<Br>(dq_semaphore, bh, Nq, q_start);  // null in the default mode
    if (count) {
      if (tid % BWD_V6_WG == 0) wait_for_turn(count, cta.j);
      named_barrier_sync<BWD_V6_WG>(2 + w);
    }
#endif
#pragma unroll
    for (int n8 = 0; n8 < DW / 8; ++n8)
      red_add4(chunk + (n8 / 8) * 64 * 64 + (n8 % 8) * 4 * BWD_V6_WG, softmax_scale * dq[4 * n8],
               softmax_scale * dq[4 * n8 + 1], softmax_scale * dq[4 * n8 + 2], softmax_scale * dq[4 * n8 + 3]);
#if TILEATTN_BWD_V6_ORDERED
    if (count) {
      __threadfence();  // this thread's adds, device-wide, before the count moves on
      named_barrier_sync<2 * BWD_V6_WG>(4);
      if (tid == 0) atomicAdd(count, 1);
    }
#endif

    wgmma_wait<0>();
    fence_operands(dV);
    fence_operands(dK);
    mbar_arrive(bar_empty(st));  // dV, dK have read the stage
  }

  // dK_w, dV_w (keys kv_start + 16 warp + g (+ 8), columns DW w + 8 (i / 4) + 2t (+ 1)); in
  // deterministic mode (ORDERED) per query head under GQA, summed by torch (store_dkdv).
  bwd_store_dkdv(dK, dV, TILEATTN_DKDV_DEST, TILEATTN_BWD_V6_ORDERED ? dq_semaphore : nullptr, b, h, H, h_per_kv, Nk,
                 kv_start + 16 * warp + g, DW * w + 2 * t, HEAD_DIM, softmax_scale);
#endif
}

TILEATTN_SMEM_BYTES(bwd_v6, bwd_v6_smem(HEAD_DIM, Br, Bc));

}  // namespace tileattn
