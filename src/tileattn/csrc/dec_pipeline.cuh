// The warp-specialised decode pipeline of dec_v2 .. dec_v5 (sm_90+): producer warps copy
// K/V tiles of Bc keys into STAGES shared-memory stages; four consumer warps (their own online
// softmax each, no barrier between them) take Bc / 4 keys of every tile (dec_v2, dec_v3) or whole
// tiles in turn (dec_v4, dec_v5: DecTiles) and release the stage on its `empty` mbarrier; the rows,
// splits, variants and merges are dec_common.cuh's.  The rungs differ in how the producers copy
// (DecCopy) and who consumes a tile (DecTiles).
//
// Row copies (BULK, CP_ASYNC): rows are padded to 2 D + 16 bytes instead of swizzled (a bulk copy
// lands a row as it is): eight consecutive rows then start 16 bytes apart modulo 128, so every
// ldmatrix phase hits eight distinct bank groups.  Rows of a partial last tile are copies of the
// chunk's last key (finite data, masked to P = 0), so every stage's copy is the same size and
// nothing is zero-filled.  Tensor copies (TMA): a stage holds K and V as SwizzledTiles (mma.cuh;
// 64-column panels, the copy engine's 128-byte swizzle), 1024-byte aligned; rows past the
// sequence's last key are zeroed in shared memory by the consumer that takes the tile.
#pragma once

#include "dec_common.cuh"

