// bwd_v2: FlashAttention-2's backward on mma.sync tensor cores (fp16 / bf16 inputs, fp32
// accumulators), sm_80 and newer — bwd_v1's loop nest with every product a warp-level
// m16n8k16 MMA.
//
// One thread block of four warps per (K/V block j of Bc keys, batch * head); Kj, Vj stay in
// shared memory and dK_j, dV_j in registers for the whole loop over the Q blocks (Br = 64 rows)
// that can see block j.  Bc = 64 up to D = 128; above it Bc = 32, and the warps of step 4 split
// the head dim in two, so that each still holds 16 keys x at most 128 columns of dK and dV.
// Per Q block:
//   1. Qi, dOi by cp.async (rows past Nq zero-filled), lse_i and D_i;
//   2. warp w takes query rows 16w..16w+15: S = Q_w Kj^T and dP = dO_w Vj^T (16 x 64 each, in
//      C fragments), then P = 2^(scale log2(e) S - log2(e) lse) (0 where masked) and
//      dS = P (dP - D_i) in place;
//   3. P and dS go to shared memory as 16-bit [row][key] tiles (the other warps need them
//      transposed), and dS stays in registers as the A operand of dQ_w = dS_w Kj, which is
//      added into the float32 dq_accum with atomics (other K/V blocks add theirs);
//   4. after a barrier, warp w takes keys 16 (w % KC).. + 15 (KC = Bc / 16 key chunks) and
//      columns of part w / KC of the head dim: dV_w += P^T dOi and dK_w += dS^T Qi, the
//      transposed operands read with ldmatrix.trans from the [row][key] and [row][d] tiles.
// At the end dK_j (times scale) and dV_j are added into dk_accum, dv_accum (atomics: the query
// heads of a GQA group share them).  P and dS are rounded to T for their MMAs, as in
// FlashAttention-2; everything else accumulates in fp32.
//
// VARLEN (bwd_v2_varlen, bwd_v2_variants_varlen: serving's varlen backward): the same body over
// packed sequences, one thread block per (sequence's K/V block, head) from bwd_varlen_sequence
// (bwd_common.cuh), every bound and causal offset the sequence's own.  Kernels of their own: the
// lengths and offset held in registers instead of read from the parameters made the dense
// kernels spill (D = 80, 96, 128 with variants, 192, 256; NVRTC 13.0).
//
// Fragment and ldmatrix layouts: mma.cuh.  The A operand of step 4 is P^T (keys x rows): with
// P stored [row][key], ldmatrix.trans of the 8x8 blocks (rows 16ks + 0..7 | 8..15) x (keys
// 16w + 0..7 | 8..15), in the order (0,0) (0,1) (1,0) (1,1), hands each lane exactly the A
// fragment registers a[0..3] of P^T: the same lane addressing as the non-transposed B operand.
#include "bwd_common.cuh"
#include "mma.cuh"

