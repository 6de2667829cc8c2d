// Helpers shared by every rung: the uniform kernel signature, per-head addressing,
// cp.async wrappers and the -inf guards of the online softmax.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace tileattn {

// An FP8 e4m3 value as the kernels' T (v3.5): one byte, no arithmetic (the tensor core and
// cvt's e4m3x2 conversions are all that read or write it), so no header's type is needed.
struct fp8_e4m3 {
  unsigned char bits;
};

// NVRTC ships no <cmath>, so INFINITY is undefined; this is the IEEE bit pattern of +inf.
#define TILEATTN_NEG_INF (-__int_as_float(0x7f800000))
// log2(e): rungs that use exp2 fold it into softmax_scale once, on the host side of the loop.
#define TILEATTN_LOG2E 1.4426950408889634f

// The TMA descriptors of the rungs that load tiles through the copy engine (v3.2, v3.3): six
// 128-byte CUtensorMaps, q, k, v with 64-column boxes, then q, k, v with the narrow last panel's
// box (mma.cuh: tma_tile_load).  They travel by value as one `const __grid_constant__` kernel
// parameter: the copy engine reads them from the launch's own parameter space, so no device buffer
// exists that a later call could free or overwrite while this kernel (or a CUDA graph) still runs.
// 64-byte alignment is what cp.async.bulk.tensor requires of a tensor map.
struct alignas(64) TmaMaps {
  unsigned long long desc[6][16];
};

// The forward kernels' arguments, written once: every kernel takes TILEATTN_FWD_PARAMS (the list
// below as separate parameters), FwdParams<T> is the same list as one struct, and the host
// (_params.py) checks its own copy against both for every instantiation (tests/test_layout.py).
// A field added here reaches every rung's signature, its shared bodies (TILEATTN_FWD_ARGS) and the
// struct at once.
//
// Why separate parameters rather than the struct by value: NVVM rematerialises a scalar kernel
// parameter at each use (it is a constant-bank operand), but keeps the members of a by-value
// aggregate live in registers from the kernel's start; compiled that way, v2 (D=32), v2.3
// (D=128) and v3.1 (D=40..96) spilled, v2.2 lost FMNMX/FMUL and v2.1's P V loop unrolled 3x
// (SASS diff of all 216 sm_90 instantiations; bench/NOTES.md).  Pointers as kernel parameters
// are also what lets __restrict__ give the read-only path (LDG.CONSTANT) and global addressing.
//
// Strides are in elements; the last dim (head dim) is contiguous.  h_per_kv = H / H_kv (GQA);
// query row i of a head sees key j iff j <= i + causal_offset (0: top-left, Nk - Nq: bottom-right).
// bh_offset lets the host split B*H over several launches when it exceeds gridDim.y's 65535.
// lse may be null: the caller did not ask for the log-sum-exp, and no rung stores it then.
// The fields after bh_offset are the room the next features grow into (variable-length batches,
// paged KV caches, sliding windows, softcapping): the host sets them to their "off" values
// (null / 0 / -1).  Variable-length batches (cu_seqlens_q non-null; v3.3, v3_1_varlen_fwd and
// v3_1_variants_fwd read them): q, k, v, o are packed (total, H, D) with batch strides 0,
// sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and o (of k, v:
// cu_seqlens_k), Nq and Nk are the packed totals, lse is (H, total_q), and the causal offset is
// per sequence: Nk_b - Nq_b when bottom_right, else causal_offset.  The score variants (v3.3's
// and v3.1's variants kernels): query row i sits at key position i + offset (the causal offset,
// or the host's Nk - Nq without a causal mask, as flash-attn); it sees keys j in
// [pos - window_left, pos + window_right] (-1: unbounded); softcap > 0 replaces each scaled
// score s by softcap tanh(s / softcap); alibi_slopes adds -slope |pos - j|.
#define TILEATTN_FWD_FIELDS(X, SEP)                                                        \
  X(const T* __restrict__, q) SEP X(const T* __restrict__, k) SEP X(const T* __restrict__, v) SEP \
  X(T* __restrict__, o) SEP X(float* __restrict__, lse) SEP X(float* __restrict__, workspace) SEP \
  X(const int, Nq) SEP X(const int, Nk) SEP X(const int, H) SEP X(const int, h_per_kv) SEP \
  X(const long long, q_sb) SEP X(const long long, q_sh) SEP X(const long long, q_sn) SEP  \
  X(const long long, k_sb) SEP X(const long long, k_sh) SEP X(const long long, k_sn) SEP  \
  X(const long long, v_sb) SEP X(const long long, v_sh) SEP X(const long long, v_sn) SEP  \
  X(const long long, o_sb) SEP X(const long long, o_sh) SEP X(const long long, o_sn) SEP  \
  X(const float, softmax_scale) SEP X(const int, causal_offset) SEP X(const int, bh_offset) SEP \
  /* room to grow */                                                                       \
  X(const int* __restrict__, cu_seqlens_q) SEP   /* [B + 1] row offsets, packed sequences */ \
  X(const int* __restrict__, cu_seqlens_k) SEP                                             \
  X(const int* __restrict__, seqused_k) SEP      /* [B] keys in use, KV cache */            \
  X(const int* __restrict__, page_table) SEP     /* [B][pages], paged KV cache */           \
  X(const long long, page_table_stride) SEP X(const int, page_size) SEP                    \
  X(const int, window_left) SEP X(const int, window_right) SEP /* -1: unbounded */         \
  X(const float, softcap) SEP                    /* tanh soft-capping of scores, 0: off */   \
  X(const int, bottom_right) SEP                 /* variable-length: causal offset Nk_b - Nq_b */ \
  X(const float* __restrict__, alibi_slopes) SEP /* [B][H] at alibi_sb, [H] (alibi_sb 0); null: off */ \
  X(const long long, alibi_sb) SEP                                                         \
  X(const float* __restrict__, descale) SEP      /* [B * H_kv][3] q, k, v factors of FP8 inputs (v3.5) */ \
  X(const int, bh_count) SEP                     /* B * H: persistent rungs (v3.6), a CTA per SM */ \
  X(const float* __restrict__, split_amax)       /* v2.4: max |x| per 64-row block of q, k, v (api._split_blocks) */