namespace tileattn {

constexpr int DEC_CONSUMERS = 4;  // warps 0..3 compute; the warps after them copy

// Shared memory: the stages' mbarriers (full[STAGES], empty[STAGES]; 16 STAGES bytes rounded up
// to 64), Q (Br padded rows), then STAGES x (K, V) of Bc padded rows.  Shared tiles (dec_v2,
// dec_v3): as many stages as fit in ~104 KB (two blocks per SM up to D=128), 2 to 4.  Warp tiles
// (dec_v4): as many small stages as fit in ~200 KB (one block per SM), a multiple of 4 (each
// consumer warp owns a quarter of them), 4 to 32.  The warps' merge reuses the stage area.
// Swizzled (TMA) stages: rows of exactly 2 D bytes, the stage area 1024-byte aligned (the copy
// engine's 128-byte swizzle repeats every 8 rows of 128 bytes: SwizzledTile's pattern holds for
// tiles at multiples of 1024).
__host__ __device__ constexpr int dec_pipe_pitch(int D) { return 2 * D + 16; }
__host__ __device__ constexpr int dec_pipe_stage_bytes(int D, int Bc, bool swizzled = false) {
  return 2 * Bc * (swizzled ? 2 * D : dec_pipe_pitch(D));
}
__host__ __device__ constexpr int dec_pipe_stages(int D, int Bc, bool warp_tiles = false, bool swizzled = false) {
  return warp_tiles ? clamp_int(200 * 1024 / dec_pipe_stage_bytes(D, Bc, swizzled) / 4 * 4, 4, 32)
                    : clamp_int((D <= 128 ? 104 : 200) * 1024 / dec_pipe_stage_bytes(D, Bc), 2, 4);
}
__host__ __device__ constexpr int dec_pipe_bar_bytes(int stages) { return (16 * stages + 63) / 64 * 64; }
__host__ __device__ constexpr int dec_pipe_stages_offset(int D, int Br, int stages, bool swizzled) {
  return swizzled ? (dec_pipe_bar_bytes(stages) + Br * dec_pipe_pitch(D) + 1023) / 1024 * 1024
                  : dec_pipe_bar_bytes(stages) + Br * dec_pipe_pitch(D);
}
__host__ __device__ constexpr int dec_pipe_smem(int D, int Br, int Bc, bool warp_tiles = false, bool swizzled = false) {
  return dec_pipe_stages_offset(D, Br, dec_pipe_stages(D, Bc, warp_tiles, swizzled), swizzled) +
         dec_pipe_stages(D, Bc, warp_tiles, swizzled) * dec_pipe_stage_bytes(D, Bc, swizzled);
}

// How the producer warps move a tile's rows.  BULK: one cp.async.bulk per row from one lane,
// counted on the stage's full mbarrier by bytes (one arrival, with the byte count).  CP_ASYNC:
// 16 bytes per cp.async from every producer thread, each thread's copies arriving on the full
// mbarrier when they land (cp.async.mbarrier.arrive.noinc: 32 x PRODUCERS arrivals).  TMA: lane 0
// of each producer warp issues tensor copies per 64-column panel of K and of V for its share of
// the tiles (through the kernel's TmaMaps: K at map 1, V at map 2, as (batch or page, K/V head,
// row, column)), counted on the full mbarrier by bytes (one arrival with the tile's byte count).
// The copies are whole boxes of rows of one batch or one page: the host picks TMA for contiguous
// caches, pages of a multiple of Bc rows (tiles start at multiples of Bc: dec_block's ALIGN) and
// pages of a multiple of 8 rows that divide Bc (one copy per page).
enum class DecCopy { BULK, CP_ASYNC, TMA };

// Who consumes a tile.  SHARED (dec_v2, dec_v3): all four consumer warps, Bc / 4 keys each, and
// the stage is free once all four release it.  WARP (dec_v4, dec_v5): one warp takes the whole tile
// (tile n: warp n % 4) into stages of its own (a quarter of them, in turn), so a stage waits for
// one warp only and is small (dec_v4: 32 keys): many stages are in flight at once, and a consumer
// waits only for its own tile's copies, never for the slowest of a large tile's.  Each stage
// passes through its tiles in order, consumed by one warp, so the parity waits stay sound: a
// barrier is never more than one phase past the tile its consumer waits for.
enum class DecTiles { SHARED, WARP };

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, DecCopy COPY, int PRODUCERS,
          DecTiles TILES = DecTiles::SHARED>
__device__ __forceinline__ void dec_pipeline(TILEATTN_DEC_PARAMS(T), const TmaMaps* tmaps = nullptr) {
  constexpr bool WARP_TILES = TILES == DecTiles::WARP, SWIZZLED = COPY == DecCopy::TMA;
  using Tile = SwizzledTile<Bc, HEAD_DIM>;  // one stage's K (and then V) when SWIZZLED
  static_assert(sizeof(T) == 2, "16-bit (fp16 / bf16) inputs");
  static_assert(Br == 16, "one m16 row tile per block");
  static_assert(HEAD_DIM % 16 == 0 && Bc % (16 * (WARP_TILES ? 1 : DEC_CONSUMERS)) == 0, "whole k-steps of 16 per warp");
  static_assert(!SWIZZLED || (HEAD_DIM % 64 == 0 && Bc % 8 == 0), "TMA: whole 64-column panels, 8-row swizzle");
  static_assert(!SWIZZLED || (WARP_TILES && DEC_CONSUMERS % PRODUCERS == 0), "TMA: each producer a whole warp's tiles");
  constexpr int STAGES = dec_pipe_stages(HEAD_DIM, Bc, WARP_TILES, SWIZZLED), PITCH = dec_pipe_pitch(HEAD_DIM);
  constexpr int STAGE_BYTES = dec_pipe_stage_bytes(HEAD_DIM, Bc, SWIZZLED);
  constexpr int KEYS = WARP_TILES ? Bc : Bc / DEC_CONSUMERS, DT = HEAD_DIM / 8;
  static_assert(STAGES * STAGE_BYTES >= dec_merge_bytes(HEAD_DIM, Br, DEC_CONSUMERS),
                "the merge reuses the stages");
  static_assert(!WARP_TILES || STAGES % DEC_CONSUMERS == 0, "each consumer warp owns STAGES / 4 stages");
  static_assert(dec_pipe_smem(HEAD_DIM, Br, Bc, WARP_TILES, SWIZZLED) <= 227 * 1024,
                "a tile this large leaves too few stages");
  // Tile n's stage and its use number there (the parity of the barriers' phase).
  constexpr int RING = WARP_TILES ? STAGES / DEC_CONSUMERS : STAGES;  // the stages one tile sequence cycles through
  const auto stage_of = [](int n) {
    return WARP_TILES ? n % DEC_CONSUMERS * RING + n / DEC_CONSUMERS % RING : n % STAGES;
  };
  const auto use_of = [](int n) { return WARP_TILES ? n / DEC_CONSUMERS / RING : n / STAGES; };

  extern __shared__ __align__(1024) unsigned char smem[];
  const auto addr = [](const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); };
  const unsigned bars = addr(smem);
  const auto full = [=](int s) { return bars + 8 * s; };
  const auto empty = [=](int s) { return bars + 8 * (STAGES + s); };
  unsigned char* Qs = smem + dec_pipe_bar_bytes(STAGES);
  // stage s: K rows at stages + s * STAGE_BYTES, V rows after them
  unsigned char* stages = smem + dec_pipe_stages_offset(HEAD_DIM, Br, STAGES, SWIZZLED);
  const unsigned stages_addr = addr(stages);
  const auto K_at = [=](int s) { return stages_addr + s * STAGE_BYTES; };
  constexpr int V_OFFSET = SWIZZLED ? Tile::BYTES : Bc * PITCH;  // V's rows after K's in a stage

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const DecBlock blk = dec_block<Br, Bc, CAUSAL, SWIZZLED>(cache_seqlens, Nq, H, h_per_kv, Nk, num_splits,
                                                           window_left, window_right);
  const int b = blk.b, hk = blk.hk, qr0 = blk.qr0, kv_begin = blk.kv_begin, kv_end = blk.kv_end;
  const int tiles = kv_end > kv_begin ? (kv_end - kv_begin + Bc - 1) / Bc : 0;

