// v1: FlashAttention-1's loop order on CUDA cores, FP32 (the seed's v1).
//
// K/V blocks are the OUTER loop and Q blocks the inner one; one thread block per (batch, head),
// so the grid is only B*H blocks wide.  Because every Q block is revisited once per K/V block,
// the running state of each row (O, m_i, l_i) lives in HBM and is read and written back on
// every K/V block: 2*Nq*D*Tc floats of O traffic instead of the 2*Nq*D that v2 reaches.
// O is renormalised (divided by l_i) after every K/V block, and exp(S - m~) is recomputed inside
// the P*V loop: both are the inefficiencies v2 removes.
//
// Layout: one thread per query row of the Q block (Br threads); shared memory holds
// Qi [Br][D], Kj [Bc][D], Vj [Bc][D] and S [Br][Bc].  workspace holds m_i and l_i: [B*H][2][Nq].
#include "common.cuh"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
// (Br, 1): with no minimum-blocks hint ptxas capped v1.1 at 64 registers and spilled 8 bytes.
__global__ void __launch_bounds__(Br, 1) v1_fwd(TILEATTN_FWD_PARAMS(T)) {
  static_assert(sizeof(T) == 4, "v1 is an FP32 rung");
  extern __shared__ float smem[];
  float* Qi = smem;                  // [Br][D]
  float* Kj = Qi + Br * HEAD_DIM;    // [Bc][D]
  float* Vj = Kj + Bc * HEAD_DIM;    // [Bc][D]
  float* S = Vj + Bc * HEAD_DIM;     // [Br][Bc], this thread's row is S[tx][:]

  const int bh = blockIdx.x + bh_offset;
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  float* m_hbm = workspace + (long long)bh * 2 * Nq;
  float* l_hbm = m_hbm + Nq;
  const int tx = threadIdx.x;
  const int Tr = (Nq + Br - 1) / Br;
  const int Tc = (Nk + Bc - 1) / Bc;

  // The state starts in HBM as (m, l, O) = (-inf, 0, 0) for every row this thread will own.
  for (int i = 0; i < Tr; ++i) {
    const int row = i * Br + tx;
    if (row < Nq) {
      m_hbm[row] = TILEATTN_NEG_INF;
      l_hbm[row] = 0.0f;
      for (int d = 0; d < HEAD_DIM; ++d) hs.o[row * o_sn + d] = 0.0f;
    }
  }

  for (int j = 0; j < Tc; ++j) {
    const int kv_start = j * Bc;
    // Cooperative load of Kj, Vj; keys past Nk are zero (their scores are masked to -inf).
    for (int idx = tx; idx < Bc * HEAD_DIM; idx += Br) {
      const int r = idx / HEAD_DIM, c = idx % HEAD_DIM;
      const bool ok = kv_start + r < Nk;
      Kj[idx] = ok ? hs.k[(kv_start + r) * k_sn + c] : 0.0f;
      Vj[idx] = ok ? hs.v[(kv_start + r) * v_sn + c] : 0.0f;
    }
    __syncthreads();

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
    __syncthreads();  // Kj and Vj are overwritten by the next K/V block
  }

  for (int i = 0; i < Tr; ++i) {
    const int row = i * Br + tx;
    if (row < Nq) hs.lse[row] = row_lse(m_hbm[row], l_hbm[row]);
  }
}

}  // namespace tileattn
