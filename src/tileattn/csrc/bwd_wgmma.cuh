// The step the wgmma backward rungs (bwd_v3_wgmma.cu, bwd_v4_ws.cu, bwd_v6_dsplit.cu) share: from
// one Q block's transposed scores to the operands of dV, dK and dQ; and the warp-specialised
// rungs' producer warp.
//
// Layout (wgmma m64n64, keys as M): a thread of warp w of its warpgroup holds, as value i, key
// kv_start + key0 + 8 ((i % 4) / 2) (key0 = the warpgroup's first key in the K/V block + 16 w + g)
// and query row 8 (i / 4) + 2t + (i % 2) of the Q block, for both S^T = K Q^T and dP^T = V dO^T.
#pragma once

#include "bwd_common.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace tileattn {

// That layout's value i: its key, the first being key0 (+ the K/V block's kv_start), and its
// column, the first being col0: the query row of S^T and dP^T, the head-dim column of dK and dV
// (both with col0 = 2t).
__device__ __forceinline__ int acc_key(int i, int key0) { return key0 + 8 * ((i % 4) / 2); }
__device__ __forceinline__ int acc_col(int i, int col0) { return col0 + 8 * (i / 4) + (i % 2); }

// TILEATTN_BWD_DKDV_PAIRS (default 1; 0 for A/B runs): the wgmma rungs' epilogues (bwd_store_dkdv
// below) store dK and dV two columns at a time (store_dkdv2: one 4-byte store per pair instead of
// two 2-byte ones, 8-byte for bwd_v2.3's float gradients; 64 + 64 a thread instead of 128 + 128 at
// D=128 and 256), for the short lengths,
// where a CTA visits few Q blocks and its epilogue weighs.  Measured on an H200 (bf16, B=32 H=16
// N=1024, scripts/bwd_probe.py --peers, one call): bwd_v5 1.02 / 0.72 / 1.85 / 1.28 ms -> 0.95 /
// 0.65 / 1.69 / 1.14 (D=64, causal, D=128, causal: 1.54-1.60x -> 1.69-1.74x FA2), bwd_v6 at D=256
// 4.42 / 2.87 -> 4.11 / 2.55 (1.50x -> 1.62 / 1.69x FA2, 1.09 / 1.05x cuDNN); bench/NOTES.md.
#ifndef TILEATTN_BWD_DKDV_PAIRS
#define TILEATTN_BWD_DKDV_PAIRS 1
#endif

// The end of a K/V block in the wgmma rungs: this thread's dK (scaled here) and dV accumulators
// (value i at acc_key(i, key0), acc_col(i, col0): key0 holds the thread's g, col0 its 2t) through
// store_dkdv; keys past Nk are skipped.  dest: the rung's TILEATTN_DKDV_DEST fields.  PACKED
// (bwd_v5_varlen): keys are rows of the packed tensors (Nk their total, the accumulators' row
// count), bounded by the sequence's own end key_end.
template <typename T, int N, bool PACKED = false>
__device__ __forceinline__ void bwd_store_dkdv(const float (&dK)[N], const float (&dV)[N], float* dk_accum,
                                               float* dv_accum, T* dk_out, T* dv_out, long long dkv_sb,
                                               long long dkv_sh, long long dkv_sn, const int* dq_semaphore, int b,
                                               int h, int H, int h_per_kv, int Nk, int key0, int col0, int head_dim,
                                               float softmax_scale, int key_end = 0) {
#pragma unroll
  for (int i = 0; i < N; i += TILEATTN_BWD_DKDV_PAIRS ? 2 : 1) {
    const int key = acc_key(i, key0), col = acc_col(i, col0);
    if (key >= Nk || (PACKED && key >= key_end)) continue;
    if constexpr (TILEATTN_BWD_DKDV_PAIRS)  // values i, i + 1: columns col, col + 1 of one key
      store_dkdv2(TILEATTN_DKDV_DEST, dq_semaphore, b, h, H, h_per_kv, Nk, key, col, head_dim,
                  softmax_scale * dK[i], softmax_scale * dK[i + 1], dV[i], dV[i + 1]);
    else
      store_dkdv(TILEATTN_DKDV_DEST, dq_semaphore, b, h, H, h_per_kv, Nk, key, col, head_dim, softmax_scale * dK[i],
                 dV[i]);
  }
}

