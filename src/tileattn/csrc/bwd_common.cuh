// The backward kernels' arguments and the preprocessing step they share.
//
// FlashAttention-2's backward (reference.attention_backward_tiled is the same loop nest in NumPy):
// with S = scale Q K^T, P = exp(S - lse) rebuilt from the forward's log-sum-exp (no N x N matrix
// is ever stored) and D_i = rowsum(dO * O),
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D_i),  dQ = scale dS K,  dK = scale dS^T Q.
// The main kernels take K/V blocks as the outer loop (one thread block each, dK_j and dV_j on
// chip) and accumulate dQ across K/V blocks in a float32 buffer.
#pragma once

#include "mma.cuh"
#include "softmax.cuh"

namespace tileattn {

// The backward arguments, written once (as the forward's TILEATTN_FWD_FIELDS).  q, k, v, o, dout
// in the caller's layout (strides in elements, head dim contiguous); lse, Di: (B, H, Nq) float32,
// contiguous; the accumulators are float32 and contiguous: dq_accum (B, H, Nq, D), zeroed by the
// host, into which every K/V block adds its dQ with atomics, in whatever order the blocks run;
// dk_accum and dv_accum (B, H_kv, Nk, D), into which the query heads of a GQA group add with
// atomics (zeroed by the host), or which each K/V block writes without (no GQA: store_dkdv);
// dk_out, dv_out: null, or (no GQA) the gradients themselves, which the K/V blocks write in T
// instead of the accumulators (strides dkv_sb, dkv_sh, dkv_sn; dv's the same as dk's).
// dq_semaphore null: that.  Non-null (deterministic mode, (B*H, ceil(Nq / Br)) int32 zeroed): the
// K/V blocks add their dQ of a Q block in the order j = 0, 1, 2, ... (each waits for the count of
// adds before it), and dk_accum, dv_accum are (B, H, Nk, D), one slice per query head written
// without atomics, summed over each GQA group by the host: bitwise-reproducible gradients.
// tail_from, tail_segments, tail_accum: the tail (bwd_work below, backward.py's _tail_plan);
// tail_segments = 0 where a call has none.  dq_zero, tail_zero: how many floats of dq_accum a head
// and of tail_accum bwd_preprocess zeroes for the rung that follows it (multiples of 4).
// split_amax: null, or (bwd_v2.3, whose operands are scaled fp16 halves: split_halves.cu) the
// largest |x| of each 64-row block of q, k, v and dO (api._split_blocks), which set their scales.
#define TILEATTN_BWD_FIELDS(X, SEP)                                                        \
  X(const T* __restrict__, q) SEP X(const T* __restrict__, k) SEP X(const T* __restrict__, v) SEP \
  X(const T* __restrict__, o) SEP X(const T* __restrict__, dout) SEP                       \
  X(const float* __restrict__, lse) SEP X(float* __restrict__, Di) SEP                     \
  X(float* __restrict__, dq_accum) SEP X(float* __restrict__, dk_accum) SEP                \
  X(float* __restrict__, dv_accum) SEP X(int* __restrict__, dq_semaphore) SEP             \
  X(const float* __restrict__, split_amax) SEP                                             \
  X(const int, Nq) SEP X(const int, Nk) SEP X(const int, H) SEP X(const int, h_per_kv) SEP \
  X(const long long, q_sb) SEP X(const long long, q_sh) SEP X(const long long, q_sn) SEP  \
  X(const long long, k_sb) SEP X(const long long, k_sh) SEP X(const long long, k_sn) SEP  \
  X(const long long, v_sb) SEP X(const long long, v_sh) SEP X(const long long, v_sn) SEP  \
  X(const long long, o_sb) SEP X(const long long, o_sh) SEP X(const long long, o_sn) SEP  \
  X(const long long, do_sb) SEP X(const long long, do_sh) SEP X(const long long, do_sn) SEP \
  X(T* __restrict__, dk_out) SEP X(T* __restrict__, dv_out) SEP                            \
  X(const long long, dkv_sb) SEP X(const long long, dkv_sh) SEP X(const long long, dkv_sn) SEP \
  X(const float, softmax_scale) SEP X(const int, causal_offset) SEP X(const int, bh_offset) SEP \
  X(const int, tail_from) SEP X(const int, tail_segments) SEP X(float* __restrict__, tail_accum) SEP \
  X(const int, dq_zero) SEP X(const int, tail_zero) SEP                                   \
  /* the score variants (bwd_v2_variants; the forward's fields of the same names, common.cuh) */ \
  X(const int, window_left) SEP X(const int, window_right) SEP X(const float, softcap) SEP \
  X(const float* __restrict__, alibi_slopes) SEP X(const long long, alibi_sb) SEP         \
  /* variable-length batches (bwd_v2's varlen kernels: BwdSeq below); null: dense */        \
  X(const int* __restrict__, cu_seqlens_q) SEP X(const int* __restrict__, cu_seqlens_k) SEP \
  X(const int, num_seqs) SEP X(const int, bottom_right)

#define TILEATTN_BWD_PARAMS(T) TILEATTN_BWD_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)
#define TILEATTN_BWD_ARGS TILEATTN_BWD_FIELDS(TILEATTN_NAME_, TILEATTN_COMMA_)  // (a shared body's call)

// Which (head bh, K/V block j) a thread block of the (ceil(Nk / Bc), heads) grid takes.  The
// hardware starts blocks in linear order (x fastest).  Without a causal mask that is blockIdx
// itself: one head's K/V blocks in turn, so the ~132 blocks running at once share two or three
// heads' Q, dO and dQ in L2.  With one, block j visits fewer Q blocks as j grows, and in that
// order the last head's longest block starts about one head's work before the end: the SMs that
// finish first idle while it runs.  So heads go in groups of TILEATTN_BWD_CAUSAL_GROUP, each
// group's K/V blocks by j with the group's heads' block j side by side: the last group's longest
// blocks start two heads' work before the end.  Measured on an H200 (scripts/bwd_probe.py, bf16
// B=4 H=16 N=8192, one call; bench/NOTES.md): D=128 causal 5.65 / 5.77 ms -> 5.56 (groups of 2),
// 5.55 (4), 5.57 (8); D=64 causal unchanged; without the mask groups of 2 / 4 / 8 cost 1.3 / 1.6 /
// 3.0% at D=128 (fewer of the running blocks share a head's tiles in L2), hence the plain order.
#ifndef TILEATTN_BWD_CAUSAL_GROUP
#define TILEATTN_BWD_CAUSAL_GROUP 2
#endif
struct BwdTile {
  int bh, j;
  int seg;  // a tail part (bwd_work): which of the K/V block's tail_segments ranges of Q blocks; else -1
};
template <bool CAUSAL>
__device__ __forceinline__ BwdTile bwd_tile(int bh_offset) {
  constexpr int G = CAUSAL ? TILEATTN_BWD_CAUSAL_GROUP : 1;
  if constexpr (G > 1) {
    const int L = blockIdx.x + gridDim.x * blockIdx.y, Tc = gridDim.x;
    const int g = L / (G * Tc), r = L % (G * Tc), Gg = min(G, (int)gridDim.y - g * G);  // (a last group of fewer)
    return {bh_offset + g * G + r % Gg, r / Gg, -1};
  }
  return {(int)blockIdx.y + bh_offset, (int)blockIdx.x, -1};
}

// The sequence a thread block of the mma.sync rung's kernels works on, and where its rows are.
// Dense calls (bwd_v2, bwd_v2_variants; cu_seqlens_q null): head bh = blockIdx.y + bh_offset of
// batch bh / H, K/V block blockIdx.x, all Nq / Nk rows, the host's causal offset; `b` is also the
// batch index into the (B, H, ...) buffers (mem_b).  Variable-length calls (serving's varlen backward):
// q, k, v, dO are packed (1, total, H, D) (Nq, Nk the totals), lse, D_i and dq_accum are per head
// over the packed rows ((1, H, total_q [, D])), and dk/dv (direct) or their accumulators are
// (1, total_k, H_kv, D) / (1, H_kv, total_k, D): sequence b's rows start at q0 = cu_seqlens_q[b],
// k0 = cu_seqlens_k[b] of batch 0.  The grid is (ceil(total_k / Bc) + num_seqs, H), independent
// of max_seqlen_k (a caller's understated max_seqlen_k cannot drop keys from the gradient):
// sequence b's K/V blocks are the linear indices from start(b) = (k0 - cu_seqlens_k[0]) / Bc + b
// on (v3.3's packed_tile does the same over Q blocks), start() strictly increasing, so
// blockIdx.x's sequence is the last b with start(b) <= blockIdx.x (a binary search over the
// offsets), and a block past its sequence's keys has no work (nk = 0 below: at most num_seqs of
// them, one a sequence; reference.varlen_kv_blocks is the model).  Positions are per sequence:
// causal offset Nk_b - Nq_b when bottom_right, else the host's.
struct BwdSeq {
  int b, h, kv_start;  // the sequence (batch), the query head, the K/V block's first key (local)
  int mem_b;           // the batch index into the buffers: b, or 0 for packed rows
  int q0, k0;          // the sequence's first row of q (and dO, lse, D_i, dq_accum) and of k, v
  int nq, nk;          // its query rows and keys (nk = 0: the block has no work)
  int offset;          // the causal offset (and the variants' position offset)
};
// Dense: everything from the kernel's parameters, as the rung had it before variable length (the
// row offsets fold to 0; the dense kernels' registers and spills are unchanged, their SASS moved
// a little in address arithmetic: scripts/sass_fingerprint.py).
template <int Bc>
__device__ __forceinline__ BwdSeq bwd_dense_sequence(int H, int Nq, int Nk, int causal_offset, int bh_offset) {
  const int bh = blockIdx.y + bh_offset;
  return {bh / H, bh % H, (int)blockIdx.x * Bc, bh / H, 0, 0, Nq, Nk, causal_offset};
}
// The sequence of packed block L in that numbering (blocks of `rows` rows from start(b) =
// (cu[b] - cu[0]) / rows + b): the last b with start(b) <= L, by a binary search over the offsets
// cu; its block's first row (local to the sequence) in first_row.  bwd_v5_varlen's dQ chunks
// (Br query rows) are numbered the same way over cu_seqlens_q (bwd_dq_convert.cu reads them back).
__device__ __forceinline__ int varlen_block(const int* cu, int num_seqs, int L, int rows, int& first_row) {
  const int base = cu[0];
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if ((cu[mid] - base) / rows + mid <= L)
      lo = mid;
    else
      hi = mid - 1;
  }
  first_row = (L - ((cu[lo] - base) / rows + lo)) * rows;
  return lo;
}
template <int Bc>
__device__ __forceinline__ BwdSeq bwd_varlen_sequence(int causal_offset, const int* cu_seqlens_q,
                                                      const int* cu_seqlens_k, int num_seqs, int bottom_right) {
  int kv_start;
  const int b = varlen_block(cu_seqlens_k, num_seqs, blockIdx.x, Bc, kv_start);
  const int k0 = cu_seqlens_k[b], q0 = cu_seqlens_q[b];
  const int nq = cu_seqlens_q[b + 1] - q0;
  const int nk_all = cu_seqlens_k[b + 1] - k0, nk = kv_start < nk_all ? nk_all : 0;
  return {b, (int)blockIdx.y, kv_start, 0, q0, k0, nq, nk, bottom_right ? nk_all - nq : causal_offset};
}

