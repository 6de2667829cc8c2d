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
#include "kv_outer.cuh"

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
  const int Tc = (Nk + Bc - 1) / Bc;

  kv_outer_init<T, HEAD_DIM, Br>(hs, m_hbm, l_hbm, Nq, o_sn);
  for (int j = 0; j < Tc; ++j) {
    const int kv_start = j * Bc;
    // Cooperative load of Kj, Vj; keys past Nk are zero (their scores are masked to -inf).
    for (int idx = threadIdx.x; idx < Bc * HEAD_DIM; idx += Br) {
      const int r = idx / HEAD_DIM, c = idx % HEAD_DIM;
      const bool ok = kv_start + r < Nk;
      Kj[idx] = ok ? hs.k[(kv_start + r) * k_sn + c] : 0.0f;
      Vj[idx] = ok ? hs.v[(kv_start + r) * v_sn + c] : 0.0f;
    }
    __syncthreads();
    kv_outer_block<T, HEAD_DIM, Br, Bc, CAUSAL>(hs, Qi, Kj, Vj, S, m_hbm, l_hbm, kv_start, Nq, Nk, q_sn, o_sn,
                                                softmax_scale, causal_offset);
    __syncthreads();  // Kj and Vj are overwritten by the next K/V block
  }
  if (lse) kv_outer_finish<T, Br>(hs, m_hbm, l_hbm, Nq);
}

// Qi, Kj, Vj, S.
TILEATTN_SMEM_BYTES(v1_fwd, (Br * HEAD_DIM + 2 * Bc * HEAD_DIM + Br * Bc) * 4);

}  // namespace tileattn
