// bwd_v1: FlashAttention-2's backward on CUDA cores, FP32 — the backward ladder's first rung, the
// plain loop nest of reference.attention_backward_tiled with every product in FP32 FMAs.
//
// One thread block per (K/V block j of Bc keys, batch * head); grid (ceil(Nk / Bc), B*H).  Kj, Vj
// stay in shared memory, dK_j and dV_j in registers, for the whole inner loop over the Q blocks
// that can see block j (causal: the blocks above the diagonal are skipped).  Per Q block i:
//   1. Qi, dOi (Br rows), lse_i, D_i into shared memory (rows past Nq: zeros, weight 0);
//   2. P = exp(scale Qi Kj^T - lse_i) (0 where masked, past Nk or for a row that saw no key) and
//      dS = P * (dOi Vj^T - D_i), both Br x Bc in shared memory;
//   3. dV_j += P^T dOi and dK_j += dS^T Qi in registers;
//   4. dQ_i += scale dS Kj, added into the float32 dq_accum with atomics (other K/V blocks add
//      theirs concurrently).
// At the end dK_j, dV_j (scale applied to dK) are added into dk_accum, dv_accum: atomics, since
// the H / H_kv query heads of a GQA group all add into their K/V head.
//
// Layout: NTHREADS = 256.  Shared tiles are padded to D+1 (Q, dO, K, V) and Bc+1 (P, dS) floats,
// so that a warp walking one index of a tile's rows reads 32 banks.  Step 2 gives each thread
// Br*Bc/256 (row, key) pairs, keys fastest; step 3 each thread one key and HEAD_DIM/TPK columns
// (TPK = 256/Bc threads per key); step 4 one row and HEAD_DIM/TPR columns (TPR = 256/Br).
#include "bwd_common.cuh"