// A tail part's end of a K/V block (bwd_common.cuh's bwd_work), where the rung writes the
// gradients itself (dk_out): each part adds its dK and dV into the block's float32 tile of
// tail_accum (r tiles of [dK | dV], Bc keys x D each, [key][column], then r counts, all zeroed by
// bwd_preprocess) through bwd_store_dkdv's GQA path (red adds; TailTile's arguments make its index
// (key - kv_start) D + column), and the part that finishes last reads the sums back and writes
// the gradients (bwd_tail_finish).
struct TailTile {
  float *k, *v;  // (biased by -kv_start rows: bwd_store_dkdv indexes by key)
  int* count;
};
template <int Bc>
__device__ __forceinline__ TailTile tail_tile(float* tail_accum, int tail_from, int tail_segments, int kv_start,
                                              int head_dim) {
  const int tiles = (gridDim.x - tail_from) / tail_segments, t = (blockIdx.x - tail_from) / tail_segments;
  float* const k = tail_accum + (long long)t * 2 * Bc * head_dim;
  return {k - kv_start * head_dim, k + (Bc - kv_start) * head_dim,
          reinterpret_cast<int*>(tail_accum + (long long)tiles * 2 * Bc * head_dim) + t};
}
// After this part's adds: the usual ordering (every thread's adds, a fence, the consumers'
// barrier, one thread's count); the last part's threads fence again and read the sums from L2
// (ld.global.cg, where the adds were done), each the values it added, and store them as
// bwd_store_dkdv would.  THREADS consumer threads, tid among them, on named barrier barrier_id.
template <typename T, int THREADS, int N>
__device__ __forceinline__ void bwd_tail_finish(TailTile tile, int tail_segments, T* dk_out, T* dv_out,
                                                long long dkv_sb, long long dkv_sh, long long dkv_sn, int b, int h,
                                                int Nk, int key0, int col0, int head_dim, int tid, int barrier_id) {
  __shared__ int last;
  __threadfence();
  named_barrier_sync<THREADS>(barrier_id);
  if (tid == 0) last = atomicAdd(tile.count, 1) == tail_segments - 1;
  named_barrier_sync<THREADS>(barrier_id);
  if (!last) return;
  __threadfence();
#pragma unroll
  for (int i = 0; i < N; i += 2) {  // values i, i + 1: columns col, col + 1 of one key
    const int key = acc_key(i, key0), col = acc_col(i, col0);
    if (key >= Nk) continue;
    const float2 k2 = __ldcg(reinterpret_cast<const float2*>(tile.k + (long long)key * head_dim + col));
    const float2 v2 = __ldcg(reinterpret_cast<const float2*>(tile.v + (long long)key * head_dim + col));
    store_dkdv2(nullptr, nullptr, dk_out, dv_out, dkv_sb, dkv_sh, dkv_sn, nullptr, b, h, 0, 1, Nk, key, col,
                head_dim, k2.x, k2.y, v2.x, v2.y);
  }
}

// The warp-specialised rungs (bwd_v4_ws.cu, bwd_v6_dsplit.cu): the producer warpgroup keeps 24
// registers a thread, the two consumer warpgroups 240: 24 + 2 x 240 = 504, the CTA's pool (3
// warpgroups x the 168 a thread of a 384-thread launch; setmaxnreg.inc asking more would wait
// for ever: test_compile.py's pool check).
constexpr int BWD_V4_PRODUCER_REGS = 24;   // one warp issues copies and moves 2 x Br floats a block
constexpr int BWD_V4_CONSUMER_REGS = 240;

