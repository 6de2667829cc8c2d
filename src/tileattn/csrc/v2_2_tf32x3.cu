// v2.2: FP32-accurate attention on tensor cores by 3xTF32 (and, as an opt-in, plain TF32).
//
// What changes from v2: the two matrix products S = Q K^T and O += P V move from FFMA to
// mma.sync.m16n8k8 with TF32 operands and FP32 accumulators, FA2's warp layout replaces one
// thread per row: each warp owns 16 query rows, S and O live in registers as mma accumulator
// fragments, and softmax runs on those fragments.
//
// Accuracy (why 3 products): TF32 keeps 10 mantissa bits, so one TF32 product carries ~1e-3
// relative error.  Each FP32 operand x is split as x = hi + lo with hi = x with its low 13 mantissa
// bits cleared (exactly representable in TF32) and lo = x - hi (exact in FP32; the tensor core
// truncates it to TF32, costing ~2^-21 relative).  a*b ~= hi_a*hi_b + hi_a*lo_b + lo_a*hi_b; the
// dropped lo_a*lo_b is ~2^-22 relative.  Three mma per product, FP32 accumulation: FP32-level error.
// The TF32 variant (SPLIT = false) issues only hi_a*hi_b on raw operands: 3x fewer mma, ~1e-3 error.
//
// Fragment layouts (PTX ISA, mma.m16n8k8 .tf32; lane = 4*g + t, g = lane/4 in 0..7, t = lane%4):
//   A 16x8 (row-major):  a0 = (g, t)  a1 = (g+8, t)  a2 = (g, t+4)  a3 = (g+8, t+4)
//   B 8x8  (k x n):      b0 = (k=t, n=g)             b1 = (k=t+4, n=g)
//   C 16x8 (fp32):       c0 = (g, 2t)  c1 = (g, 2t+1)  c2 = (g+8, 2t)  c3 = (g+8, 2t+1)
// P*V without a shared-memory round trip: the C fragment of S holds keys 2t and 2t+1 of each
// 8-key block, the A fragment wants k-indices t and t+4.  The k index of P*V is a sum over keys,
// so any permutation works if V's rows follow it: k-index t <-> key 2t, k-index t+4 <-> key 2t+1.
// Then a0..a3 = c0, c2, c1, c3 and b0 = V[2t][n], b1 = V[2t+1][n].
//
// Per-tile FP32 accumulation: the tensor core's own FP32 accumulation is not IEEE round-to-nearest
// (measured: relative error grew linearly with N, 3e-5 at N=4097 and 2.3e-4 at N=32768, when O
// accumulated inside mma across all K/V blocks).  So P*V of one K/V block is accumulated by mma
// from zero (Bc products), and the blocks are merged with FFMA: acc = scale_old*acc + pv.
//
// Operand splitting once per block, not per warp: after a K/V block lands (cp.async, raw FP32),
// one cooperative pass writes K_hi, K_lo [Bc][D+4] and V transposed V_hi, V_lo [D][Bc+4], V's keys
// stored in the permuted order above, so every B fragment is one ldmatrix (the 8x8 b16 matrix
// of ldmatrix is an 8x4 FP32 matrix whose lane (g, t) word is element (g, t): an m16n8k8 TF32
// fragment).  Row strides D+4 and Bc+4 floats put the 8 rows of each ldmatrix in 8 different
// 16-byte bank groups (conflict-free).  8 warps (Br=128) share each split, one block per SM.
#include "softmax.cuh"
#include "tf32x3.cuh"  // mma_fp32, FragA, ldmatrix_x4 of FP32 rows