#define TILEATTN_COMMA_ ,
#define TILEATTN_SEMI_ ;
#define TILEATTN_DECLARE_(type, name) type name
#define TILEATTN_NAME_(type, name) name

// The kernels' parameter list, and the same names passed on (a kernel entry calling a shared
// __device__ body that takes TILEATTN_FWD_PARAMS too).
#define TILEATTN_FWD_PARAMS(T) TILEATTN_FWD_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)
#define TILEATTN_FWD_ARGS TILEATTN_FWD_FIELDS(TILEATTN_NAME_, TILEATTN_COMMA_)

// The same fields as one struct (C layout), for code that passes them around whole.
template <typename T>
struct FwdParams {
  TILEATTN_FWD_FIELDS(TILEATTN_DECLARE_, TILEATTN_SEMI_);
};

// The dynamic shared memory (bytes) an instantiation of `kernel` carves up, declared in the rung's
// file from the same constants as its carve-up: a __device__ variable with the kernel's template
// arguments, which the host reads from the cubin (_params.smem_bytes) and launches with.  No
// host-side formula exists to drift from it.
#define TILEATTN_SMEM_BYTES(kernel, ...)                                                   \
  template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>                         \
  __device__ int kernel##_smem_bytes = (__VA_ARGS__)

// Base pointers of one (batch, head) slice.  lse is laid out (B, H, Nq), contiguous; when the
// kernel's lse argument is null, hs.lse is meaningless and the rungs test that argument (a
// constant-bank operand, no register) before storing.
template <typename T>
struct HeadSlice {
  const T* q; const T* k; const T* v; T* o; float* lse;
};