// Their pipeline's mbarriers, by thread 0 (the caller's __syncthreads publishes them): bar_kv (K_j
// and V_j: the copying lane's COPIES arrivals with their bytes, two, or four with bwd_v2.3's lo
// tiles), bar_full(st) (Q_i and dO_i: COPIES such arrivals, then one of each producer lane with its
// lse_i, D_i), bar_empty(st) (every consumer thread, once done with the stage).
template <int STAGES, int CONSUMERS, int COPIES = 2, typename BF, typename BE>
__device__ __forceinline__ void bwd_init_pipeline(unsigned bar_kv, BF bar_full, BE bar_empty) {
  mbar_init(bar_kv, COPIES);
  for (int st = 0; st < STAGES; ++st) {
    mbar_init(bar_full(st), COPIES + 32);
    mbar_init(bar_empty(st), CONSUMERS);
  }
}

// Their producer warp (lane: 0..31).  Lane 0 loads K_j, V_j once (TmaMaps built by backward.py: 1
// k and 2 v in boxes of Bc rows) and each Q block n's Q_i, dO_i (0 q and 3 dO, Br rows) into
// stage n % STAGES once the consumers have emptied it (bar_empty); the 32 lanes store its lse_i
// and D_i there and arrive on bar_full.  Block n's lse_i and D_i are loaded into registers while
// the warp waits for its stage to empty (their global-memory latency under that wait, not between
// the wait and the arrival).  Rows past Nq: lse -inf (weight 0 everywhere), D 0; their Q, dO
// rows arrive as zeros.  Packed sequences (bwd_v5_varlen): the copies start at rows q_row0 of q,
// dO and k_row0 of k, v (lse_bh, Di_bh and Nq are the sequence's), and rows past the sequence
// arrive as the next one's (the consumers zero them: bwd_v4_ws.cu).  s_q, s_do (shared-space addresses) and lse_s, Di_s (pointers) map a
// stage to its buffers, bar_full and bar_empty to its mbarriers.  SPLIT (bwd_v2.3): every tile is
// followed by its lo tile, at head h_lo (q, dO) or hk_lo (k, v) of the same maps.
template <int HEAD_DIM, int Br, int Bc, int STAGES, bool SPLIT = false, typename SQ, typename SDO, typename SL,
          typename SD, typename BF, typename BE>