namespace tileattn {

// Rows [row0, row0 + ROWS) of a (rows x HEAD_DIM) FP32 matrix into shared memory with row stride
// SSTRIDE floats, 16-byte cp.async copies; rows >= nrows are zero-filled without being read.
template <int ROWS, int HEAD_DIM, int SSTRIDE, int NTHREADS>
__device__ __forceinline__ void rows_async_copy(const float* src, long long src_sn, float* dst, int row0, int nrows) {
  constexpr int VEC_PER_ROW = HEAD_DIM / 4;
  for (int i = threadIdx.x; i < ROWS * VEC_PER_ROW; i += NTHREADS) {
    const int r = i / VEC_PER_ROW, c4 = (i % VEC_PER_ROW) * 4;
    const bool ok = row0 + r < nrows;
    cp_async_16(dst + r * SSTRIDE + c4, src + (ok ? row0 + r : 0) * src_sn + c4, ok);
  }
}

// Qs, Kraw x2, Vraw x2, Khi (+ Klo) at row stride D+4; Vhi (+ Vlo) transposed at row stride Bc+4.
__host__ __device__ constexpr int v2_2_smem_bytes(int D, int Br, int Bc, bool split) {
  return ((Br + (split ? 6 : 5) * Bc) * (D + 4) + (split ? 2 : 1) * D * (Bc + 4)) * 4;
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, bool SPLIT>
__device__ __forceinline__ void v2_2_body(TILEATTN_FWD_PARAMS(T)) {
  static_assert(sizeof(T) == 4, "v2.2 is an FP32 rung");
  static_assert(Br % 16 == 0 && Bc % 16 == 0 && HEAD_DIM % 16 == 0, "ldmatrix.x4 loads fragment pairs");
  constexpr int WARPS = Br / 16;
  constexpr int NTHREADS = WARPS * 32;
  constexpr int SK = HEAD_DIM + 4;        // row stride of Q, K (floats): conflict-free ldmatrix
  constexpr int SV = Bc + 4;              // row stride of transposed V
  constexpr int KSTEPS_D = HEAD_DIM / 8;  // k-steps of S = Q K^T (over d)
  constexpr int NTILES_S = Bc / 8;        // 8-key column tiles of S (= k-steps of P V)
  constexpr int NTILES_O = HEAD_DIM / 8;  // 8-wide column tiles of O
  // Q's A fragments stay in registers when they fit beside the accumulators (D <= 64).
  constexpr bool Q_IN_REGS = HEAD_DIM <= 64;

  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;                          // [Br][SK]
  float* Kraw = Qs + Br * SK;                // [2][Bc][SK]  cp.async landing, double buffered
  float* Vraw = Kraw + 2 * Bc * SK;          // [2][Bc][SK]
  float* Khi = Vraw + 2 * Bc * SK;           // [Bc][SK]
  float* Klo = Khi + Bc * SK;                // [Bc][SK]     (SPLIT only)
  float* Vhi = Klo + (SPLIT ? Bc * SK : 0);  // [D][SV]      transposed, keys permuted
  float* Vlo = Vhi + HEAD_DIM * SV;          // [D][SV]      (SPLIT only)

  const int bh = blockIdx.y + bh_offset;
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int lm = lane / 8, lr = lane % 8;  // ldmatrix: which matrix / which row this lane addresses
  const int q_start = blockIdx.x * Br;
  const int wrow = warp * 16;  // this warp's first row in the Q tile
  const int row_a = q_start + wrow + g, row_b = row_a + 8;  // the two query rows this thread holds
  const float scale_log2 = softmax_scale * TILEATTN_LOG2E;

  const int kv_limit = CAUSAL ? min(Nk, max(0, q_start + Br + causal_offset)) : Nk;
  const int Tc = (kv_limit + Bc - 1) / Bc;

  rows_async_copy<Br, HEAD_DIM, SK, NTHREADS>(hs.q, q_sn, Qs, q_start, Nq);
  if (Tc > 0) {
    rows_async_copy<Bc, HEAD_DIM, SK, NTHREADS>(hs.k, k_sn, Kraw, 0, Nk);
    rows_async_copy<Bc, HEAD_DIM, SK, NTHREADS>(hs.v, v_sn, Vraw, 0, Nk);
  }
  cp_async_commit();

  // Per thread: rows g and g+8 of the warp's slice.  m_i in the log2 domain; l_i is this thread's
  // partial row sum (its 2 columns of every 8), reduced across the quad once at the end.
  float m_i[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
  float l_i[2] = {0.0f, 0.0f};
  float acc[NTILES_O][4];  // O accumulator, C layout
#pragma unroll
  for (int n = 0; n < NTILES_O; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[n][r] = 0.0f;

  // A fragment of Q for k-step kk: matrices (rows 0-7, cols 0-3), (rows 8-15, cols 0-3),
  // (rows 0-7, cols 4-7), (rows 8-15, cols 4-7) give a0..a3.
  const float* q_lane = Qs + (wrow + (lm & 1) * 8 + lr) * SK + (lm >> 1) * 4;
  auto load_q = [&](FragA<SPLIT>& a, int kk) {
    unsigned r[4];
    ldmatrix_x4(r, q_lane + kk * 8);
#pragma unroll
    for (int i = 0; i < 4; ++i) a.set(i, __uint_as_float(r[i]));
  };
  FragA<SPLIT> q_frag[Q_IN_REGS ? KSTEPS_D : 1];

  for (int j = 0; j < Tc; ++j) {
    const int cur = j & 1;
    const int kv_start = j * Bc;
    cp_async_wait<0>();  // block j (and, at j = 0, Q) has landed in Kraw/Vraw[cur]
    __syncthreads();     // ... for every thread; and everyone is done with Khi..Vlo of block j-1
    if (j + 1 < Tc) {    // prefetch block j+1 into the other landing buffer
      rows_async_copy<Bc, HEAD_DIM, SK, NTHREADS>(hs.k, k_sn, Kraw + (cur ^ 1) * Bc * SK, kv_start + Bc, Nk);
      rows_async_copy<Bc, HEAD_DIM, SK, NTHREADS>(hs.v, v_sn, Vraw + (cur ^ 1) * Bc * SK, kv_start + Bc, Nk);
      cp_async_commit();
    }
    // Split pass: K as [Bc][SK] hi/lo (float4 in, float4 out); V transposed to [D][SV] hi/lo with
    // permuted keys.  Consecutive lanes take consecutive keys of V: the float4 reads hit 8 distinct
    // 16-byte groups per phase and the transposed scalar writes 32 distinct banks.
    {
      const float* Kc = Kraw + cur * Bc * SK;
      const float* Vc = Vraw + cur * Bc * SK;
      for (int i = threadIdx.x; i < Bc * HEAD_DIM / 4; i += NTHREADS) {
        const int r = i / (HEAD_DIM / 4), c = (i % (HEAD_DIM / 4)) * 4;
        const float4 x = *reinterpret_cast<const float4*>(Kc + r * SK + c);
        uint4 hi, lo;
        split_tf32x4(x, hi, lo);
        *reinterpret_cast<uint4*>(Khi + r * SK + c) = SPLIT ? hi : make_uint4(__float_as_uint(x.x),
            __float_as_uint(x.y), __float_as_uint(x.z), __float_as_uint(x.w));
        if (SPLIT) *reinterpret_cast<uint4*>(Klo + r * SK + c) = lo;
      }
      for (int i = threadIdx.x; i < Bc * HEAD_DIM / 4; i += NTHREADS) {
        const int key = i % Bc, d = (i / Bc) * 4;
        const float4 x = *reinterpret_cast<const float4*>(Vc + key * SK + d);
        const float xs[4] = {x.x, x.y, x.z, x.w};
        const int pos = permuted_key(key);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          unsigned hi, lo;
          split_tf32(xs[e], hi, lo);
          Vhi[(d + e) * SV + pos] = SPLIT ? __uint_as_float(hi) : xs[e];
          if (SPLIT) Vlo[(d + e) * SV + pos] = __uint_as_float(lo);
        }
      }
    }
    __syncthreads();
    if constexpr (Q_IN_REGS) {
      if (j == 0) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS_D; ++kk) load_q(q_frag[kk], kk);
      }
    }

    // 1. S = Q K^T for this warp's 16 rows x Bc keys, FP32 accumulators.  One ldmatrix.x4 gives
    //    (b0, b1) of two 8-key tiles: matrices (keys n..n+7, d 0-3), (n.., d 4-7), (n+8.., ...).
    float S[NTILES_S][4];
#pragma unroll
    for (int n = 0; n < NTILES_S; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) S[n][r] = 0.0f;
    const int k_lane = ((lm >> 1) * 8 + lr) * SK + (lm & 1) * 4;
#pragma unroll
    for (int kk = 0; kk < KSTEPS_D; ++kk) {
      FragA<SPLIT> a;
      if constexpr (Q_IN_REGS) a = q_frag[kk];
      else load_q(a, kk);
#pragma unroll
      for (int n = 0; n < NTILES_S; n += 2) {
        unsigned bh4[4], bl4[4];
        ldmatrix_x4(bh4, Khi + n * 8 * SK + k_lane + kk * 8);
        if (SPLIT) ldmatrix_x4(bl4, Klo + n * 8 * SK + k_lane + kk * 8);
        mma_fp32<SPLIT>(S[n], a, {bh4[0], bh4[1]}, {bl4[0], bl4[1]});
        mma_fp32<SPLIT>(S[n + 1], a, {bh4[2], bh4[3]}, {bl4[2], bl4[3]});
      }
    }

    // 2. Scale into the log2 domain and mask: keys past Nk, and above the diagonal on the
    //    block(s) that straddle it.  Only those blocks pay for the compares.
    const bool needs_mask = block_needs_mask<CAUSAL>(kv_start, Bc, Nk, q_start, causal_offset);
    const int kend_a = key_end<CAUSAL>(row_a, Nk, causal_offset);
    const int kend_b = key_end<CAUSAL>(row_b, Nk, causal_offset);
    float m_tile[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
#pragma unroll
    for (int n = 0; n < NTILES_S; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = kv_start + n * 8 + 2 * t + (r & 1);
        float s = S[n][r] * scale_log2;
        if (needs_mask && key >= (r < 2 ? kend_a : kend_b)) s = TILEATTN_NEG_INF;
        S[n][r] = s;
        m_tile[r / 2] = fmaxf(m_tile[r / 2], s);
      }
    }
    // Row max across the quad (the 4 threads holding one row's 8-key slices).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_tile[h] = lanes_max<4>(m_tile[h]);
    }

    // 3. Online softmax: rebase to m_new, P = exp2(S - m_new) in place, rescale l_i.
    float scale_old[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m_i[h], m_tile[h]);
      scale_old[h] = exp2f(m_i[h] - safe_max(m_new));  // exp2(-inf) = 0 on the first block
      m_i[h] = m_new;
      l_i[h] *= scale_old[h];
    }
#pragma unroll
    for (int n = 0; n < NTILES_S; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        S[n][r] = exp2f(S[n][r] - safe_max(m_i[r / 2]));
        l_i[r / 2] += S[n][r];
      }
    }

    // 4. pv = P V of this block (mma from zero), then acc = scale_old*acc + pv in FFMA.
    //    P's C fragments are A fragments under the key permutation: a0..a3 = c0, c2, c1, c3.
    //    V^T rows are d, columns permuted keys: one ldmatrix.x4 = (b0, b1) of two d-tiles.
    float pv[NTILES_O][4];