// The tail (backward.py's _tail_plan).  All K/V blocks of a call without a causal mask take the
// same time, so B*H*Tc of them on P SMs run in ceil(B*H*Tc / P) waves, and where the last wave
// holds r << P blocks (4 of 132 at every shape of the bwd suite: B*H*Tc = 4096), r SMs work while
// the others idle for a whole block's time.  So a call with a tail (tail_segments = S > 0) is one
// launch of a 1-D grid: its first tail_from = B*H*Tc - r thread blocks take the K/V blocks of the
// plain order before its last r, and the r * S after them split each of those r over S thread
// blocks, each over a contiguous 1/S of its Q blocks.  The hardware starts thread blocks in
// linear order, so the parts start as the SMs free up at the end and fill the last wave (as a
// second launch they ran only once the first had drained).  Their dQ adds go where they would
// have; dK and dV are sums over the Q blocks, so each part adds its own into tail_accum and the
// last to finish writes the block's gradients (bwd_tail_finish), or with GQA all add into the
// zeroed accumulators as usual.  Without a causal mask only (the causal blocks' lengths differ,
// and bwd_tile's groups already start the longest first); the host passes tail_segments = 0
// otherwise, and a call of more than one chunk of heads has no tail.
template <bool CAUSAL, int Bc>
__device__ __forceinline__ BwdTile bwd_work(int bh_offset, int Nk, int tail_from, int tail_segments) {
  if constexpr (!CAUSAL) {
    if (tail_segments > 0) {  // (bh_offset 0: one chunk of heads)
      const int Tc = (Nk + Bc - 1) / Bc, L = blockIdx.x;
      if (L < tail_from) return {L / Tc, L % Tc, -1};
      const int part = L - tail_from, Lt = tail_from + part / tail_segments;  // part = t * S + seg
      return {Lt / Tc, Lt % Tc, part % tail_segments};
    }
  }
  return bwd_tile<CAUSAL>(bh_offset);
}
// The Q blocks [n0, n0 + n_blocks) of a K/V block's n_blocks that part seg of S takes (seg = -1:
// all of them).
__device__ __forceinline__ void tail_range(int seg, int S, int& q_first, int& n_blocks, int Br) {
  if (seg < 0) return;
  const int n0 = (int)((long long)seg * n_blocks / S), n1 = (int)((long long)(seg + 1) * n_blocks / S);
  q_first += n0 * Br;
  n_blocks = n1 - n0;
}

