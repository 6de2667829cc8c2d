// v1.1: v1 plus cp.async double buffering of the K/V blocks (the seed's v1.1).
//
// Identical loop nest to v1 (K/V outer, Q inner, O/m_i/l_i in HBM); the one new idea is that
// K/V block j+1 is copied global->shared with cp.async into the second buffer while block j is
// being used, so the HBM latency of the K/V loads hides behind the Q-block loop.  Tail rows past
// Nk are zero-filled by the copy itself (src-size 0) and masked to -inf in S.
//
// Layout: Qi [Br][D], Kj [2][Bc][D], Vj [2][Bc][D], S [Br][Bc]; workspace holds m_i, l_i.
#include "kv_outer.cuh"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
// (Br, 1): with no minimum-blocks hint ptxas capped v1.1 at 64 registers and spilled 8 bytes.
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
  const int Tc = (Nk + Bc - 1) / Bc;

  kv_outer_init<T, HEAD_DIM, Br>(hs, m_hbm, l_hbm, Nq, o_sn);
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
    kv_outer_block<T, HEAD_DIM, Br, Bc, CAUSAL>(hs, Qi, Ks + cur * Bc * HEAD_DIM, Vs + cur * Bc * HEAD_DIM, S,
                                                m_hbm, l_hbm, kv_start, Nq, Nk, q_sn, o_sn, softmax_scale,
                                                causal_offset);
    __syncthreads();  // everyone is done with buffer `cur` before the next prefetch reuses it
  }
  if (lse) kv_outer_finish<T, Br>(hs, m_hbm, l_hbm, Nq);
}

// Qi, Ks x2, Vs x2, S.
TILEATTN_SMEM_BYTES(v1_1_fwd, (Br * HEAD_DIM + 4 * Bc * HEAD_DIM + Br * Bc) * 4);

}  // namespace tileattn