__device__ __forceinline__ void bwd_produce(const TmaMaps* tmaps, unsigned s_k, unsigned s_v, SQ s_q, SDO s_do,
                                            SL lse_s, SD Di_s, unsigned bar_kv, BF bar_full, BE bar_empty,
                                            const float* lse_bh, const float* Di_bh, int kv_start, int q_first,
                                            int n_blocks, int Nq, int h, int hk, int b, int lane, int h_lo = 0,
                                            int hk_lo = 0, int rot = 0, int q_row0 = 0, int k_row0 = 0) {
  if (lane == 0) {
    tma_tile_load<HEAD_DIM>(tmaps, 1, s_k, bar_kv, Bc, k_row0 + kv_start, hk, b);
    tma_tile_load<HEAD_DIM>(tmaps, 2, s_v, bar_kv, Bc, k_row0 + kv_start, hk, b);
    if constexpr (SPLIT) {
      tma_tile_load<HEAD_DIM>(tmaps, 1, s_k + Bc * HEAD_DIM * 2, bar_kv, Bc, kv_start, hk_lo, b);
      tma_tile_load<HEAD_DIM>(tmaps, 2, s_v + Bc * HEAD_DIM * 2, bar_kv, Bc, kv_start, hk_lo, b);
    }
  }
  float lse_r[Br / 32], Di_r[Br / 32];
  auto load_stats = [&](int n) {
#pragma unroll
    for (int k = 0; k < Br / 32; ++k) {
      const int row = q_first + q_block(n, rot, n_blocks) * Br + lane + 32 * k;
      const bool ok = n < n_blocks && row < Nq;
      lse_r[k] = ok ? lse_bh[row] : TILEATTN_NEG_INF;
      Di_r[k] = ok ? Di_bh[row] : 0.0f;
    }
  };
  load_stats(0);
  for (int n = 0; n < n_blocks; ++n) {
    const int st = n % STAGES, q_start = q_first + q_block(n, rot, n_blocks) * Br;
    if (n >= STAGES) mbar_wait(bar_empty(st), ((n / STAGES) & 1) ^ 1);
    if (lane == 0) {
      tma_tile_load<HEAD_DIM>(tmaps, 0, s_q(st), bar_full(st), Br, q_row0 + q_start, h, b);
      tma_tile_load<HEAD_DIM>(tmaps, 3, s_do(st), bar_full(st), Br, q_row0 + q_start, h, b);
      if constexpr (SPLIT) {
        tma_tile_load<HEAD_DIM>(tmaps, 0, s_q(st) + Br * HEAD_DIM * 2, bar_full(st), Br, q_start, h_lo, b);
        tma_tile_load<HEAD_DIM>(tmaps, 3, s_do(st) + Br * HEAD_DIM * 2, bar_full(st), Br, q_start, h_lo, b);
      }
    }
#pragma unroll
    for (int k = 0; k < Br / 32; ++k) {
      lse_s(st)[lane + 32 * k] = lse_r[k];
      Di_s(st)[lane + 32 * k] = Di_r[k];
    }
    mbar_arrive(bar_full(st));  // (a release: this lane's stores, before the consumers' wait)
    load_stats(n + 1);
  }
}

