// v2.3: FP32-accurate attention (3xTF32) on Hopper's warpgroup MMA, with a producer warpgroup
// that splits K and V while the consumers multiply (sm_90a).
//
// Why (v2.2's limits, measured on an H200 at D=128): v2.2 runs 8 warps that all split the K/V
// block into TF32 hi/lo halves, wait at a barrier, then all multiply; nothing overlaps the split
// (dropping it: +17%) or the copies (+12%), and mma.sync's B fragments are re-read from shared
// memory by every warp.  Here:
//  * wgmma.m64nNk8 TF32: a consumer warpgroup (4 warps, 64 query rows) multiplies with operands
//    read by the tensor core straight from shared memory (Q, K, V^T) or registers (P): no
//    ldmatrix, and each K/V element is read once per 64 rows instead of once per 16.
//  * Warp specialisation: warpgroup 0 (the producer) loads Q, K and V with 16-byte global loads
//    into registers, one block ahead, splits them into hi/lo and stores them in wgmma's 128-byte
//    swizzled K-major layout; warpgroups 1 and 2 (the consumers, Br = 128: two 64-row halves of
//    the Q tile sharing every K/V block) run S = Q K^T, the online softmax and O += P V.  They
//    hand buffers over with mbarriers (full: producer -> consumers, empty: back), K and V
//    separately, so K_{j+1} is written while the consumers are still on P_j V_j.  While one
//    consumer does its softmax the other's wgmma keeps the tensor cores busy.
//  * TF32 wgmma takes K-major operands only, so V is stored transposed (rows d, columns keys) by
//    the producer, its keys in the permuted order that lets P's accumulator fragment be the A
//    operand of P V directly (tf32x3.cuh).
//
// Numerics are v2.2's: S = Q_lo K_hi + Q_hi K_lo + Q_hi K_hi (small terms first) accumulated in
// the tensor core over d; softmax in FP32 with exp2 and the scale folded; P V of each K/V block
// accumulated from zero by the tensor core and merged into O in FP32 FFMA (acc = scale_old * acc +
// pv), because the tensor core's accumulation across all blocks is not round-to-nearest and its
// error grows with N (see v2_2_tf32x3.cu).
//
// v3.3's shared pieces (fragment_online_softmax / fragment_store_rows, KVBarriers, q_block) were
// tried here too (0af6b0c, FP32 suite, bench/results/sweeps/fp32_0af6b0c_v2.3_shared_helpers.json,
// against results/fp32.json; v2.2, unchanged, measured 0.99-1.00x between the two runs): D=32 0.71x /
// 0.74x, v2.3_tf32 0.68x / 0.71x at D=32 and 0.89x / 0.92x at D=128, v2.3 at D=64 and 128 0.98-1.06x.
// So v2.3 keeps its own versions, the code that was measured.
// Resources (384 threads, one CTA per SM, 168 registers per thread): shared memory holds Q hi/lo
// [Br][D] and per stage K hi/lo [Bc][D], V^T hi/lo [D][Bc]; two stages where they fit (D <= 64,
// Bc = 64: 192 KB) and one at D = 128 (Bc = 32: 192 KB).  At D = 128, P V's accumulator for all
// of D does not fit beside O and P, so it runs in two 64-column slices (OPARTS below).
// Measured (H200, B=4, H=8, N=8192, vs one warpgroup of 64 rows): two consumers 1.32x at D=64
// (97.9 vs 73.4 TFLOP/s at Bc=64), 1.15x at D=128 (87.7 vs 76.0, Bc=32 vs 64).
#include "softmax.cuh"
#include "mma.cuh"  // mbarrier helpers
#include "tf32x3.cuh"
#include "wgmma.cuh"

