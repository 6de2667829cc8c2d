// v2: the seed's FlashAttention-2 forward on CUDA cores, FP32 (sections 1-3 of the seed).
//
// What changes from v1.1, each a named idea of the FA2 paper:
//  * Loop order swapped (seed 1.1): Q blocks OUTER, one thread block per Q block, K/V streamed
//    inner.  grid = (Tr, B*H), block = Br threads, one thread owns one query row, so the 4 warps
//    of Br=128 never talk to each other except to share K/V tiles.
//  * State on chip (1.2): the Q block is loaded once into shared memory; m_i, l_i are two
//    registers; the unnormalised accumulator Oacc lives in shared memory and reaches HBM once.
//  * Deferred normalisation (1.3): the loop only does Oacc = e^(m_old-m_new) Oacc + e^(m~-m_new) PV;
//    one reciprocal of l_i at the end replaces Tc*D divisions.
//  * P kept in registers (3.3): S[Bc] and P[Bc] are indexed only by unrolled constants, so they
//    stay in registers (0 bytes of stack) and exp is computed Bc times, not Bc*D times.
//  * cp.async double-buffered K/V (3.2) with zero-fill of tail rows and -inf scores past Nk.
//  * Two-level causal mask (1.4/3.4): K/V blocks above the diagonal are never visited (the loop
//    bound is cut); only the block straddling the diagonal masks element-wise, by row index.
//
// Shared memory (3.1): Ks, Vs [2][Bc][D] unpadded (a warp reads one K row at a time: broadcast);
// Qs, Oacc [Br][D+1] padded, since D+1 = 1 (mod 32) puts neighbouring threads' rows in
// neighbouring banks.  Br=128, Bc=32, D=64: 2*2*32*64*4 + 2*128*65*4 = 97 KB (dynamic).
#include "softmax.cuh"

