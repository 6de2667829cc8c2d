// v3.3: fp16/bf16 attention on Hopper's warpgroup MMA with warp specialisation (sm_90a).
//
// Why (v3.2's limits, measured on an H200): v3.2 issues mma.sync per warp, re-reading every K/V
// fragment from shared memory by ldmatrix in each of its 4 warps, and runs S -> softmax -> P V
// serially per warp with one other warp per scheduler to hide it (fixed-latency stalls, 63% tensor
// pipe).  Here:
//  * wgmma.m64nNk16: a consumer warpgroup (4 warps, 64 query rows) multiplies with Q, K and V read
//    by the tensor core straight from shared memory (P from registers); V is read N-major through
//    the descriptor's transpose bit, so the tiles stay as the copy engine wrote them.
//  * Warp specialisation: one thread of the producer warpgroup issues the TMA copies of Q, K and
//    V (v3.2's tensor maps, 64-column panels, 128-byte swizzle = wgmma's K-major and N-major
//    layouts) into two stages, counted by full mbarriers; the two consumer warpgroups (Br = 128,
//    two 64-row halves sharing every K/V block) release each K and V buffer on empty mbarriers.
//    The producer gives its registers to the consumers (setmaxnreg 24 / 240).
//  * Intra-warpgroup overlap: S_{j+1} = Q K_{j+1}^T and P_j V_j are issued back to back, and the
//    softmax of block j+1 runs on the CUDA cores while the tensor core still does P_j V_j (the
//    loop body is straight-line so that ptxas keeps the two wgmma groups in flight).  Measured
//    against the same kernel issuing S, softmax, P V in sequence (f159240; H200, bf16, N=8192):
//    +6% / +5% at D=128, -1% / +8% at D=64 (non-causal / causal).
//  * O accumulates inside the tensor core across K/V blocks (FP32, rescaled by FFMA when the row
//    max moves), as in v3.x.
// Head dims 64, 128, 192 and 256 (whole 64-column panels); Br = 128, Bc = 128 up to D = 128 (160 KB
// of shared memory at D = 128) and 64 above (O takes 96-128 registers a thread; 192 KB at D = 256);
// v3.6_wide (versions.py) runs D = 128 at Bc = 160 for long calls without a mask.
// Other head dims run v3.2 (up to 128) or v3.1.
// Variable-length batches (flash_attn_varlen_func): the same kernel with cu_seqlens (common.cuh);
// grid (packed tiles, heads): a tile scheduler over (sequence, Q block) (common.cuh packed_tile),
// and the copy engine reads each sequence's rows of the packed tensors from its offset.
// Score variants (sliding window, softcap, ALiBi): v3_3_variants_fwd, the same body compiled with
// VARIANTS, so that the plain kernel's code is untouched (its instructions are the same).  The
// K/V loop covers only the blocks inside the window of some row of the Q block (skipped, not
// masked).
#include "common.cuh"
#include "mma.cuh"  // pack2, mbarriers, tma_load_4d
#include "wgmma.cuh"

