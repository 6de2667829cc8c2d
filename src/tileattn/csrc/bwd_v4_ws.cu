// bwd_v4: bwd_v3's products on a warp-specialised CTA of 128 keys (sm_90a): a producer warp
// streams Q_i, dO_i (TMA), lse_i and D_i into three stages, two consumer warpgroups of 64 keys
// each share every one of them.  fp16 / bf16, head dims 64 and 128.
//
// Why: bwd_v3 (one warpgroup per 64 keys) runs its five products, the elementwise step, the dS
// stores and the dQ adds strictly in sequence, and two of its CTAs an SM fill few of the gaps:
// 245-276 TFLOP/s on an H200 against 380-410 here at D=128 (bench/NOTES.md).
// Here (FlashAttention-3's backward layout; Shah et al. 2024):
//  * Bc = 128 keys per CTA over two consumer warpgroups: each Q_i / dO_i tile is read for twice
//    the keys, and dQ's adds per key halve (at D=128 each warpgroup computes 64 of dQ's columns
//    over all 128 keys; at D=64 each adds its own 64 keys' part);
//  * a producer warp (the first warpgroup, its registers given to the consumers by setmaxnreg
//    24 / 240) loads K_j, V_j once and then Q_i, dO_i (TMA tensor copies, 128-byte swizzle) and
//    lse_i, D_i (its 32 lanes) into a three-stage ring on full / empty mbarriers, so the copies
//    of the next blocks run under this block's products;
//  * at D=128 the two warpgroups meet once per Q block (named barrier 1: every dS row is in
//    shared memory before either multiplies dQ = dS K); dS is double-buffered so that a
//    warpgroup that runs ahead writes the other buffer.  At D=64 each waits for its own rows only.
// The products per warpgroup are bwd_v3's, with the key dimension as wgmma's M:
//   S^T = K_w Q_i^T, dP^T = V_w dO_i^T (SS); P^T, dS^T in registers; dV_w += P^T dO_i,
//   dK_w += dS^T Q_i (RS); dQ_i = dS K (SS), added into dq_accum with red.global.add.
// Not deterministic (the dQ adds land in any order): a deterministic backward runs bwd_v5 (its
// producer warp orders the dQ reductions) or bwd_v3.
#include "bwd_common.cuh"
#include "bwd_wgmma.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace tileattn {

constexpr int BWD_V4_WG = 128;
constexpr int BWD_V4_STAGES = 3;  // Q_i / dO_i / lse_i / D_i stages: fits beside K, V and dS at D=128 (194 KB)
constexpr int BWD_V4_DQ_BYTES = 64 * 64 * 4;  // bwd_v5: a consumer warpgroup's dQ tile (float32)
constexpr int BWD_V5_VARLEN_BARRIER = 4;  // bwd_v5_varlen's named barrier (1, 2: dS; 3: the tail's)
// Br = 128 (bwd_v5's tile at D=64) takes two stages: three with the 128-row dS tiles would pass
// 227 KB by 88 bytes.
__host__ __device__ constexpr int bwd_v4_stages(int Br) { return Br == 128 ? 2 : BWD_V4_STAGES; }

