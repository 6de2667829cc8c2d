// bwd_v2.2: the FP32-accurate backward on tensor cores by 3xTF32 (mma.sync m16n8k8), sm_80 and
// newer: bwd_v2's loop nest for FP32 inputs, as v2.2 is the forward's FP32 tensor-core rung.
//
// Why: bwd_v1 multiplies on CUDA cores at ~10 TFLOP/s, 0.26-0.29x PyTorch's memory-efficient
// backward on an H200 (bench/results/bwd_n8192.json).  Here every product runs on the tensor
// core with each FP32 operand split x = hi + lo into TF32 halves and three products summed
// (tf32x3.cuh: FP32-level error); bwd_v2.2_tf32 (opt-in, precision="tf32") issues hi*hi only.
//
// One thread block of four warps per (K/V block j of Bc keys, batch * head), as bwd_v2:
//   0. K_j, V_j are read once, split into hi/lo and kept in shared memory ([key][d], row stride
//      D + 4: conflict-free ldmatrix of S's and dP's B fragments, and conflict-free scalar reads
//      of dQ's, below);
//   1. per Q block (Br = 64 rows; bwd_v2_2_stages: one stage for 3xTF32, two for TF32 on sm_90):
//      Q_i, dO_i by cp.async as raw FP32 into XOR-swizzled [row][d] tiles, lse_i, D_i;
//   2. warp w takes rows 16w..16w+15: S = Q_w K_j^T and dP = dO_w V_j^T (A fragments by ldmatrix,
//      split in registers), P = 2^(scale log2(e) S - log2(e) lse) (0 where masked), dS = P (dP - D_i);
//   3. P^T and dS^T to shared memory as FP32 [key][row] (stride Br + 4), and dQ_w = dS_w K_j from
//      registers: dS's C fragments are A fragments under v2.2's key permutation (tf32x3.cuh),
//      so K's B fragment is keys (2t, 2t+1) of each 8, read as scalars from the [key][d] tile;
//      added into dq_accum with red (deterministic: in K/V-block order);
//   4. after a barrier, warp w takes 16 keys (and, at Bc = 32, half the head dim): dV_w += P^T dO_i
//      and dK_w += dS^T Q_i, A fragments by ldmatrix of the [key][row] tiles, B fragments
//      (rows t, t + 4 of column g) as scalars from the swizzled tiles.
// At the end dK_j (times scale) and dV_j go into dk_accum, dv_accum as in bwd_v2.
//
// Numerics: the tensor core's FP32 accumulation is not round-to-nearest (v2_2_tf32x3.cu: the
// forward's error grew with N when O accumulated inside mma across K/V blocks), so each product
// runs from zero over one block's k extent (D for S and dP, Bc keys for dQ, Br rows for dV and
// dK) and dV, dK are summed across Q blocks in FP32 FADD; dQ's blocks add in L2 (red).
//
// Swizzle of the Q and dO tiles (FP32 [row][HEAD_DIM], HEAD_DIM a multiple of 32): element (r, c)
// sits at column c ^ qk_swizzle(r), qk_swizzle(r) = 8 (r % 4) + 4 ((r / 4) % 2), which stays inside
// the 32-column chunk and keeps 16-byte chunks whole (cp.async).  It serves both reads:
//   step 2's ldmatrix (8 rows of one 16-byte chunk): the chunks land on 8 different bank groups;
//   step 4's B fragments (rows 8ks + t, columns 8n + g, one instruction): banks
//   (8n + g) ^ 8t (and ^ (8t + 4) for rows + 4) are 32 different banks.
#include "bwd_common.cuh"
#include "tf32x3.cuh"