namespace tileattn {

constexpr int V3_3_WG = 128;              // threads per warpgroup
// The producer only issues copies.  With the sorted tail (common.cuh sorted_tail_rounds) its walk
// takes more registers than 24 (the tail's tile arithmetic spilled 8-16 bytes there).
__host__ __device__ constexpr int v3_3_producer_regs(int Br) { return sorted_tail_rounds(Br) > 0 ? 32 : 24; }
// The block: a producer warpgroup and Br / 64 consumer warpgroups of 64 query rows (Br = 128;
// Br = 192 in v3.7: registered at D = 64; D = 128 fits at Bc = 64 only, for tile sweeps).  The
// consumers share what the producer gives back, in setmaxnreg's steps of 8, of the CTA's pool:
// the registers the launch gave each thread (65536 / threads, down to a multiple of 8: 168 for
// three warpgroups, 128 for four) times the warpgroups, not the whole register file (384 threads
// leave 1,024 registers unallocated).  A consumer's setmaxnreg.inc waits until the pool holds
// what it asks for, so asking more than the pool has hangs the CTA: two consumers get 240 each
// beside a 24-register producer (24 + 2 x 240 = 3 x 168) but 232 beside 32; three get 160 beside
// either (32 + 3 x 160 = 4 x 128).
__host__ __device__ constexpr int v3_3_threads(int Br) { return V3_3_WG * (1 + Br / 64); }
__host__ __device__ constexpr int v3_3_launch_regs(int Br) { return 65536 / v3_3_threads(Br) / 8 * 8; }
__host__ __device__ constexpr int v3_3_consumer_regs(int Br) {
  return (v3_3_launch_regs(Br) * (1 + Br / 64) - v3_3_producer_regs(Br)) / (Br / 64) / 8 * 8;
}
static_assert(v3_3_consumer_regs(128) == (sorted_tail_rounds(128) ? 232 : 240) && v3_3_consumer_regs(192) == 160,
              "the consumers' registers (the pool: v3_3_launch_regs)");

// Shared memory (versions.py sizes it): Q [Br][D], then two stages of K [Bc][D] and V [Bc][D]
// (16-bit, 64-column panels), then 9 mbarriers (Q; K and V full x2; K and V empty x2); the
// persistent kernels (v3.6, v3.7) add Q's empty barrier and, at 16 bits, O's stage.

// O's stage (fragment_store_rows_tma, mma.cuh): the persistent kernels at 16 bits write each
// warp's 16 rows of O into shared memory by stmatrix and copy them out with the copy engine's
// tensor stores (the map at TmaMaps index 3, which the loads leave free at D = 64, 128 and 256),
// so the stores leave the consumers' path and overlap the next tile.  The host builds O's map
// when O's base and strides are 16-byte aligned (api._o_map), and the kernel tests the same
// (o_tma_aligned); any other O takes the direct stores.  At D = 256 a whole row's stage (64 KB)
// does not fit beside v3.6's 192 KB; a 128-column one (32 KB) does, and takes a row in two passes
// (O_STAGE_COLS).  History (bench/NOTES.md): a bulk copy a row from a padded stage measured +4-7%
// at D = 128 N = 1024 and +8-12% at D = 256 against the direct stores, but -3% at D = 64 causal
// N = 1024, which kept the direct stores; a tile trace then put the store at 1100-1300 SM clocks
// at D = 64 and 2200 at D = 128 (6-9% of a tile at N = 1024), which the tensor stores cut.
__host__ __device__ constexpr bool v3_3_stages_o(bool persistent, int elem_bytes, int head_dim) {
#ifdef TILEATTN_O_DIRECT
  return false;
#else
  return persistent && elem_bytes == 2 && head_dim % 64 == 0;
#endif
}
// The persistent kernels' shared memory: Q, 2 stages of K and V, 10 mbarriers (KVBarriers<2> and
// Q's empty one), then O's stage from 1024 bytes past the K/V stages (the 128-byte swizzle's
// alignment), 16 rows a consumer warp.
template <int HEAD_DIM>
__host__ __device__ constexpr int v3_6_smem_bytes(int Br, int Bc) {
  return (Br + 4 * Bc) * HEAD_DIM * 2 +
         (v3_3_stages_o(true, 2, HEAD_DIM) ? 1024 + Br / 16 * O_STAGE_WARP_BYTES<HEAD_DIM> : 10 * 8);
}
// Whether O at `o` with these strides (elements of T) can be a tensor map's: base and strides on
// 16-byte boundaries.  api._o_map builds the map under the same test.
template <typename T>
__device__ __forceinline__ bool o_tma_aligned(const T* o, long long o_sb, long long o_sh, long long o_sn) {
  return ((reinterpret_cast<unsigned long long>(o) | ((o_sb | o_sh | o_sn) * sizeof(T))) & 15) == 0;
}

// One tile's geometry: which (batch, head) slice, Q block, sequence rows and K/V blocks.
struct V33Tile {
  int bh, qb, q0, k0, seq_q, seq_k, offset;
  int q_start, j_lo, Tc;  // rows q_start ..; K/V blocks j_lo .. j_lo + Tc - 1
  bool empty;             // nothing to do (a packed tile past its sequence's blocks)
};

// f(tile, c0, i) for each tile of this CTA: c0 = its K/V blocks before the tile, i = its tiles
// before it.  PERSISTENT: in units of U consecutive tiles (causal: persistent_tile's pairs of a
// long and a short Q block, equal work together), unit blockIdx.x, + gridDim.x, ...; else the
// CTA's one tile, w0 (computed before the roles split).  warp_uniform (the consumer
// warpgroups): c0 is handed over through a shuffle from lane 0, because ptxas treats the
// loop-carried sum as varying across the warp and moves the stage arithmetic of every K/V block
// (descriptors, barrier addresses) from the uniform datapath into vector registers, 24 R2UR more
// per block at D=64 (4% of the loop's instructions); a shuffle's result it knows to be uniform.
// A trace of each tile's phases, a diagnostic (TILEATTN_DEFINES=TILEATTN_TRACE=1, read by
// scripts/tile_trace.py): thread 0 of each consumer warpgroup (slot cwg) and the producer's thread
// (slot 3) write the SM's clock at the phases' edges of the CTA's first TRACE_TILES tiles.
// Consumer: 0 tile start, 1 Q arrived, 2 block 0's softmax done, 3 the loop done, 4 the last P V
// done, 5 O stored; 7 holds Tc.  Producer: 0 tile start, 1 Q's buffer free (its copy issued
// next), 2 the tile's last K/V copy issued.  The default build has none of it.
#ifndef TILEATTN_TRACE
#define TILEATTN_TRACE 0
#endif
constexpr int TRACE_CTAS = 160, TRACE_TILES = 48;
}  // namespace tileattn
#if TILEATTN_TRACE
// At global scope, so that its name is not mangled: the host finds it with cuLibraryGetGlobal.
__device__ long long tileattn_trace[tileattn::TRACE_CTAS][tileattn::TRACE_TILES][4][8];
#endif
namespace tileattn {
// Both compile to nothing without the define (the clock is read only under it).
__device__ __forceinline__ void trace_at(int i, int slot, int ev, long long value) {
#if TILEATTN_TRACE
  if (blockIdx.x < TRACE_CTAS && i < TRACE_TILES) ::tileattn_trace[blockIdx.x][i][slot][ev] = value;
#endif
}
__device__ __forceinline__ void trace_clock(int i, int slot, int ev) {
#if TILEATTN_TRACE
  trace_at(i, slot, ev, clock64());
#endif
}
// The speculative softmax of an unmasked K/V block (16-bit P).  The exponentials start at once
// against the row's running max m_i instead of after the block's row max (64 FMNMX a thread at
// Bc = 128, half-rate on the ALU pipe, then two shuffle rounds, while the SFU waits).  The guess
// is checked after them, without a shuffle: every thread's partial row sum of the weights at most
// 2^15 (each weight is at most the sum, so none reaches fp16's 65504; a sum that large means the
// row max moved by more than 10, where the lazy rebase would move too; NaN and infinity fail).  On
// a failed check (a warpgroup any of whose rows failed: the vote is the warpgroup's) S is computed
// again from the K stage, which the warpgroup therefore releases only after the softmax, and takes
// the ordinary path.  Measured on an H100 (bench/NOTES.md, "The speculative softmax"; ratios to
// cuDNN in the same process): 1.02-1.07x the ordinary softmax's speed at most shapes, even at
// D = 128 without a mask from N = 8192 (v3.6_wide) and causal N = 1024, 0.97-0.99x at D = 64
// causal N = 1024 (the ping-pong's causal kernel, which therefore keeps the ordinary softmax).
// The same in the variants kernels at D = 128, on blocks with no mask of any kind (Nk, causal,
// the window's edges) in calls without ALiBi (its offsets ride the ordinary path's row max):
// softcap's tanh, then the speculative exponentials.  Measured on an H100 (bench/NOTES.md, "The
// speculative softmax in the variants kernels"; bf16 B=2 H=16 N=8192 causal): D = 128 window 4096
// 0.722 -> 0.688 ms, nothing on 0.902 -> 0.858, softcap 1.093 -> 1.102; at D = 64 it lost
// (softcap 0.847 -> 0.914 ms, the SFU binds; window 0.504 -> 0.535), so D = 64 keeps the ordinary
// path.  TILEATTN_DEFINES=TILEATTN_SPEC_VARIANTS=1 turns it on at every head dim (the experiment).
#ifndef TILEATTN_SPEC_VARIANTS
#define TILEATTN_SPEC_VARIANTS 0
#endif
// v3.8 (causal ALiBi) speculates too, and walks its K/V blocks from the diagonal leftwards
// (REVERSE below).  ALiBi's bias falls with every block of that walk, so the first block (the
// diagonal's, masked, the ordinary path) sets a row max the later ones rarely pass: the
// speculative check rarely fails and the lazy rebase rarely rescales O, whatever the slopes.  The
// block term slope_s (kv_start - first_pos) joins the exponent's per-row constant as it joins the
// ordinary path's row max.  scripts/alibi_spec_model.py (float64, BLOOM's 16 slopes, N = 8192):
// left to right the ordinary path rescales O on 93% of a warpgroup's blocks; from the diagonal on
// none, and every check passes.  Measured on an H100 (bench/NOTES.md, "ALiBi from the diagonal";
// bf16 B=2 H=16 N=8192, one process): 0.864x -> 0.970x of plain causal time at D = 64, 0.875x ->
// 0.954x at D = 128; the walk alone 0.938x / 0.920x; left to right with the speculation gated to
// heads climbing <= 8 log2 units a block 0.808x / 0.809x (its check failed too often).
// FP8 keeps the ordinary path: against 2^8 (its lazy rebase's bound) the check failed on 31% of
// blocks (0.74-0.92x); against e4m3's 448 it took 0.96-1.09x the ordinary kernel's time, more at
// 10 of 12 shapes (the same note, "FP8's check against 448").
// v3.8 (ALIBI, v3_8_alibi_mma.cu): causal ALiBi's key term slope_s c (c = 0 .. Bc - 1, the key's
// column in its block) as one more k16 step of S = Q K^T, A [64 x 16] in registers against a
// constant B [Bc x 16] in shared memory.  The table: row c holds c, c, c in columns 0 .. 2 and
// zeros after (bf16, exact for c < 256), in K's layout (128-byte rows, the 128-byte swizzle:
// 16-byte chunk j of row r at chunk j ^ (r % 8)), so that K's descriptor form reads it.
template <int Bc>
__device__ __forceinline__ void alibi_key_table(unsigned char* table, int tid, int nthreads) {
  static_assert(Bc <= 256, "key columns exact in bf16");
  for (int i = tid; i < Bc * 8; i += nthreads) {
    const int r = i / 8, chunk = i % 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if ((chunk ^ (r % 8)) == 0) {  // logical chunk 0: columns 0 .. 7
      const unsigned c = pack2<__nv_bfloat16>(static_cast<float>(r), static_cast<float>(r));
      v.x = c;
      v.y = c & 0xffffu;
    }
    *reinterpret_cast<uint4*>(table + i * 16) = v;
  }
  fence_proxy_async_smem();  // generic-proxy stores, before the tensor core's async-proxy reads
}
// The A fragment: every row (0, 1, 2) = slope_s split into three bf16 terms hi + mid + lo (24 bits
// of the float's mantissa; their products with c are exact in the FP32 accumulator).  A's
// registers: a[0] row g, columns 2t, 2t + 1; a[1] row g + 8, the same; a[2], a[3] columns 8 up.
__device__ __forceinline__ void alibi_slope_fragment(unsigned (&a)[4], float slope_s, int t) {
  const auto bf16 = [](float x) { return __bfloat162float(__float2bfloat16_rn(x)); };
  const float hi = bf16(slope_s), mid = bf16(slope_s - hi), lo = bf16(slope_s - hi - mid);
  a[0] = a[1] = t == 0 ? pack2<__nv_bfloat16>(hi, mid) : t == 1 ? pack2<__nv_bfloat16>(lo, 0.0f) : 0u;
  a[2] = a[3] = 0u;
}

template <bool PERSISTENT, bool CAUSAL, int R, typename TileAt, typename F>
__device__ __forceinline__ void v3_3_for_my_tiles(const TileAt& tile_at, int total, const V33Tile& w0, F& f,
                                                  bool warp_uniform) {
  if constexpr (PERSISTENT) {
    constexpr int U = CAUSAL ? 2 : 1;
    int c0 = 0, i = 0;
    if constexpr (CAUSAL && R > 0) {  // pairs up to the sorted tail (common.cuh), then its tiles in a snake
      // One loop and one call of f (three calls inlined the tile's body three times).  The pairs
      // end at a whole round: this CTA's first 2 * rounds tiles are its units' pairs.
      // (G, t0 and the pairs' count are found again each tile: kept live across the tile's body
      // they spilled 4-16 bytes.)
      for (int n = 0;; ++n) {
        const int G = gridDim.x, t0 = sorted_tail_start(total, G, R), pair_tiles = t0 / G;
        int tile;
        if (n < pair_tiles) {
          tile = (blockIdx.x + n / 2 * G) * 2 + n % 2;
        } else {
          const int r = n - pair_tiles, k = r * G + (r % 2 == 0 ? blockIdx.x : G - 1 - blockIdx.x);
          if (k >= total - t0) break;  // (a CTA's k grows from round to round)
          tile = t0 + k;
        }
        const auto w = tile_at(tile);
        f(w, warp_uniform ? __shfl_sync(0xffffffffu, c0, 0) : c0, i);
        c0 += w.Tc;
        ++i;
      }
      return;
    }
    for (int unit = blockIdx.x; unit * U < total; unit += gridDim.x) {
      for (int tile = unit * U; tile < min(total, unit * U + U); ++tile, ++i) {
        const auto w = tile_at(tile);
        f(w, warp_uniform ? __shfl_sync(0xffffffffu, c0, 0) : c0, i);
        c0 += w.Tc;
      }
    }
  } else {
    f(w0, 0, 0);
  }
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, bool VARIANTS, bool PINGPONG = false,
          bool PERSISTENT = false, bool ALIBI = false, bool WINDOW = false>
__device__ __forceinline__ void v3_3_body(TILEATTN_FWD_PARAMS(T), const TmaMaps* tmaps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // FP8: v3.5 (v3_5_fp8.cu), e4m3 Q, K and V^T, bf16 O; its differences are marked FP8 below.
  constexpr bool FP8 = sizeof(T) == 1;
  static_assert(sizeof(T) == 2 || FP8, "v3.3 is an fp16/bf16 rung, v3.5 an e4m3 one");
  constexpr int CONSUMERS = Br / 64;  // consumer warpgroups of 64 query rows
  static_assert(Br == 128 || (Br == 192 && !PINGPONG),
                "two consumer warpgroups, or three (v3.7; the ping-pong takes two)");
  static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "whole 64-column panels");
  // Bc: k16 steps of P V (16-bit), k32 steps and whole V^T panels (FP8); registered 64, 128 and
  // 256 (FP8 at D = 64), other widths for tile sweeps (scripts/tile_sweep.py, fp8_probe.py --tile).
  static_assert(Bc % (FP8 ? 64 : 16) == 0 && Bc <= 256, "Bc: whole k-steps (FP8: whole V^T panels), at most 256");
  static_assert(!FP8 || !VARIANTS, "FP8: no score variants");
  // FP8's V^T panels: 128 key bytes (the 128-byte swizzle) when Bc is a multiple of 128, else 64
  // (the 64-byte swizzle; the host's map boxes match: fp8._tensor_maps).
  constexpr int VT_PANEL = Bc % 128 == 0 ? 128 : 64;
  // ALIBI (v3.8, v3_8_alibi_mma.cu): causal ALiBi alone, its key term added by the tensor core.
  static_assert(!ALIBI || (CAUSAL && !VARIANTS && !FP8 && PERSISTENT && Bc == 128), "v3.8: causal, 16-bit, v3.6's walk");
  // WINDOW (v3.9, v3_9_window.cu): a causal sliding window alone, the left edge's mask on the
  // blocks that cross it; the rest is the plain causal kernel.
  static_assert(!WINDOW || (CAUSAL && !VARIANTS && !FP8 && !ALIBI && PERSISTENT), "v3.9: causal, 16-bit, v3.6's walk");
  constexpr bool REVERSE = ALIBI;  // v3.8's blocks from the diagonal leftwards (above)
  // K/V block n of tile w's walk, in the producer's copies and the consumers' offsets alike.  A
  // macro: as a lambda (capturing by reference or by value) ptxas scheduled 40 of the default
  // kernels differently (SASS fingerprints), REVERSE or not.
#define kv_block(w, n) (REVERSE ? (w).j_lo + (w).Tc - 1 - (n) : (w).j_lo + (n))
  constexpr int STAGES = 2;
  constexpr int Q_BYTES = Br * HEAD_DIM * sizeof(T), KV_BYTES = Bc * HEAD_DIM * sizeof(T);

  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned s_q = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  auto s_k = [&](int s) { return s_q + Q_BYTES + s * KV_BYTES; };
  auto s_v = [&](int s) { return s_q + Q_BYTES + (STAGES + s) * KV_BYTES; };
  const KVBarriers<STAGES> bars{s_q + Q_BYTES + 2 * STAGES * KV_BYTES};
  // PERSISTENT (v3.6): Q's buffer is refilled for each tile once every consumer warpgroup is
  // done reading it (their last S): one more mbarrier after KVBarriers's, every consumer thread.
  const unsigned q_empty = bars.q + 8 * KVBarriers<STAGES>::COUNT;
  // Q and full: the producer thread's one arrival (with the copy's bytes); empty: every consumer thread.
  if (threadIdx.x == 0) {
    if (PERSISTENT) mbar_init(q_empty, CONSUMERS * V3_3_WG);
    bars.init(1, CONSUMERS * V3_3_WG);
  }
  // ALIBI: the key table past O's stage (v3_8_alibi_mma.cu), written once, before any MMA reads it.
  const unsigned s_keys = s_q + Q_BYTES + 2 * STAGES * KV_BYTES + 1024 + Br / 16 * O_STAGE_WARP_BYTES<HEAD_DIM>;
  if constexpr (ALIBI) alibi_key_table<Bc>(smem + (s_keys - s_q), threadIdx.x, blockDim.x);
  __syncthreads();

  // The tiles this CTA takes.  One: the whole (b_, h_) slice of grid row bh, Q block x; or
  // (variable-length batches, common.cuh) the (sequence, Q block) tile x of packed_tile's schedule
  // at head y, rows q0 .. q0 + seq_q - 1 of packed q and k0 .. k0 + seq_k - 1 of packed k, v.
  // Tiles reaching past a sequence's end read the next sequence's rows (or the copy engine's zeros
  // past the tensor): keys there are masked like keys past Nk, query rows there are not stored.
  // PERSISTENT (v3.6, v3_6_persistent.cu): one CTA per SM takes tiles of persistent_tile's order
  // over Tr * bh_count tiles (v3_3_for_my_tiles); dense calls only (the host launches packed
  // sequences on the non-persistent kernels, so cu_seqlens is null here).
  const int Tr = (Nq + Br - 1) / Br;
  auto tile_at = [&](int tile) {
    V33Tile w{0, 0, 0, 0, Nq, Nk, causal_offset, 0, 0, 0, false};
    if constexpr (PERSISTENT) {
      const TileIndex ti = persistent_tile<CAUSAL, sorted_tail_rounds(Br)>(tile, Tr, bh_count);
      w.bh = ti.bh;
      w.qb = ti.q_block;
    } else {
      w.bh = blockIdx.y + bh_offset;
      w.qb = q_block<CAUSAL>();
      if (cu_seqlens_q) {
        const PackedTile pt = packed_tile<CAUSAL, Br>(cu_seqlens_q, Nq);
        if (pt.q_block < 0) {  // the one empty tile a sequence may leave
          w.empty = true;
          return w;
        }
        w.bh = pt.b * H + w.bh;
        w.qb = pt.q_block;
        w.q0 = cu_seqlens_q[pt.b];
        w.k0 = cu_seqlens_k[pt.b];
        w.seq_q = cu_seqlens_q[pt.b + 1] - w.q0;
        w.seq_k = cu_seqlens_k[pt.b + 1] - w.k0;
        if (bottom_right) w.offset = w.seq_k - w.seq_q;
      }
    }
    w.q_start = w.qb * Br;
    w.empty = w.q_start >= w.seq_q;  // dense: a Q block past Nq (never launched); packed: none
    // Keys kv_lo .. kv_hi - 1 hold every key some row of the block sees: K/V blocks j_lo .. j_lo +
    // Tc - 1, counted by n = j - j_lo for the stages and barriers.  Without a window, j_lo is 0.
    int kv_lo = 0, kv_hi = CAUSAL ? min(w.seq_k, max(0, w.q_start + Br + w.offset)) : w.seq_k;
    if (VARIANTS || WINDOW) {
      if (!CAUSAL && window_right >= 0) kv_hi = min(kv_hi, max(0, w.q_start + Br + w.offset + window_right));
      if (window_left >= 0) kv_lo = min(kv_hi, max(0, w.q_start + w.offset - window_left));
    }
    w.j_lo = kv_lo / Bc;
    w.Tc = (kv_hi + Bc - 1) / Bc - w.j_lo;
    return w;
  };
  // The CTA's one tile (not PERSISTENT), found by every thread before the roles split:
  // packed_tile's search is a warp-wide ballot, which the producer's one thread cannot run.
  const V33Tile w0 = PERSISTENT ? V33Tile{} : tile_at(0);
  if (!PERSISTENT && w0.empty) return;

  if (threadIdx.x < V3_3_WG) {
    // ---------------- producer: one thread issues every copy ----------------
    setmaxnreg_dec<v3_3_producer_regs(Br)>();
    if (threadIdx.x != 0) return;
    // One tile.  c0: this CTA's K/V blocks before it (stage c0 + n of block n); i: its tiles before it.
    auto produce_tile = [&](const V33Tile& w, const int c0, const int i) {
      const int h_ = w.bh % H, hk_ = h_ / h_per_kv;
      const int tma_b = cu_seqlens_q ? 0 : w.bh / H;  // packed tensors are one "batch" to the copy engine
      trace_clock(i, 3, 0);
      if (PERSISTENT && i > 0) mbar_wait(q_empty, (i - 1) & 1);  // the consumers are done with the last Q
      trace_clock(i, 3, 1);
      if constexpr (FP8) {  // maps: q, k (rows of D bytes), v^T (rows of keys, the host's copy)
        tma_rows_load_e4m3<HEAD_DIM>(tmaps, 0, s_q, bars.q, Br, w.q0 + w.q_start, h_, tma_b);
        for (int n = 0; n < w.Tc; ++n) {
          const int c = c0 + n;
          bars.wait_k_empty(c);
          tma_rows_load_e4m3<HEAD_DIM>(tmaps, 1, s_k(bars.stage(c)), bars.k_full(c), Bc, kv_block(w, n) * Bc, hk_,
                                       tma_b);
          bars.wait_v_empty(c);
          mbar_arrive_expect_tx(bars.v_full(c), HEAD_DIM * Bc);  // panels of D rows x VT_PANEL key bytes
#pragma unroll
          for (int p = 0; p < Bc / VT_PANEL; ++p)
            tma_load_4d(s_v(bars.stage(c)) + p * HEAD_DIM * VT_PANEL, tmaps->desc[2],
                        (kv_block(w, n) * Bc + VT_PANEL * p) / 2, 0, hk_, tma_b, bars.v_full(c));
        }
        return;
      }
      tma_tile_load<HEAD_DIM>(tmaps, 0, s_q, bars.q, Br, w.q0 + w.q_start, h_, tma_b);  // maps: q, k, v
      for (int n = 0; n < w.Tc; ++n) {
        const int row = w.k0 + kv_block(w, n) * Bc, c = c0 + n;
        bars.wait_k_empty(c);
        tma_tile_load<HEAD_DIM>(tmaps, 1, s_k(bars.stage(c)), bars.k_full(c), Bc, row, hk_, tma_b);
        bars.wait_v_empty(c);
        tma_tile_load<HEAD_DIM>(tmaps, 2, s_v(bars.stage(c)), bars.v_full(c), Bc, row, hk_, tma_b);
      }
      trace_clock(i, 3, 2);
    };
    v3_3_for_my_tiles<PERSISTENT, CAUSAL, sorted_tail_rounds(Br)>(tile_at, Tr * bh_count, w0, produce_tile, false);
    return;
  }

  // ---------------- consumers: S = Q K^T, online softmax, O += P V ----------------
  setmaxnreg_inc<v3_3_consumer_regs(Br)>();
  const int cwg = threadIdx.x / V3_3_WG - 1;
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  constexpr int NS = Bc / 2, NO = HEAD_DIM / 2;  // accumulator values per thread: S (64 x Bc), O (64 x D)
  float acc[NO];

  // Descriptors: Q and K K-major (k16 step kk: panel kk / 4, 32 bytes per step inside the row);
  // this warpgroup's Q rows start cwg * 64 rows into each panel.  V N-major: k16 step ks starts 16 key
  // rows (2048 bytes) further; the next 64 columns of d are the next panel (leading byte offset).
  // FP8 at D = 64: rows of 64 bytes, the 64-byte swizzle (wgmma_desc_sw64); else 128-byte rows.
  constexpr int ROW_BYTES = (FP8 && HEAD_DIM == 64) ? 64 : 128;
  const unsigned long long dq = wgmma_desc_k_major<ROW_BYTES>(s_q + cwg * 64 * ROW_BYTES);
  // This warp's 16 rows of O's stage (v3_6_smem_bytes).
  constexpr bool STAGE_O = v3_3_stages_o(PERSISTENT, sizeof(T), HEAD_DIM);
  const unsigned o_stage = s_q + Q_BYTES + 2 * STAGES * KV_BYTES + 1024 + (cwg * 4 + warp) * O_STAGE_WARP_BYTES<HEAD_DIM>;

  unsigned alibi_a[4];  // ALIBI: the head's slope as the k16 step's A fragment (alibi_slope_fragment)
  // S = Q K_j^T into S (asynchronous: issued, committed, not waited for); n counts the CTA's K/V
  // blocks (the stage).
  auto issue_s = [&](float (&S)[NS], int n) {
    // (The 16-bit path calls wgmma_desc_sw128 itself: through a lambda, ptxas ORed instead of adding
    // the descriptor's bits, one instruction more in v3.3's SASS.)
    const unsigned k_tile = s_k(KVBarriers<STAGES>::stage(n));
    const unsigned long long dk = FP8 ? wgmma_desc_k_major<ROW_BYTES>(k_tile) : wgmma_desc_sw128(k_tile);
    wgmma_fence();
    if constexpr (FP8) {  // k32 steps of 32 bytes
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 32; ++kk)
        WgmmaE4M3::ss(S, dq + (sw128_k_step(kk, Br) >> 4), dk + (sw128_k_step(kk, Bc) >> 4), kk > 0);
    } else {
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
        Wgmma16<T>::ss(S, dq + (sw128_k_step(kk, Br) >> 4), dk + (sw128_k_step(kk, Bc) >> 4), kk > 0);
      // ALIBI: S += slope_s c for key c of the block (bf16 whatever T: the slope's three terms).
      if constexpr (ALIBI) Wgmma16<__nv_bfloat16>::rs(S, alibi_a, wgmma_desc_sw128(s_keys), 1);
    }
    wgmma_commit();
  };
  // acc += P V_j (asynchronous), V read N-major: k16 step ks starts 16 key rows (2048 bytes)
  // further; the next 64 columns of d are the next panel (the leading byte offset).
  // FP8: V^T [d][key] K-major (8-bit wgmma has no N-major form), k32 step ks 32 bytes along its
  // rows of VT_PANEL keys, the next VT_PANEL keys the next panel (D rows further).
  unsigned p[Bc / (FP8 ? 32 : 16)][4];
  auto issue_pv = [&](int n) {
    const unsigned v_tile = s_v(KVBarriers<STAGES>::stage(n));
    const unsigned long long dv = FP8 ? wgmma_desc_k_major<VT_PANEL>(v_tile) : wgmma_desc_sw128(v_tile, Bc * 128);
    fence_operands(acc);
    wgmma_fence();
    if constexpr (FP8) {
#pragma unroll
      for (int ks = 0; ks < Bc / 32; ++ks)
        WgmmaE4M3::rs(acc, p[ks], dv + (k_major_step<VT_PANEL>(ks, HEAD_DIM) >> 4), 1);
    } else {
#pragma unroll
      for (int ks = 0; ks < Bc / 16; ++ks) Wgmma16<T>::rs_bt(acc, p[ks], dv + ((ks * 16 * 128) >> 4), 1);
    }
    wgmma_commit();
  };

