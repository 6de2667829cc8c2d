// v1.1: v1 plus cp.async double buffering of the K/V blocks (the seed's v1.1).
//
// Identical loop nest to v1 (K/V outer, Q inner, O/m_i/l_i in HBM); the one new idea is that
// K/V block j+1 is copied global->shared with cp.async into the second buffer while block j is
// being used, so the HBM latency of the K/V loads hides behind the Q-block loop.  Tail rows past
// Nk are zero-filled by the copy itself (src-size 0) and masked to -inf in S.
//
// Layout: Qi [Br][D], Kj [2][Bc][D], Vj [2][Bc][D], S [Br][Bc]; workspace holds m_i, l_i.
#include "common.cuh"

namespace tileattn {

// Issue the 16-byte cp.async copies of one K/V block into buffer `buf` (rows >= Nk zero-filled).
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(Br, 1) v1_1_fwd(TILEATTN_FWD_PARAMS(T)) {
  static_assert(sizeof(T) == 4, "v1.1 is an FP32 rung");
  extern __shared__ __align__(16) float smem[];
  float* Qi = smem;                       // [Br][D]
  float* Ks = Qi + Br * HEAD_DIM;         // [2][Bc][D]
  float* Vs = Ks + 2 * Bc * HEAD_DIM;     // [2][Bc][D]
  float* S = Vs + 2 * Bc * HEAD_DIM;      // [Br][Bc]

  const int bh = blockIdx.x + bh_offset;
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  float* m_hbm = workspace + (long long)bh * 2 * Nq;
  float* l_hbm = m_hbm + Nq;
  const int tx = threadIdx.x;
  const int Tr = (Nq + Br - 1) / Br;
  const int Tc = (Nk + Bc - 1) / Bc;

  for (int i = 0; i < Tr; ++i) {
    const int row = i * Br + tx;
    if (row < Nq) {
      m_hbm[row] = TILEATTN_NEG_INF;
      l_hbm[row] = 0.0f;
      for (int d = 0; d < HEAD_DIM; ++d) hs.o[row * o_sn + d] = 0.0f;
    }
  }

  // Prologue: block 0 in flight before the loop starts.
  kv_async_copy<HEAD_DIM, Bc, Br>(hs.k, hs.v, k_sn, v_sn, Ks, Vs, 0, Nk);
  cp_async_commit();

  for (int j = 0; j < Tc; ++j) {
    const int kv_start = j * Bc;
    const int cur = j & 1;
    if (j + 1 < Tc) {
      kv_async_copy<HEAD_DIM, Bc, Br>(hs.k, hs.v, k_sn, v_sn, Ks + (cur ^ 1) * Bc * HEAD_DIM,
                                      Vs + (cur ^ 1) * Bc * HEAD_DIM, kv_start + Bc, Nk);
      cp_async_commit();
      cp_async_wait<1>();  // block j has landed; block j+1 stays in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // cp.async data is visible to the issuing thread only until a barrier
    const float* Kj = Ks + cur * Bc * HEAD_DIM;
    const float* Vj = Vs + cur * Bc * HEAD_DIM;

    for (int i = 0; i < Tr; ++i) {
      const int q_start = i * Br;
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
      __syncthreads();
    }
    __syncthreads();  // everyone is done with buffer `cur` before the next prefetch reuses it
  }

  for (int i = 0; i < Tr; ++i) {
    const int row = i * Br + tx;
    if (row < Nq) hs.lse[row] = row_lse(m_hbm[row], l_hbm[row]);
  }
}

}  // namespace tileattn