// TILEATTN_BWD_V4_PIPE (default 1; 0 gives the serial order, for A/B runs) issues block n+1's S^T
// and dP^T right after block n's dQ product, so that n's dQ wait and red adds run under n+1's
// products instead of leaving the tensor core to the other warpgroup.  D=64 only: S and dP are
// dead once packed into the fragments, so n+1's products reuse them, and the fragments, dQ, dK,
// dV and S, dP in flight together are 192 registers; at D=128 dK and dV alone are 128 (256 >
// 240).  Measured on an H200 (scripts/bwd_probe.py, bf16 B=4 H=16 N=8192, one call, at cc5d0fd):
// 9.81 -> 9.64 ms non-causal, 5.26 -> 5.07 ms causal (bench/results/sweeps/bwd_v4_pipe_cc5d0fd.log).
#ifndef TILEATTN_BWD_V4_PIPE
#define TILEATTN_BWD_V4_PIPE 1
#endif
// TILEATTN_BWD_V5_LATE_PUBLISH (default 1; 0 for A/B runs): bwd_v5 outside the PIPE order hands a
// block's dQ tile to its dQ warp (proxy fence, dq_full) after issuing the next block's S^T and dP^T
// instead of right after its shared stores, so that the fence's wait for those stores runs under
// the products.  (ncu's source counters at D=128: 4.7% of all warp samples on that fence and the
// arrival after it, bench/NOTES.md.)
#ifndef TILEATTN_BWD_V5_LATE_PUBLISH
#define TILEATTN_BWD_V5_LATE_PUBLISH 1
#endif

// Shared memory: K_j, V_j (Bc x D), bwd_v4_stages(Br) stages of Q_i and dO_i (Br x D), two dS tiles
// (Br x Bc, [query row][key]), all 16-bit SwizzledTiles whose sizes are multiples of 1024 bytes
// (the 128-byte swizzle's alignment); with DQ_BULK (bwd_v5) each consumer warpgroup's dQ tile
// (64 rows x 64 columns, float32); the stages' lse_i and D_i (Br floats each); the mbarriers
// (DQ_BULK: a full and an empty one per consumer warpgroup more).
__host__ __device__ constexpr int bwd_v4_smem(int D, int Br, int Bc, bool dq_bulk = false) {
  return (2 * Bc * D + bwd_v4_stages(Br) * 2 * Br * D + 2 * Br * Bc) * 2 + (dq_bulk ? 2 * BWD_V4_DQ_BYTES : 0) +
         bwd_v4_stages(Br) * 2 * Br * 4 + (1 + 2 * bwd_v4_stages(Br) + (dq_bulk ? 4 : 0)) * 8;
}

// Rows first .. ROWS - 1 (first >= 0) of a 16-bit tile of 64-column panels (ROWS rows of 128
// bytes each, the 128-byte swizzle permuting 16-byte chunks within a row) at shared address tile,
// set to 0 by thread tid of NTHREADS.  The caller fences them for the async proxy and syncs.
template <int ROWS, int HEAD_DIM, int NTHREADS>
__device__ __forceinline__ void zero_tile_rows(unsigned tile, int first, int tid) {
  const int chunks = (ROWS - first) * 8;  // a panel's 16-byte chunks from row first on
  for (int i = tid; i < HEAD_DIM / 64 * chunks; i += NTHREADS)
    st_shared_zero16(tile + i / chunks * ROWS * 128 + first * 128 + i % chunks * 16);
}

// The kernel body of bwd_v4 (DQ_BULK false) and bwd_v5 (bwd_v5_dq_bulk.cu: true; VARLEN:
// packed sequences; VARIANTS: the forward's window, softcap and ALiBi, bwd_wgmma.cuh's
// bwd_p_ds_variants, with each K/V block's Q blocks cut to the window as bwd_v2_variants cuts
// them).  tmaps: the kernel's __grid_constant__ parameter.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, bool DQ_BULK, bool VARLEN = false,
          bool VARIANTS = false>
