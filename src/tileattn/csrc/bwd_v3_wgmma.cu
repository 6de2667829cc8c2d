// bwd_v3: FlashAttention-2's backward (bwd_v2's loop nest) on Hopper's warpgroup MMA (sm_90a),
// fp16 / bf16 inputs, fp32 accumulators, head dims 64 and 128.
//
// Why: bwd_v2 runs at ~200 TFLOP/s on an H200 (0.38-0.47x cuDNN, bench/results/bwd.json): its
// mma.sync products re-read every operand fragment from shared memory by ldmatrix, per warp, and
// P and dS make a round trip through shared memory before dV and dK.  Here one warpgroup (four
// warps, 128 threads) per (K/V block j of Bc = 64 keys, batch * head) computes every product
// with wgmma, the tensor core reading K, V, Q and dO straight from shared memory, and keeps the
// key dimension as the M of the transposed products, so that P^T and dS^T come out of their
// accumulators already in the register layout of the A operand of dV and dK (as v3.3's P V):
//   1. Q_i, dO_i (Br = 64 rows) by cp.async into SwizzledTiles (64-column panels, the 128-byte
//      swizzle, which is wgmma's K-major and N-major layout), lse_i and D_i;
//   2. S^T = K_j Q_i^T and dP^T = V_j dO_i^T (SS, both K-major: M = 64 keys, N = 64 rows);
//   3. P^T = 2^(scale log2(e) S^T - log2(e) lse) (0 where masked), dS^T = P^T (dP^T - D_i) in
//      place, both rounded to 16-bit A fragments; dS also to shared memory as [row][key];
//   4. dV_j += P^T dO_i and dK_j += dS^T Q_i (RS: A from registers, B = dO_i, Q_i N-major);
//   5. dQ_i = dS K_j (SS: A = dS [row][key] K-major, B = K_j N-major), 64 columns at a time,
//      added into the float32 dq_accum with red (or in K/V-block order, deterministic mode).
// At the end dK_j (times scale) and dV_j go into dk_accum, dv_accum as in bwd_v2.
//
// Accumulator layout (wgmma m64nN, mma.cuh): warp w of the warpgroup holds rows 16 w + g and
// 16 w + g + 8 (lane = 4 g + t), columns 8 i + 2 t, + 1 of each n8 tile i, as values 4 i, 4 i + 1
// (row g) and 4 i + 2, 4 i + 3 (row g + 8).  Here rows are keys (S^T, dP^T, dK, dV) or query
// rows (dQ), columns query rows (S^T, dP^T) or the head dim (dK, dV, dQ).
//
// Q_i, dO_i, lse_i and D_i are double-buffered: the next Q block's copies are issued at the top
// of each step and land while this one computes.  Still no warp specialisation, the products in
// sequence (each waited for): what the tensor core gains over mma.sync, before the overlap that
// FlashAttention-3's backward adds.
#include "bwd_common.cuh"
#include "bwd_wgmma.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace tileattn {

constexpr int BWD_V3_THREADS = 128;  // one warpgroup

