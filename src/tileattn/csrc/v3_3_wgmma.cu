// v3.3: fp16/bf16 attention on Hopper's warpgroup MMA with warp specialisation (sm_90a).
//
// Why (v3.2's limits, measured on an H200): v3.2 issues mma.sync per warp, re-reading every K/V
// fragment from shared memory by ldmatrix in each of its 4 warps, and runs S -> softmax -> P V
// serially per warp with one other warp per scheduler to hide it (fixed-latency stalls, 63% tensor
// pipe).  Here:
//  * wgmma.m64nNk16: a consumer warpgroup (4 warps, 64 query rows) multiplies with Q, K and V read
//    by the tensor core straight from shared memory (P from registers); V is read N-major through
//    the descriptor's transpose bit, so the tiles stay as the copy engine wrote them.
//  * Warp specialisation: one thread of the producer warpgroup issues the TMA copies of Q, K and
//    V (v3.2's tensor maps, 64-column panels, 128-byte swizzle = wgmma's K-major and N-major
//    layouts) into two stages, counted by full mbarriers; the two consumer warpgroups (Br = 128,
//    two 64-row halves sharing every K/V block) release each K and V buffer on empty mbarriers.
//    The producer gives its registers to the consumers (setmaxnreg 24 / 240).
//  * Intra-warpgroup overlap: S_{j+1} = Q K_{j+1}^T and P_j V_j are issued back to back, and the
//    softmax of block j+1 runs on the CUDA cores while the tensor core still does P_j V_j (the
//    loop body is straight-line so that ptxas keeps the two wgmma groups in flight).  Measured
//    against the same kernel without it (TILEATTN_V3_3_NO_OVERLAP; H200, bf16, N=8192): +6% / +5%
//    at D=128, -1% / +8% at D=64 (non-causal / causal).
//  * O accumulates inside the tensor core across K/V blocks (FP32, rescaled by FFMA when the row
//    max moves), as in v3.x.
// Head dims 64, 128, 192 and 256 (whole 64-column panels); Br = 128, Bc = 128 up to D = 128 (160 KB
// of shared memory at D = 128) and 64 above (O takes 96-128 registers a thread; 192 KB at D = 256).
// Other head dims run v3.2 (up to 128) or v3.1.
#include "common.cuh"
#include "mma.cuh"  // pack2, mbarriers, tma_load_4d
#include "wgmma.cuh"

namespace tileattn {

constexpr int V3_3_WG = 128;              // threads per warpgroup
constexpr int V3_3_PRODUCER_REGS = 24;    // the producer only issues copies
constexpr int V3_3_CONSUMER_REGS = 240;   // (65536 / 384 rounded to 168) * 3 = 24 + 2 * 240

// Shared memory (versions.py sizes it): Q [Br][D], then two stages of K [Bc][D] and V [Bc][D]
// (16-bit, 64-column panels), then 9 mbarriers (Q; K and V full x2; K and V empty x2).

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(V3_3_WG * 3, 1) v3_3_fwd(TILEATTN_FWD_PARAMS(T)) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(T) == 2, "v3.3 is an fp16/bf16 rung");
  static_assert(Br == 128, "two consumer warpgroups of 64 query rows");
  static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256 && (Bc == 64 || Bc == 128), "whole 64-column panels");
  constexpr int STAGES = 2;
  constexpr int PANELS = HEAD_DIM / 64;
  constexpr int Q_BYTES = Br * HEAD_DIM * 2, KV_BYTES = Bc * HEAD_DIM * 2;

  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned s_q = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  auto s_k = [&](int s) { return s_q + Q_BYTES + s * KV_BYTES; };
  auto s_v = [&](int s) { return s_q + Q_BYTES + (STAGES + s) * KV_BYTES; };
  const unsigned bar_q = s_q + Q_BYTES + 2 * STAGES * KV_BYTES;
  auto bar_k_full = [&](int s) { return bar_q + 8 * (1 + s); };
  auto bar_v_full = [&](int s) { return bar_q + 8 * (3 + s); };
  auto bar_k_empty = [&](int s) { return bar_q + 8 * (5 + s); };
  auto bar_v_empty = [&](int s) { return bar_q + 8 * (7 + s); };

  if (threadIdx.x == 0) {
    for (int i = 0; i < 5; ++i) mbar_init(bar_q + 8 * i, 1);                   // the producer's one arrival
    for (int i = 5; i < 9; ++i) mbar_init(bar_q + 8 * i, 2 * V3_3_WG);         // every consumer thread
    mbar_fence_init();
  }
  __syncthreads();

  const int bh = blockIdx.y + bh_offset;
  const int q_start = blockIdx.x * Br;
  const int kv_limit = CAUSAL ? min(Nk, max(0, q_start + Br + causal_offset)) : Nk;
  const int Tc = (kv_limit + Bc - 1) / Bc;

  if (threadIdx.x < V3_3_WG) {
    // ---------------- producer: one thread issues every copy ----------------
    setmaxnreg_dec<V3_3_PRODUCER_REGS>();
    if (threadIdx.x != 0) return;
    const int b_ = bh / H, h_ = bh % H;
    // One tile = one TMA copy per 64-column panel (maps: q, k, v in `workspace`, 128 bytes each).
    auto tma_tile = [&](int map, unsigned dst, unsigned bar, int rows, int first_row) {
      mbar_arrive_expect_tx(bar, rows * HEAD_DIM * 2);
#pragma unroll
      for (int p = 0; p < PANELS; ++p)
        tma_load_4d(dst + p * rows * 128, static_cast<const char*>(static_cast<const void*>(workspace)) + 128 * map,
                    p * 64, first_row, map == 0 ? h_ : h_ / h_per_kv, b_, bar);
    };
    tma_tile(0, s_q, bar_q, Br, q_start);
    for (int j = 0; j < Tc; ++j) {
      const int s = j % STAGES;
      const unsigned empty_parity = ((j / STAGES) & 1) ^ 1;
      if (j >= STAGES) mbar_wait(bar_k_empty(s), empty_parity);
      tma_tile(1, s_k(s), bar_k_full(s), Bc, j * Bc);
      if (j >= STAGES) mbar_wait(bar_v_empty(s), empty_parity);
      tma_tile(2, s_v(s), bar_v_full(s), Bc, j * Bc);
    }
    return;
  }

  // ---------------- consumers: S = Q K^T, online softmax, O += P V ----------------
  setmaxnreg_inc<V3_3_CONSUMER_REGS>();
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  const int cwg = threadIdx.x / V3_3_WG - 1;
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row_a = q_start + cwg * 64 + warp * 16 + g, row_b = row_a + 8;
  // > 0, so max(s S) = s max(S) and the scale folds into one FFMA per score (api.py makes it >= 0).
  const float scale_log2 = fmaxf(softmax_scale * TILEATTN_LOG2E, 1e-30f);
  constexpr int NS = Bc / 2, NO = HEAD_DIM / 2;  // accumulator values per thread: S (64 x Bc), O (64 x D)