namespace tileattn {

constexpr int BWD_V2_THREADS = 128;

// K, V (Bc x D), Q, dO (Br x D), P, dS (Br x Bc), all 16-bit, then lse_i and D_i (fp32).
__host__ __device__ constexpr int bwd_v2_smem(int D, int Br, int Bc) {
  return (2 * Bc * D + 2 * Br * D + 2 * Br * Bc) * 2 + 2 * Br * 4;
}

// VARIANTS (bwd_v2_variants): the gradients of the forward's score variants (a sliding window,
// softcap, ALiBi: the window_left .. alibi_sb fields), the K/V block's Q blocks cut to the window
// (variants_q_range) and P, dS by frag_p_ds_variants.  VARLEN: packed sequences (above).
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, bool VARIANTS, bool VARLEN>
__device__ __forceinline__ void bwd_v2_body(TILEATTN_BWD_PARAMS(T)) {
  static_assert(sizeof(T) == 2, "bwd_v2 takes 16-bit (fp16 / bf16) inputs");
  static_assert(Br == 64 && (Bc == 64 || Bc == 32), "four warps: 16 query rows each in steps 2-3");
  constexpr int NTHREADS = BWD_V2_THREADS, KSTEPS = HEAD_DIM / 16, NT = Bc / 8, DT = HEAD_DIM / 8;
  // Step 4: KC chunks of 16 keys, each taken by DPARTS warps that split the head dim; DTW = the
  // 8-column tiles of dK and dV one warp holds.
  constexpr int KC = Bc / 16, DPARTS = 4 / KC, DTW = DT / DPARTS;
  static_assert(DTW % 2 == 0, "whole pairs of 8-column n-tiles per ldmatrix.trans");
  static_assert(DT % 2 == 0, "dQ takes whole pairs of 8-column n-tiles");
  using QTile = SwizzledTile<Br, HEAD_DIM>;   // Q and dO
  using KVTile = SwizzledTile<Bc, HEAD_DIM>;  // K and V
  using PTile = SwizzledTile<Br, Bc>;         // P and dS, [query row][key]

  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* Ks = smem;
  unsigned char* Vs = Ks + KVTile::BYTES;
  unsigned char* Qs = Vs + KVTile::BYTES;
  unsigned char* dOs = Qs + QTile::BYTES;
  unsigned char* Ps = dOs + QTile::BYTES;
  unsigned char* dSs = Ps + PTile::BYTES;
  float* lse_s = reinterpret_cast<float*>(dSs + PTile::BYTES);
  float* Di_s = lse_s + Br;
  const auto addr = [](const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); };
  const unsigned Ks_a = addr(Ks), Vs_a = addr(Vs), Qs_a = addr(Qs), dOs_a = addr(dOs), Ps_a = addr(Ps),
                 dSs_a = addr(dSs);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  // This block's sequence (bwd_common.cuh's BwdSeq), its rows q0.. / k0.. of the buffers; Nq_b,
  // Nk_b its lengths, offset its causal offset.
  BwdSeq seq;
  if constexpr (VARLEN) {
    seq = bwd_varlen_sequence<Bc>(causal_offset, cu_seqlens_q, cu_seqlens_k, num_seqs, bottom_right);
    if (seq.nk == 0) return;  // a block past its sequence's keys
  } else {
    seq = bwd_dense_sequence<Bc>(H, Nq, Nk, causal_offset, bh_offset);
  }
  const int b = seq.b, h = seq.h, hk = h / h_per_kv, mb = seq.mem_b, kv_start = seq.kv_start;
  // (Dense: bh and row 0 straight from blockIdx.y, as before variable length.  The equivalent
  // b * H + h and (mb * H + h) * Nq + q0 for both moved ptxas's allocation: bwd_v2_variants at
  // D=256 spilled 80 bytes instead of 24.)
  const int bh = VARLEN ? b * H + h : (int)blockIdx.y + bh_offset, Nq_b = seq.nq, Nk_b = seq.nk, offset = seq.offset;
  const long long row0 = VARLEN ? (long long)h * Nq + seq.q0 : (long long)bh * Nq;  // lse, D_i, dq_accum's row 0
  const T* q_bh = q + mb * q_sb + h * q_sh + seq.q0 * q_sn;
  const T* do_bh = dout + mb * do_sb + h * do_sh + seq.q0 * do_sn;
  const float* lse_bh = lse + row0;
  const float* Di_bh = Di + row0;
  float* dq_bh = dq_accum + row0 * HEAD_DIM;

  tile_async_copy<T, Bc, HEAD_DIM, HEAD_DIM, NTHREADS>(Ks, k + mb * k_sb + hk * k_sh + seq.k0 * k_sn, k_sn, kv_start,
                                                       Nk_b, tid);
  tile_async_copy<T, Bc, HEAD_DIM, HEAD_DIM, NTHREADS>(Vs, v + mb * v_sb + hk * v_sh + seq.k0 * v_sn, v_sn, kv_start,
                                                       Nk_b, tid);
  cp_async_commit();

  // Per-lane ldmatrix rows and chunks (as fa2_mma.cuh): A operand; B operand; .trans B operand.
  const auto [a_r, a_c, b_r, b_c, bt_r, bt_c] = ldsm_lane(lane);