// Steps of the head-dim loops unrolled.  8: spill-free under NVRTC 13.0 and 13.5 at every head dim
// (4 spilled 16 bytes under 13.5 without a mask on sm_90a, with 168 registers; 13.0 did not).
#ifndef V2_D_UNROLL
#define V2_D_UNROLL 8
#endif

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(Br) v2_fwd(TILEATTN_FWD_PARAMS(T)) {
  static_assert(sizeof(T) == 4, "v2 is an FP32 rung");
  extern __shared__ __align__(16) float smem[];
  float* Ks = smem;                                   // [2][Bc][D]
  float* Vs = Ks + 2 * Bc * HEAD_DIM;                 // [2][Bc][D]
  float(*Qs)[HEAD_DIM + 1] =                          // [Br][D+1], resident for the whole loop
      reinterpret_cast<float(*)[HEAD_DIM + 1]>(Vs + 2 * Bc * HEAD_DIM);
  float(*Oacc)[HEAD_DIM + 1] =                        // [Br][D+1], unnormalised O~
      reinterpret_cast<float(*)[HEAD_DIM + 1]>(&Qs[Br][0]);

  const int bh = blockIdx.y + bh_offset;
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  const int tx = threadIdx.x;
  const int q_start = blockIdx.x * Br;
  const int row = tx;
  const int grow = q_start + row;  // this thread's global query row
  const bool row_valid = grow < Nq;

  // Q block loaded once (rows past Nq are zeros; they compute garbage-free values nobody writes).
  for (int idx = tx; idx < Br * HEAD_DIM; idx += Br) {
    const int r = idx / HEAD_DIM, c = idx % HEAD_DIM;
    Qs[r][c] = q_start + r < Nq ? hs.q[(q_start + r) * q_sn + c] : 0.0f;
  }
  float m_i = TILEATTN_NEG_INF;
  float l_i = 0.0f;
#pragma unroll
  for (int d = 0; d < HEAD_DIM; ++d) Oacc[row][d] = 0.0f;
  __syncthreads();

  // Causal, block level: keys past the last row's diagonal are never visited.
  const int kv_limit = CAUSAL ? min(Nk, max(0, q_start + Br + causal_offset)) : Nk;
  const int Tc = (kv_limit + Bc - 1) / Bc;

  if (Tc > 0) {
    kv_async_copy<HEAD_DIM, Bc, Br>(hs.k, hs.v, k_sn, v_sn, Ks, Vs, 0, Nk);
    cp_async_commit();
  }

  for (int j = 0; j < Tc; ++j) {
    const int cur = j & 1;
    const int kv_start = j * Bc;
    if (j + 1 < Tc) {
      kv_async_copy<HEAD_DIM, Bc, Br>(hs.k, hs.v, k_sn, v_sn, Ks + (cur ^ 1) * Bc * HEAD_DIM,
                                      Vs + (cur ^ 1) * Bc * HEAD_DIM, kv_start + Bc, Nk);
      cp_async_commit();
      cp_async_wait<1>();  // wait for block j only; block j+1 stays in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* Kj = Ks + cur * Bc * HEAD_DIM;
    const float* Vj = Vs + cur * Bc * HEAD_DIM;

    // Element-level causal mask only on the block that straddles this Q block's diagonal.
    const bool diag_block = CAUSAL && (kv_start + Bc - 1 > q_start + causal_offset);

    // 1. S = Qs[row] . Kj^T, scaled; keys past Nk and above the diagonal get -inf.  The head dim
    //    is the outer loop: one Qs read serves Bc independent accumulators (Bc FMAs in flight),
    //    and only V2_D_UNROLL steps of it are unrolled (a full unroll of D x Bc FMAs took ptxas
    //    a minute and more at D=128, for 245 registers).
    float S[Bc];
#pragma unroll
    for (int c = 0; c < Bc; ++c) S[c] = 0.0f;
#pragma unroll V2_D_UNROLL
    for (int d = 0; d < HEAD_DIM; ++d) {
      const float q = Qs[row][d];
#pragma unroll
      for (int c = 0; c < Bc; ++c) S[c] += q * Kj[c * HEAD_DIM + d];
    }
#pragma unroll
    for (int c = 0; c < Bc; ++c) {
      S[c] = kv_start + c < Nk ? S[c] * softmax_scale : TILEATTN_NEG_INF;
      if (diag_block && kv_start + c > grow + causal_offset) S[c] = TILEATTN_NEG_INF;
    }

    // 2. Block statistics m~, P = exp(S - m~) kept in registers, l~.
    float m_tilde = TILEATTN_NEG_INF;
#pragma unroll
    for (int c = 0; c < Bc; ++c) m_tilde = fmaxf(m_tilde, S[c]);
    const float m_base = safe_max(m_tilde);
    float P[Bc];
    float l_tilde = 0.0f;
#pragma unroll
    for (int c = 0; c < Bc; ++c) {
      P[c] = __expf(S[c] - m_base);
      l_tilde += P[c];
    }

    // 3. Merge with the running state, rebased to m_new.
    const float m_new = fmaxf(m_i, m_tilde);
    const float scale_old = __expf(m_i - safe_max(m_new));
    const float scale_new = __expf(m_tilde - safe_max(m_new));
    l_i = scale_old * l_i + scale_new * l_tilde;
    m_i = m_new;

    // 4. Oacc update: multiply-adds only, normalisation deferred.
#pragma unroll V2_D_UNROLL
    for (int d = 0; d < HEAD_DIM; ++d) {
      float pv = 0.0f;
#pragma unroll
      for (int c = 0; c < Bc; ++c) pv += P[c] * Vj[c * HEAD_DIM + d];
      Oacc[row][d] = scale_old * Oacc[row][d] + scale_new * pv;
    }
    __syncthreads();  // all reads of buffer `cur` done before the next prefetch overwrites it
  }

  // Epilogue: the single HBM write of O; one reciprocal instead of D divisions.
  if (row_valid) {
    const float inv_l = l_i > 0.0f ? 1.0f / l_i : 0.0f;  // a row that saw no key outputs 0
#pragma unroll
    for (int d = 0; d < HEAD_DIM; ++d) hs.o[grow * o_sn + d] = Oacc[row][d] * inv_l;
    if (lse) hs.lse[grow] = row_lse(m_i, l_i);
  }
}

// Ks x2, Vs x2, Qs and Oacc padded to D+1.
TILEATTN_SMEM_BYTES(v2_fwd, (4 * Bc * HEAD_DIM + 2 * Br * (HEAD_DIM + 1)) * 4);

}  // namespace tileattn