// The order of a K/V block's Q blocks.  Without a causal mask every K/V block of a head visits the
// same Q blocks, and in the same order the ~64 blocks of a head that start together add their
// dQ into the same Q block's chunk of dq_accum at about the same time (the causal blocks start at
// different Q blocks already).  So K/V block j starts at Q block (j % S) n_blocks / S of its
// n_blocks and wraps around: about 1 / S of them add into any one chunk at a time, and the S
// starting points stay far enough apart that the head's Q, dO and dQ are all in L2 at once
// anyway.  Measured on an H200 (bwd_v5, B*N = 32768, H=16, N = 4096 and 8192, fp16 and bf16, all
// variants interleaved in one process; bench/NOTES.md): S = 4 at a stride of n_blocks / 4 took
// D=64 from 6.16 / 5.86 ms to 5.80 / 5.67 (N=8192 fp16 / bf16; 4-6%) and D=128 from 10.51 /
// 10.25 to 10.43 / 10.16 (0.7-0.9%); S = 8 or 16, or strides of one Q block, gained as much or
// less at D=64 and up to 4% less at D=128.  Not in deterministic mode (the adds' order is the
// point there) nor for a tail part (its parts' ranges differ already).  S = 1: plain order.
#ifndef TILEATTN_BWD_STAGGER
#define TILEATTN_BWD_STAGGER 4
#endif
template <bool CAUSAL>
__device__ __forceinline__ int q_rotation(const BwdTile& cta, int n_blocks, bool ordered) {
  constexpr int S = TILEATTN_BWD_STAGGER;
  if constexpr (CAUSAL || S <= 1) return 0;
  if (ordered || cta.seg >= 0) return 0;
  return cta.j % S * (n_blocks / S);
}
// The Q block (its index among the K/V block's n_blocks) visited n-th (n = n_blocks, the producer's
// look-ahead past the last: some block, its loads masked).
__device__ __forceinline__ int q_block(int n, int rot, int n_blocks) {
  if constexpr (TILEATTN_BWD_STAGGER <= 1) return n;
  const int i = n + rot;
  return i >= n_blocks ? i - n_blocks : i;
}

