// dec_v1: split-KV decoding (FlashDecoding) over a contiguous or paged KV cache, fp16 / bf16 on
// mma.sync — issue 12's decode path.  reference.attention_split_kv is the same loop nest in NumPy
// and reference.merge_partials the merge.
//
// Decode has a handful of query rows per sequence and many keys: one thread block per (batch,
// head) would leave most SMs idle and read each K/V head once per query head.  Here:
//   * the query rows that read one K/V head (h_per_kv query heads x Nq tokens, row qr = head
//     offset * Nq + token) form the M dimension of the MMAs, 16 (Br) rows per block, so a K/V
//     byte is read once per block of 16 such rows (GQA 32:8 at decode: 4 rows, one block);
//     grid.y = (batch, K/V head, row block);
//   * the sequence's keys are cut into num_splits chunks of whole Bc tiles (grid.x); inside a
//     block, each of the four warps takes every fourth tile of the chunk with its own
//     double-buffered cp.async copies and its own online softmax, so no barrier runs in the loop;
//   * the four warps' (m_i, l_i, acc) merge through shared memory into the block's partial (O_c in
//     float32, lse_c), and dec_combine merges the chunks through their lse into O and lse.
// Paged cache: key j of sequence b is row j % page_size of page block_table[b][j / page_size], so
// any page size >= 1 works (the row, not the page, is the unit of every copy).
#include "mma.cuh"
#include "softmax.cuh"

namespace tileattn {

// q (B, Nq, H, D) strided; k_cache, v_cache: contiguous (B, Nk, H_kv, D) with k_sb the batch
// stride, or (block_table non-null) paged (num_pages, page_size, H_kv, D) with k_sb the page
// stride; k_sn, v_sn the row strides.  cache_seqlens (B,) int32: keys in use per sequence (null:
// Nk).  o_part (num_splits, B, H, Nq, D) and lse_part (num_splits, B, H, Nq), float32 contiguous:
// the chunks' partial results, which dec_combine merges into o (B, Nq, H, D) strided and lse
// (B, H, Nq) contiguous (null: not stored).  causal: bottom-right per sequence, token i of Nq sees
// keys j <= i + seqlen - Nq.
#define TILEATTN_DEC_FIELDS(X, SEP)                                                           \
  X(const T* __restrict__, q) SEP X(const T* __restrict__, k_cache) SEP                       \
  X(const T* __restrict__, v_cache) SEP X(T* __restrict__, o) SEP X(float* __restrict__, lse) SEP \
  X(float* __restrict__, o_part) SEP X(float* __restrict__, lse_part) SEP                     \
  X(const int* __restrict__, cache_seqlens) SEP X(const int* __restrict__, block_table) SEP   \
  X(const int, B) SEP X(const int, Nq) SEP X(const int, H) SEP X(const int, h_per_kv) SEP     \
  X(const int, Nk) SEP X(const int, num_splits) SEP X(const int, page_size) SEP               \
  X(const long long, bt_stride) SEP                                                           \
  X(const long long, q_sb) SEP X(const long long, q_sn) SEP X(const long long, q_sh) SEP     \
  X(const long long, k_sb) SEP X(const long long, k_sn) SEP X(const long long, k_sh) SEP     \
  X(const long long, v_sb) SEP X(const long long, v_sn) SEP X(const long long, v_sh) SEP     \
  X(const long long, o_sb) SEP X(const long long, o_sn) SEP X(const long long, o_sh) SEP     \
  X(const float, softmax_scale)

#define TILEATTN_DEC_PARAMS(T) TILEATTN_DEC_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)

constexpr int DEC_WARPS = 4;

// Shared memory: Q (Br x D), then per warp two stages of K and V (Bc x D), all 16-bit; the
// merge at the end reuses the K/V area for each warp's m_i, l_i (Br floats each) and acc
// (Br x D floats).
__host__ __device__ constexpr int dec_v1_kv_bytes(int D, int Bc) { return DEC_WARPS * 4 * Bc * D * 2; }
__host__ __device__ constexpr int dec_v1_merge_bytes(int D, int Br) { return DEC_WARPS * Br * (D + 3) * 4; }
__host__ __device__ constexpr int dec_v1_smem(int D, int Br, int Bc) {
  return Br * D * 2 + (dec_v1_kv_bytes(D, Bc) > dec_v1_merge_bytes(D, Br) ? dec_v1_kv_bytes(D, Bc)
                                                                          : dec_v1_merge_bytes(D, Br));
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
  constexpr int KSTEPS = HEAD_DIM / 16, NT = Bc / 8, DT = HEAD_DIM / 8;
  using QTile = SwizzledTile<Br, HEAD_DIM>;
  using KVTile = SwizzledTile<Bc, HEAD_DIM>;

  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* Qs = smem;
  unsigned char* kv0 = smem + QTile::BYTES;  // warp w, stage s: K at kv0 + (4 w + 2 s) KVTile::BYTES, V after it
  const auto addr = [](const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); };

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  // grid (num_splits, B * H_kv * row_blocks): blockIdx.y = (b, K/V head, block of 16 rows).
  const int rows_per_kv = h_per_kv * Nq, row_blocks = (rows_per_kv + Br - 1) / Br;
  const int per_b = (H / h_per_kv) * row_blocks;
  const int split = blockIdx.x, b = blockIdx.y / per_b;
  const int hk = blockIdx.y % per_b / row_blocks, qr0 = blockIdx.y % row_blocks * Br;
  const int seqlen = cache_seqlens ? cache_seqlens[b] : Nk;