#define TILEATTN_HEAD_SLICE(T, bh)                                                         \
  [&]() {                                                                                  \
    const int b_ = (bh) / H, h_ = (bh) % H, hk_ = h_ / h_per_kv;                           \
    return tileattn::HeadSlice<T>{q + b_ * q_sb + h_ * q_sh, k + b_ * k_sb + hk_ * k_sh,   \
                                  v + b_ * v_sb + hk_ * v_sh, o + b_ * o_sb + h_ * o_sh,   \
                                  lse + (long long)(bh) * Nq};                             \
  }()

// The Q block a q_outer CTA takes: with a causal mask the later blocks have more keys to see,
// so they are launched first (block x = gridDim.x - 1 first) and the short ones fill the tail.
template <bool CAUSAL>
__device__ __forceinline__ int q_block() { return CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x; }

// The persistent rungs' tile order (v3.6): one CTA per SM takes tiles blockIdx.x, + gridDim.x, ...
// (in pairs under the causal mask, v3_3_wgmma.cu) of Tr * BH.  The Q blocks of one (batch, head)
// are consecutive, so the CTAs running at once share that head's K and V in L2 (with Br = 128 a
// CTA reads 1 byte of K/V per 128 FLOPs: ~4.7 TB/s at 600 TFLOP/s, more than HBM, so L2 must serve
// the repeats).  Causal: a head's Q blocks interleave from both ends (Tr - 1, 0, Tr - 2, 1, ...),
// so each pair sees Tr + 1 blocks of keys: every CTA's pairs are equal work, as the hardware's
// own block scheduler would balance them.  (The first cut's static longest-first order over
// L2-sized sections of heads ran 0.90x v3.3 at N=32768 causal: one section's round of tiles gave
// some CTAs three times the work of others.)
// With an odd Tr a head's middle block has no partner.  Paired in place it would straddle two
// heads (its middle and the next head's longest block: 1.5 pairs of work), which a model of the
// static schedule (scripts/schedule_model.py) puts at 9-11% above the ideal makespan for v3.7's
// 192-row tiles at N = 8192 and 32768 (Tr = 43, 171).  So the pairs of every head come first
// (tiles 0 .. (Tr - 1) bh_count - 1), then the middles two by two (two middles are one pair's
// work; the model: 5-6% above ideal).  Measured on an H200 (bf16, D=64, causal, one run each way,
// bench/results/sweeps/mma_middles_last_96c6cdf.json): v3.7 1.03x at N = 32768 and 8192, 1.30x at
// N = 2048 (Tr = 11); even Tr (v3.6's 128-row tiles at these lengths) takes the same order as before.
struct TileIndex {
  int bh, q_block;
};
// The sorted tail (causal, R > 0): the pairs stop R rounds of units before the end, at a whole
// round (every CTA has had the same pairs, so the same work), and the tiles left, from tail_start
// on, go one at a time, the most keys first, dealt to the CTAs in a snake (CTA 0 .. G - 1, then
// G - 1 .. 0, ...): a greedy longest-first packing of the tail instead of a last round of pairs
// that leaves some CTAs idle.  A model of the schedule (reference.persistent_schedule,
// scripts/schedule_model.py) puts the busiest CTA at 1.03-1.16x the ideal makespan with the pairs
// alone (v3.7 at N = 8192 B*H = 32: 1.155) and 1.004-1.018x with R = 2.  Measured (H100, bf16
// causal, one call, bench/NOTES.md): v3.7's 192-row tiles at D = 64 1.0x / 1.036x / 1.031x faster
// at N = 4096 / 8192 / 32768 (H200: 1.010x / 1.033x / 1.025x at N = 2048 / 8192 / 32768), so
// R = 2 is their default; v3.6's 128-row tiles 0.97x at N = 1024 and 1.004-1.017x above (its two
// consumers give up 8 registers each for the producer's walk), so R = 0 there.
// TILEATTN_SORTED_TAIL_128 / _192 (TILEATTN_DEFINES) set R for an experiment.
#ifndef TILEATTN_SORTED_TAIL_128
#define TILEATTN_SORTED_TAIL_128 0
#endif
#ifndef TILEATTN_SORTED_TAIL_192
#define TILEATTN_SORTED_TAIL_192 2
#endif
__host__ __device__ constexpr int sorted_tail_rounds(int Br) {
  return Br == 192 ? TILEATTN_SORTED_TAIL_192 : TILEATTN_SORTED_TAIL_128;
}
// The first tile of the sorted tail (even: a pair boundary), for G = gridDim.x CTAs over T tiles.
__device__ __forceinline__ int sorted_tail_start(int T, int G, int R) {
  const int rounds = (T + 1) / 2 / G - R;
  return rounds > 0 ? 2 * rounds * G : 0;
}
// Tile k of the tail from t0 (persistent order) in decreasing Q block order.  The tail holds, in
// persistent order, the rest of head h0's pairs (Q blocks j0 .. Tr - 1 - j0), every pair of the
// nw heads after it, then every head's middle block (odd Tr; "middles last" below).  By Q block:
// j0 blocks at the top with nw tiles each, the band j0 .. Tr - 1 - j0 with nw + 1 (the middle:
// bh_count), j0 blocks at the bottom with nw each.
__device__ __forceinline__ TileIndex sorted_tail_tile(int k, int t0, int Tr, int bh_count) {
  const int W = Tr % 2 == 1 ? Tr - 1 : Tr;
  if (t0 >= W * bh_count) return {t0 - W * bh_count + k, Tr / 2};  // middles only
  const int h0 = t0 / W, j0 = t0 % W / 2, nw = bh_count - 1 - h0, mid = Tr % 2 == 1 ? Tr / 2 : -1;
  const int top = j0 * nw;
  if (k < top) return {h0 + 1 + k % nw, Tr - 1 - k / nw};
  k -= top;
  const int hi = Tr - 1 - j0;  // the band's first Q block
  const int above = mid >= 0 ? (hi - mid) * (nw + 1) : 0;  // the band's tiles above the middle
  if (mid >= 0 && k >= above) {
    k -= above;
    if (k < bh_count) return {k, mid};
    k -= bh_count;
    const int band_below = (mid - j0) * (nw + 1);
    if (k < band_below) return {h0 + k % (nw + 1), mid - 1 - k / (nw + 1)};
    k -= band_below;
    return {h0 + 1 + k % nw, j0 - 1 - k / nw};
  }
  const int band = (hi - j0 + 1) * (nw + 1);  // (no middle)
  if (k < band) return {h0 + k % (nw + 1), hi - k / (nw + 1)};
  k -= band;
  return {h0 + 1 + k % nw, j0 - 1 - k / nw};
}
template <bool CAUSAL, int R = 0>
__device__ __forceinline__ TileIndex persistent_tile(int tile, int Tr, int bh_count) {
  if (!CAUSAL) return {tile / Tr, tile % Tr};
  if constexpr (R > 0) {
    const int t0 = sorted_tail_start(Tr * bh_count, gridDim.x, R);
    if (tile >= t0) return sorted_tail_tile(tile - t0, t0, Tr, bh_count);
  }
  const int W = Tr % 2 == 1 ? Tr - 1 : Tr;  // a head's tiles in pairs
  if (W < Tr && tile >= W * bh_count) return {tile - W * bh_count, Tr / 2};
  const int bh = tile / W, r = tile % W;
  return {bh, r % 2 == 0 ? Tr - 1 - r / 2 : r / 2};
}