// S^T = K Q_i^T and dP^T = V dO_i^T (SS, both K-major; A: 64 key rows of a KV_ROWS-row K / V tile,
// B: Br rows of a Q_ROWS-row Q / dO tile), one commit group, waited for unless WAIT is false (then
// the caller waits for the group and fences S and dP before reading them).  PASSES 3 (bwd_v2.3):
// fp16 hi / lo halves, x3_a_lo / x3_b_lo's three products (the lo tiles kv_lo, q_lo descriptor
// units after K / V's and Q / dO's hi tiles).
template <typename T, int HEAD_DIM, int Br, int KV_ROWS, bool WAIT = true, int Q_ROWS = Br, int PASSES = 1>
__device__ __forceinline__ void bwd_scores(float (&S)[Br / 2], float (&dP)[Br / 2], unsigned long long k_desc,
                                           unsigned long long v_desc, unsigned long long q_desc,
                                           unsigned long long do_desc, unsigned kv_lo = 0, unsigned q_lo = 0) {
  wgmma_fence();
#pragma unroll
  for (int pass = 3 - PASSES; pass < 3; ++pass)  // PASSES 1: pass 2 alone, hi hi
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      const unsigned ka = (sw128_k_step(kk, KV_ROWS) >> 4) + x3_a_lo(pass, kv_lo);
      const unsigned kb = (sw128_k_step(kk, Q_ROWS) >> 4) + x3_b_lo(pass, q_lo);
      Wgmma16<T>::ss(S, k_desc + ka, q_desc + kb, pass > 3 - PASSES || kk > 0);
      Wgmma16<T>::ss(dP, v_desc + ka, do_desc + kb, pass > 3 - PASSES || kk > 0);
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
// the block] (SwizzledTile STile) for dQ = dS K, and with STORE_P P as well (p_tile, the same
// layout: bwd_v6 reads both tiles as dV's and dK's A operands).  warp_key0: the warp's first key
// in the block.
//
// MASK false: bwd_p_ds below has checked (bwd_block_unmasked) that every (row, key) pair of the block
// is visible, so the weights need no test (and the registers of the per-element bounds are free:
// at D=128 causal the tests alone made bwd_v4 spill).
// A warpgroup's Br query rows of P^T or dS^T as 8x8 matrices (frag[ks][j]: keys warp_key0 + 8 (j %
// 2) + row, query rows 16 ks + 8 (j / 2) + column) into a [query row][key] tile by stmatrix.trans:
// each matrix as 8 rows of 16 bytes, four instructions a thread instead of 32 two-byte stores.
// Lane 8 j + c addresses query row 16 ks + 8 (j / 2) + c, key chunk (warp_key0 + 8 (j % 2)) / 8;
// the k16 steps move 16 rows on, which leaves the swizzle (row % 8) and the panel alone.
// N tiles at once, k step by k step: tile(m) (a shared-space address) <- frag(m, ks) (the four
// registers of k step ks).
template <typename STile, int Br, int N, typename Tile, typename Frag>
__device__ __forceinline__ void bwd_store_rows_trans(Tile tile, Frag frag, int warp_key0, int lane) {
  static_assert(STile::REM == 0, "whole 64-key panels: offset_panels, the k16 steps' row offset");
  const int j = lane / 8, c = lane % 8;
  const unsigned row_offset = STile::offset_panels(8 * (j / 2) + c, (warp_key0 + 8 * (j % 2)) / 8);
#pragma unroll
  for (int ks = 0; ks < Br / 16; ++ks)
#pragma unroll
    for (int m = 0; m < N; ++m) stmatrix_x4_trans(tile(m) + row_offset + STile::offset_panels(16 * ks, 0), frag(m, ks));
}

// The end of either step below: P^T and dS^T (in S and dP) as the A fragments of dV and dK, dS
// (and with STORE_P P) stored to its [query row][key] tile, fenced for the tensor core's reads.
template <typename T, typename STile, int Br, bool STORE_P>
__device__ __forceinline__ void bwd_p_ds_out(const float (&S)[Br / 2], const float (&dP)[Br / 2],
                                             unsigned (&p_frag)[Br / 16][4], unsigned (&ds_frag)[Br / 16][4],
                                             unsigned ds_tile, unsigned p_tile, int warp_key0, int lane) {
#pragma unroll
  for (int i = 0; i < Br / 2; i += 2) {
    const int n8 = i / 4;
    p_frag[n8 / 2][(n8 % 2) * 2 + (i % 4) / 2] = pack2<T>(S[i], S[i + 1]);
    ds_frag[n8 / 2][(n8 % 2) * 2 + (i % 4) / 2] = pack2<T>(dP[i], dP[i + 1]);
  }
  bwd_store_rows_trans<STile, Br, STORE_P ? 2 : 1>(
      [&](int m) { return m == 0 ? ds_tile : p_tile; },
      [&](int m, int ks) -> const unsigned(&)[4] { return m == 0 ? ds_frag[ks] : p_frag[ks]; }, warp_key0, lane);
  fence_proxy_async_smem();  // this thread's dS (and P) stores, before the tensor core reads them
}

template <typename T, typename STile, int Br, bool CAUSAL, bool MASK, bool STORE_P = false>
__device__ __forceinline__ void bwd_p_ds_step(float (&S)[Br / 2], float (&dP)[Br / 2], unsigned (&p_frag)[Br / 16][4],
                                         unsigned (&ds_frag)[Br / 16][4], unsigned ds_tile, const float* lse_i,
                                         const float* Di_i, int kv_start, int warp_key0, int q_start, int Nk,
                                         int causal_offset, float scale_log2, int lane, unsigned p_tile = 0) {
  static_assert(STile::REM == 0, "whole 64-key panels: offset_panels, the k16 steps' row offset below");
  constexpr int NS = Br / 2;
  const int key0 = warp_key0 + lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int key = acc_key(i, kv_start + key0), r = acc_col(i, 2 * t);
    const float l = lse_i[r];
    const bool seen = !MASK || (l != TILEATTN_NEG_INF && key < key_end<CAUSAL>(q_start + r, Nk, causal_offset));
    const float p = seen ? softmax_weight(S[i], scale_log2, l * TILEATTN_LOG2E) : 0.0f;
    S[i] = p;
    dP[i] = p * (dP[i] - Di_i[r]);
  }
  bwd_p_ds_out<T, STile, Br, STORE_P>(S, dP, p_frag, ds_frag, ds_tile, p_tile, warp_key0, lane);
}