// K, V (Bc x D), two stages of Q, dO (Br x D), dS (Br x Bc), all 16-bit SwizzledTiles (multiples
// of 1024 bytes, so every tile starts 1024-byte aligned as the 128-byte swizzle needs), then two
// stages of lse_i and D_i.
constexpr int BWD_V3_STAGES = 2;
__host__ __device__ constexpr int bwd_v3_smem(int D, int Br, int Bc) {
  return (2 * Bc * D + BWD_V3_STAGES * 2 * Br * D + Br * Bc) * 2 + BWD_V3_STAGES * 2 * Br * 4;
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(BWD_V3_THREADS, 1) bwd_v3(TILEATTN_BWD_PARAMS(T)) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(T) == 2, "bwd_v3 takes 16-bit (fp16 / bf16) inputs");
  static_assert(Br == 64 && Bc == 64, "wgmma's M = 64 keys, N = 64 query rows");
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "whole 64-column panels, dK and dV in 64 registers each");
  constexpr int NS = Br / 2;        // S^T, dP^T values per thread (64 x Br over 128 threads)
  constexpr int ND = HEAD_DIM / 2;  // dK, dV values per thread (64 x D)
  constexpr int DQ_PARTS = HEAD_DIM / 64;
  using QTile = SwizzledTile<Br, HEAD_DIM>;   // Q and dO
  using KVTile = SwizzledTile<Bc, HEAD_DIM>;  // K and V
  using STile = SwizzledTile<Br, Bc>;         // dS, [query row][key]

  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* Ks = smem;
  unsigned char* Vs = Ks + KVTile::BYTES;
  auto Qs = [&](int st) { return Vs + KVTile::BYTES + st * 2 * QTile::BYTES; };  // stage st: Q, then dO
  auto dOs = [&](int st) { return Qs(st) + QTile::BYTES; };
  unsigned char* dSs = Qs(BWD_V3_STAGES);
  auto lse_s = [&](int st) { return reinterpret_cast<float*>(dSs + STile::BYTES) + st * 2 * Br; };
  auto Di_s = [&](int st) { return lse_s(st) + Br; };
  const auto addr = [](const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); };
  const unsigned Ks_a = addr(Ks), Vs_a = addr(Vs), dSs_a = addr(dSs);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  // (bwd_v2's setup, written again: a shared struct of these bases, tried on the CPU, kept the
  // pointers live in registers and took bwd_v2's spills at D=128 on sm_80 from 20 to 56 bytes.)
  const int bh = blockIdx.y + bh_offset;
  const int b = bh / H, h = bh % H, hk = h / h_per_kv;
  const int kv_start = blockIdx.x * Bc;
  const T* q_bh = q + b * q_sb + h * q_sh;
  const T* do_bh = dout + b * do_sb + h * do_sh;
  const float* lse_bh = lse + (long long)bh * Nq;
  const float* Di_bh = Di + (long long)bh * Nq;
  float* dq_bh = dq_accum + (long long)bh * Nq * HEAD_DIM;

  // Q block q_start's tiles into stage st (one cp.async group with whatever else is pending).
  auto copy_q_block = [&](int q_start, int st) {
    tile_async_copy<T, Br, HEAD_DIM, HEAD_DIM, BWD_V3_THREADS>(Qs(st), q_bh, q_sn, q_start, Nq, tid);
    tile_async_copy<T, Br, HEAD_DIM, HEAD_DIM, BWD_V3_THREADS>(dOs(st), do_bh, do_sn, q_start, Nq, tid);
  };
  const int q_first = first_q_start<CAUSAL, Br>(kv_start, causal_offset);
  tile_async_copy<T, Bc, HEAD_DIM, HEAD_DIM, BWD_V3_THREADS>(Ks, k + b * k_sb + hk * k_sh, k_sn, kv_start, Nk, tid);
  tile_async_copy<T, Bc, HEAD_DIM, HEAD_DIM, BWD_V3_THREADS>(Vs, v + b * v_sb + hk * v_sh, v_sn, kv_start, Nk, tid);
  if (q_first < Nq) copy_q_block(q_first, 0);
  cp_async_commit();
  load_row_stats<Br, BWD_V3_THREADS>(lse_s(0), Di_s(0), lse_bh, Di_bh, q_first, Nq);

  // Descriptors.  K-major (S^T's and dP^T's A = K_j, V_j and B = Q_i, dO_i; dQ's A = dS): k16
  // step kk at sw128_k_step(kk, rows).  N-major (B = dO_i, Q_i of dV, dK; B = K_j of dQ): the
  // next 64 columns are the next panel (leading byte offset rows x 128), k16 step ks 16 rows on.
  const unsigned long long k_desc = wgmma_desc_sw128(Ks_a), v_desc = wgmma_desc_sw128(Vs_a);
  const unsigned long long ds_desc = wgmma_desc_sw128(dSs_a);

  float dK[ND], dV[ND];
