// dec_v1: split-KV decoding (FlashDecoding) over a contiguous or paged KV cache, fp16 / bf16 on
// mma.sync (sm_80+).  What the decode kernels share (rows, splits, variants, merges) is in
// dec_common.cuh.
//
// Decode has a handful of query rows per sequence and many keys: one thread block per (batch,
// head) would leave most SMs idle and read each K/V head once per query head.  Here the GQA rows
// of a K/V head are the MMA's M (dec_common.cuh), the sequence's keys are cut into num_splits
// chunks of whole Bc tiles (grid.x), and inside a block each of the four warps takes every
// fourth tile of the chunk with its own double-buffered cp.async copies and its own online
// softmax, so no barrier runs in the loop; the four warps' (m_i, l_i, acc) merge into the
// block's partial (O_c in float32, lse_c), and dec_combine merges the chunks through their lse.
// Paged cache: key j of sequence b is row j % page_size of page block_table[b][j / page_size], so
// any page size >= 1 works (the row, not the page, is the unit of every copy).
#include "dec_common.cuh"

namespace tileattn {

constexpr int DEC_WARPS = 4;

// Shared memory: Q (Br x D), then per warp two stages of K and V (Bc x D), all 16-bit; the
// merge at the end reuses the K/V area for each warp's m_i, l_i (Br floats each) and acc
// (Br x D floats).
__host__ __device__ constexpr int dec_v1_kv_bytes(int D, int Bc) { return DEC_WARPS * 4 * Bc * D * 2; }
__host__ __device__ constexpr int dec_v1_smem(int D, int Br, int Bc) {
  return Br * D * 2 + (dec_v1_kv_bytes(D, Bc) > dec_merge_bytes(D, Br, DEC_WARPS) ? dec_v1_kv_bytes(D, Bc)
                                                                          : dec_merge_bytes(D, Br, DEC_WARPS));
}

// Copy ROWS rows of HEAD_DIM 16-bit elements into a swizzled tile, 16 bytes at a time, by the
// LANES threads lane = 0..LANES-1; row_ptr(r) gives a row's global address, rows with
// valid(r) false are zero-filled (their address is not read).
template <typename T, int ROWS, int HEAD_DIM, int LANES, typename RowPtr, typename Valid>
__device__ __forceinline__ void gather_rows_async(unsigned char* tile, int lane, RowPtr row_ptr, Valid valid) {
  using Tile = SwizzledTile<ROWS, HEAD_DIM>;
  constexpr int CHUNKS = HEAD_DIM / 8;
#pragma unroll
  for (int i = lane; i < ROWS * CHUNKS; i += LANES) {
    const int r = i / CHUNKS, c = i % CHUNKS;
    const bool ok = valid(r);
    cp_async_16(tile + Tile::offset(r, c), ok ? row_ptr(r) + c * 8 : row_ptr(0), ok);
  }
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(32 * DEC_WARPS) dec_v1(TILEATTN_DEC_PARAMS(T)) {
  static_assert(sizeof(T) == 2, "dec_v1 takes 16-bit (fp16 / bf16) inputs");
  static_assert(Br == 16, "one m16 row tile per block");
  static_assert(HEAD_DIM % 16 == 0 && Bc % 16 == 0, "whole k-steps of 16");
  constexpr int DT = HEAD_DIM / 8;
  using QTile = SwizzledTile<Br, HEAD_DIM>;
  using KVTile = SwizzledTile<Bc, HEAD_DIM>;

  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* Qs = smem;
  unsigned char* kv0 = smem + QTile::BYTES;  // warp w, stage s: K at kv0 + (4 w + 2 s) KVTile::BYTES, V after it
  const auto addr = [](const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const DecBlock blk = dec_block<Br, Bc, CAUSAL>(cache_seqlens, Nq, H, h_per_kv, Nk, num_splits, window_left,
                                                 window_right);
  const int b = blk.b, hk = blk.hk, qr0 = blk.qr0, kv_begin = blk.kv_begin, kv_end = blk.kv_end;
  const int my_tiles = kv_end > kv_begin ? ((kv_end - kv_begin + Bc - 1) / Bc - warp + DEC_WARPS - 1) / DEC_WARPS : 0;

  // Row qr of this K/V head's query rows: query head hk h_per_kv + qr / Nq, token qr % Nq.
  const auto q_row = [=](int r) {
    const int qr = qr0 + r;
    return q + b * q_sb + (qr % Nq) * q_sn + (hk * h_per_kv + qr / Nq) * q_sh;
  };
  gather_rows_async<T, Br, HEAD_DIM, 32 * DEC_WARPS>(Qs, tid, q_row, [=](int r) { return r < blk.rows; });
  cp_async_commit();

  const auto kv_row = [=](const T* cache, long long sb, long long sn, long long sh, int j) {
    return blk.kv_row(cache, sb, sn, sh, j, block_table, bt_stride, page_size);
  };
  // This warp's n-th tile (the chunk's tile warp + 4 n) into stage n & 1; rows past kv_end are
  // zero-filled (unused cache rows may hold anything, NaN included).
  const auto copy_tile = [=](int n) {
    const int j0 = kv_begin + (warp + DEC_WARPS * n) * Bc;
    unsigned char* Ks = kv0 + (4 * warp + 2 * (n & 1)) * KVTile::BYTES;
    const auto in_range = [=](int r) { return j0 + r < kv_end; };
    gather_rows_async<T, Bc, HEAD_DIM, 32>(Ks, lane, [=](int r) { return kv_row(k_cache, k_sb, k_sn, k_sh, j0 + r); },
                                           in_range);
    gather_rows_async<T, Bc, HEAD_DIM, 32>(Ks + KVTile::BYTES, lane,
                                           [=](int r) { return kv_row(v_cache, v_sb, v_sn, v_sh, j0 + r); }, in_range);
  };
  if (my_tiles > 0) copy_tile(0);
  cp_async_commit();

  const LdsmLane ln = ldsm_lane(lane);  // (a named struct: lambdas cannot capture structured bindings)
  const int q_r = ln.a_r, q_c = ln.a_c, k_r = ln.b_r, k_c = ln.b_c, v_r = ln.bt_r, v_c = ln.bt_c;
  cp_async_wait<1>();  // Q (this thread's copies)
  __syncthreads();     // (everyone's)
  // Q's A fragments: kept in registers for the whole loop up to D=64; above, re-read from shared
  // memory at each k-step (beside acc's D/2 registers they would spill).
  constexpr bool Q_IN_REGS = HEAD_DIM <= 64;
  unsigned q_regs[Q_IN_REGS ? HEAD_DIM / 16 : 1][4];
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int ks = 0; ks < HEAD_DIM / 16; ++ks) ldmatrix_x4(q_regs[ks], QTile::ldsm_addr(addr(Qs), q_r, q_c, 0, ks));
  }
  const auto q_frag = [&](int ks, unsigned (&qa)[4]) {
    if constexpr (Q_IN_REGS) {
#pragma unroll
      for (int i = 0; i < 4; ++i) qa[i] = q_regs[ks][i];
    } else {
      ldmatrix_x4(qa, QTile::ldsm_addr(addr(Qs), q_r, q_c, 0, ks));
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

  for (int n = 0; n < my_tiles; ++n) {
    if (n + 1 < my_tiles) copy_tile(n + 1);  // into the other stage, read last in tile n - 1
    cp_async_commit();
    cp_async_wait<1>();  // tile n (this lane's copies) ...
    __syncwarp();        // ... and the warp's
    const unsigned K_addr = addr(kv0 + (4 * warp + 2 * (n & 1)) * KVTile::BYTES), V_addr = K_addr + KVTile::BYTES;
    dec_tile<T, HEAD_DIM, Bc>(
        acc, m_i, l_i, q_frag, [=](int np, int ks) { return KVTile::ldsm_addr(K_addr, k_r, k_c, 16 * np, ks); },
        [=](int kk, int dp) { return KVTile::ldsm_addr(V_addr, v_r, v_c, 16 * kk, dp); }, rows,
        kv_begin + (warp + DEC_WARPS * n) * Bc, variants, folded_scale(softmax_scale), softcap, scale_log2);
    __syncwarp();  // every lane is done with this stage before tile n + 2 lands in it
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its K/V stages: the merge area reuses them
  const int split = blockIdx.x;
  dec_merge_warps<HEAD_DIM, Br, DEC_WARPS>(reinterpret_cast<float*>(kv0), acc, m_i, l_i, blk.rows,
      TILEATTN_DEC_SINK(blk, split), [] { __syncthreads(); });
}

TILEATTN_SMEM_BYTES(dec_v1, dec_v1_smem(HEAD_DIM, Br, Bc));

}  // namespace tileattn