// The first Q block (its first row, a multiple of Br) a K/V block starting at kv_start visits:
// causal, the first query row that sees key kv_start is kv_start - causal_offset; the Q blocks
// before it see none of the block's keys.
template <bool CAUSAL, int Br>
__device__ __forceinline__ int first_q_start(int kv_start, int causal_offset) {
  return CAUSAL ? max(0, kv_start - causal_offset) / Br * Br : 0;
}

// lse_i and D_i of the Q block's Br rows into shared memory, by NTHREADS threads; a row past Nq
// gets lse = -inf, which gives it weight 0 everywhere.
template <int Br, int NTHREADS>
__device__ __forceinline__ void load_row_stats(float* lse_s, float* Di_s, const float* lse_bh, const float* Di_bh,
                                               int q_start, int Nq) {
  for (int r = threadIdx.x; r < Br; r += NTHREADS) {
    const bool ok = q_start + r < Nq;
    lse_s[r] = ok ? lse_bh[q_start + r] : TILEATTN_NEG_INF;
    Di_s[r] = ok ? Di_bh[q_start + r] : 0.0f;
  }
}

// Deterministic mode's count for (head bh, the Q block at q_start), or null in the default mode.
template <int Br>
__device__ __forceinline__ int* dq_count(int* dq_semaphore, int bh, int Nq, int q_start) {
  return dq_semaphore ? dq_semaphore + (long long)bh * ((Nq + Br - 1) / Br) + q_start / Br : nullptr;
}

