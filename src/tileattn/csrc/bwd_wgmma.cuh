// The step the wgmma backward rungs (bwd_v3_wgmma.cu, bwd_v4_ws.cu) share: from one Q block's
// transposed scores to the operands of dV, dK and dQ.
//
// Layout (wgmma m64n64, keys as M): a thread of warp w of its warpgroup holds, as value i, key
// kv_start + key0 + 8 ((i % 4) / 2) (key0 = the warpgroup's first key in the K/V block + 16 w + g)
// and query row 8 (i / 4) + 2t + (i % 2) of the Q block, for both S^T = K Q^T and dP^T = V dO^T.
#pragma once

#include "bwd_common.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace tileattn {

// S^T = K Q_i^T and dP^T = V dO_i^T (SS, both K-major; A: 64 key rows of a KV_ROWS-row K / V tile,
// B: the Q block's Br rows), one commit group, waited for unless WAIT is false (then the caller
// waits for the group and fences S and dP before reading them).
template <typename T, int HEAD_DIM, int Br, int KV_ROWS, bool WAIT = true>
__device__ __forceinline__ void bwd_scores(float (&S)[Br / 2], float (&dP)[Br / 2], unsigned long long k_desc,
                                           unsigned long long v_desc, unsigned long long q_desc,
                                           unsigned long long do_desc) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    Wgmma16<T>::ss(S, k_desc + (sw128_k_step(kk, KV_ROWS) >> 4), q_desc + (sw128_k_step(kk, Br) >> 4), kk > 0);
    Wgmma16<T>::ss(dP, v_desc + (sw128_k_step(kk, KV_ROWS) >> 4), do_desc + (sw128_k_step(kk, Br) >> 4), kk > 0);
  }
  wgmma_commit();
  if constexpr (WAIT) {
    wgmma_wait<0>();
    fence_operands(S);
    fence_operands(dP);
  }
}

// dV += P^T dO_i and dK += dS^T Q_i (RS: A the fragments of bwd_p_ds, B N-major with the k16 step
// 16 query rows on), one commit group, not waited for.
template <typename T, int Br, int ND>
__device__ __forceinline__ void bwd_dv_dk(float (&dV)[ND], float (&dK)[ND], unsigned (&p_frag)[Br / 16][4],
                                          unsigned (&ds_frag)[Br / 16][4], unsigned long long do_ndesc,
                                          unsigned long long q_ndesc) {
  fence_operands(p_frag);
  fence_operands(ds_frag);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < Br / 16; ++ks) {
    Wgmma16<T>::rs_bt(dV, p_frag[ks], do_ndesc + ((ks * 16 * 128) >> 4), 1);
    Wgmma16<T>::rs_bt(dK, ds_frag[ks], q_ndesc + ((ks * 16 * 128) >> 4), 1);
  }
  wgmma_commit();
}

// True when rows q_start .. + Br - 1 and keys kv_start .. + kv_rows - 1 all exist and every row
// sees every key: no masking.  (Such a row sees a key, so its lse is finite: the -inf test of
// bwd_p_ds is needed only where this is false.)
template <bool CAUSAL>
__device__ __forceinline__ bool bwd_block_unmasked(int q_start, int Br, int Nq, int kv_start, int kv_rows, int Nk,
                                                   int causal_offset) {
  return q_start + Br <= Nq && kv_start + kv_rows <= Nk && (!CAUSAL || kv_start + kv_rows - 1 <= q_start + causal_offset);
}