  // This block's chunk of keys: whole Bc tiles, the same number per split.
  const int tiles = (seqlen + Bc - 1) / Bc;
  const int tiles_per_split = (tiles + num_splits - 1) / num_splits;
  const int kv_begin = split * tiles_per_split * Bc;
  const int kv_end = min(seqlen, kv_begin + tiles_per_split * Bc);
  const int my_tiles = kv_end > kv_begin ? ((kv_end - kv_begin + Bc - 1) / Bc - warp + DEC_WARPS - 1) / DEC_WARPS : 0;

  // Row qr of this K/V head's query rows: query head hk h_per_kv + qr / Nq, token qr % Nq.
  const auto q_row = [=](int r) {
    const int qr = qr0 + r;
    return q + b * q_sb + (qr % Nq) * q_sn + (hk * h_per_kv + qr / Nq) * q_sh;
  };
  const auto row_valid = [=](int r) { return qr0 + r < rows_per_kv; };
  gather_rows_async<T, Br, HEAD_DIM, 32 * DEC_WARPS>(Qs, tid, q_row, row_valid);
  cp_async_commit();

  // Key j's row of a cache (contiguous, or through the block table).
  const auto kv_row = [=](const T* cache, long long sb, long long sn, long long sh, int j) {
    if (block_table) {
      const int page = block_table[b * bt_stride + j / page_size];
      return cache + page * sb + (j % page_size) * sn + hk * sh;
    }
    return cache + b * sb + j * sn + hk * sh;
  };
  // This warp's n-th tile (the chunk's tile warp + 4 n) into stage n & 1.
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