// Deterministic mode's ordering of the dQ adds of K/V block j into one Q block: wait until the j
// blocks before it have added (the count is j: a K/V block visits the Q blocks from its first
// visible one on, so the blocks that visit Q block i are 0, 1, ..., in order), add, publish.
// Block j waits only on its head's blocks 0 .. j - 1, which the hardware starts first (bwd_tile
// puts them before it in linear order).
// wait_for_turn is the one thread's part (bwd_v5's dQ warp calls it alone).
__device__ __forceinline__ void wait_for_turn(const int* count, int j) {
  while (*reinterpret_cast<const volatile int*>(count) != j) {
  }
  __threadfence();  // the earlier blocks' adds are visible before this block reads dq_accum
}
__device__ __forceinline__ void ordered_add_begin(const int* count, int j) {
  if (threadIdx.x == 0) wait_for_turn(count, j);
  __syncthreads();
}
__device__ __forceinline__ void ordered_add_end(int* count) {
  __threadfence();  // this thread's adds are visible device-wide before the count moves on
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(count, 1);
}

// Float32 adds into an accumulator that no thread of this kernel reads: red, not atom.
// atomicAdd compiles to ATOMG here (SASS), whose result register, though unused, is only
// released when L2 answers: a long-scoreboard stall for the warp at the register's next use
// (ncu: 2.5 cycles of it per issued instruction in bwd_v2).  sm_90 adds two adjacent floats
// in one instruction (red.v2.f32).
__device__ __forceinline__ void red_add(float* p, float x) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(x));
}
__device__ __forceinline__ void red_add2(float* p, float x, float y) {  // p 8-byte aligned
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(x), "f"(y));
#else
  red_add(p, x);
  red_add(p + 1, y);
#endif
}
__device__ __forceinline__ void red_add4(float* p, float x, float y, float z, float w) {  // p 16-byte aligned
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(x), "f"(y), "f"(z), "f"(w));
#else
  red_add2(p, x, y);
  red_add2(p + 2, z, w);
#endif
}