  // dK_w, dV_w: keys kv_start + 16 kc + g (elements 0, 1) and + 8 (2, 3), columns 8 (dt0 + dt) +
  // 2t, +1.
  const int kc = DPARTS == 1 ? warp : warp % KC, dt0 = DPARTS == 1 ? 0 : (warp / KC) * DTW;  // (constant 0: folded)
  float dK[DTW][4], dV[DTW][4];
#pragma unroll
  for (int dt = 0; dt < DTW; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dK[dt][e] = dV[dt][e] = 0.0f;

  const float scale_log2 = softmax_scale * TILEATTN_LOG2E;  // any sign: no max is folded here
  int q_begin = first_q_start<CAUSAL, Br>(kv_start, offset), q_end = Nq_b;
  ScoreVariants var{};
  if constexpr (VARIANTS) {  // (the host passes softmax_scale >= 0: a negative one negated q)
    var = head_variants<CAUSAL>(softmax_scale, softcap, alibi_slopes, alibi_sb, b, h, window_left, window_right);
    variants_q_range<Br, Bc>(var, kv_start, offset, q_begin, q_end);
  }
  for (int q_start = q_begin; q_start < q_end; q_start += Br) {
    __syncthreads();  // the previous Q block's tiles are no longer read
    // 1. Qi, dOi, lse_i, D_i.
    tile_async_copy<T, Br, HEAD_DIM, HEAD_DIM, NTHREADS>(Qs, q_bh, q_sn, q_start, Nq_b, tid);
    tile_async_copy<T, Br, HEAD_DIM, HEAD_DIM, NTHREADS>(dOs, do_bh, do_sn, q_start, Nq_b, tid);
    cp_async_commit();
    load_row_stats<Br, NTHREADS>(lse_s, Di_s, lse_bh, Di_bh, q_start, Nq_b);
    cp_async_wait<0>();
    __syncthreads();

    // 2. S = Q_w Kj^T and dP = dO_w Vj^T, 16 x Bc per warp: [nt] holds keys 8 nt + 2t, +1 of
    //    rows g (elements 0, 1) and g + 8 (2, 3).
    float S[NT][4], dP[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[nt][e] = dP[nt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      unsigned qa[4], da[4];
      ldmatrix_x4(qa, QTile::ldsm_addr(Qs_a, a_r, a_c, 16 * warp, ks));
      ldmatrix_x4(da, QTile::ldsm_addr(dOs_a, a_r, a_c, 16 * warp, ks));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned kb[4], vb[4];
        ldmatrix_x4(kb, KVTile::ldsm_addr(Ks_a, b_r, b_c, 16 * np, ks));
        ldmatrix_x4(vb, KVTile::ldsm_addr(Vs_a, b_r, b_c, 16 * np, ks));
        mma_m16n16k16<T>(S[2 * np], S[2 * np + 1], qa, kb);
        mma_m16n16k16<T>(dP[2 * np], dP[2 * np + 1], da, vb);
      }
    }
    // P and dS in place (S becomes P, dP becomes dS).
    if constexpr (VARIANTS)
      frag_p_ds_variants<CAUSAL>(S, dP, lse_s, Di_s, var, 16 * warp, q_start, kv_start, Nk_b, offset,
                                 exp_scale_log2(var, folded_scale_log2(softmax_scale)), g, t);
    else
      frag_p_ds<CAUSAL>(S, dP, lse_s, Di_s, 16 * warp, q_start, kv_start, Nk_b, offset, scale_log2, g, t);

    // 3. P and dS to shared memory (this warp's rows), dS as the A fragments of dS Kj.
    unsigned ds_frag[Bc / 16][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = 16 * warp + g, col = 8 * nt + 2 * t;
      *reinterpret_cast<unsigned*>(Ps + PTile::offset_elem(r, col)) = pack2<T>(S[nt][0], S[nt][1]);
      *reinterpret_cast<unsigned*>(Ps + PTile::offset_elem(r + 8, col)) = pack2<T>(S[nt][2], S[nt][3]);
      *reinterpret_cast<unsigned*>(dSs + PTile::offset_elem(r, col)) = pack2<T>(dP[nt][0], dP[nt][1]);
      *reinterpret_cast<unsigned*>(dSs + PTile::offset_elem(r + 8, col)) = pack2<T>(dP[nt][2], dP[nt][3]);
    }
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) pack_a_frag<T>(ds_frag[kk], dP[2 * kk], dP[2 * kk + 1]);
    // dQ_w = dS_w Kj: k-steps of 16 keys, Kj as the .trans B operand (as V in the forward's P V),
    // 32 columns at a time (the last 16 when DT % 4 == 2) so that only 16 partial sums are live
    // beside dK_w and dV_w.  Added into dq_accum by red, or (deterministic) the whole block's
    // adds in K/V block order, without atomics.
    constexpr int DQ_TILES = 4;
    int* count = dq_count<Br>(dq_semaphore, bh, Nq, q_start);
    if (count) ordered_add_begin(count, blockIdx.x);
#pragma unroll
    for (int d0 = 0; d0 < DT; d0 += DQ_TILES) {
      float dq[DQ_TILES][4];
#pragma unroll
      for (int i = 0; i < DQ_TILES; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[i][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
        for (int dp = 0; dp < DQ_TILES / 2; ++dp) {
          if (d0 + 2 * dp >= DT) continue;  // (compile-time: unrolled)
          unsigned kt[4];
          ldmatrix_x4_trans(kt, KVTile::ldsm_addr(Ks_a, bt_r, bt_c, 16 * kk, d0 / 2 + dp));
          mma_m16n16k16<T>(dq[2 * dp], dq[2 * dp + 1], ds_frag[kk], kt);
        }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = q_start + 16 * warp + 8 * hh + g;
        if (row < Nq_b) {
          float* dq_row = dq_bh + (long long)row * HEAD_DIM + 8 * d0 + 2 * t;
#pragma unroll
          for (int i = 0; i < DQ_TILES; ++i) {
            if (d0 + i >= DT) continue;
            if (count) {
              dq_row[8 * i] += softmax_scale * dq[i][2 * hh];
              dq_row[8 * i + 1] += softmax_scale * dq[i][2 * hh + 1];
            } else {
              red_add2(dq_row + 8 * i, softmax_scale * dq[i][2 * hh], softmax_scale * dq[i][2 * hh + 1]);
            }
          }
        }
      }
    }
    if (count)
      ordered_add_end(count);  // (its barrier also publishes P and dS)
    else
      __syncthreads();  // every warp's rows of P and dS are in shared memory

    // 4. dV_w += P^T dOi, dK_w += dS^T Qi over the Q block's rows, 16 at a time.
#pragma unroll
    for (int ks = 0; ks < Br / 16; ++ks) {
      unsigned pa[4], sa[4];
      ldmatrix_x4_trans(pa, PTile::ldsm_addr(Ps_a, b_r, b_c, 16 * ks, kc));
      ldmatrix_x4_trans(sa, PTile::ldsm_addr(dSs_a, b_r, b_c, 16 * ks, kc));
#pragma unroll
      for (int dp = 0; dp < DTW / 2; ++dp) {
        unsigned ob[4], qb[4];
        ldmatrix_x4_trans(ob, QTile::ldsm_addr(dOs_a, bt_r, bt_c, 16 * ks, dt0 / 2 + dp));
        ldmatrix_x4_trans(qb, QTile::ldsm_addr(Qs_a, bt_r, bt_c, 16 * ks, dt0 / 2 + dp));
        mma_m16n16k16<T>(dV[2 * dp], dV[2 * dp + 1], pa, ob);
        mma_m16n16k16<T>(dK[2 * dp], dK[2 * dp + 1], sa, qb);
      }
    }
  }
  cp_async_wait<0>();  // (Tc = 0 Q blocks: K and V copies still complete before exit)

  // dK_j, dV_j into the accumulators (shared by the GQA group: atomics, or per query head).
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = kv_start + 16 * kc + 8 * hh + g;
    if (key < Nk_b) {
#pragma unroll
      for (int dt = 0; dt < DTW; ++dt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          store_dkdv(TILEATTN_DKDV_DEST, dq_semaphore, mb, h, H, h_per_kv, Nk, seq.k0 + key, 8 * (dt0 + dt) + 2 * t + e,
                     HEAD_DIM, softmax_scale * dK[dt][2 * hh + e], dV[dt][2 * hh + e]);
    }
  }
}

// The four kernels of the body (registered in versions.py), each with its shared-memory size.
#define TILEATTN_BWD_V2_KERNEL(kernel, VARIANTS, VARLEN)                                        \
  template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>                              \
  __global__ void __launch_bounds__(BWD_V2_THREADS, 1) kernel(TILEATTN_BWD_PARAMS(T)) {          \
    bwd_v2_body<T, HEAD_DIM, Br, Bc, CAUSAL, VARIANTS, VARLEN>(TILEATTN_BWD_ARGS);               \
  }                                                                                             \
  TILEATTN_SMEM_BYTES(kernel, bwd_v2_smem(HEAD_DIM, Br, Bc))

TILEATTN_BWD_V2_KERNEL(bwd_v2, false, false);
TILEATTN_BWD_V2_KERNEL(bwd_v2_variants, true, false);
TILEATTN_BWD_V2_KERNEL(bwd_v2_varlen, false, true);
TILEATTN_BWD_V2_KERNEL(bwd_v2_variants_varlen, true, true);

}  // namespace tileattn