  // Q's A fragments: kept in registers for the whole loop up to D=64; above, re-read from shared
  // memory at each k-step (beside acc's D/2 registers they would spill).
  constexpr bool Q_IN_REGS = HEAD_DIM <= 64;
  const auto [q_r, q_c, k_r, k_c, v_r, v_c] = ldsm_lane(lane);
  cp_async_wait<1>();  // Q (this thread's copies)
  __syncthreads();     // (everyone's)
  unsigned q_frag[Q_IN_REGS ? KSTEPS : 1][4];
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) ldmatrix_x4(q_frag[ks], QTile::ldsm_addr(addr(Qs), q_r, q_c, 0, ks));
  }

  // This lane's rows g and g + 8: their token (for the causal bound) and the first key they may
  // not see: token i sees keys j < i + seqlen - Nq + 1 (and j < kv_end: the chunk).
  // (Two scalars, not an array: an indexed pair went to the stack at D=32.)
  const auto stop_of = [=](int qr) { return key_end<CAUSAL>(qr % Nq, kv_end, seqlen - Nq); };
  const int key_stop_lo = stop_of(qr0 + g), key_stop_hi = stop_of(qr0 + g + 8);

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
    const int j0 = kv_begin + (warp + DEC_WARPS * n) * Bc;
    const unsigned K_addr = addr(kv0 + (4 * warp + 2 * (n & 1)) * KVTile::BYTES), V_addr = K_addr + KVTile::BYTES;

    // S = Q K^T (16 x Bc), masked past each row's key_stop.
    float S[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) S[nt][0] = S[nt][1] = S[nt][2] = S[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      unsigned qa[4];
      if constexpr (Q_IN_REGS) {
#pragma unroll
        for (int i = 0; i < 4; ++i) qa[i] = q_frag[ks][i];
      } else {
        ldmatrix_x4(qa, QTile::ldsm_addr(addr(Qs), q_r, q_c, 0, ks));
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned kb[4];
        ldmatrix_x4(kb, KVTile::ldsm_addr(K_addr, k_r, k_c, 16 * np, ks));
        mma_m16n16k16<T>(S[2 * np], S[2 * np + 1], qa, kb);
      }
    }
    float m_blk[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (j0 + 8 * nt + 2 * t + e % 2 >= (e < 2 ? key_stop_lo : key_stop_hi)) S[nt][e] = TILEATTN_NEG_INF;
        m_blk[e / 2] = fmaxf(m_blk[e / 2], S[nt][e]);
      }
    float m_base[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) alpha[h] = online_rescale(m_i[h], l_i[h], lanes_max<4>(m_blk[h]) * scale_log2, m_base[h]);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      acc[dt][0] *= alpha[0];
      acc[dt][1] *= alpha[0];
      acc[dt][2] *= alpha[1];
      acc[dt][3] *= alpha[1];
    }
    unsigned p_frag[Bc / 16][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        S[nt][e] = softmax_weight(S[nt][e], scale_log2, m_base[e / 2]);
        l_i[e / 2] += S[nt][e];
      }
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) pack_a_frag<T>(p_frag[kk], S[2 * kk], S[2 * kk + 1]);
    // acc += P V (rows past kv_end were zero-filled: P = 0 times 0).
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        unsigned vb[4];
        ldmatrix_x4_trans(vb, KVTile::ldsm_addr(V_addr, v_r, v_c, 16 * kk, dp));
        mma_m16n16k16<T>(acc[2 * dp], acc[2 * dp + 1], p_frag[kk], vb);
      }
    __syncwarp();  // every lane is done with this stage before tile n + 2 lands in it
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its K/V stages: the merge area reuses them

  // Merge the four warps: each writes m_i (log2 domain), l_i and its unnormalised acc; one thread
  // per row turns them into each warp's weight 2^(m_w - m) / l and the row's lse; then the
  // block's 128 threads combine the accumulators element by element.
  float* m_s = reinterpret_cast<float*>(kv0);  // [warp][Br]
  float* l_s = m_s + DEC_WARPS * Br;           // [warp][Br]
  float* w_s = l_s + DEC_WARPS * Br;           // [warp][Br]
  float* acc_s = w_s + DEC_WARPS * Br;         // [warp][Br][HEAD_DIM]
  const auto part_row = [=](int qr) {          // (split, b, query head, token) of o_part, lse_part
    return (((long long)split * B + b) * H + hk * h_per_kv + qr / Nq) * Nq + qr % Nq;
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = lanes_sum<4>(l_i[h]);
    if (t == 0) {
      m_s[warp * Br + g + 8 * h] = m_i[h];
      l_s[warp * Br + g + 8 * h] = l;
    }
  }
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_s[(warp * Br + g + 8 * (e / 2)) * HEAD_DIM + 8 * dt + 2 * t + e % 2] = acc[dt][e];
  __syncthreads();
  if (tid < Br) {
    const int r = tid;
    float m = TILEATTN_NEG_INF;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) m = fmaxf(m, m_s[w * Br + r]);
    const float m_base = safe_max(m);
    float f[DEC_WARPS], l = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) {
      f[w] = exp2_ftz(m_s[w * Br + r] - m_base);  // 0 for a warp that saw no key
      l += f[w] * l_s[w * Br + r];
    }
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // a row no warp saw outputs 0
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) w_s[w * Br + r] = f[w] * inv_l;
    constexpr float LN2 = 0.6931471805599453f;
    if (qr0 + r < rows_per_kv) lse_part[part_row(qr0 + r)] = row_lse(m * LN2, l);
  }
  __syncthreads();
  for (int i = tid; i < Br * HEAD_DIM; i += 32 * DEC_WARPS) {
    const int r = i / HEAD_DIM, d = i % HEAD_DIM;
    if (qr0 + r >= rows_per_kv) continue;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) o += w_s[w * Br + r] * acc_s[(w * Br + r) * HEAD_DIM + d];
    o_part[part_row(qr0 + r) * HEAD_DIM + d] = o;
  }
}

// The chunks' merge: one warp per query row (b, h, i), lanes over the head dim.  Weights
// exp(lse_c - max lse); a chunk that saw no key (lse -inf) weighs 0; a row no chunk saw gets
// O = 0 and lse -inf.  Br: rows (warps) per block.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(32 * Br) dec_combine(TILEATTN_DEC_PARAMS(T)) {
  const int row = blockIdx.x * Br + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= B * H * Nq) return;
  const long long split_stride = (long long)B * H * Nq;
  float m = TILEATTN_NEG_INF;
  for (int s = 0; s < num_splits; ++s) m = fmaxf(m, lse_part[s * split_stride + row]);
  const float m_base = safe_max(m);
  float l = 0.0f;
  for (int s = 0; s < num_splits; ++s) l += __expf(lse_part[s * split_stride + row] - m_base);
  const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
  const int i = row % Nq, h = (row / Nq) % H, b = row / (Nq * H);
  T* o_row = o + b * o_sb + i * o_sn + h * o_sh;
  for (int d = lane; d < HEAD_DIM; d += 32) {
    float acc = 0.0f;
    for (int s = 0; s < num_splits; ++s)
      acc += __expf(lse_part[s * split_stride + row] - m_base) * o_part[(s * split_stride + row) * HEAD_DIM + d];
    o_row[d] = static_cast<T>(acc * inv_l);
  }
  if (lse && lane == 0) lse[row] = row_lse(m_base, l);
}

TILEATTN_SMEM_BYTES(dec_v1, dec_v1_smem(HEAD_DIM, Br, Bc));
TILEATTN_SMEM_BYTES(dec_combine, 0);

}  // namespace tileattn