#pragma unroll
  for (int i = 0; i < ND; ++i) dK[i] = dV[i] = 0.0f;

  const float scale_log2 = softmax_scale * TILEATTN_LOG2E;  // any sign: no max is folded here
  for (int q_start = q_first, st = 0; q_start < Nq; q_start += Br, st ^= 1) {
    // 1. The next Q block into the other stage, whose last reader was the previous step (its
    //    wgmmas were waited for before this barrier; its lse_i / D_i too), while this one's
    //    copies land.  cp.async writes through the generic proxy; wgmma reads through the async
    //    proxy: each thread fences its landed copies before the barrier.
    __syncthreads();
    const int q_next = q_start + Br;
    if (q_next < Nq) copy_q_block(q_next, st ^ 1);
    cp_async_commit();  // (empty at the last block: the count of groups stays one a step)
    // The next block's lse and D, in registers until the end of this step (their loads' latency
    // under this step's products).
    const int r_next = q_next + tid;
    const bool next_ok = tid < Br && r_next < Nq;
    const float lse_next = next_ok ? lse_bh[r_next] : TILEATTN_NEG_INF;
    const float Di_next = next_ok ? Di_bh[r_next] : 0.0f;
    cp_async_wait<1>();  // this block's group (the first: with K_j and V_j)
    fence_proxy_async_smem();
    __syncthreads();
    const float* lse_i = lse_s(st);
    const float* Di_i = Di_s(st);
    const unsigned Qs_a = addr(Qs(st)), dOs_a = addr(dOs(st));
    const unsigned long long q_desc = wgmma_desc_sw128(Qs_a), do_desc = wgmma_desc_sw128(dOs_a);
    const unsigned long long q_ndesc = wgmma_desc_sw128(Qs_a, Br * 128), do_ndesc = wgmma_desc_sw128(dOs_a, Br * 128);

    // 2. S^T = K_j Q_i^T, dP^T = V_j dO_i^T: one commit group, waited for.
    float S[NS], dP[NS];
    bwd_scores<T, HEAD_DIM, Br, Bc>(S, dP, k_desc, v_desc, q_desc, do_desc);

    // 3. P^T and dS^T in place, their A fragments, dS to shared memory (bwd_wgmma.cuh).
    unsigned p_frag[Br / 16][4], ds_frag[Br / 16][4];
    bwd_p_ds<T, STile, Br, CAUSAL>(S, dP, p_frag, ds_frag, dSs_a, lse_i, Di_i, kv_start, Bc, 16 * warp, q_start, Nq,
                                   Nk, causal_offset, scale_log2, lane);

    // 4. dV_j += P^T dO_i, dK_j += dS^T Q_i (RS, B N-major), one commit group.
    bwd_dv_dk<T, Br>(dV, dK, p_frag, ds_frag, do_ndesc, q_ndesc);
    __syncthreads();  // every thread's dS is in shared memory

    // 5. dQ_i = dS K_j, 64 columns at a time (K_j N-major: panel part), each added as it lands.
    int* count = dq_count<Br>(dq_semaphore, bh, Nq, q_start);
    if (count) ordered_add_begin(count, blockIdx.x);
#pragma unroll
    for (int part = 0; part < DQ_PARTS; ++part) {
      float dq[32];
      const unsigned long long kn_desc = wgmma_desc_sw128(Ks_a + part * Bc * 128, Bc * 128);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < Bc / 16; ++ks)
        Wgmma16<T>::ss_bt(dq, ds_desc + (sw128_k_step(ks, Br) >> 4), kn_desc + ((ks * 16 * 128) >> 4), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();  // (also step 4's group: its register operands are free from here)
      if (part == 0) {
        fence_operands(p_frag);
        fence_operands(ds_frag);
      }
      fence_operands(dq);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = q_start + 16 * warp + g + 8 * hh;
        if (row >= Nq) continue;
        float* dq_row = dq_bh + (long long)row * HEAD_DIM + 64 * part + 2 * t;
#pragma unroll
        for (int n8 = 0; n8 < 8; ++n8) {
          const float x = softmax_scale * dq[4 * n8 + 2 * hh], y = softmax_scale * dq[4 * n8 + 2 * hh + 1];
          if (count) {
            dq_row[8 * n8] += x;
            dq_row[8 * n8 + 1] += y;
          } else {
            red_add2(dq_row + 8 * n8, x, y);
          }
        }
      }
    }
    fence_operands(dV);
    fence_operands(dK);
    if (count) ordered_add_end(count);
    if (tid < Br) {  // the other stage's row statistics: nobody reads them before the next barrier
      lse_s(st ^ 1)[tid] = lse_next;
      Di_s(st ^ 1)[tid] = Di_next;
    }
  }
  cp_async_wait<0>();  // (no Q block: K and V copies still complete before exit)

  // dK_j, dV_j into the accumulators (shared by the GQA group: red, or per query head).
  bwd_store_dkdv(dK, dV, TILEATTN_DKDV_DEST, dq_semaphore, b, h, H, h_per_kv, Nk, kv_start + 16 * warp + g, 2 * t,
                 HEAD_DIM, softmax_scale);
#endif
}

TILEATTN_SMEM_BYTES(bwd_v3, bwd_v3_smem(HEAD_DIM, Br, Bc));

}  // namespace tileattn