namespace tileattn {

constexpr int BWD_V2_2_THREADS = 128;

__device__ __forceinline__ int qk_swizzle(int r) { return 8 * (r % 4) + 4 * ((r / 4) % 2); }

// Q_i, dO_i stages.  3xTF32: one (measured on an H200, scripts/bwd_probe.py: 2-7% faster than two
// at D=128, and at D=64 it lets two blocks of Bc = 32 share an SM: 8-10% faster than one block of
// Bc = 64 with two).  TF32: two where the shared memory of sm_90 (227 KB) holds them (0-5% faster
// than one), one on sm_80 (163 KB).
__host__ __device__ constexpr int bwd_v2_2_stages(bool split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return split ? 1 : 2;
#else
  return 1;
#endif
}

// K, V hi (and lo) [Bc][D + 4]; per stage Q, dO [Br][D]; P^T, dS^T [Bc][Br + 4]; per stage lse_i, D_i.
__host__ __device__ constexpr int bwd_v2_2_smem(int D, int Br, int Bc, bool split) {
  return ((split ? 4 : 2) * Bc * (D + 4) + bwd_v2_2_stages(split) * 2 * (Br * D + Br) + 2 * Bc * (Br + 4)) * 4;
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, bool SPLIT>
__device__ __forceinline__ void bwd_v2_2_body(TILEATTN_BWD_PARAMS(T)) {
  static_assert(sizeof(T) == 4, "bwd_v2.2 is an FP32 rung");
  static_assert(Br == 64 && (Bc == 64 || Bc == 32), "four warps: 16 query rows each in steps 2-3");
  static_assert(HEAD_DIM % 32 == 0, "the Q / dO swizzle works in 32-column chunks");
  constexpr int NTHREADS = BWD_V2_2_THREADS, STAGES = bwd_v2_2_stages(SPLIT);
  constexpr int KSTEPS = HEAD_DIM / 8, NT = Bc / 8, DT = HEAD_DIM / 8;
  constexpr int SK = HEAD_DIM + 4, SP = Br + 4;  // row strides (floats) of K / V and of P^T / dS^T
  // Step 4: KC chunks of 16 keys, each taken by DPARTS warps that split the head dim; DTW = the
  // 8-column tiles of dK and dV one warp holds.
  constexpr int KC = Bc / 16, DPARTS = 4 / KC, DTW = DT / DPARTS;
  // dQ's 8-column tiles per pass: 8 independent accumulator chains of (Bc / 8) x 3 dependent mma
  // (32 partial sums live); 4 measured 0-5% slower (H200, bench/NOTES.md).
  constexpr int DQ_TILES = DT >= 8 ? 8 : DT;
  static_assert(DT % DQ_TILES == 0, "whole dQ passes");

  extern __shared__ __align__(16) float smem[];
  float* Khi = smem;
  float* Klo = Khi + Bc * SK;  // (SPLIT only, as Vlo)
  float* Vhi = Klo + (SPLIT ? Bc * SK : 0);
  float* Vlo = Vhi + Bc * SK;
  float* stage0 = Vlo + (SPLIT ? Bc * SK : 0);
  auto Qs = [&](int st) { return stage0 + st * 2 * Br * HEAD_DIM; };  // stage st: Q, then dO
  auto dOs = [&](int st) { return Qs(st) + Br * HEAD_DIM; };
  float* Pt = Qs(STAGES);  // P^T [key][row]
  float* dSt = Pt + Bc * SP;
  auto lse_s = [&](int st) { return dSt + Bc * SP + st * 2 * Br; };
  auto Di_s = [&](int st) { return lse_s(st) + Br; };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int lm = lane / 8, lr = lane % 8;  // ldmatrix: which matrix / which row this lane addresses
  const int bh = blockIdx.y + bh_offset;
  const int b = bh / H, h = bh % H, hk = h / h_per_kv;
  const int kv_start = blockIdx.x * Bc;
  const T* q_bh = q + b * q_sb + h * q_sh;
  const T* do_bh = dout + b * do_sb + h * do_sh;
  const float* lse_bh = lse + (long long)bh * Nq;
  const float* Di_bh = Di + (long long)bh * Nq;
  float* dq_bh = dq_accum + (long long)bh * Nq * HEAD_DIM;

  // Q block q_start's rows, lse_i and D_i into stage st, all by cp.async (one group with whatever
  // else is pending), so that no register holds them in flight.  Rows past Nq are zero-filled,
  // lse included: their Q and dO rows are 0, so S = dP = 0, P = 1 and dS = 1 (0 - 0) = 0, and
  // they add nothing to dV = P^T dO or dK = dS^T Q (their dQ is not stored).
  auto copy_q_block = [&](int q_start, int st) {
    for (int i = tid; i < Br * HEAD_DIM / 4; i += NTHREADS) {
      const int r = i / (HEAD_DIM / 4), c4 = (i % (HEAD_DIM / 4)) * 4;
      const bool ok = q_start + r < Nq;
      const long long row = ok ? q_start + r : 0;
      const int off = r * HEAD_DIM + (c4 ^ qk_swizzle(r));
      cp_async_16(Qs(st) + off, q_bh + row * q_sn + c4, ok);
      cp_async_16(dOs(st) + off, do_bh + row * do_sn + c4, ok);
    }
    if (tid < Br) {
      const bool ok = q_start + tid < Nq;
      const int row = ok ? q_start + tid : 0;
      cp_async_4(lse_s(st) + tid, lse_bh + row, ok);
      cp_async_4(Di_s(st) + tid, Di_bh + row, ok);
    }
  };
  const int q_first = first_q_start<CAUSAL, Br>(kv_start, causal_offset);
  if (q_first < Nq) copy_q_block(q_first, 0);
  cp_async_commit();

  // 0. K_j, V_j split into hi / lo once (keys past Nk: zeros; their P is 0 as well).
  {
    const T* k_bh = k + b * k_sb + hk * k_sh;
    const T* v_bh = v + b * v_sb + hk * v_sh;
    for (int i = tid; i < Bc * HEAD_DIM / 4; i += NTHREADS) {
      const int r = i / (HEAD_DIM / 4), c4 = (i % (HEAD_DIM / 4)) * 4;
      const bool ok = kv_start + r < Nk;
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 kx = ok ? *reinterpret_cast<const float4*>(k_bh + (kv_start + r) * k_sn + c4) : zero;
      const float4 vx = ok ? *reinterpret_cast<const float4*>(v_bh + (kv_start + r) * v_sn + c4) : zero;
      if (SPLIT) {
        uint4 hi, lo;
        split_tf32x4(kx, hi, lo);
        *reinterpret_cast<uint4*>(Khi + r * SK + c4) = hi;
        *reinterpret_cast<uint4*>(Klo + r * SK + c4) = lo;
        split_tf32x4(vx, hi, lo);
        *reinterpret_cast<uint4*>(Vhi + r * SK + c4) = hi;
        *reinterpret_cast<uint4*>(Vlo + r * SK + c4) = lo;
      } else {  // the tensor core truncates to TF32
        *reinterpret_cast<float4*>(Khi + r * SK + c4) = kx;
        *reinterpret_cast<float4*>(Vhi + r * SK + c4) = vx;
      }
    }
  }

  // Per-lane offsets.  Step 2's A fragments: rows 16 warp + 8 (lm & 1) + lr, columns 8 kk +
  // 4 (lm >> 1) (swizzled); its B fragments (v2.2's): keys 8 (lm >> 1) + lr, columns 4 (lm & 1).
  // Step 4's A fragments: keys 16 kc + 8 (lm & 1) + lr, rows 8 ks + 4 (lm >> 1).
  const int a_row = 16 * warp + 8 * (lm & 1) + lr, a_col = 4 * (lm >> 1), a_swz = qk_swizzle(lr);
  const int k_lane = (8 * (lm >> 1) + lr) * SK + 4 * (lm & 1);
  const int kc = DPARTS == 1 ? warp : warp % KC, dt0 = DPARTS == 1 ? 0 : (warp / KC) * DTW;
  const int pt_lane = (16 * kc + 8 * (lm & 1) + lr) * SP + 4 * (lm >> 1);

  // dK_w, dV_w: keys kv_start + 16 kc + g (elements 0, 1) and + 8 (2, 3), columns 8 (dt0 + dt) +
  // 2t, +1.
  float dK[DTW][4], dV[DTW][4];
#pragma unroll
  for (int dt = 0; dt < DTW; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dK[dt][e] = dV[dt][e] = 0.0f;

  const float scale_log2 = softmax_scale * TILEATTN_LOG2E;  // any sign: no max is folded here
  for (int q_start = q_first, st = 0; q_start < Nq; q_start += Br, st = (st + 1) % STAGES) {
    // 1. The next Q block into the other stage (two stages) while this one's copies land.  One
    //    stage: this block's copies were issued at the end of the previous step.
    __syncthreads();  // the previous step's readers of P^T, dS^T and the other stage are done
    const int q_next = q_start + Br;
    if (STAGES == 2 && q_next < Nq) copy_q_block(q_next, st ^ 1);
    cp_async_commit();  // (empty at the last block: the count of groups stays one a step)
    cp_async_wait<1>();  // this block's group
    __syncthreads();
    const float* Q_i = Qs(st);
    const float* dO_i = dOs(st);
    const float* lse_i = lse_s(st);
    const float* Di_i = Di_s(st);

    // 2. S = Q_w K_j^T and dP = dO_w V_j^T, 16 x Bc per warp: [nt] holds keys 8 nt + 2t, +1 of
    //    rows g (elements 0, 1) and g + 8 (2, 3).
    float S[NT][4], dP[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[nt][e] = dP[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      FragA<SPLIT> qa, da;
      {
        unsigned r[4], s[4];
        const int off = a_row * HEAD_DIM + ((8 * kk + a_col) ^ a_swz);
        ldmatrix_x4(r, Q_i + off);
        ldmatrix_x4(s, dO_i + off);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          qa.set(i, __uint_as_float(r[i]));
          da.set(i, __uint_as_float(s[i]));
        }
      }
#pragma unroll
      for (int n = 0; n < NT; n += 2) {
        unsigned kh[4], kl[4], vh[4], vl[4];
        ldmatrix_x4(kh, Khi + n * 8 * SK + k_lane + kk * 8);
        ldmatrix_x4(vh, Vhi + n * 8 * SK + k_lane + kk * 8);
        if (SPLIT) {
          ldmatrix_x4(kl, Klo + n * 8 * SK + k_lane + kk * 8);
          ldmatrix_x4(vl, Vlo + n * 8 * SK + k_lane + kk * 8);
        }
        mma_fp32<SPLIT>(S[n], qa, {kh[0], kh[1]}, {kl[0], kl[1]});
        mma_fp32<SPLIT>(S[n + 1], qa, {kh[2], kh[3]}, {kl[2], kl[3]});
        mma_fp32<SPLIT>(dP[n], da, {vh[0], vh[1]}, {vl[0], vl[1]});
        mma_fp32<SPLIT>(dP[n + 1], da, {vh[2], vh[3]}, {vl[2], vl[3]});
      }
    }
    // P and dS in place (S becomes P, dP becomes dS).
    frag_p_ds<CAUSAL>(S, dP, lse_i, Di_i, 16 * warp, q_start, kv_start, Nk, causal_offset, scale_log2, g, t);

    // 3. P^T and dS^T to shared memory as [key][row]: one store instruction covers keys 8 nt +
    //    2t + e (bank 8t + 4e + const) of rows g (+ const): 32 different banks.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = 8 * nt + 2 * t + (e % 2), r = 16 * warp + g + 8 * (e / 2);
        Pt[key * SP + r] = S[nt][e];
        dSt[key * SP + r] = dP[nt][e];
      }
    // dQ_w = dS_w K_j: k-steps of 8 keys, dS's C fragment as the A fragment (a0..a3 = c0, c2, c1,
    // c3: k-index t is key 2t, t + 4 is key 2t + 1), K's B fragment keys 2t, 2t + 1 of column g.
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
      for (int kk = 0; kk < NT; ++kk) {
        FragA<SPLIT> a;
        a.set_from_c(dP[kk]);
#pragma unroll
        for (int i = 0; i < DQ_TILES; ++i) {
          const int off = (8 * kk + 2 * t) * SK + 8 * (d0 + i) + g;
          FragB<SPLIT> kb;
          kb.hi[0] = __float_as_uint(Khi[off]);
          kb.hi[1] = __float_as_uint(Khi[off + SK]);
          if (SPLIT) {
            kb.lo[0] = __float_as_uint(Klo[off]);
            kb.lo[1] = __float_as_uint(Klo[off + SK]);
          }
          mma_fp32<SPLIT>(dq[i], a, kb.hi, kb.lo);
        }
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = q_start + 16 * warp + 8 * hh + g;
        if (row < Nq) {
          float* dq_row = dq_bh + (long long)row * HEAD_DIM + 8 * d0 + 2 * t;
#pragma unroll
          for (int i = 0; i < DQ_TILES; ++i) {
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
      ordered_add_end(count);  // (its barrier also publishes P^T and dS^T)
    else
      __syncthreads();  // every warp's P^T and dS^T are in shared memory

    // 4. dV_w += P^T dO_i, dK_w += dS^T Q_i over the Q block's rows, 8 at a time: 3xTF32 sums each
    //    block from zero in the tensor core and adds it in FP32; TF32 (~1e-3 error anyway)
    //    accumulates in dV, dK directly, which leaves ptxas the 64 registers of the block sums.
    float pv_blk[DTW][4], sq_blk[DTW][4];  // (unused, so not allocated, in TF32)
    float(&pv)[DTW][4] = SPLIT ? pv_blk : dV;
    float(&sq)[DTW][4] = SPLIT ? sq_blk : dK;
#pragma unroll
    for (int dt = 0; dt < DTW; ++dt)
#pragma unroll
      for (int e = 0; e < 4 && SPLIT; ++e) pv[dt][e] = sq[dt][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < Br / 8; ++ks) {
      FragA<SPLIT> pa, sa;
      {
        unsigned r[4], s[4];
        ldmatrix_x4(r, Pt + pt_lane + 8 * ks);
        ldmatrix_x4(s, dSt + pt_lane + 8 * ks);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          pa.set(i, __uint_as_float(r[i]));
          sa.set(i, __uint_as_float(s[i]));
        }
      }
      // B fragments: rows 8 ks + t (b0) and + 4 (b1), column 8 n + g, of dO_i and Q_i.
      const int row0 = (8 * ks + t) * HEAD_DIM, row1 = row0 + 4 * HEAD_DIM;
      const int swz0 = qk_swizzle(t), swz1 = qk_swizzle(t + 4);
#pragma unroll
      for (int dt = 0; dt < DTW; ++dt) {
        const int c = 8 * (dt0 + dt) + g;
        FragB<SPLIT> ob, qb;
        ob.set(0, dO_i[row0 + (c ^ swz0)]);
        ob.set(1, dO_i[row1 + (c ^ swz1)]);
        qb.set(0, Q_i[row0 + (c ^ swz0)]);
        qb.set(1, Q_i[row1 + (c ^ swz1)]);
        mma_fp32<SPLIT>(pv[dt], pa, ob.hi, ob.lo);
        mma_fp32<SPLIT>(sq[dt], sa, qb.hi, qb.lo);
      }
    }
#pragma unroll
    for (int dt = 0; dt < DTW; ++dt)
#pragma unroll
      for (int e = 0; e < 4 && SPLIT; ++e) {
        dV[dt][e] += pv[dt][e];
        dK[dt][e] += sq[dt][e];
      }

    if (STAGES == 1 && q_next < Nq) {  // one stage: the next block's copies after every read of this one
      __syncthreads();
      copy_q_block(q_next, 0);
      cp_async_commit();  // (the next step's top commits an empty group after it: wait<1> covers this)
    }
  }
  cp_async_wait<0>();  // (no Q block: its copy group still completes before exit)

  // dK_j, dV_j into the accumulators (shared by the GQA group: atomics, or per query head).
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = kv_start + 16 * kc + 8 * hh + g;
    if (key < Nk) {
#pragma unroll
      for (int dt = 0; dt < DTW; ++dt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          store_dkdv(TILEATTN_DKDV_DEST, dq_semaphore, b, h, H, h_per_kv, Nk, key, 8 * (dt0 + dt) + 2 * t + e, HEAD_DIM,
                     softmax_scale * dK[dt][2 * hh + e], dV[dt][2 * hh + e]);
    }
  }
}

// 3xTF32: FP32-level accuracy (the default for FP32 inputs).
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(BWD_V2_2_THREADS, 1) bwd_v2_2(TILEATTN_BWD_PARAMS(T)) {
  bwd_v2_2_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*SPLIT=*/true>(TILEATTN_BWD_ARGS);
}

// One TF32 product per multiply (opt-in, precision="tf32"): ~1e-3 relative error.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(BWD_V2_2_THREADS, 1) bwd_v2_2_tf32(TILEATTN_BWD_PARAMS(T)) {
  bwd_v2_2_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*SPLIT=*/false>(TILEATTN_BWD_ARGS);
}

TILEATTN_SMEM_BYTES(bwd_v2_2, bwd_v2_2_smem(HEAD_DIM, Br, Bc, true));
TILEATTN_SMEM_BYTES(bwd_v2_2_tf32, bwd_v2_2_smem(HEAD_DIM, Br, Bc, false));

}  // namespace tileattn