namespace tileattn {

// An R x C FP32 tile, K-major (C contiguous) in 32-column panels of R rows x 128 bytes, with the
// 128-byte swizzle wgmma_desc_sw128 describes.  Byte offset of element (r, c):
template <int R, int C>
struct Sw128Tile {
  static_assert(R % 8 == 0 && C % 32 == 0, "whole 8-row swizzle atoms and 32-column panels");
  static constexpr int BYTES = R * C * 4;
  __device__ __forceinline__ static int offset(int r, int c) {
    return (c / 32) * R * 128 + r * 128 + ((((c % 32) / 4) ^ (r % 8)) * 16) + (c % 4) * 4;
  }
  // Descriptor offset (bytes) of k8 step kk.
  __device__ __forceinline__ static constexpr int k_step(int kk) { return sw128_k_step(kk, R); }
};

// Four consecutive values of row r, columns c4..c4+3, split into TF32 hi/lo and stored with one
// 16-byte store into each of two tiles of the same layout (SPLIT), or stored as they are (TF32).
template <typename Tile, bool SPLIT>
__device__ __forceinline__ void split_store(const float4& x, unsigned hi_tile, unsigned lo_tile, int r, int c4) {
  const unsigned off = Tile::offset(r, c4);
  if (!SPLIT) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(hi_tile + off), "f"(x.x), "f"(x.y), "f"(x.z),
                 "f"(x.w) : "memory");
    return;
  }
  uint4 hi, lo;
  split_tf32x4(x, hi, lo);
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(hi_tile + off), "r"(hi.x), "r"(hi.y), "r"(hi.z),
               "r"(hi.w) : "memory");
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(lo_tile + off), "r"(lo.x), "r"(lo.y), "r"(lo.z),
               "r"(lo.w) : "memory");
}

// Shared memory: Q, and per stage K and V^T, each as hi and lo tiles (SPLIT) or one TF32 tile,
// then 1 + 4 * stages mbarriers.  Two stages where they fit in 227 KB, else one (versions.py
// mirrors this).
__host__ __device__ constexpr int v2_3_smem_bytes(int D, int Br, int Bc, bool split, int stages) {
  return (split ? 2 : 1) * (Br * D + stages * 2 * Bc * D) * 4 + (1 + 4 * stages) * 8;
}
__host__ __device__ constexpr int v2_3_stages(int D, int Br, int Bc, bool split) {
  return v2_3_smem_bytes(D, Br, Bc, split, 2) <= 227 * 1024 ? 2 : 1;
}

constexpr int V2_3_WG = 128;  // threads per warpgroup