#pragma unroll
    for (int n = 0; n < NTILES_O; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) pv[n][r] = 0.0f;
    const int v_lane = ((lm >> 1) * 8 + lr) * SV + (lm & 1) * 4;
#pragma unroll
    for (int ks = 0; ks < NTILES_S; ++ks) {
      FragA<SPLIT> a;
      a.set_from_c(S[ks]);
#pragma unroll
      for (int n = 0; n < NTILES_O; n += 2) {
        unsigned bh4[4], bl4[4];
        ldmatrix_x4(bh4, Vhi + n * 8 * SV + v_lane + ks * 8);
        if (SPLIT) ldmatrix_x4(bl4, Vlo + n * 8 * SV + v_lane + ks * 8);
        mma_fp32<SPLIT>(pv[n], a, {bh4[0], bh4[1]}, {bl4[0], bl4[1]});
        mma_fp32<SPLIT>(pv[n + 1], a, {bh4[2], bh4[3]}, {bl4[2], bl4[3]});
      }
    }
#pragma unroll
    for (int n = 0; n < NTILES_O; ++n) {
      acc[n][0] = fmaf(scale_old[0], acc[n][0], pv[n][0]);
      acc[n][1] = fmaf(scale_old[0], acc[n][1], pv[n][1]);
      acc[n][2] = fmaf(scale_old[1], acc[n][2], pv[n][2]);
      acc[n][3] = fmaf(scale_old[1], acc[n][3], pv[n][3]);
    }
  }
  cp_async_wait<0>();  // with Tc = 0 the Q copy was never waited for: none may outlive the block

  // Epilogue: finish l_i across the quad, one reciprocal per row, write O and lse.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_i[h] = lanes_sum<4>(l_i[h]);
  }
  constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h == 0 ? row_a : row_b;
    if (row >= Nq) continue;
    const float inv_l = l_i[h] > 0.0f ? 1.0f / l_i[h] : 0.0f;  // a row that saw no key outputs 0
    T* o_row = hs.o + row * o_sn;