// bwd_p_ds_step under the score variants (bwd_v5_variants, bwd_v5_variants_varlen): P and dS from
// the forward's scores rebuilt as frag_p_ds_variants does (bwd_common.cuh's variant_p_ds: softcap's
// tanh and its derivative on dS, ALiBi, the window's and causal masks, keys past Nk, rows whose lse
// is -inf), then the fragments and dS's tile as bwd_p_ds_step.  Every block takes the per-score
// tests (a block wholly inside a window is rare enough at the window sizes of the models that use one).
template <typename T, typename STile, int Br, bool CAUSAL>
__device__ __forceinline__ void bwd_p_ds_variants(float (&S)[Br / 2], float (&dP)[Br / 2],
                                                  unsigned (&p_frag)[Br / 16][4], unsigned (&ds_frag)[Br / 16][4],
                                                  unsigned ds_tile, const float* lse_i, const float* Di_i,
                                                  const ScoreVariants& var, int kv_start, int warp_key0, int q_start,
                                                  int Nk, int offset, float exp_scale, int lane) {
  constexpr int NS = Br / 2;
  const int key0 = warp_key0 + lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int key = acc_key(i, kv_start + key0), r = acc_col(i, 2 * t), pos = q_start + r + offset;
    const float l = lse_i[r];
    const int kend = l == TILEATTN_NEG_INF ? 0 : key_end<CAUSAL>(q_start + r, Nk, offset);
    const int lo = var.left >= 0 ? pos - var.left : 0, hi = var.right >= 0 ? pos + var.right : Nk - 1;
    variant_p_ds(S[i], dP[i], var, pos, key, kend, lo, hi, l * TILEATTN_LOG2E, Di_i[r], exp_scale);
  }
  bwd_p_ds_out<T, STile, Br, false>(S, dP, p_frag, ds_frag, ds_tile, 0, warp_key0, lane);
}

// bwd_p_ds_step for the block of Br query rows and kv_rows keys, without the per-element tests
// where bwd_block_unmasked holds (uniform over the CTA: both builds inline, one runs).
template <typename T, typename STile, int Br, bool CAUSAL, bool STORE_P = false>
__device__ __forceinline__ void bwd_p_ds(float (&S)[Br / 2], float (&dP)[Br / 2], unsigned (&p_frag)[Br / 16][4],
                                         unsigned (&ds_frag)[Br / 16][4], unsigned ds_tile, const float* lse_i,
                                         const float* Di_i, int kv_start, int kv_rows, int warp_key0, int q_start,
                                         int Nq, int Nk, int causal_offset, float scale_log2, int lane,
                                         unsigned p_tile = 0) {
  if (bwd_block_unmasked<CAUSAL>(q_start, Br, Nq, kv_start, kv_rows, Nk, causal_offset))
    bwd_p_ds_step<T, STile, Br, CAUSAL, false, STORE_P>(S, dP, p_frag, ds_frag, ds_tile, lse_i, Di_i, kv_start,
                                                        warp_key0, q_start, Nk, causal_offset, scale_log2, lane,
                                                        p_tile);
  else
    bwd_p_ds_step<T, STile, Br, CAUSAL, true, STORE_P>(S, dP, p_frag, ds_frag, ds_tile, lse_i, Di_i, kv_start,
                                                       warp_key0, q_start, Nk, causal_offset, scale_log2, lane, p_tile);
}

}  // namespace tileattn