namespace tileattn {

constexpr int BWD_V1_THREADS = 256;

__host__ __device__ constexpr int bwd_v1_smem(int D, int Br, int Bc) {
  return (2 * Bc * (D + 1) + 2 * Br * (D + 1) + 2 * Br * (Bc + 1) + 2 * Br) * 4;
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(BWD_V1_THREADS, 1) bwd_v1(TILEATTN_BWD_PARAMS(T)) {
  static_assert(sizeof(T) == 4, "bwd_v1 is an FP32 rung");
  constexpr int NT = BWD_V1_THREADS, LD = HEAD_DIM + 1, LS = Bc + 1;
  constexpr int TPK = NT / Bc, TPR = NT / Br;  // threads per key (step 3), per query row (step 4)
  static_assert(NT % Bc == 0 && NT % Br == 0 && HEAD_DIM % TPK == 0 && HEAD_DIM % TPR == 0, "whole tiles per thread");
  static_assert((Br * Bc) % NT == 0, "whole (row, key) pairs per thread");
  constexpr int DK = HEAD_DIM / TPK, DQ = HEAD_DIM / TPR, PAIRS = Br * Bc / NT;

  extern __shared__ float smem[];
  float* Ks = smem;               // [Bc][LD]
  float* Vs = Ks + Bc * LD;       // [Bc][LD]
  float* Qs = Vs + Bc * LD;       // [Br][LD]
  float* dOs = Qs + Br * LD;      // [Br][LD]
  float* Ps = dOs + Br * LD;      // [Br][LS]
  float* dSs = Ps + Br * LS;      // [Br][LS]
  float* lse_s = dSs + Br * LS;   // [Br]
  float* Di_s = lse_s + Br;       // [Br]

  const int tid = threadIdx.x;
  const int bh = blockIdx.y + bh_offset;
  const int b = bh / H, h = bh % H, hk = h / h_per_kv;
  const int kv_start = blockIdx.x * Bc;
  const float* k_bh = k + b * k_sb + hk * k_sh;
  const float* v_bh = v + b * v_sb + hk * v_sh;
  const float* q_bh = q + b * q_sb + h * q_sh;
  const float* do_bh = dout + b * do_sb + h * do_sh;
  const float* lse_bh = lse + (long long)bh * Nq;
  const float* Di_bh = Di + (long long)bh * Nq;
  float* dq_bh = dq_accum + (long long)bh * Nq * HEAD_DIM;

  // Kj, Vj once (keys past Nk: zeros; their P is 0 as well).
  for (int i = tid; i < Bc * HEAD_DIM; i += NT) {
    const int c = i / HEAD_DIM, d = i % HEAD_DIM;
    const bool ok = kv_start + c < Nk;
    Ks[c * LD + d] = ok ? k_bh[(kv_start + c) * k_sn + d] : 0.0f;
    Vs[c * LD + d] = ok ? v_bh[(kv_start + c) * v_sn + d] : 0.0f;
  }

  // Step 3's ownership: key c3, columns d3 + TPK * m.
  const int c3 = tid / TPK, d3 = tid % TPK;
  float dK[DK], dV[DK];
#pragma unroll
  for (int m = 0; m < DK; ++m) dK[m] = dV[m] = 0.0f;

  for (int q_start = first_q_start<CAUSAL, Br>(kv_start, causal_offset); q_start < Nq; q_start += Br) {
    __syncthreads();  // the previous Q block's tiles are no longer read
    // 1. Qi, dOi, lse_i, D_i.
    for (int i = tid; i < Br * HEAD_DIM; i += NT) {
      const int r = i / HEAD_DIM, d = i % HEAD_DIM;
      const bool ok = q_start + r < Nq;
      Qs[r * LD + d] = ok ? q_bh[(q_start + r) * q_sn + d] : 0.0f;
      dOs[r * LD + d] = ok ? do_bh[(q_start + r) * do_sn + d] : 0.0f;
    }
    load_row_stats<Br, NT>(lse_s, Di_s, lse_bh, Di_bh, q_start, Nq);
    __syncthreads();

    // 2. P and dS for this thread's (row, key) pairs.
#pragma unroll 1
    for (int e = 0; e < PAIRS; ++e) {
      const int idx = tid + NT * e, r = idx / Bc, c = idx % Bc;
      float s = 0.0f, dp = 0.0f;
#pragma unroll 8
      for (int d = 0; d < HEAD_DIM; ++d) {
        s = fmaf(Qs[r * LD + d], Ks[c * LD + d], s);
        dp = fmaf(dOs[r * LD + d], Vs[c * LD + d], dp);
      }
      const int row = q_start + r, key = kv_start + c;
      const float l = lse_s[r];
      // lse = -inf: a row that saw no key (or a padding row) has every weight 0.
      const bool visible = key < key_end<CAUSAL>(row, Nk, causal_offset) && l != TILEATTN_NEG_INF;
      const float p = visible ? expf(fmaf(s, softmax_scale, -l)) : 0.0f;
      Ps[r * LS + c] = p;
      dSs[r * LS + c] = p * (dp - Di_s[r]);
    }
    __syncthreads();

    // 3. dV_j += P^T dOi, dK_j += dS^T Qi (scale applied once, at the end).
#pragma unroll 4
    for (int r = 0; r < Br; ++r) {
      const float p = Ps[r * LS + c3], ds = dSs[r * LS + c3];
#pragma unroll
      for (int m = 0; m < DK; ++m) {
        dV[m] = fmaf(p, dOs[r * LD + d3 + TPK * m], dV[m]);
        dK[m] = fmaf(ds, Qs[r * LD + d3 + TPK * m], dK[m]);
      }
    }

    // 4. dQ_i += scale dS Kj, into dq_accum (deterministic: in K/V block order, plain adds).
    int* count = dq_count<Br>(dq_semaphore, bh, Nq, q_start);
    if (count) ordered_add_begin(count, blockIdx.x);
    {
      const int r4 = tid / TPR, d4 = tid % TPR;
      if (q_start + r4 < Nq) {
        float dq[DQ];
#pragma unroll
        for (int m = 0; m < DQ; ++m) dq[m] = 0.0f;
#pragma unroll 4
        for (int c = 0; c < Bc; ++c) {
          const float ds = dSs[r4 * LS + c];
#pragma unroll
          for (int m = 0; m < DQ; ++m) dq[m] = fmaf(ds, Ks[c * LD + d4 + TPR * m], dq[m]);
        }
        float* dq_row = dq_bh + (long long)(q_start + r4) * HEAD_DIM;
#pragma unroll
        for (int m = 0; m < DQ; ++m) {
          if (count)
            dq_row[d4 + TPR * m] += softmax_scale * dq[m];
          else
            red_add(dq_row + d4 + TPR * m, softmax_scale * dq[m]);
        }
      }
    }
    if (count) ordered_add_end(count);
  }

  // dK_j, dV_j into the accumulators (shared by the GQA group: atomics, or per query head).
  if (kv_start + c3 < Nk) {
#pragma unroll
    for (int m = 0; m < DK; ++m)
      store_dkdv(TILEATTN_DKDV_DEST, dq_semaphore, b, h, H, h_per_kv, Nk, kv_start + c3, d3 + TPK * m, HEAD_DIM,
                 softmax_scale * dK[m], dV[m]);
  }
}

// Kj, Vj, Qi, dOi padded to D+1; P and dS padded to Bc+1; lse_i and D_i.
TILEATTN_SMEM_BYTES(bwd_v1, bwd_v1_smem(HEAD_DIM, Br, Bc));

}  // namespace tileattn