__device__ __forceinline__ void bwd_v4_body(TILEATTN_BWD_PARAMS(T), const TmaMaps* tmaps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(T) == 2, "bwd_v4 takes 16-bit (fp16 / bf16) inputs");
  static_assert(DQ_BULK || !(VARLEN || VARIANTS), "packed sequences and the variants take bwd_v5's blocked dQ");
  static_assert((Br == 64 || (Br == 128 && HEAD_DIM == 64 && DQ_BULK)) && Bc == 128,
                "wgmma's M = 64 keys per warpgroup, N = 64 query rows (bwd_v5 at D=64: 128 too)");
  constexpr int STAGES = bwd_v4_stages(Br);
  // (Whole 64-column panels also keep tma_tile_load off its narrow-panel maps 3..5: map 3 is dO here.)
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "whole 64-column panels, dK and dV in 64 registers each");
  constexpr int NS = Br / 2;        // S^T, dP^T values per thread (64 keys x Br rows over 128 threads)
  constexpr int ND = HEAD_DIM / 2;  // dK, dV values per thread (64 keys x D)
  constexpr int Q_BYTES = Br * HEAD_DIM * 2, KV_BYTES = Bc * HEAD_DIM * 2, DS_BYTES = Br * Bc * 2;
  using STile = SwizzledTile<Br, Bc>;  // dS, [query row][key]: 2 panels of 64 keys

  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned s_k = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const unsigned s_v = s_k + KV_BYTES;
  auto s_q = [&](int st) { return s_k + 2 * KV_BYTES + st * 2 * Q_BYTES; };
  auto s_do = [&](int st) { return s_q(st) + Q_BYTES; };
  auto s_ds = [&](int buf) { return s_q(STAGES) + buf * DS_BYTES; };
  constexpr int DQ_SMEM = DQ_BULK ? 2 * BWD_V4_DQ_BYTES : 0;
  const unsigned s_dq = s_ds(2);  // DQ_BULK: warpgroup w's dQ tile at s_dq + w * BWD_V4_DQ_BYTES
  float* const stats = reinterpret_cast<float*>(smem + 2 * KV_BYTES + STAGES * 2 * Q_BYTES + 2 * DS_BYTES + DQ_SMEM);
  auto lse_s = [&](int st) { return stats + st * 2 * Br; };
  auto Di_s = [&](int st) { return stats + st * 2 * Br + Br; };
  // mbarriers: kv (K_j and V_j: the copying thread's 2 arrivals), full[st] (Q_i, dO_i: 2
  // arrivals of the copying lane with the bytes, then one of each of the 32 lanes with its lse_i,
  // D_i), empty[st] (the 256 consumer threads, once they are done with the stage); DQ_BULK:
  // dq_full[w] (warpgroup w's 128 threads, their dQ values in its tile), dq_empty[w] (its dQ
  // warp, once the reduction has read the tile).
  const unsigned bar_kv =
      s_k + 2 * KV_BYTES + STAGES * 2 * Q_BYTES + 2 * DS_BYTES + DQ_SMEM + STAGES * 2 * Br * 4;
  auto bar_full = [&](int st) { return bar_kv + 8 * (1 + st); };
  auto bar_empty = [&](int st) { return bar_kv + 8 * (1 + STAGES + st); };
  auto bar_dq_full = [&](int w) { return bar_kv + 8 * (1 + 2 * STAGES + w); };
  auto bar_dq_empty = [&](int w) { return bar_kv + 8 * (3 + 2 * STAGES + w); };
  if (threadIdx.x == 0) {
    bwd_init_pipeline<STAGES, 2 * BWD_V4_WG>(bar_kv, bar_full, bar_empty);
    if constexpr (DQ_BULK)
      for (int w = 0; w < 2; ++w) {
        mbar_init(bar_dq_full(w), BWD_V4_WG);
        mbar_init(bar_dq_empty(w), 1);
      }
    mbar_fence_init();
  }
  __syncthreads();

  constexpr bool TAIL = !CAUSAL && DQ_BULK && !VARLEN && !VARIANTS;  // (the registry's tail_split: bwd_v5's)
  // The CTA's K/V block.  Dense: bwd_work's (head bh, block j) of all Nq / Nk rows.  VARLEN
  // (bwd_common.cuh's bwd_varlen_sequence; one launch over every sequence, no host sync): sequence
  // seq.b's block at seq.kv_start of query head seq.h, its rows q0.. of packed q, dO (and of lse,
  // D_i: (H, total_q)) and k0.. of packed k, v, its lengths nq, nk and its causal offset.  Rows the
  // copy engine brings in past a sequence's end belong to the next one (or are whatever the buffer
  // holds past the last: NaN included), so the consumers zero them before any product reads them
  // (zero_tile_rows): P and dS are 0 there, but 0 x NaN is NaN in the tensor core.
  // (The dense values as they were before VARLEN: computed from seq, ptxas moved the epilogue's
  // index arithmetic off the uniform datapath.)
  BwdTile cta;
  BwdSeq seq{};
  if constexpr (VARLEN) {
    seq = bwd_varlen_sequence<Bc>(causal_offset, cu_seqlens_q, cu_seqlens_k, num_seqs, bottom_right);
    if (seq.nk == 0) return;  // a block past its sequence's keys
    cta = {seq.b * H + seq.h, seq.kv_start / Bc, -1};
  } else {
    cta = bwd_work<CAUSAL, Bc>(bh_offset, Nk, tail_from, TAIL ? tail_segments : 0);
  }
  const int bh = cta.bh;
  const int b = VARLEN ? seq.mem_b : bh / H, h = VARLEN ? seq.h : bh % H, hk = h / h_per_kv;
  const int kv_start = VARLEN ? seq.kv_start : cta.j * Bc;
  const int Nq_b = VARLEN ? seq.nq : Nq, Nk_b = VARLEN ? seq.nk : Nk, offset = VARLEN ? seq.offset : causal_offset;
  int q_first = first_q_start<CAUSAL, Br>(kv_start, offset), q_end = Nq_b;
  ScoreVariants var{};  // (the host passes softmax_scale >= 0 with variants: a negative one negated q)
  if constexpr (VARIANTS) {
    var = head_variants<CAUSAL>(softmax_scale, softcap, alibi_slopes, alibi_sb, VARLEN ? seq.b : b, h, window_left,
                                window_right);
    variants_q_range<Br, Bc>(var, kv_start, offset, q_first, q_end);
  }
  int n_blocks = q_first < q_end ? (q_end - q_first + Br - 1) / Br : 0;  // Q blocks this K/V block visits
  tail_range(cta.seg, tail_segments, q_first, n_blocks, Br);        // (a tail part: its share of them)
  const int rot = q_rotation<CAUSAL>(cta, n_blocks, dq_semaphore != nullptr);  // (bwd_common.cuh's stagger)
  // dQ's split between the consumer warpgroups.  D=128: warpgroup w takes dQ's columns 64 w.. over
  // all Bc keys (both warpgroups' dS rows; one 256-thread barrier per Q block).  D=64: each its own
  // 64 keys over all columns (dS's panel w, K's rows 64 w..), with no barrier between the two, so
  // they drift apart and one's elementwise step runs under the other's products.  (At D=128 that
  // form, with twice the dQ adds, measured 306 / 262 TFLOP/s against 362 / 334.)
  // Br = 128 (bwd_v5 at D=64): warpgroup w takes dQ's rows 64 w.. over all Bc keys and all columns
  // (both warpgroups' dS rows, the same barrier).  Against Br = 64 (each its own keys, no barrier,
  // the PIPE order) it halves the Q blocks, so the per-block waits and the dQ reductions (one 16 KB
  // tile a warpgroup per 128 rows instead of per 64): 424 -> 445 TFLOP/s, causal 380 -> 414 on an
  // H200 (bench/NOTES.md), despite the spills of its 64 + 64 score registers (versions.py).
  constexpr bool SHARED_DQ = HEAD_DIM == 128 || Br == 128;

  if (threadIdx.x < BWD_V4_WG) {
    // ---------------- producer: warp 0 (lane 0 issues the tensor copies) ----------------
    setmaxnreg_dec<BWD_V4_PRODUCER_REGS>();
    const bool ordered = dq_semaphore != nullptr;  // deterministic mode (bwd_common.cuh)
    if (DQ_BULK && (threadIdx.x == 32 || (threadIdx.x == 64 && !ordered))) {
      // ---------------- bwd_v5's dQ: lane 0 of warp 1 + w, for consumer warpgroup w ----------------
      // Each Q block's dQ tile, once the warpgroup has written it, added into the block's chunk of
      // dq_accum (Br x D floats, at (bh, Q block) in the blocked layout; at D=128 warpgroup w's
      // columns are the chunk's half w, at D=64 both add into the whole chunk) by one reduction,
      // which has read the tile before the warpgroup may write the next.
      // Deterministic: warp 1 alone serves both warpgroups, in the fixed order of bwd_common.cuh's
      // ordered adds (K/V block j after blocks 0 .. j - 1, warpgroup 0 before 1 where both add into
      // the same floats), waiting until each reduction's writes are done before the next that
      // depends on them and before it moves the Q block's count on.  Only this thread waits; the
      // consumers run on until they need their tile again.
      const int w0 = threadIdx.x / 32 - 1, w1 = ordered ? 1 : w0;
      // (VARLEN: head h's chunks, ceil(total_q / Br) + num_seqs of them, sequence b's from
      // varlen_block's start(b) on; bwd_dq_convert finds them the same way.)
      const long long chunk0 = VARLEN ? (long long)h * ((Nq + Br - 1) / Br + num_seqs) +
                                            (seq.q0 - cu_seqlens_q[0]) / Br + seq.b
                                      : (long long)bh * ((Nq + Br - 1) / Br);
      float* dst = dq_accum + (chunk0 + q_first / Br) * Br * HEAD_DIM;
      for (int n = 0; n < n_blocks; ++n) {
        const int qb = q_block(n, rot, n_blocks);
        int* count = ordered ? dq_count<Br>(dq_semaphore, bh, Nq, q_first + qb * Br) : nullptr;
        if (ordered) wait_for_turn(count, cta.j);
        for (int w = w0; w <= w1; ++w) {
          mbar_wait(bar_dq_full(w), n & 1);
          bulk_reduce_add(dst + (long long)qb * Br * HEAD_DIM + (SHARED_DQ ? w * BWD_V4_DQ_BYTES / 4 : 0),
                          s_dq + w * BWD_V4_DQ_BYTES, BWD_V4_DQ_BYTES);
          bulk_commit();
          if (ordered && (!SHARED_DQ || w == w1)) bulk_wait<0>();  // (the same floats next, or the count)
        }
        if (ordered) {
          __threadfence();
          atomicAdd(count, 1);
        } else {
          bulk_wait_read<0>();
        }
        for (int w = w0; w <= w1; ++w) mbar_arrive(bar_dq_empty(w));
      }
      return;
    }
    if (threadIdx.x >= 32) return;
    const long long row0 = VARLEN ? (long long)h * Nq + seq.q0 : (long long)bh * Nq;  // lse's, D_i's
    bwd_produce<HEAD_DIM, Br, Bc, STAGES>(tmaps, s_k, s_v, s_q, s_do, lse_s, Di_s, bar_kv, bar_full, bar_empty,
                                           lse + row0, Di + row0, kv_start, q_first, n_blocks, Nq_b, h, hk, b,
                                           threadIdx.x, 0, 0, rot, seq.q0, seq.k0);
    return;
  }

  // ---------------- consumers: warpgroup w owns keys kv_start + 64 w .. + 63 ----------------
  setmaxnreg_inc<BWD_V4_CONSUMER_REGS>();
  const int tid = threadIdx.x - BWD_V4_WG, w = tid / BWD_V4_WG;
  const int warp = tid / 32 % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  float* dq_bh = dq_accum + (long long)bh * Nq * HEAD_DIM;

  // Descriptors.  K-major: A = K_w, V_w (rows 64 w.. of each 64-column panel of Bc rows), B = Q_i,
  // dO_i (S^T's, dP^T's); A = dS (dQ's).  N-major (the next 64 columns are the next panel): B =
  // dO_i, Q_i (dV's, dK's), B = K (dQ's, keys as the k16 steps).
  const unsigned long long kw_desc = wgmma_desc_sw128(s_k + w * 64 * 128);
  const unsigned long long vw_desc = wgmma_desc_sw128(s_v + w * 64 * 128);

  float dK[ND], dV[ND];