#ifdef TILEATTN_V3_3_NO_OVERLAP
  constexpr bool OVERLAP = false;
#else
  constexpr bool OVERLAP = true;
#endif

  float m_i[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
  float l_i[2] = {0.0f, 0.0f};
  float acc[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) acc[i] = 0.0f;

  // Descriptors: Q and K K-major (k16 step kk: panel kk / 4, 32 bytes per step inside the row);
  // this warpgroup's Q rows start 64 rows into each panel.  V N-major: k16 step ks starts 16 key
  // rows (2048 bytes) further; the next 64 columns of d are the next panel (leading byte offset).
  const unsigned long long dq = wgmma_desc_sw128(s_q + cwg * 64 * 128);
  mbar_wait(bar_q, 0);  // even with no K/V block: no copy may outlive the CTA

  // S = Q K_j^T into S (asynchronous: issued, committed, not waited for).
  auto issue_s = [&](float (&S)[NS], int j) {
    const unsigned long long dk = wgmma_desc_sw128(s_k(j % STAGES));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
      Wgmma16<T>::ss(S, dq + (((kk / 4) * Br * 128 + (kk % 4) * 32) >> 4),
                     dk + (((kk / 4) * Bc * 128 + (kk % 4) * 32) >> 4), kk > 0);
    wgmma_commit();
  };
  // acc += P V_j (asynchronous), V read N-major: k16 step ks starts 16 key rows (2048 bytes)
  // further; the next 64 columns of d are the next panel (the leading byte offset).
  unsigned p[Bc / 16][4];
  auto issue_pv = [&](int j) {
    const unsigned long long dv = wgmma_desc_sw128(s_v(j % STAGES), Bc * 128);
    fence_operands(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Bc / 16; ++ks) Wgmma16<T>::rs_bt(acc, p[ks], dv + ((ks * 16 * 128) >> 4), 1);
    wgmma_commit();
  };
  // Online softmax of block j's scores, in place: mask, rebase to the new row max (log2 domain,
  // the scale folded into one FFMA per score), S = exp2(...), l_i and scale_old updated.
  float scale_old[2];
  auto softmax = [&](float (&S)[NS], int j) {
    const int kv_start = j * Bc;
    const bool needs_mask = kv_start + Bc > Nk || (CAUSAL && kv_start + Bc - 1 > q_start + causal_offset);
    const int kend_a = key_end<CAUSAL>(row_a, Nk, causal_offset);
    const int kend_b = key_end<CAUSAL>(row_b, Nk, causal_offset);
    float m_tile[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int r = i % 4, key = kv_start + (i / 4) * 8 + 2 * t + (r & 1);
      if (needs_mask && key >= (r < 2 ? kend_a : kend_b)) S[i] = TILEATTN_NEG_INF;
      m_tile[r / 2] = fmaxf(m_tile[r / 2], S[i]);
    }
    float m_base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m_i[h], lanes_max<4>(m_tile[h]) * scale_log2);
      m_base[h] = safe_max(m_new);
      scale_old[h] = exp2_ftz(m_i[h] - m_base[h]);  // 0 on the first visible block
      m_i[h] = m_new;
      l_i[h] *= scale_old[h];
    }
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      S[i] = exp2_ftz(fmaf(S[i], scale_log2, -m_base[(i % 4) / 2]));
      l_i[(i % 4) / 2] += S[i];
    }
  };
  // P as 16-bit A fragments of P V (k16 step ks = S's n8 tiles 2ks, 2ks + 1: rows g / g + 8 of
  // the even tile are a0 / a1, of the odd tile a2 / a3), and O rebased to the new row max.
  auto to_p_and_rescale = [&](const float (&S)[NS]) {
#pragma unroll
    for (int i = 0; i < NS; i += 2) {
      const int n8 = i / 4;
      p[n8 / 2][(n8 % 2) * 2 + (i % 4) / 2] = pack2<T>(S[i], S[i + 1]);
    }
#pragma unroll
    for (int i = 0; i < NO; ++i) acc[i] *= scale_old[(i % 4) / 2];
  };

  if constexpr (!OVERLAP) {
    for (int j = 0; j < Tc; ++j) {
      const int s = j % STAGES;
      float S[NS];
      mbar_wait(bar_k_full(s), (j / STAGES) & 1);
      issue_s(S, j);
      wgmma_wait<0>();
      fence_operands(S);
      mbar_arrive(bar_k_empty(s));
      softmax(S, j);
      to_p_and_rescale(S);
      mbar_wait(bar_v_full(s), (j / STAGES) & 1);
      issue_pv(j);
      wgmma_wait<0>();
      fence_operands(acc);
      mbar_arrive(bar_v_empty(s));
    }
  } else if (Tc > 0) {  // (OVERLAP)
    // Intra-warpgroup pipelining: S_{j+1} = Q K_{j+1}^T and P_j V_j are issued together, and the
    // softmax of block j+1 runs on the CUDA cores while the tensor core does P_j V_j.  p and acc
    // belong to the in-flight P V until its wait (fence_operands keeps their registers pinned).
    {
      float S[NS];
      mbar_wait(bar_k_full(0), 0);
      issue_s(S, 0);
      wgmma_wait<0>();
      fence_operands(S);
      mbar_arrive(bar_k_empty(0));
      softmax(S, 0);
      to_p_and_rescale(S);
    }
    for (int j = 0; j + 1 < Tc; ++j) {  // straight-line body: ptxas tracks the two groups
      const int s = j % STAGES, s1 = (j + 1) % STAGES;
      float S[NS];
      mbar_wait(bar_k_full(s1), ((j + 1) / STAGES) & 1);
      issue_s(S, j + 1);
      mbar_wait(bar_v_full(s), (j / STAGES) & 1);
      issue_pv(j);
      wgmma_wait<1>();  // S_{j+1} done (groups complete in order), P_j V_j may still run
      fence_operands(S);
      mbar_arrive(bar_k_empty(s1));
      softmax(S, j + 1);
      wgmma_wait<0>();
      fence_operands(acc);
      fence_operands(p);
      mbar_arrive(bar_v_empty(s));
      to_p_and_rescale(S);
    }
    const int last = Tc - 1;
    mbar_wait(bar_v_full(last % STAGES), (last / STAGES) & 1);
    issue_pv(last);
    wgmma_wait<0>();
    fence_operands(acc);
    mbar_arrive(bar_v_empty(last % STAGES));
  }

  // Epilogue: finish l_i across the quad, write O (pairs of 16-bit values) and lse.
  constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = lanes_sum<4>(l_i[h]);
    const int row = h == 0 ? row_a : row_b;
    if (row >= Nq) continue;
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    T* o_row = hs.o + row * o_sn;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n)
      *reinterpret_cast<unsigned*>(o_row + n * 8 + 2 * t) = pack2<T>(acc[4 * n + 2 * h] * inv_l, acc[4 * n + 2 * h + 1] * inv_l);
    if (t == 0) hs.lse[row] = row_lse(m_i[h] * LN2, l);
  }
#endif
}

}  // namespace tileattn