#pragma unroll
    for (int n = 0; n < NTILES_O; ++n) {
      const float2 val = make_float2(acc[n][2 * h] * inv_l, acc[n][2 * h + 1] * inv_l);
      *reinterpret_cast<float2*>(o_row + n * 8 + 2 * t) = val;
    }
    if (t == 0 && lse) hs.lse[row] = l_i[h] > 0.0f ? (m_i[h] + __log2f(l_i[h])) * LN2 : TILEATTN_NEG_INF;
  }
}

// 3xTF32: FP32-level accuracy.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(Br * 2, 1) v2_2_fwd(TILEATTN_FWD_PARAMS(T)) {
  v2_2_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*SPLIT=*/true>(TILEATTN_FWD_ARGS);
}

// Plain TF32 (opt-in, precision="tf32"): one product per mma, ~1e-3 relative error.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(Br * 2, 1) v2_2_tf32_fwd(TILEATTN_FWD_PARAMS(T)) {
  v2_2_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*SPLIT=*/false>(TILEATTN_FWD_ARGS);
}

TILEATTN_SMEM_BYTES(v2_2_fwd, v2_2_smem_bytes(HEAD_DIM, Br, Bc, true));
TILEATTN_SMEM_BYTES(v2_2_tf32_fwd, v2_2_smem_bytes(HEAD_DIM, Br, Bc, false));

}  // namespace tileattn