// Br = 64 * consumer warpgroups (1 or 2, sharing each K/V block); one producer warpgroup.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, bool SPLIT>
__device__ __forceinline__ void v2_3_body(TILEATTN_FWD_PARAMS(T)) {
  static_assert(sizeof(T) == 4, "v2.3 is an FP32 rung");
  static_assert(Br == 64 || Br == 128, "one or two consumer warpgroups of 64 query rows");
  constexpr int CONSUMERS = Br / 64;
  static_assert(Bc % 32 == 0 && HEAD_DIM % 32 == 0 && Bc <= 128 && HEAD_DIM <= 128, "wgmma N and 32-column panels");
  constexpr int STAGES = v2_3_stages(HEAD_DIM, Br, Bc, SPLIT);
  using QTile = Sw128Tile<Br, HEAD_DIM>;
  using KTile = Sw128Tile<Bc, HEAD_DIM>;
  using VTile = Sw128Tile<HEAD_DIM, Bc>;  // V^T: rows d, columns (permuted) keys
  constexpr int PARTS = SPLIT ? 2 : 1;  // hi and lo tiles, or one
  constexpr int STAGE_BYTES = PARTS * (KTile::BYTES + VTile::BYTES);

  // Layout: Q_hi, Q_lo, then per stage K_hi, K_lo, V_hi, V_lo (all 1024-byte aligned; no _lo tiles
  // without SPLIT), then the mbarriers.
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned s_base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned s_qhi = s_base, s_qlo = s_qhi + (PARTS - 1) * QTile::BYTES;
  const unsigned s_stage0 = s_base + PARTS * QTile::BYTES;
  auto s_khi = [&](int s) { return s_stage0 + s * STAGE_BYTES; };
  auto s_klo = [&](int s) { return s_khi(s) + (PARTS - 1) * KTile::BYTES; };
  auto s_vhi = [&](int s) { return s_khi(s) + PARTS * KTile::BYTES; };
  auto s_vlo = [&](int s) { return s_vhi(s) + (PARTS - 1) * VTile::BYTES; };
  const unsigned bar_q = s_stage0 + STAGES * STAGE_BYTES;
  auto bar_k_full = [&](int s) { return bar_q + 8 * (1 + s); };
  auto bar_v_full = [&](int s) { return bar_q + 8 * (1 + STAGES + s); };
  auto bar_k_empty = [&](int s) { return bar_q + 8 * (1 + 2 * STAGES + s); };
  auto bar_v_empty = [&](int s) { return bar_q + 8 * (1 + 3 * STAGES + s); };

  if (threadIdx.x == 0) {
    // Every phase waits for all threads of the other side: the producer warpgroup (Q, full),
    // every consumer warpgroup (empty).
    for (int i = 0; i < 1 + 2 * STAGES; ++i) mbar_init(bar_q + 8 * i, V2_3_WG);
    for (int i = 1 + 2 * STAGES; i < 1 + 4 * STAGES; ++i) mbar_init(bar_q + 8 * i, CONSUMERS * V2_3_WG);
    mbar_fence_init();
  }
  __syncthreads();

  const int bh = blockIdx.y + bh_offset;
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  const int q_start = blockIdx.x * Br;
  const int kv_limit = CAUSAL ? min(Nk, max(0, q_start + Br + causal_offset)) : Nk;
  const int Tc = (kv_limit + Bc - 1) / Bc;

  if (threadIdx.x < V2_3_WG) {
    // ---------------- producer warpgroup: global -> registers -> hi/lo -> swizzled shared ----------------
    const int tid = threadIdx.x;
    // Row-major tiles (Q, K): thread tid takes float4 columns; a warp covers one 512-byte row at
    // D = 128 (coalesced), and 8 consecutive lanes write one 128-byte swizzled row (conflict-free).
    constexpr int VEC_PER_ROW = HEAD_DIM / 4;
    auto load_row_vec = [&](const float* g, long long sn, int row, int nrows, int c4) {
      return row < nrows ? *reinterpret_cast<const float4*>(g + row * sn + c4) : make_float4(0.f, 0.f, 0.f, 0.f);
    };

    // Q, once.
    {
      constexpr int QV = Br * VEC_PER_ROW / V2_3_WG;
      float4 x[QV];
#pragma unroll
      for (int it = 0; it < QV; ++it) {
        const int i = tid + it * V2_3_WG, r = i / VEC_PER_ROW, c4 = (i % VEC_PER_ROW) * 4;
        x[it] = load_row_vec(hs.q, q_sn, q_start + r, Nq, c4);
      }
#pragma unroll
      for (int it = 0; it < QV; ++it) {
        const int i = tid + it * V2_3_WG, r = i / VEC_PER_ROW, c4 = (i % VEC_PER_ROW) * 4;
        split_store<QTile, SPLIT>(x[it], s_qhi, s_qlo, r, c4);
      }
      fence_proxy_async_smem();
      mbar_arrive(bar_q);
    }

    // K block: KV float4 per thread, row-major like Q.  V block: thread tid takes key tid % Bc
    // (32 consecutive keys per warp) and 8 consecutive d (two float4, one 32-byte sector); its
    // transposed scalar stores of one d land in 32 distinct banks (32 keys = one swizzled row).
    constexpr int KV = Bc * VEC_PER_ROW / V2_3_WG;
    constexpr int VV = Bc * (HEAD_DIM / 8) / V2_3_WG;
    static_assert(KV * V2_3_WG == Bc * VEC_PER_ROW && VV * V2_3_WG == Bc * HEAD_DIM / 8, "whole passes");
    float4 kx[KV], vx[VV][2];
    auto load_k = [&](int kv_start) {
#pragma unroll
      for (int it = 0; it < KV; ++it) {
        const int i = tid + it * V2_3_WG, r = i / VEC_PER_ROW, c4 = (i % VEC_PER_ROW) * 4;
        kx[it] = load_row_vec(hs.k, k_sn, kv_start + r, Nk, c4);
      }
    };
    auto load_v = [&](int kv_start) {
#pragma unroll
      for (int it = 0; it < VV; ++it) {
        const int i = tid + it * V2_3_WG, key = i % Bc, d8 = (i / Bc) * 8;
        vx[it][0] = load_row_vec(hs.v, v_sn, kv_start + key, Nk, d8);
        vx[it][1] = load_row_vec(hs.v, v_sn, kv_start + key, Nk, d8 + 4);
      }
    };
    if (Tc > 0) {
      load_k(0);
      load_v(0);
    }
    for (int j = 0; j < Tc; ++j) {
      const int s = j % STAGES;
      const unsigned empty_parity = ((j / STAGES) & 1) ^ 1;  // the consumer's release of the last use
      if (j >= STAGES) mbar_wait(bar_k_empty(s), empty_parity);
#pragma unroll
      for (int it = 0; it < KV; ++it) {
        const int i = tid + it * V2_3_WG, r = i / VEC_PER_ROW, c4 = (i % VEC_PER_ROW) * 4;
        split_store<KTile, SPLIT>(kx[it], s_khi(s), s_klo(s), r, c4);
      }
      fence_proxy_async_smem();
      mbar_arrive(bar_k_full(s));
      if (j + 1 < Tc) load_k((j + 1) * Bc);  // in flight while V_j is stored and the consumer works

      if (j >= STAGES) mbar_wait(bar_v_empty(s), empty_parity);
#pragma unroll
      for (int it = 0; it < VV; ++it) {
        const int i = tid + it * V2_3_WG, key = i % Bc, d8 = (i / Bc) * 8;
        const float xs[8] = {vx[it][0].x, vx[it][0].y, vx[it][0].z, vx[it][0].w,
                             vx[it][1].x, vx[it][1].y, vx[it][1].z, vx[it][1].w};
        const int pos = permuted_key(key);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          unsigned hi = __float_as_uint(xs[e]), lo;
          if (SPLIT) split_tf32(xs[e], hi, lo);
          const int off = VTile::offset(d8 + e, pos);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_vhi(s) + off), "r"(hi) : "memory");
          if (SPLIT) asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_vlo(s) + off), "r"(lo) : "memory");
        }
      }
      fence_proxy_async_smem();
      mbar_arrive(bar_v_full(s));
      if (j + 1 < Tc) load_v((j + 1) * Bc);
    }
    return;
  }

  // ---------------- consumer warpgroup: S = Q K^T, online softmax, O += P V ----------------
  const int cwg = threadIdx.x / V2_3_WG - 1;  // which consumer warpgroup: rows 64 * cwg ...
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row_a = q_start + cwg * 64 + warp * 16 + g, row_b = row_a + 8;  // the two query rows this thread holds
  const float scale_log2 = softmax_scale * TILEATTN_LOG2E;
  constexpr int NS = Bc / 2, NO = HEAD_DIM / 2;  // accumulator values per thread: S (64 x Bc), O (64 x D)
  constexpr int OPARTS = CONSUMERS == 2 && HEAD_DIM > 64 ? 2 : 1;

  float m_i[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
  float l_i[2] = {0.0f, 0.0f};  // this thread's partial row sums, reduced across the quad at the end
  float acc[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) acc[i] = 0.0f;

  // This warpgroup's 64 rows of Q start 64 rows into every panel.
  const unsigned long long dq_hi = wgmma_desc_sw128(s_qhi + cwg * 64 * 128), dq_lo = wgmma_desc_sw128(s_qlo + cwg * 64 * 128);
  if (Tc > 0) mbar_wait(bar_q, 0);
  for (int j = 0; j < Tc; ++j) {
    const int s = j % STAGES;
    const unsigned full_parity = (j / STAGES) & 1;
    const int kv_start = j * Bc;

    // 1. S = Q K^T over d in k8 steps: three TF32 products each, small terms first; the first
    //    wgmma starts S from zero.
    float S[NS];
    mbar_wait(bar_k_full(s), full_parity);
    const unsigned long long dk_hi = wgmma_desc_sw128(s_khi(s)), dk_lo = wgmma_desc_sw128(s_klo(s));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 8; ++kk) {
      const unsigned long long qo = QTile::k_step(kk) >> 4, ko = KTile::k_step(kk) >> 4;
      if (SPLIT) {
        wgmma_tf32(S, dq_lo + qo, dk_hi + ko, kk > 0);
        wgmma_tf32(S, dq_hi + qo, dk_lo + ko, 1);
      }
      wgmma_tf32(S, dq_hi + qo, dk_hi + ko, SPLIT || kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(S);
    mbar_arrive(bar_k_empty(s));  // K_j may be overwritten

    // 2. Scale into the log2 domain and mask (keys past Nk; the diagonal blocks when causal).
    const bool needs_mask = block_needs_mask<CAUSAL>(kv_start, Bc, Nk, q_start, causal_offset);
    const int kend_a = key_end<CAUSAL>(row_a, Nk, causal_offset);
    const int kend_b = key_end<CAUSAL>(row_b, Nk, causal_offset);
    float m_tile[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int r = i % 4, key = kv_start + (i / 4) * 8 + 2 * t + (r & 1);
      float x = S[i] * scale_log2;
      if (needs_mask && key >= (r < 2 ? kend_a : kend_b)) x = TILEATTN_NEG_INF;
      S[i] = x;
      m_tile[r / 2] = fmaxf(m_tile[r / 2], x);
    }
    // 3. Online softmax: the quad's row max, rebase to m_new, P = exp2(S - m_new) in place.
    float scale_old[2], m_base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) scale_old[h] = online_rescale(m_i[h], l_i[h], lanes_max<4>(m_tile[h]), m_base[h]);
    // P as TF32 hi/lo A fragments of P V: a0..a3 = c0, c2, c1, c3 under the key permutation.
    unsigned p_hi[Bc / 8][4], p_lo[Bc / 8][4];
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int r = i % 4;
      const float p = exp2_ftz(S[i] - m_base[r / 2]);
      l_i[r / 2] += p;
      const int a = r == 1 ? 2 : r == 2 ? 1 : r;
      if (SPLIT) split_tf32(p, p_hi[i / 4][a], p_lo[i / 4][a]);
      else p_hi[i / 4][a] = __float_as_uint(p);  // the tensor core truncates to TF32
    }

    // 4. pv = P V of this block from zero (k8 steps over keys), then acc = scale_old * acc + pv.
    //    With two consumer warpgroups at D > 64 the 168 registers a thread has (384 threads) do
    //    not hold pv for all of D beside acc and P: the product runs in OPARTS column slices of
    //    V^T's rows (d), each merged before the next starts.
    mbar_wait(bar_v_full(s), full_parity);
#pragma unroll
    for (int part = 0; part < OPARTS; ++part) {
      float pv[NO / OPARTS];
      const unsigned rows = part * (HEAD_DIM / OPARTS) * 128;  // d rows of this slice, in every panel
      const unsigned long long dv_hi = wgmma_desc_sw128(s_vhi(s) + rows), dv_lo = wgmma_desc_sw128(s_vlo(s) + rows);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < Bc / 8; ++ks) {
        const unsigned long long vo = VTile::k_step(ks) >> 4;
        if (SPLIT) {
          wgmma_tf32(pv, p_lo[ks], dv_hi + vo, ks > 0);
          wgmma_tf32(pv, p_hi[ks], dv_lo + vo, 1);
        }
        wgmma_tf32(pv, p_hi[ks], dv_hi + vo, SPLIT || ks > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(pv);
      if (part == OPARTS - 1) mbar_arrive(bar_v_empty(s));
#pragma unroll
      for (int i = 0; i < NO / OPARTS; ++i) {
        float& o = acc[part * (NO / OPARTS) + i];
        o = fmaf(scale_old[(i % 4) / 2], o, pv[i]);
      }
    }
  }

  // Epilogue: finish l_i across the quad, one reciprocal per row, write O and lse.
  constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = lanes_sum<4>(l_i[h]);
    const int row = h == 0 ? row_a : row_b;
    if (row >= Nq) continue;
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // a row that saw no key outputs 0
    T* o_row = hs.o + row * o_sn;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) {
      *reinterpret_cast<float2*>(o_row + n * 8 + 2 * t) =
          make_float2(acc[4 * n + 2 * h] * inv_l, acc[4 * n + 2 * h + 1] * inv_l);
    }
    if (t == 0 && lse) hs.lse[row] = l > 0.0f ? (m_i[h] + __log2f(l)) * LN2 : TILEATTN_NEG_INF;
  }
}

// 3xTF32: FP32-level accuracy.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(V2_3_WG + 2 * Br, 1) v2_3_fwd(TILEATTN_FWD_PARAMS(T)) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  v2_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*SPLIT=*/true>(TILEATTN_FWD_ARGS);
#endif
}

// Plain TF32 (opt-in, precision="tf32"): one product per multiply, ~1e-3 relative error.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(V2_3_WG + 2 * Br, 1) v2_3_tf32_fwd(TILEATTN_FWD_PARAMS(T)) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  v2_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*SPLIT=*/false>(TILEATTN_FWD_ARGS);
#endif
}

TILEATTN_SMEM_BYTES(v2_3_fwd, v2_3_smem_bytes(HEAD_DIM, Br, Bc, true, v2_3_stages(HEAD_DIM, Br, Bc, true)));
TILEATTN_SMEM_BYTES(v2_3_tf32_fwd, v2_3_smem_bytes(HEAD_DIM, Br, Bc, false, v2_3_stages(HEAD_DIM, Br, Bc, false)));

}  // namespace tileattn