  // Q by the consumers, 16 bytes a thread (zeros for rows past the block's); the barriers, thread
  // 0.  The producers start once the barriers exist, without waiting for Q's copies.
  for (int i = tid; i < (warp < DEC_CONSUMERS ? Br * HEAD_DIM / 8 : 0); i += 32 * DEC_CONSUMERS) {
    const int r = i / (HEAD_DIM / 8), c = i % (HEAD_DIM / 8), qr = qr0 + r;
    const bool ok = r < blk.rows;
    const T* src = q + b * q_sb + (ok ? (qr % Nq) * q_sn + (hk * h_per_kv + qr / Nq) * q_sh + c * 8 : 0);
    cp_async_16(Qs + r * PITCH + c * 16, src, ok);
  }
  cp_async_commit();
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full(s), COPY == DecCopy::CP_ASYNC ? 32 * PRODUCERS : 1);
      mbar_init(empty(s), WARP_TILES ? 1 : DEC_CONSUMERS);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (warp >= DEC_CONSUMERS && SWIZZLED) {  // the producers: lane 0 of each issues tensor copies
    if (lane != 0) return;
    // Producer pw fills tiles pw, pw + PRODUCERS, ... (with four, the tiles of consumer warp pw):
    // one thread's integer work per copy is what limits the copy issue (below), so each
    // producer warp's thread issues its own share in parallel with the others.
    const int pw = warp - DEC_CONSUMERS;
    // A tile is Bc / R copies of R rows per 64-column panel: R = Bc for a contiguous cache and
    // pages of a multiple of Bc (the tile inside one page: tiles start at multiples of Bc), else
    // R = page_size (a divisor of Bc, a multiple of 8 rows: each copy one whole page, landing at
    // a multiple of 1024 bytes in the panel, where the swizzle pattern restarts).  The host's
    // maps have boxes of R rows.
    const int R = block_table && page_size < Bc ? page_size : Bc, per_tile = Bc / R;
    const int copies = (tiles > pw ? (tiles - pw + PRODUCERS - 1) / PRODUCERS : 0) * per_tile;
    // A walk over this producer's copies: the block-table index (paged) and the row in the page,
    // or the row in the batch, advanced by R a copy and past the other producers' tiles at each
    // tile's end, never dividing by the runtime page size in the loop (with a division or two
    // per copy, 16-row tiles of paged caches ran at 2.1-3.1 TB/s against 4.1 contiguous, H200).
    struct Walk {
      int idx, row, k;  // k: the copy's part of its tile
    };
    const int first = kv_begin + pw * Bc;
    const auto step = [=](Walk& w) {
      w.row += R;
      if (++w.k == per_tile) w.k = 0, w.row += (PRODUCERS - 1) * Bc;
      if (block_table)
        while (w.row >= page_size) w.row -= page_size, ++w.idx;
    };
    // Copy u's batch (contiguous) or page, looked up AHEAD copies early, the next group's loads
    // in flight while this group's copies are issued.
    constexpr int AHEAD = 8;
    Walk look{block_table ? first / page_size : 0, block_table ? first % page_size : first, 0};
    const auto look_up = [&](int u) {  // u = 0, 1, 2, ... in turn
      if (!block_table || u >= copies) return b;
      const int page = block_table[b * bt_stride + look.idx];
      step(look);
      return page;
    };
    int cur[AHEAD], nxt[AHEAD];
#pragma unroll
    for (int i = 0; i < AHEAD; ++i) cur[i] = look_up(i);
    Walk at{0, block_table ? first % page_size : first, 0};
    int n = pw;  // the copy's tile
    for (int u0 = 0; u0 < copies; u0 += AHEAD) {
#pragma unroll
      for (int i = 0; i < AHEAD; ++i) nxt[i] = look_up(u0 + AHEAD + i);
#pragma unroll
      for (int i = 0; i < AHEAD; ++i) {
        if (u0 + i >= copies) break;
        const int s = stage_of(n);
        if (at.k == 0) {
          if (use_of(n) > 0) mbar_wait(empty(s), (use_of(n) + 1) & 1);  // its release number use_of(n) - 1
          mbar_arrive_expect_tx(full(s), 2 * Tile::BYTES);               // the whole tile, K and V
        }
#pragma unroll
        for (int p = 0; p < HEAD_DIM / 64; ++p) {
          const unsigned dst = K_at(s) + p * Bc * 128 + at.k * R * 128;
          tma_load_4d(dst, tmaps->desc[1], 64 * p, at.row, hk, cur[i], full(s));
          tma_load_4d(dst + V_OFFSET, tmaps->desc[2], 64 * p, at.row, hk, cur[i], full(s));
        }
        if (at.k == per_tile - 1) n += PRODUCERS;
        step(at);
      }
#pragma unroll
      for (int i = 0; i < AHEAD; ++i) cur[i] = nxt[i];
    }
    return;
  }
  if (warp >= DEC_CONSUMERS) {  // the producer warps
    const int ptid = tid - 32 * DEC_CONSUMERS;
    const auto kv_row = [=](const T* cache, long long sb, long long sn, long long sh, int j) {
      return blk.kv_row(cache, sb, sn, sh, j, block_table, bt_stride, page_size);
    };
    // Each thread copies ROWS rows (BULK: whole rows; CP_ASYNC: its 16-byte chunk column of them).
    constexpr int CHUNKS = COPY == DecCopy::BULK ? 1 : HEAD_DIM / 8;      // pieces per row
    constexpr int ROW_STEP = 32 * PRODUCERS / CHUNKS;                     // rows the threads cover at once
    constexpr int ROWS = (Bc + ROW_STEP - 1) / ROW_STEP;
    static_assert(COPY == DecCopy::BULK || (32 * PRODUCERS) % CHUNKS == 0, "whole rows per pass");
    const int row0 = ptid / CHUNKS, chunk = ptid % CHUNKS;
    for (int n = 0; n < tiles; ++n) {
      const int s = stage_of(n), j0 = kv_begin + n * Bc;
      // Source rows first: the block table's reads overlap the wait for the stage.
      const T* k_src[ROWS];
      const T* v_src[ROWS];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        const int j = min(j0 + row0 + ROW_STEP * i, kv_end - 1);  // past kv_end: the last key again
        k_src[i] = kv_row(k_cache, k_sb, k_sn, k_sh, j) + chunk * 8;
        v_src[i] = kv_row(v_cache, v_sb, v_sn, v_sh, j) + chunk * 8;
      }
      if (use_of(n) > 0) mbar_wait(empty(s), (use_of(n) + 1) & 1);  // its release number use_of(n) - 1
      if constexpr (COPY == DecCopy::BULK) {
        if (ptid == 0) mbar_arrive_expect_tx(full(s), 2 * Bc * HEAD_DIM * 2);
        __syncwarp();
      }
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        const int r = row0 + ROW_STEP * i;
        if (r < Bc) {
          const unsigned k_dst = K_at(s) + r * PITCH + chunk * 16, v_dst = k_dst + V_OFFSET;
          if constexpr (COPY == DecCopy::BULK) {
            bulk_load(k_dst, k_src[i], HEAD_DIM * 2, full(s));
            bulk_load(v_dst, v_src[i], HEAD_DIM * 2, full(s));
          } else {
            cp_async_16_to(k_dst, k_src[i]);
            cp_async_16_to(v_dst, v_src[i]);
          }
        }
      }
      if constexpr (COPY == DecCopy::CP_ASYNC) cp_async_mbar_arrive(full(s));
    }
    return;
  }

  // Consumers: warp w takes keys w KEYS .. (w + 1) KEYS - 1 of every tile (SHARED), or tiles
  // w, w + 4, w + 8, ... whole (WARP).  First Q, every consumer's copies.
  const auto consumers_sync = [] { named_barrier_sync<32 * DEC_CONSUMERS>(1); };
  cp_async_wait<0>();
  consumers_sync();
  const LdsmLane ln = ldsm_lane(lane);  // (a named struct: lambdas cannot capture structured bindings)
  const int q_r = ln.a_r, q_c = ln.a_c, k_r = ln.b_r, k_c = ln.b_c, v_r = ln.bt_r, v_c = ln.bt_c;
  const unsigned Q_addr = addr(Qs);
  constexpr bool Q_IN_REGS = HEAD_DIM <= 64;  // as dec_v1: above, acc's registers need the room
  unsigned q_regs[Q_IN_REGS ? HEAD_DIM / 16 : 1][4];
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) ldmatrix_x4(q_regs[ks], Q_addr + q_r * PITCH + (2 * ks + q_c) * 16);
  }
  const auto q_frag = [&](int ks, unsigned (&qa)[4]) {
    if constexpr (Q_IN_REGS) {
#pragma unroll
      for (int i = 0; i < 4; ++i) qa[i] = q_regs[ks][i];
    } else {
      ldmatrix_x4(qa, Q_addr + q_r * PITCH + (2 * ks + q_c) * 16);
    }
  };
  const DecRows rows = dec_rows<CAUSAL>(blk, lane / 4, Nq, h_per_kv, window_left, window_right, alibi_slopes,
                                        alibi_sb, folded_scale(softmax_scale));
  const bool variants = softcap > 0.0f || alibi_slopes;

  float acc[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
  float m_i[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF}, l_i[2] = {0.0f, 0.0f};
  const float scale_log2 = folded_scale_log2(softmax_scale);
  const int key0 = WARP_TILES ? 0 : warp * KEYS;

  for (int n = WARP_TILES ? warp : 0; n < tiles; n += WARP_TILES ? DEC_CONSUMERS : 1) {
    const int s = stage_of(n), j0 = kv_begin + n * Bc;
    mbar_wait(full(s), use_of(n) & 1);
    if constexpr (SWIZZLED) {
      // The tile's rows past the sequence's last key hold whatever the cache holds there (NaN
      // in an unused page, say), and 0 x NaN would reach O through P V: zero them (whole rows,
      // so the swizzle does not matter).  Only a sequence's last tile has such rows.
      const int valid = blk.seqlen - j0;
      if (valid < Bc) {
        for (int i = lane; i < 2 * (Bc - valid) * (HEAD_DIM / 8); i += 32) {
          const int kv = i / ((Bc - valid) * (HEAD_DIM / 8)), rest = i % ((Bc - valid) * (HEAD_DIM / 8));
          const int r = valid + rest / (HEAD_DIM / 8), c = rest % (HEAD_DIM / 8);
          st_shared_zero16(K_at(s) + kv * V_OFFSET + Tile::offset(r, c));
        }
        __syncwarp();
      }
      const unsigned K_addr = K_at(s), V_addr = K_at(s) + V_OFFSET;
      dec_tile<T, HEAD_DIM, KEYS>(
          acc, m_i, l_i, q_frag, [=](int np, int ks) { return K_addr + Tile::ldsm_offset(k_r, k_c, 16 * np, ks); },
          [=](int kk, int dp) { return V_addr + Tile::ldsm_offset(v_r, v_c, 16 * kk, dp); }, rows, j0, variants,
          folded_scale(softmax_scale), softcap, scale_log2);
      // Those zeros were generic-proxy writes; the stage's next tensor copy is an async-proxy
      // write of the same bytes, so order them first.
      if (valid < Bc) fence_proxy_async_smem();
    } else {
      const unsigned K_addr = K_at(s) + key0 * PITCH, V_addr = K_at(s) + (Bc + key0) * PITCH;
      dec_tile<T, HEAD_DIM, KEYS>(
          acc, m_i, l_i, q_frag,
          [=](int np, int ks) { return K_addr + (16 * np + k_r) * PITCH + (2 * ks + k_c) * 16; },
          [=](int kk, int dp) { return V_addr + (16 * kk + v_r) * PITCH + (2 * dp + v_c) * 16; }, rows, j0 + key0,
          variants, folded_scale(softmax_scale), softcap, scale_log2);
    }
    __syncwarp();  // the warp's reads of stage s are done ...
    if (lane == 0) mbar_arrive(empty(s));  // ... so the producer may refill it
  }

  // Every tile was waited for by a consumer, so every copy has landed: the stages are free.
  consumers_sync();
  const int split = blockIdx.x;
  dec_merge_warps<HEAD_DIM, Br, DEC_CONSUMERS>(reinterpret_cast<float*>(stages), acc, m_i, l_i, blk.rows,
      TILEATTN_DEC_SINK(blk, split), consumers_sync);
}

}  // namespace tileattn