// The mma.sync rungs' (bwd_v2, bwd_v2.2) step on a warp's 16 query rows in the C fragment layout
// ([nt] holds keys 8 nt + 2t, +1 of rows g (values 0, 1) and g + 8 (2, 3)):
// P = 2^(scale log2(e) S - log2(e) lse) (0 where masked, past Nk, and on a row whose lse is -inf:
// it saw no key, or lies past Nq) and dS = P (dP - D_i), in place in S and dP.  warp_row0: the
// warp's first row in the Q block; lse_i, D_i: the Q block's row statistics.
template <bool CAUSAL, int NT>
__device__ __forceinline__ void frag_p_ds(float (&S)[NT][4], float (&dP)[NT][4], const float* lse_i, const float* Di_i,
                                          int warp_row0, int q_start, int kv_start, int Nk, int causal_offset,
                                          float scale_log2, int g, int t) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = warp_row0 + 8 * hh + g;  // row in the Q block
    const float l = lse_i[r], m = l * TILEATTN_LOG2E, di = Di_i[r];
    const int kend = l == TILEATTN_NEG_INF ? 0 : key_end<CAUSAL>(q_start + r, Nk, causal_offset) - kv_start - 2 * t;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = 8 * nt + e < kend ? softmax_weight(S[nt][2 * hh + e], scale_log2, m) : 0.0f;
        S[nt][2 * hh + e] = p;
        dP[nt][2 * hh + e] = p * (dP[nt][2 * hh + e] - di);
      }
  }
}

// frag_p_ds under the score variants (bwd_v2_variants): the forward's scores rebuilt from the raw
// S = Q K^T with head_variants's constants (the units of fragment_variants: softcap's tanh(S s /
// c), ALiBi's -slope |pos - key| over s or c), weighted with the forward's lse, and masked to the
// window, the causal diagonal and Nk.  Rows sit at positions pos = row + offset (causal_offset,
// the forward's alignment).  dS is taken back through the softcap: d(c tanh(S s / c)) / dS =
// s (1 - tanh^2), the factor s being the caller's (as for plain scores), so dS = P (dP - D_i)
// (1 - tanh^2) here, tanh and P computed in one pass (no second fragment of tanh values live).
// One score of it (frag_p_ds_variants here, bwd_wgmma.cuh's bwd_p_ds_variants): the raw s and
// dp -> P into s, dS into dp, for the key `key` of a row at position pos that sees keys below
// kend and in the window [lo, hi]; m = log2(e) lse, di = D_i.
__device__ __forceinline__ void variant_p_ds(float& s, float& dp, const ScoreVariants& var, int pos, int key, int kend,
                                             int lo, int hi, float m, float di, float exp_scale) {
  float x = s, tanh_x = 0.0f;
  if (var.softcap) x = tanh_x = tanh_approx(x * var.inv_cap_s);
  if (var.alibi) x = fmaf(-var.slope_s, fabsf(static_cast<float>(pos - key)), x);
  const bool seen = key < kend && key >= lo && key <= hi;
  const float p = seen ? exp2_ftz(fmaf(x, exp_scale, -m)) : 0.0f;
  float ds = p * (dp - di);
  if (var.softcap) ds *= 1.0f - tanh_x * tanh_x;
  s = p;
  dp = ds;
}

template <bool CAUSAL, int NT>
__device__ __forceinline__ void frag_p_ds_variants(float (&S)[NT][4], float (&dP)[NT][4], const float* lse_i,
                                                   const float* Di_i, const ScoreVariants& var, int warp_row0,
                                                   int q_start, int kv_start, int Nk, int offset, float exp_scale,
                                                   int g, int t) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = warp_row0 + 8 * hh + g, pos = q_start + r + offset;
    const float l = lse_i[r], m = l * TILEATTN_LOG2E, di = Di_i[r];
    const int kend = l == TILEATTN_NEG_INF ? 0 : key_end<CAUSAL>(q_start + r, Nk, offset);
    const int lo = var.left >= 0 ? pos - var.left : 0, hi = var.right >= 0 ? pos + var.right : Nk - 1;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        variant_p_ds(S[nt][2 * hh + e], dP[nt][2 * hh + e], var, pos, kv_start + 8 * nt + 2 * t + e, kend, lo, hi, m,
                     di, exp_scale);
  }
}