// P^T = 2^(scale log2(e) S^T - log2(e) lse) (0 where masked, and on rows past Nq, whose lse is
// -inf) and dS^T = P^T (dP^T - D_i), in place in S and dP; both as 16-bit A fragments of dV +=
// P^T dO and dK += dS^T Q (k16 step ks = query rows 16 ks..: n8 tiles 2 ks and 2 ks + 1, v3.3's
// P V mapping); dS stored to shared memory (ds_tile, a shared-space address) as [query row][key in
// the block] (SwizzledTile STile) for dQ = dS K.  warp_key0: the warp's first key in the block.
//
// MASK false: bwd_p_ds below has checked (bwd_block_unmasked) that every (row, key) pair of the block
// is visible, so the weights need no test (and the registers of the per-element bounds are free:
// at D=128 causal the tests alone made bwd_v4 spill).
template <typename T, typename STile, int Br, bool CAUSAL, bool MASK>
__device__ __forceinline__ void bwd_p_ds_step(float (&S)[Br / 2], float (&dP)[Br / 2], unsigned (&p_frag)[Br / 16][4],
                                         unsigned (&ds_frag)[Br / 16][4], unsigned ds_tile, const float* lse_i,
                                         const float* Di_i, int kv_start, int warp_key0, int q_start, int Nk,
                                         int causal_offset, float scale_log2, int lane) {
  static_assert(STile::REM == 0, "whole 64-key panels: offset_panels, the k16 steps' row offset below");
  constexpr int NS = Br / 2;
  const int key0 = warp_key0 + lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int key = kv_start + key0 + 8 * ((i % 4) / 2), r = 8 * (i / 4) + 2 * t + (i % 2);
    const float l = lse_i[r];
    const bool seen = !MASK || (l != TILEATTN_NEG_INF && key < key_end<CAUSAL>(q_start + r, Nk, causal_offset));
    const float p = seen ? softmax_weight(S[i], scale_log2, l * TILEATTN_LOG2E) : 0.0f;
    S[i] = p;
    dP[i] = p * (dP[i] - Di_i[r]);
  }
#pragma unroll
  for (int i = 0; i < NS; i += 2) {
    const int n8 = i / 4;
    p_frag[n8 / 2][(n8 % 2) * 2 + (i % 4) / 2] = pack2<T>(S[i], S[i + 1]);
    ds_frag[n8 / 2][(n8 % 2) * 2 + (i % 4) / 2] = pack2<T>(dP[i], dP[i + 1]);
  }
  // dS^T's fragments are 8x8 matrices (ds_frag[ks][j]: keys warp_key0 + 8 (j % 2) + row, query
  // rows 16 ks + 8 (j / 2) + column), so stmatrix.trans writes each as 8 rows of 16 bytes of the
  // [query row][key] tile: four instructions a thread instead of 32 two-byte stores.  Lane 8 j + c
  // addresses query row 16 ks + 8 (j / 2) + c, key chunk (warp_key0 + 8 (j % 2)) / 8; the k16
  // steps move 16 rows on, which leaves the swizzle (row % 8) and the panel alone.
  const int j = lane / 8, c = lane % 8;
  const unsigned row_addr = ds_tile + STile::offset_panels(8 * (j / 2) + c, (warp_key0 + 8 * (j % 2)) / 8);
#pragma unroll
  for (int ks = 0; ks < Br / 16; ++ks) stmatrix_x4_trans(row_addr + STile::offset_panels(16 * ks, 0), ds_frag[ks]);
  fence_proxy_async_smem();  // this thread's dS stores, before the tensor core reads them
}

// bwd_p_ds_step for the block of Br query rows and kv_rows keys, without the per-element tests
// where bwd_block_unmasked holds (uniform over the CTA: both builds inline, one runs).
template <typename T, typename STile, int Br, bool CAUSAL>
__device__ __forceinline__ void bwd_p_ds(float (&S)[Br / 2], float (&dP)[Br / 2], unsigned (&p_frag)[Br / 16][4],
                                         unsigned (&ds_frag)[Br / 16][4], unsigned ds_tile, const float* lse_i,
                                         const float* Di_i, int kv_start, int kv_rows, int warp_key0, int q_start,
                                         int Nq, int Nk, int causal_offset, float scale_log2, int lane) {
  if (bwd_block_unmasked<CAUSAL>(q_start, Br, Nq, kv_start, kv_rows, Nk, causal_offset))
    bwd_p_ds_step<T, STile, Br, CAUSAL, false>(S, dP, p_frag, ds_frag, ds_tile, lse_i, Di_i, kv_start, warp_key0,
                                               q_start, Nk, causal_offset, scale_log2, lane);
  else
    bwd_p_ds_step<T, STile, Br, CAUSAL, true>(S, dP, p_frag, ds_frag, ds_tile, lse_i, Di_i, kv_start, warp_key0,
                                              q_start, Nk, causal_offset, scale_log2, lane);
}

}  // namespace tileattn
