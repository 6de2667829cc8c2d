// The FA1 loop nest shared by v1 and v1.1 (K/V blocks outer, Q blocks inner): everything but how
// a K/V block reaches shared memory.  One thread per query row; the row's state (O, m_i, l_i) lives
// in HBM and is read, merged and written back for every K/V block.
#pragma once
#include "softmax.cuh"

namespace tileattn {

// (m, l, O) = (-inf, 0, 0) in HBM for every row this thread owns (rows tx, tx + Br, ...).
template <typename T, int HEAD_DIM, int Br>
__device__ __forceinline__ void kv_outer_init(const HeadSlice<T>& hs, float* m_hbm, float* l_hbm, int Nq,
                                              long long o_sn) {
  for (int row = threadIdx.x; row < Nq; row += Br) {
    m_hbm[row] = TILEATTN_NEG_INF;
    l_hbm[row] = 0.0f;
    for (int d = 0; d < HEAD_DIM; ++d) hs.o[row * o_sn + d] = 0.0f;
  }
}

// All Q blocks against the K/V block [kv_start, kv_start + Bc) already in Kj, Vj ([Bc][D]).
// Qi [Br][D] and S [Br][Bc] are shared scratch.  The seed's v1 arithmetic: S and its row max,
// l~ = sum exp(S - m~), then O renormalised by l_new after every block, and exp(S - m~)
// recomputed inside the P*V loop (Bc*D exps per row where Bc would do): what v2 removes.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__device__ __forceinline__ void kv_outer_block(const HeadSlice<T>& hs, float* Qi, const float* Kj, const float* Vj,
                                               float* S, float* m_hbm, float* l_hbm, int kv_start, int Nq, int Nk,
                                               long long q_sn, long long o_sn, float softmax_scale,
                                               int causal_offset) {
  const int tx = threadIdx.x;
  const int Tr = (Nq + Br - 1) / Br;
  for (int i = 0; i < Tr; ++i) {
    const int q_start = i * Br;
    // Causal, block level: this Q block sees nothing of this K/V block (block-uniform skip).
    if (CAUSAL && kv_start > q_start + Br - 1 + causal_offset) continue;
    for (int idx = tx; idx < Br * HEAD_DIM; idx += Br) {
      const int r = idx / HEAD_DIM, c = idx % HEAD_DIM;
      Qi[idx] = q_start + r < Nq ? hs.q[(q_start + r) * q_sn + c] : 0.0f;
    }
    __syncthreads();

    const int row = q_start + tx;
    if (row < Nq) {
      const int kend = key_end<CAUSAL>(row, Nk, causal_offset);
      const float m_prev = m_hbm[row], l_prev = l_hbm[row];
      // S = Qi Kj^T * scale for this row; m~ = rowmax(S).
      float m_tilde = TILEATTN_NEG_INF;
      for (int c = 0; c < Bc; ++c) {
        float s = 0.0f;
        for (int d = 0; d < HEAD_DIM; ++d) s += Qi[tx * HEAD_DIM + d] * Kj[c * HEAD_DIM + d];
        s = kv_start + c < kend ? s * softmax_scale : TILEATTN_NEG_INF;
        S[tx * Bc + c] = s;
        m_tilde = fmaxf(m_tilde, s);
      }
      const float m_base = safe_max(m_tilde);
      float l_tilde = 0.0f;
      for (int c = 0; c < Bc; ++c) l_tilde += __expf(S[tx * Bc + c] - m_base);

      const float m_new = fmaxf(m_prev, m_tilde);
      const float scale_old = __expf(m_prev - safe_max(m_new));
      const float scale_new = __expf(m_tilde - safe_max(m_new));
      const float l_new = scale_old * l_prev + scale_new * l_tilde;
      // A row whose keys so far were all masked keeps l = 0 and O = 0 (no 0/0).
      const float inv_l_new = l_new > 0.0f ? 1.0f / l_new : 0.0f;
      for (int d = 0; d < HEAD_DIM; ++d) {
        float pv = 0.0f;
        for (int c = 0; c < Bc; ++c) pv += __expf(S[tx * Bc + c] - m_base) * Vj[c * HEAD_DIM + d];
        T* o_ptr = hs.o + row * o_sn + d;
        *o_ptr = (scale_old * l_prev * *o_ptr + scale_new * pv) * inv_l_new;
      }
      m_hbm[row] = m_new;
      l_hbm[row] = l_new;
    }
    __syncthreads();  // Qi and S are overwritten by the next Q block
  }
}

// lse = m + log(l) for every row this thread owns, once all K/V blocks are merged.
template <typename T, int Br>
__device__ __forceinline__ void kv_outer_finish(const HeadSlice<T>& hs, const float* m_hbm, const float* l_hbm, int Nq) {
  for (int row = threadIdx.x; row < Nq; row += Br) hs.lse[row] = row_lse(m_hbm[row], l_hbm[row]);
}

}  // namespace tileattn