// The causal range [q_begin, q_end) of Q blocks (first_q_start .. Nq) of a K/V block of keys
// kv_start .. kv_start + Bc - 1, narrowed to the rows the variants' window lets see one of them
// (rows i at positions i + offset see keys pos - left .. pos + right; reference.variants_q_range).
template <int Br, int Bc>
__device__ __forceinline__ void variants_q_range(const ScoreVariants& var, int kv_start, int offset, int& q_begin,
                                                 int& q_end) {
  if (var.right >= 0) q_begin = max(q_begin, max(0, kv_start - offset - var.right) / Br * Br);
  if (var.left >= 0) q_end = min(q_end, max(0, kv_start + Bc + var.left - offset));
}

// The end of a K/V block: its dK (already scaled) and dV values at (key, column) of query head h.
// dk_out non-null (no GQA): into the gradients themselves, in their dtype and layout (strides
// dkv_*), this thread being the value's one writer.  Otherwise into the float32 accumulators:
// atomics into the K/V head's slice where a GQA group's query heads share it, or a plain store
// into the query head's own slice (deterministic), or without GQA the K/V head's, which is the
// same slice (so the host need not zero them first).  The rungs pass the destinations as
// TILEATTN_DKDV_DEST (their fields by name).
#define TILEATTN_DKDV_DEST dk_accum, dv_accum, dk_out, dv_out, dkv_sb, dkv_sh, dkv_sn
template <typename T>
__device__ __forceinline__ void store_dkdv(float* dk_accum, float* dv_accum, T* dk_out, T* dv_out, long long dkv_sb,
                                           long long dkv_sh, long long dkv_sn, const int* dq_semaphore, int b, int h,
                                           int H, int h_per_kv, int Nk, int key, int col, int head_dim, float dk,
                                           float dv) {
  if (dk_out) {
    const long long i = b * dkv_sb + h * dkv_sh + key * dkv_sn + col;
    dk_out[i] = static_cast<T>(dk);
    dv_out[i] = static_cast<T>(dv);
  } else if (dq_semaphore || h_per_kv == 1) {
    const long long i = (((long long)b * H + h) * Nk + key) * head_dim + col;
    dk_accum[i] = dk;
    dv_accum[i] = dv;
  } else {
    const long long i = (((long long)b * (H / h_per_kv) + h / h_per_kv) * Nk + key) * head_dim + col;
    red_add(dk_accum + i, dk);
    red_add(dv_accum + i, dv);
  }
}

// store_dkdv for columns col and col + 1 (col even) of one key: where the rung writes the
// gradients directly, one 4-byte (16-bit T) or 8-byte (float) store of each (the gradients are
// fresh contiguous tensors with an even head dim, so the pair is aligned); otherwise two store_dkdv.
template <typename T>
__device__ __forceinline__ void store_dkdv2(float* dk_accum, float* dv_accum, T* dk_out, T* dv_out, long long dkv_sb,
                                            long long dkv_sh, long long dkv_sn, const int* dq_semaphore, int b, int h,
                                            int H, int h_per_kv, int Nk, int key, int col, int head_dim, float dk0,
                                            float dk1, float dv0, float dv1) {
  if (dk_out) {
    const long long i = b * dkv_sb + h * dkv_sh + key * dkv_sn + col;
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float2*>(dk_out + i) = make_float2(dk0, dk1);
      *reinterpret_cast<float2*>(dv_out + i) = make_float2(dv0, dv1);
    } else {
      *reinterpret_cast<unsigned*>(dk_out + i) = pack2<T>(dk0, dk1);
      *reinterpret_cast<unsigned*>(dv_out + i) = pack2<T>(dv0, dv1);
    }
  } else {
    store_dkdv(dk_accum, dv_accum, dk_out, dv_out, dkv_sb, dkv_sh, dkv_sn, dq_semaphore, b, h, H, h_per_kv, Nk, key,
               col, head_dim, dk0, dv0);
    store_dkdv(dk_accum, dv_accum, dk_out, dv_out, dkv_sb, dkv_sh, dkv_sn, dq_semaphore, b, h, H, h_per_kv, Nk, key,
               col + 1, head_dim, dk1, dv1);
  }
}