// The tile scheduler of packed sequences (v3.3's variable-length batches): blockIdx.x enumerates
// every sequence's Q blocks in turn, so no CTA is launched for the blocks a grid over the longest
// sequence would hold past a short one's end.  Sequence b's blocks are tiles first(b) ..
// first(b) + ceil(len_b / Br) - 1 with first(b) = floor((cu_q[b] - cu_q[0]) / Br) + b: first(0)
// = 0, increasing, and first(b + 1) - first(b) = floor(c_{b+1} / Br) - floor(c_b / Br) + 1 >=
// ceil(len_b / Br) (c_b = cu_q[b] - cu_q[0]).  So floor(total_q / Br) + B tiles hold every block
// once (cu_q[B] - cu_q[0] <= total_q), at most one tile per sequence stays empty (more when q has
// rows past cu_q[B]), and B is gridDim.x - total_q / Br: the host needs no sequence length (no
// sync).  Each warp finds b by a 32-way search over first() (one round of loads up to 32
// sequences, two up to 1024); every thread of the warp must be here.  Causal: a sequence's later
// blocks, which see more keys, come first.  q_block -1: an empty tile.
struct PackedTile {
  int b, q_block;
};
template <bool CAUSAL, int Br>
__device__ __forceinline__ PackedTile packed_tile(const int* cu_seqlens_q, int total_q) {
  const int tile = blockIdx.x, lane = threadIdx.x % 32;
  const int c0 = cu_seqlens_q[0];
  auto first = [&](int b) { return (cu_seqlens_q[b] - c0) / Br + b; };
  int lo = 0, n = gridDim.x - total_q / Br;  // b lies in lo .. lo + n - 1, and first(lo) <= tile
  while (n > 1) {
    const int step = (n + 31) / 32, probe = lo + lane * step;
    const unsigned below = __ballot_sync(0xffffffffu, probe < lo + n && first(probe) <= tile);
    const int k = 31 - __clz(below);  // the last probe at or below the tile (lane 0's is lo)
    lo += k * step;
    n = min(step, n - k * step);
  }
  const int blocks = (cu_seqlens_q[lo + 1] - cu_seqlens_q[lo] + Br - 1) / Br, i = tile - first(lo);
  return {lo, i >= blocks ? -1 : CAUSAL ? blocks - 1 - i : i};
}