#pragma unroll
  for (int i = 0; i < ND; ++i) dK[i] = dV[i] = 0.0f;

  // dQ = dS K over the split above: K's 64-column panel w at D=128, its rows 64 w.. (the keys as
  // the k16 steps) where the warpgroup takes its own keys; dS's rows 64 w.. at Br = 128, its panel
  // w (keys 64 w..) where the warpgroup takes its own keys.
  constexpr int DQ_KEYS = SHARED_DQ ? Bc : 64;  // the dQ product's k extent
  const unsigned long long kn_desc =
      wgmma_desc_sw128(s_k + (HEAD_DIM == 128 ? w * Bc * 128 : 0) + (SHARED_DQ ? 0 : w * 64 * 128), Bc * 128);
  const unsigned ds_offset = (Br == 128 ? w * 64 * 128 : 0) + (SHARED_DQ ? 0 : w * Br * 128);

  const float scale_log2 = softmax_scale * TILEATTN_LOG2E;  // any sign: no max is folded here
  constexpr bool PIPE = TILEATTN_BWD_V4_PIPE && HEAD_DIM == 64 && Br == 64;
  constexpr bool LATE_PUBLISH = TILEATTN_BWD_V5_LATE_PUBLISH && DQ_BULK && !PIPE;
  auto publish_dq = [&] {  // this thread's stores of the warpgroup's dQ tile, to the dQ warp
    fence_proxy_async_smem();
    mbar_arrive(bar_dq_full(w));
  };
  // 1. S^T = K_w Q_n^T, dP^T = V_w dO_n^T: one commit group, issued once block n's stage is full
  // (waited for by the caller).
  float S[NS], dP[NS];
  auto issue_scores = [&](int n) {
    const int st = n % STAGES;
    mbar_wait(bar_full(st), (n / STAGES) & 1);
    if constexpr (VARLEN) {  // the Q block's rows past the sequence (both warpgroups read all of them)
      const int first = Nq_b - (q_first + q_block(n, rot, n_blocks) * Br);
      if (first < Br) {
        zero_tile_rows<Br, HEAD_DIM, 2 * BWD_V4_WG>(s_q(st), first, tid);
        zero_tile_rows<Br, HEAD_DIM, 2 * BWD_V4_WG>(s_do(st), first, tid);
        fence_proxy_async_smem();
        named_barrier_sync<2 * BWD_V4_WG>(BWD_V5_VARLEN_BARRIER);
      }
    }
    bwd_scores<T, HEAD_DIM, Br, Bc, false>(S, dP, kw_desc, vw_desc, wgmma_desc_sw128(s_q(st)),
                                           wgmma_desc_sw128(s_do(st)));
  };
  // PIPE: the products of block n + 1 issued under block n's dQ, unconditionally (a branch around
  // them would merge two versions of S and dP while the products run, and the copies that merge
  // makes read their registers in flight: ptxas then serialises every wgmma of the kernel).  After
  // the last block they repeat that block's (its stage is still full, the result unused).
  auto issue_next_scores = [&](int n) {
    const bool last = n + 1 >= n_blocks;
    const int st = (last ? n : n + 1) % STAGES;
    if (!last) mbar_wait(bar_full(st), ((n + 1) / STAGES) & 1);
    bwd_scores<T, HEAD_DIM, Br, Bc, false>(S, dP, kw_desc, vw_desc, wgmma_desc_sw128(s_q(st)),
                                           wgmma_desc_sw128(s_do(st)));
  };
  auto wait_scores = [&] {
    wgmma_wait<0>();
    fence_operands(S);
    fence_operands(dP);
  };
  mbar_wait(bar_kv, 0);
  if constexpr (VARLEN) {  // the K/V block's keys past the sequence
    if (kv_start + Bc > Nk_b) {
      zero_tile_rows<Bc, HEAD_DIM, 2 * BWD_V4_WG>(s_k, Nk_b - kv_start, tid);
      zero_tile_rows<Bc, HEAD_DIM, 2 * BWD_V4_WG>(s_v, Nk_b - kv_start, tid);
      fence_proxy_async_smem();
      named_barrier_sync<2 * BWD_V4_WG>(BWD_V5_VARLEN_BARRIER);
    }
  }
  if (PIPE && n_blocks > 0) {
    issue_scores(0);
    wait_scores();
  }
  for (int n = 0; n < n_blocks; ++n) {
    const int st = n % STAGES, q_start = q_first + q_block(n, rot, n_blocks) * Br;
    const unsigned ds_base = s_ds(n % 2);
    if (!PIPE) issue_scores(n);  // (PIPE: issued and waited for during block n - 1)
    if (LATE_PUBLISH && n > 0) publish_dq();  // block n - 1's tile
    const unsigned long long q_ndesc = wgmma_desc_sw128(s_q(st), Br * 128);
    const unsigned long long do_ndesc = wgmma_desc_sw128(s_do(st), Br * 128);
    const float* lse_i = lse_s(st);
    const float* Di_i = Di_s(st);
    wait_scores();  // (PIPE: nothing in flight here; the wait ends each iteration, so that no
                    // group is in flight across the loop's back edge, where S and dP merge)

    // 2. P^T and dS^T in place, their A fragments, dS to this block's tile (bwd_wgmma.cuh).
    unsigned p_frag[Br / 16][4], ds_frag[Br / 16][4];
    const int warp_key0 = 64 * w + 16 * warp;
    if constexpr (VARIANTS)
      bwd_p_ds_variants<T, STile, Br, CAUSAL>(S, dP, p_frag, ds_frag, ds_base, lse_i, Di_i, var, kv_start, warp_key0,
                                              q_start, Nk_b, offset,
                                              exp_scale_log2(var, folded_scale_log2(softmax_scale)), lane);
    else
      bwd_p_ds<T, STile, Br, CAUSAL>(S, dP, p_frag, ds_frag, ds_base, lse_i, Di_i, kv_start, Bc, warp_key0, q_start,
                                     Nq_b, Nk_b, offset, scale_log2, lane);

    // 3. dV_w += P^T dO_i, dK_w += dS^T Q_i (RS, B N-major), one commit group, not waited for here.
    bwd_dv_dk<T, Br>(dV, dK, p_frag, ds_frag, do_ndesc, q_ndesc);

    // 4. dQ_i = dS K, added into dq_accum, once this block's dS rows it reads are in the tile.
    // (Issuing the k-steps over the warpgroup's own keys before this meeting, the other warpgroup's
    // after it, measured 2-9% slower on an H200: bench/NOTES.md.)
    if constexpr (SHARED_DQ) named_barrier_sync<2 * BWD_V4_WG>(1);
    else named_barrier_sync<BWD_V4_WG>(1 + w);
    float dq[32];
    const unsigned long long dsa_desc = wgmma_desc_sw128(ds_base + ds_offset);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < DQ_KEYS / 16; ++ks)
      Wgmma16<T>::ss_bt(dq, dsa_desc + (sw128_k_step(ks, Br) >> 4), kn_desc + ((ks * 16 * 128) >> 4), ks > 0);
    wgmma_commit();
    if constexpr (PIPE) {
      issue_next_scores(n);  // S and dP are free: their values live in p_frag and ds_frag now
      wgmma_wait<2>();  // step 3's group (groups retire in order): the stage is free
    } else {
      wgmma_wait<1>();  // step 3's group: the stage is free, dQ may still run
    }
    fence_operands(p_frag);
    fence_operands(ds_frag);
    fence_operands(dV);
    fence_operands(dK);
    mbar_arrive(bar_empty(st));
    wgmma_wait<PIPE ? 1 : 0>();  // dQ's group (PIPE: block n + 1's may still run under the adds below)
    fence_operands(dq);
    if constexpr (DQ_BULK) {
      // bwd_v5: the tile in the accumulator's order, [n8][thread][its 4 values of n8] (a warp's
      // 16-byte stores cover 512 contiguous bytes: no bank conflict), which the dQ warp adds into
      // the chunk as it is; backward.py puts rows and columns back.  Rows past Nq add zeros (their
      // dS is 0) into the chunk's padding.
      mbar_wait(bar_dq_empty(w), (n & 1) ^ 1);  // (n = 0: the phase before the first, complete)
      const unsigned tile = s_dq + w * BWD_V4_DQ_BYTES + 16 * (tid % BWD_V4_WG);
#pragma unroll
      for (int n8 = 0; n8 < 8; ++n8)
        st_shared_v4(tile + 16 * BWD_V4_WG * n8, softmax_scale * dq[4 * n8], softmax_scale * dq[4 * n8 + 1],
                     softmax_scale * dq[4 * n8 + 2], softmax_scale * dq[4 * n8 + 3]);
      if (!LATE_PUBLISH) publish_dq();
    } else {
      const int col0 = SHARED_DQ ? 64 * w : 0;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = q_start + 16 * warp + g + 8 * hh;
        if (row >= Nq) continue;
        float* dq_row = dq_bh + (long long)row * HEAD_DIM + col0 + 2 * t;
#pragma unroll
        for (int n8 = 0; n8 < 8; ++n8)
          red_add2(dq_row + 8 * n8, softmax_scale * dq[4 * n8 + 2 * hh], softmax_scale * dq[4 * n8 + 2 * hh + 1]);
      }
    }
    if constexpr (PIPE) wait_scores();  // block n + 1's S^T and dP^T
  }
  if (LATE_PUBLISH && n_blocks > 0) publish_dq();  // the last block's tile

  // dK_w, dV_w into the gradients or the accumulators (shared by the GQA group: red); a tail part
  // writing the gradients adds into its block's tail tile as a GQA group would (bwd_wgmma.cuh).
  const int key0 = seq.k0 + kv_start + 64 * w + 16 * warp + g;  // (VARLEN: a row of the packed k)
  const bool tail_part = TAIL && cta.seg >= 0 && dk_out;
  const TailTile tile = tail_part ? tail_tile<Bc>(tail_accum, tail_from, tail_segments, kv_start, HEAD_DIM) : TailTile{};
  bwd_store_dkdv<T, ND, VARLEN>(dK, dV, tail_part ? tile.k : dk_accum, tail_part ? tile.v : dv_accum,
                                tail_part ? nullptr : dk_out, dv_out, dkv_sb, dkv_sh, dkv_sn,
                                DQ_BULK ? dq_semaphore : nullptr, tail_part ? 0 : b, tail_part ? 0 : h,
                                tail_part ? 2 : H, tail_part ? 2 : h_per_kv, Nk, key0, 2 * t, HEAD_DIM, softmax_scale,
                                seq.k0 + Nk_b);
  if (tail_part)
    bwd_tail_finish<T, 2 * BWD_V4_WG, ND>(tile, tail_segments, dk_out, dv_out, dkv_sb, dkv_sh, dkv_sn, b, h, Nk, key0,
                                      2 * t, HEAD_DIM, tid, 3);
#endif
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(3 * BWD_V4_WG, 1)
    bwd_v4(TILEATTN_BWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  bwd_v4_body<T, HEAD_DIM, Br, Bc, CAUSAL, false>(TILEATTN_BWD_ARGS, &tmaps);
}

TILEATTN_SMEM_BYTES(bwd_v4, bwd_v4_smem(HEAD_DIM, Br, Bc));

}  // namespace tileattn