  // One tile.  c0: this CTA's K/V blocks before it (the stages and barriers count c0 + n); i: its
  // tiles before it (Q's phase).
  auto consume_tile = [&](const V33Tile& w, const int c0, const int i) {
    const int bh = w.bh, b_ = bh / H, h_ = bh % H, hk_ = h_ / h_per_kv;
    const int q_start = w.q_start, q0 = w.q0, seq_q = w.seq_q, seq_k = w.seq_k, offset = w.offset;
    const int j_lo = w.j_lo, Tc = w.Tc;
    const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
    const int row_a = q_start + cwg * 64 + warp * 16 + g;  // this thread's query rows: row_a, row_a + 8
    // > 0, so max(s S) = s max(S) and the scale folds into one FFMA per score (softmax.cuh).
    // FP8: the scores are S ds_q ds_k (per-(batch, KV head) descale factors); any sign of that
    // product is folded in by negating S (fp8_negate, one uniform branch a block).
    const float* ds = FP8 ? descale + 3 * (b_ * (H / h_per_kv) + hk_) : nullptr;
    const float score_scale = FP8 ? softmax_scale * ds[0] * ds[1] : softmax_scale;
    const bool fp8_negate = FP8 && score_scale < 0.0f;
    const float plain_scale_log2 = folded_scale_log2(FP8 ? fabsf(score_scale) : softmax_scale);
    float m_i[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
    float l_i[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NO; ++i) acc[i] = 0.0f;
    const bool tracer = TILEATTN_TRACE && threadIdx.x % V3_3_WG == 0;
    if (tracer) trace_clock(i, cwg, 0);
    mbar_wait(bars.q, i & 1);  // even with no K/V block: no copy may outlive the CTA
    if (tracer) {
      trace_clock(i, cwg, 1);
      trace_at(i, cwg, 7, Tc);
    }
    // PERSISTENT: Q's buffer is free once this warpgroup's last S (block Tc - 1) is done.
    auto release_q = [&](int n) {
      if (PERSISTENT && n == Tc - 1) mbar_arrive(q_empty);
    };
    if (PERSISTENT && Tc == 0) mbar_arrive(q_empty);  // no S at all

    ScoreVariants var{};
    // ALiBi under the causal mask (every visible key at or left of the row) as one FFMA a score
    // (fragment_alibi_keys) instead of fragment_variants's FADD and FFMA: measured on an H200
    // (scripts/variants_probe.py, bf16 causal N=8192) 0.904x -> 1.045x of plain causal at D=64 and
    // 0.848x -> 0.938x at D=128.
    constexpr bool ALIBI_KEYS = VARIANTS && CAUSAL;
    // (ALIBI: the host passes no window and no softcap, so var holds ALiBi alone; WINDOW: the
    // window alone, its left edge: under the causal mask the diagonal is the right one.)
    if (VARIANTS || ALIBI || WINDOW) {
      var = head_variants<CAUSAL>(softmax_scale, softcap, alibi_slopes, alibi_sb, b_, h_, window_left, window_right);
      var.first_pos = q_start + offset;
      var.last_pos = q_start + Br - 1 + offset;
      var.pos[0] = row_a + offset;
      var.pos[1] = row_a + 8 + offset;
    }
    // The exponent's scale, times c / s with a softcap (its fragments hold tanh alone: mma.cuh).
    const float scale_log2 = VARIANTS ? exp_scale_log2(var, plain_scale_log2) : plain_scale_log2;
    ScoreVariants var_rest = var;  // what fragment_variants applies: all but ALiBi under ALIBI_KEYS
    if (ALIBI_KEYS) var_rest.alibi = false;
    // ALIBI: the tensor core adds slope_s c (key c of the block, alibi_a against the key table);
    // the block's slope_s (kv_start - first row's position) joins the row max as ALIBI_KEYS's
    // offset does, and the row's own position leaves lse at the end (the same correction).
    if constexpr (ALIBI) alibi_slope_fragment(alibi_a, var.slope_s, t);
    // Online softmax of block n's scores, in place (variants, mask, new row max, S = exp2(S * scale - m)).
    float scale_old[2];
    constexpr Rebase REBASE = FP8 ? Rebase::lazy_e4m3 : Rebase::lazy_16bit;
    auto negate_fp8 = [&](float (&S)[NS]) {
      if (fp8_negate) {
#pragma unroll
        for (int i = 0; i < NS; ++i) S[i] = -S[i];
      }
    };
    auto softmax = [&](float (&S)[NS], int n) {
      negate_fp8(S);
      const int kv_start = kv_block(w, n) * Bc;
      if (VARIANTS) fragment_variants(S, var_rest, kv_start, Bc, t);
      if (WINDOW) fragment_window_left(S, var, kv_start, t);
      if constexpr (ALIBI_KEYS || ALIBI) {
        const float alibi_offset = ALIBI ? alibi_block_offset(var, kv_start)
                                   : var.alibi ? fragment_alibi_keys(S, var, kv_start, t)
                                               : 0.0f;
        fragment_online_softmax<CAUSAL, NS, true, REBASE>(S, m_i, l_i, scale_old, scale_log2, kv_start, Bc, q_start,
                                                          row_a, t, seq_k, offset, alibi_offset);
      } else {
        fragment_online_softmax<CAUSAL, NS, false, REBASE>(S, m_i, l_i, scale_old, scale_log2, kv_start, Bc, q_start,
                                                           row_a, t, seq_k, offset);
      }
    };
    // The speculative softmax (above): block n's weights against the running max, from stage c's
    // K; false when the block is masked or the check failed (S then holds the block's scores again).
    // Not in the ping-pong's causal kernel, v3.6 at D = 64, which the dispatch takes for causal
    // calls of fewer than SHORT_CAUSAL_ROWS rows: it ran 0.97-0.99x there, measured at N = 1024.
    // Nor in v3.3 at D = 256 (not the dispatch's: v3.6 is), where its fp16 causal kernel kept 8
    // bytes of stack.
    // (Every test before the vote is uniform over the warpgroup's tile: the vote is a barrier.)
    constexpr bool SPECULATE = !FP8 && (!VARIANTS || TILEATTN_SPEC_VARIANTS || HEAD_DIM == 128) &&
                               !(PINGPONG && CAUSAL) && !(HEAD_DIM == 256 && !PERSISTENT);
    auto speculative_softmax = [&](float (&S)[NS], int n, int c) {
      const int kv_start = kv_block(w, n) * Bc;
      if (block_needs_mask<CAUSAL>(kv_start, Bc, seq_k, q_start, offset)) return false;
      if (WINDOW && window_left_edge(var, kv_start)) return false;
      if (VARIANTS) {
        if (var.alibi || window_edge(var, kv_start, Bc)) return false;
        fragment_variants(S, var_rest, kv_start, Bc, t);  // softcap's tanh: the one variant left here
      }
      // ALIBI: the block's term joins m_i for the exponentials (2^(s (S + offset) - m) = 2^(s S - m')),
      // then m_i comes back.  (In place, not through a copy of m_i: that copy changed the SASS of
      // the four D = 128 causal variants kernels, which speculate without it.)
      float m_kept[2];
      if constexpr (ALIBI) {
        const float alibi_offset = alibi_block_offset(var, kv_start);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m_kept[h] = m_i[h];
          m_i[h] = fmaf(-alibi_offset, scale_log2, m_i[h]);
        }
      }
      float lsum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        S[i] = softmax_weight(S[i], scale_log2, m_i[(i % 4) / 2]);
        lsum[(i % 4) / 2] += S[i];
      }
      if constexpr (ALIBI) m_i[0] = m_kept[0], m_i[1] = m_kept[1];
      const bool ok = lsum[0] <= 32768.0f && lsum[1] <= 32768.0f;
      // The warpgroup's vote (barrier 5 + cwg; 1 + cwg is O's store, 3 + cwg the ping-pong): a
      // failed check re-issues S, a wgmma all four warps must take (a warp's own vote, the first
      // build, hung or faulted the kernel on the first block that one warp failed alone).
      if (named_barrier_all<V3_3_WG>(5 + cwg, ok)) {
        l_i[0] += lsum[0];
        l_i[1] += lsum[1];
        scale_old[0] = scale_old[1] = 1.0f;
        return true;
      }
      issue_s(S, c);  // the block's scores again (the K stage is still this warpgroup's)
      wgmma_wait<0>();
      fence_operands(S);
      return false;
    };
    // P as 16-bit A fragments of P V (k16 step ks = S's n8 tiles 2ks, 2ks + 1: rows g / g + 8 of
    // the even tile are a0 / a1, of the odd tile a2 / a3), and O rebased to the new row max.
    // FP8: k32 step c takes S's n8 tiles 4c .. 4c + 3; register r (rows g / g + 8 as r % 2) holds
    // keys 2t, 2t + 1 of tile 4c + 2 (r / 2) and of the next tile, where the A layout expects keys
    // 4t .. 4t + 3 (16 further for r / 2 = 1): the host permutes V^T's keys to match (v3_5_fp8.cu).
    auto to_p_and_rescale = [&](const float (&S)[NS]) {
      if constexpr (FP8) {
#pragma unroll
        for (int c = 0; c < Bc / 32; ++c)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int i = 16 * c + 8 * (r / 2) + 2 * (r % 2);
            p[c][r] = pack4_e4m3(S[i], S[i + 1], S[i + 4], S[i + 5]);
          }
      } else {
#pragma unroll
        for (int i = 0; i < NS; i += 2) {
          const int n8 = i / 4;
          p[n8 / 2][(n8 % 2) * 2 + (i % 4) / 2] = pack2<T>(S[i], S[i + 1]);
        }
      }
      // O's rescale, skipped (a warp-uniform branch) when no row of the warp was rebased: under the
      // lazy rebase (lazy_rescale_log2(), softmax.cuh) that is most blocks past a row's first.
      if (__any_sync(0xffffffffu, scale_old[0] != 1.0f || scale_old[1] != 1.0f)) {
#pragma unroll
        for (int i = 0; i < NO; ++i) acc[i] *= scale_old[(i % 4) / 2];
      }
    };

    // PINGPONG (v3.4, csrc/v3_4_pingpong.cu): the two consumer warpgroups take turns issuing their
    // MMAs (named barrier 3 + w: warpgroup w's turn).  Each takes Tc + 1 turns (S_0, the Tc - 1
    // loop steps, the last P V); warpgroup 0 goes first, and warpgroup 1's last hand-over, which
    // nobody waits for, is skipped (a barrier must not be left half-arrived).
    auto my_turn = [&] {
      if (PINGPONG) named_barrier_sync<2 * V3_3_WG>(3 + cwg);
    };
    auto your_turn = [&](bool last) {
      if (PINGPONG && !(last && cwg == 1)) named_barrier_arrive<2 * V3_3_WG>(3 + (1 - cwg));
    };
    if (PINGPONG && cwg == 1 && Tc > 0) named_barrier_arrive<2 * V3_3_WG>(3);

    // Intra-warpgroup pipelining: S_{j+1} = Q K_{j+1}^T and P_j V_j are issued together, and the
    // softmax of block j+1 runs on the CUDA cores while the tensor core does P_j V_j.  p and acc
    // belong to the in-flight P V until its wait (fence_operands keeps their registers pinned).
    if (Tc > 0) {
      {
        float S[NS];
        bars.wait_k_full(c0);
        my_turn();
        issue_s(S, c0);
        your_turn(false);
        wgmma_wait<0>();
        fence_operands(S);
        mbar_arrive(bars.k_empty(c0));
        release_q(0);
        softmax(S, 0);
        to_p_and_rescale(S);
        if (tracer) trace_clock(i, cwg, 2);
      }
      for (int j = 0; j + 1 < Tc; ++j) {  // straight-line body: ptxas tracks the two groups
        float S[NS];
        bars.wait_k_full(c0 + j + 1);
        my_turn();
        issue_s(S, c0 + j + 1);
        bars.wait_v_full(c0 + j);
        issue_pv(c0 + j);
        your_turn(false);
        wgmma_wait<1>();  // S_{j+1} done (groups complete in order), P_j V_j may still run
        fence_operands(S);
        // K's stage (and, after the tile's last S, Q's buffer) go back to the producer; the
        // speculative softmax keeps them until its check passed (it may need S again).
        auto release_s = [&] {
          mbar_arrive(bars.k_empty(c0 + j + 1));
          release_q(j + 1);
        };
        if (!SPECULATE) release_s();
        if (!SPECULATE || !speculative_softmax(S, j + 1, c0 + j + 1)) softmax(S, j + 1);
        if (SPECULATE) release_s();
        // Where ptxas puts this wait is a measured choice (scripts/variants_probe.py --define, two
        // runs, bf16 causal N=8192): pinned behind the exponentials, the plain kernel runs 4% faster
        // at D = 64 and 3-4% slower at D = 128; the variants kernel moves within run-to-run noise.
        // v3.4 (PINGPONG) leaves the wait to ptxas: pinned, v3.4 ran 0.98x of v3.3 at causal D=64;
        // unpinned 1.16x (and 1.10x more without a mask), 2026-12-02.  The variants kernels pin it
        // at Br = 192 only (v3_7_variants_fwd; at Br = 128 it moved ALiBi 0.817x -> 0.824x of
        // plain causal and nothing-on 0.962x -> 0.916x, 2026-12-05).
        if constexpr (HEAD_DIM == 64 && !PINGPONG && (!VARIANTS || Br == 192))
          wgmma_wait_all_after(l_i[0] + l_i[1]);
        else
          wgmma_wait<0>();
        fence_operands(acc);
        fence_operands(p);
        mbar_arrive(bars.v_empty(c0 + j));
        to_p_and_rescale(S);
      }
      if (tracer) trace_clock(i, cwg, 3);
      bars.wait_v_full(c0 + Tc - 1);
      if (!FP8 && cu_seqlens_q) {
        // Packed sequences: the last tile's rows past the sequence's keys hold the next sequence's
        // values or whatever the buffer holds past cu_seqlens_k[B] (NaN included); P is 0 there,
        // but 0 x NaN is NaN, so each consumer warpgroup zeroes those rows of every 64-column
        // panel (row r: bytes [r 128, r 128 + 128) of its panel) before its P V reads them.  Only
        // the last tile can reach past the keys; the dense path's copy engine zero-fills instead.
        const int first = seq_k - (j_lo + Tc - 1) * Bc;  // rows first .. Bc - 1 (packed: never REVERSE)
        if (first < Bc) {
          unsigned char* v_tile = smem + (s_v(bars.stage(c0 + Tc - 1)) - s_q);
          for (int i = threadIdx.x % V3_3_WG; i < (HEAD_DIM / 64) * (Bc - first) * 8; i += V3_3_WG) {
            const int panel = i / ((Bc - first) * 8), chunk = i % ((Bc - first) * 8);
            *reinterpret_cast<uint4*>(v_tile + panel * Bc * 128 + first * 128 + chunk * 16) = make_uint4(0, 0, 0, 0);
          }
          fence_proxy_async_smem();  // the generic-proxy stores, before the tensor core's async-proxy reads
          named_barrier_sync<V3_3_WG>(1 + cwg);  // this warpgroup's stores
        }
      }
      my_turn();
      issue_pv(c0 + Tc - 1);
      your_turn(true);
      wgmma_wait<0>();
      fence_operands(acc);
      mbar_arrive(bars.v_empty(c0 + Tc - 1));
      if (tracer) trace_clock(i, cwg, 4);
    }

    if ((ALIBI_KEYS || ALIBI) && var.alibi) {  // the ALiBi offset's row constant, out of lse (O does not see it)
#pragma unroll
      for (int h = 0; h < 2; ++h) m_i[h] -= scale_log2 * var.slope_s * static_cast<float>(var.pos[h] - var.first_pos);
    }
    // Packed sequences: O from row q0, lse (H, total_q) from h_ total_q + q0.
    float* lse_rows = !lse ? nullptr : cu_seqlens_q ? lse + (long long)h_ * Nq + q0 : hs.lse;
    if constexpr (FP8) {  // O in bf16 (o's strides count bf16 elements), times V's descale factor
#pragma unroll
      for (int i = 0; i < NO; ++i) acc[i] *= ds[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) m_i[h] -= fp8_p_offset_log2();  // l_i summed weights lifted by the offset
      __nv_bfloat16* o_bf16 = reinterpret_cast<__nv_bfloat16*>(o) + b_ * o_sb + h_ * o_sh;
      fragment_store_rows<__nv_bfloat16, HEAD_DIM>(acc, m_i, l_i, row_a, t, seq_q, o_bf16, o_sn, lse_rows);
    } else {
      bool staged = false;  // O's map exists for 16-byte aligned O only (o_tma_aligned)
      if constexpr (STAGE_O) {
        if (o_tma_aligned(o, o_sb, o_sh, o_sn)) {
          fragment_store_rows_tma<T, HEAD_DIM>(acc, m_i, l_i, row_a, lane, seq_q, lse_rows, o_stage, &tmaps->desc[3],
                                               q_start + cwg * 64 + warp * 16, h_, b_);
          staged = true;
        }
      }
      if (!staged) fragment_store_rows<T, HEAD_DIM>(acc, m_i, l_i, row_a, t, seq_q, hs.o + q0 * o_sn, o_sn, lse_rows);
    }
    if (tracer) trace_clock(i, cwg, 5);
  };
#undef kv_block
  v3_3_for_my_tiles<PERSISTENT, CAUSAL, sorted_tail_rounds(Br)>(tile_at, Tr * bh_count, w0, consume_tile, true);
  if constexpr (STAGE_O) {  // the last tile's copies read the stage: it must outlive them
    if (lane == 0) bulk_wait_read<0>();
  }
#endif
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1) v3_3_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, false>(TILEATTN_FWD_ARGS, &tmaps);
}

// The same rung with the score variants read from the room fields (window, softcap, ALiBi).
// (With v3.4's ping-pong consumers at D=64 it measured 7% slower, bench/NOTES.md.)
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1)
    v3_3_variants_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, true>(TILEATTN_FWD_ARGS, &tmaps);
}

// Q, 2 stages of K and V, 9 mbarriers (KVBarriers<2>).
TILEATTN_SMEM_BYTES(v3_3_fwd, (Br + 4 * Bc) * HEAD_DIM * 2 + 9 * 8);
TILEATTN_SMEM_BYTES(v3_3_variants_fwd, (Br + 4 * Bc) * HEAD_DIM * 2 + 9 * 8);

}  // namespace tileattn