// Reductions over the LANES consecutive lanes that hold one row's slices (4: a quad of an mma
// fragment; 8: v2.1's row groups); every lane gets the result.
template <int LANES>
__device__ __forceinline__ float lanes_max(float x) {
#pragma unroll
  for (int mask = 1; mask < LANES; mask *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, mask));
  return x;
}
template <int LANES>
__device__ __forceinline__ float lanes_sum(float x) {
#pragma unroll
  for (int mask = 1; mask < LANES; mask *= 2) x += __shfl_xor_sync(0xffffffffu, x, mask);
  return x;
}

// ---- cp.async (sm_80+): 16-byte global->shared copies that bypass registers. ----
// src_bytes = 0 makes the hardware write 16 zero bytes without reading src (tail rows).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
// The same for one 4-byte value (row statistics): src_bytes = 0 writes a zero.
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// One K/V block of Bc rows of FP32 into shared buffers Ks, Vs ([Bc][D], unpadded) with 16-byte
// cp.async copies spread over NTHREADS threads.  Rows past Nk are zero-filled by the copy itself,
// and their scores are masked to -inf by the caller, so they carry no weight.
template <int HEAD_DIM, int Bc, int NTHREADS>
__device__ __forceinline__ void kv_async_copy(const float* k, const float* v, long long k_sn,
                                              long long v_sn, float* Ks, float* Vs, int kv_start,
                                              int Nk) {
  constexpr int VEC_PER_ROW = HEAD_DIM / 4;
  for (int i = threadIdx.x; i < Bc * VEC_PER_ROW; i += NTHREADS) {
    const int r = i / VEC_PER_ROW, c4 = (i % VEC_PER_ROW) * 4;
    const bool ok = kv_start + r < Nk;
    const int src_row = ok ? kv_start + r : 0;  // a zero-filled copy still needs a valid address
    cp_async_16(Ks + r * HEAD_DIM + c4, k + src_row * k_sn + c4, ok);
    cp_async_16(Vs + r * HEAD_DIM + c4, v + src_row * v_sn + c4, ok);
  }
}

}  // namespace tileattn