// Preprocessing: D_i = rowsum(dO * O) in float32, Br query rows per thread block (grid:
// (ceil(Nq / Br), B*H)), each row by bwd_pre_lanes lanes of 16-byte loads (a row's 16-byte chunks,
// rounded up to a power of two, 4 to 32): 8 lanes a row at D=64 in 16 bits, so a 64-thread
// block, where one warp a row with 2-byte loads kept too few bytes in flight to pass ~1.4 TB/s
// (0.093 ms at B=4 H=16 N=8192 on an H200).  O and dO rows start on 16-byte boundaries
// (backward.py copies them otherwise).  The uniform template signature of the registry; Bc and
// CAUSAL are unused.
template <typename T, int HEAD_DIM>
__host__ __device__ constexpr int bwd_pre_lanes() {
  int lanes = 4;  // (at least: Br = 8 rows a block then fill whole warps, as the full-mask shuffles need)
  while (lanes < 32 && lanes * 16 < HEAD_DIM * (int)sizeof(T)) lanes *= 2;
  return lanes;
}

// The products of two 16-byte vectors of T, summed in float32.
template <typename T>
__device__ __forceinline__ float dot16(const uint4& a, const uint4& b) {
  const unsigned x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (sizeof(T) == 4) {
      sum = fmaf(__uint_as_float(x[j]), __uint_as_float(y[j]), sum);
    } else {
      const float2 u = unpack2<T>(x[j]), v = unpack2<T>(y[j]);
      sum = fmaf(u.x, v.x, fmaf(u.y, v.y, sum));
    }
  }
  return sum;
}

// This thread block's 1 / gridDim.x of p[0 .. n) (n a multiple of 4, p 16-byte aligned) set to 0.
__device__ __forceinline__ void zero_share(float* p, int n) {
  const int n4 = n / 4, per = (n4 + gridDim.x - 1) / gridDim.x, end = min(n4, (int)(blockIdx.x + 1) * per);
  for (int i = blockIdx.x * per + threadIdx.x; i < end; i += blockDim.x)
    reinterpret_cast<float4*>(p)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(Br * bwd_pre_lanes<T, HEAD_DIM>()) bwd_preprocess(TILEATTN_BWD_PARAMS(T)) {
  constexpr int LANES = bwd_pre_lanes<T, HEAD_DIM>(), CHUNKS = HEAD_DIM * (int)sizeof(T) / 16;
  static_assert(HEAD_DIM * sizeof(T) % 16 == 0, "whole 16-byte chunks a row");
  const int bh = blockIdx.y + bh_offset;
  const int b = bh / H, h = bh % H;
  const int row = blockIdx.x * Br + threadIdx.x / LANES, lane = threadIdx.x % LANES;
  // (No early exit: a warp may hold rows on both sides of Nq, and its shuffles need every lane.)
  const uint4* o_row = reinterpret_cast<const uint4*>(o + b * o_sb + h * o_sh + row * o_sn);
  const uint4* do_row = reinterpret_cast<const uint4*>(dout + b * do_sb + h * do_sh + row * do_sn);
  float sum = 0.0f;
  if (row < Nq)
#pragma unroll
    for (int c = lane; c < CHUNKS; c += LANES) sum += dot16<T>(o_row[c], do_row[c]);
  sum = lanes_sum<LANES>(sum);
  if (lane == 0 && row < Nq) Di[(long long)bh * Nq + row] = sum;
  // The rung's zeroed float32 buffers, written here rather than by memsets of their own (two
  // launches fewer a call, and the writes share the launch with this kernel's reads): each block
  // its 1 / gridDim.x of its head's dq_accum, and the blocks of head 0 the tail's tiles.
  zero_share(dq_accum + (long long)bh * dq_zero, dq_zero);
  if (bh == 0) zero_share(tail_accum, tail_zero);
}
TILEATTN_SMEM_BYTES(bwd_preprocess, 0);

}  // namespace tileattn
