// What the split-KV decode kernels share (dec_v1_splitkv.cu on mma.sync everywhere,
// dec_v2_bulk.cu on Hopper's bulk copies): the parameter list, the score variants (softcap,
// ALiBi, sliding window), the merge of a block's warps into one partial result per split, and
// dec_combine, which merges the splits through their lse.  reference.attention_split_kv is the
// same loop nest in NumPy and reference.merge_partials the merge.
//
// Rows: the query rows that read one K/V head (h_per_kv query heads x Nq tokens, row
// qr = head offset * Nq + token) form the M dimension of the MMAs, 16 (Br) rows per block, so a
// K/V byte is read once per block of 16 such rows (GQA 32:8 at decode: 4 rows, one block);
// grid.y = (batch, K/V head, row block), grid.x = the splits of the sequence's keys.
#pragma once

#include "mma.cuh"

namespace tileattn {

// q (B, Nq, H, D) strided; k_cache, v_cache: contiguous (B, Nk, H_kv, D) with k_sb the batch
// stride, or (block_table non-null) paged (num_pages, page_size, H_kv, D) with k_sb the page
// stride; k_sn, v_sn the row strides.  cache_seqlens (B,) int32: keys in use per sequence (null:
// Nk).  o_part (num_splits, B, H, Nq, D) and lse_part (num_splits, B, H, Nq), float32 contiguous:
// the chunks' partial results, which dec_combine merges into o (B, Nq, H, D) strided and lse
// (B, H, Nq) contiguous (null: not stored); with one split the decode kernel writes o and lse
// itself (DecSink) and o_part, lse_part are unused.  Token i of Nq sits at key position
// i + seqlen - Nq (bottom-right, per sequence); causal: it sees keys j <= that position.
// window_left / window_right (-1: unbounded) keep keys j in [pos - left, pos + right];
// softcap > 0 replaces each scaled score s by softcap tanh(s / softcap); alibi_slopes (null: off)
// adds -slope |pos - j| to the scaled score, slope = alibi_slopes[b alibi_sb + h] (alibi_sb 0 for
// one slope per head).
#define TILEATTN_DEC_FIELDS(X, SEP)                                                           \
  X(const T* __restrict__, q) SEP X(const T* __restrict__, k_cache) SEP                       \
  X(const T* __restrict__, v_cache) SEP X(T* __restrict__, o) SEP X(float* __restrict__, lse) SEP \
  X(float* __restrict__, o_part) SEP X(float* __restrict__, lse_part) SEP                     \
  X(const int* __restrict__, cache_seqlens) SEP X(const int* __restrict__, block_table) SEP   \
  X(const float* __restrict__, alibi_slopes) SEP                                              \
  X(const int, B) SEP X(const int, Nq) SEP X(const int, H) SEP X(const int, h_per_kv) SEP     \
  X(const int, Nk) SEP X(const int, num_splits) SEP X(const int, page_size) SEP               \
  X(const int, window_left) SEP X(const int, window_right) SEP                                \
  X(const long long, bt_stride) SEP X(const long long, alibi_sb) SEP                          \
  X(const long long, q_sb) SEP X(const long long, q_sn) SEP X(const long long, q_sh) SEP     \
  X(const long long, k_sb) SEP X(const long long, k_sn) SEP X(const long long, k_sh) SEP     \
  X(const long long, v_sb) SEP X(const long long, v_sn) SEP X(const long long, v_sh) SEP     \
  X(const long long, o_sb) SEP X(const long long, o_sn) SEP X(const long long, o_sh) SEP     \
  X(const float, softmax_scale) SEP X(const float, softcap)

#define TILEATTN_DEC_PARAMS(T) TILEATTN_DEC_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)
#define TILEATTN_DEC_ARGS TILEATTN_DEC_FIELDS(TILEATTN_NAME_, TILEATTN_COMMA_)

// Where one block works: batch b, K/V head hk, query rows qr0 .. qr0 + Br - 1 of that head, and
// its split's keys [kv_begin, kv_end), whole Bc tiles, the same number per split, inside the
// keys some row of the block may see (causal and window bounds: blocks outside are skipped, not
// masked).  ALIGN: the first tile starts at a multiple of Bc (the keys before the window's first
// are masked), so that tensor copies of Bc rows never straddle a page (dec_pipeline.cuh's TMA).
struct DecBlock {
  int b, hk, qr0, rows, seqlen, kv_begin, kv_end;
  // Key j's row of a cache: contiguous (batch b), or row j % page_size of page
  // block_table[b][j / page_size] when block_table is non-null.
  template <typename T>
  __device__ __forceinline__ const T* kv_row(const T* cache, long long sb, long long sn, long long sh, int j,
                                             const int* block_table, long long bt_stride, int page_size) const {
    if (block_table) {
      const int page = block_table[b * bt_stride + j / page_size];
      return cache + page * sb + (j % page_size) * sn + hk * sh;
    }
    return cache + b * sb + j * sn + hk * sh;
  }
  // Local row r's (split, b, query head, token) index in o_part / lse_part.
  __device__ __forceinline__ long long part_row(int r, int split, int B, int H, int h_per_kv, int Nq) const {
    const int qr = qr0 + r;
    return (((long long)split * B + b) * H + hk * h_per_kv + qr / Nq) * Nq + qr % Nq;
  }
};
__host__ __device__ constexpr int clamp_int(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }
template <int Br, int Bc, bool CAUSAL, bool ALIGN = false>
__device__ __forceinline__ DecBlock dec_block(const int* cache_seqlens, int Nq, int H, int h_per_kv, int Nk,
                                              int num_splits, int window_left, int window_right) {
  DecBlock blk;
  const int rows_per_kv = h_per_kv * Nq, row_blocks = (rows_per_kv + Br - 1) / Br;
  const int per_b = (H / h_per_kv) * row_blocks;
  blk.b = blockIdx.y / per_b;
  blk.hk = blockIdx.y % per_b / row_blocks;
  blk.qr0 = blockIdx.y % row_blocks * Br;
  blk.rows = min(Br, rows_per_kv - blk.qr0);
  blk.seqlen = cache_seqlens ? cache_seqlens[blk.b] : Nk;
  // The block's tokens: rows qr0 .. qr0 + rows - 1 are tokens qr % Nq, all of them once the
  // block spans Nq rows or wraps from one head to the next.
  const int t0 = blk.qr0 % Nq, t1 = t0 + blk.rows - 1;
  const int tok_lo = t1 < Nq ? t0 : 0, tok_hi = t1 < Nq ? t1 : Nq - 1;
  const int off = blk.seqlen - Nq;
  int lo = 0, hi = blk.seqlen;
  if (window_left >= 0) lo = max(0, tok_lo + off - window_left);
  if (ALIGN) lo = lo / Bc * Bc;
  if (CAUSAL) hi = min(hi, max(0, tok_hi + off + 1));
  if (window_right >= 0) hi = min(hi, max(0, tok_hi + off + window_right + 1));
  const int tiles = hi > lo ? (hi - lo + Bc - 1) / Bc : 0;
  const int tiles_per_split = (tiles + num_splits - 1) / num_splits;
  blk.kv_begin = lo + blockIdx.x * tiles_per_split * Bc;
  blk.kv_end = min(hi, blk.kv_begin + tiles_per_split * Bc);
  return blk;
}

// The keys [key_lo, key_hi) one row may see: its causal and window bounds inside the chunk.
template <bool CAUSAL>
__device__ __forceinline__ int2 dec_row_keys(int pos, int kv_begin, int kv_end, int window_left, int window_right) {
  int lo = kv_begin, hi = key_end<CAUSAL>(pos, kv_end, 0);
  if (window_left >= 0) lo = max(lo, pos - window_left);
  if (window_right >= 0) hi = min(hi, max(0, pos + window_right + 1));
  return make_int2(lo, hi);
}

// One raw score S = q.k of a row at key position pos against key j, turned into the raw-score
// domain the folded exponent expects (softmax.cuh: the kernels compute 2^(S scale log2e - m)):
// with softcap, S becomes softcap tanh(S scale / softcap) / scale; with ALiBi, minus
// slope |pos - j| / scale.  Both divide by scale > 0 (api passes a negative scale as -q).
__device__ __forceinline__ float dec_score(float S, float scale, float softcap, float slope_over_scale, int pos,
                                           int j) {
  if (softcap > 0.0f) S = softcap / scale * tanhf(S * scale / softcap);
  return S - slope_over_scale * fabsf(static_cast<float>(pos - j));
}

// This lane's two rows of the block (g and g + 8 of an m16 fragment): their key positions, the
// keys each may see inside the chunk, and their ALiBi slopes over the scale (0: off).
struct DecRows {
  int pos[2];
  int2 keys[2];
  float slope[2];
};
template <bool CAUSAL>
__device__ __forceinline__ DecRows dec_rows(const DecBlock& blk, int g, int Nq, int h_per_kv, int window_left,
                                            int window_right, const float* alibi_slopes, long long alibi_sb,
                                            float softmax_scale) {
  DecRows r;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qr = blk.qr0 + g + 8 * h;
    r.pos[h] = qr % Nq + blk.seqlen - Nq;
    r.keys[h] = dec_row_keys<CAUSAL>(r.pos[h], blk.kv_begin, blk.kv_end, window_left, window_right);
    const int head = blk.hk * h_per_kv + qr / Nq;
    r.slope[h] = alibi_slopes && g + 8 * h < blk.rows ? alibi_slopes[blk.b * alibi_sb + head] / softmax_scale : 0.0f;
    // (softmax_scale here is folded_scale(): the scale the folded exponent really uses.)
  }
  return r;
}

// A 16 x 8 NT score fragment whose column 0 is key j0, in place: the variants (softcap, ALiBi;
// `variants` false skips both), then -inf outside each row's keys.
template <int NT>
__device__ __forceinline__ void dec_mask_scores(float (&S)[NT][4], const DecRows& rows, int j0, int t, bool variants,
                                                float softmax_scale, float softcap) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + 8 * nt + 2 * t + e % 2, h = e / 2;
      if (variants) S[nt][e] = dec_score(S[nt][e], softmax_scale, softcap, rows.slope[h], rows.pos[h], j);
      if (j < rows.keys[h].x || j >= rows.keys[h].y) S[nt][e] = TILEATTN_NEG_INF;
    }
}

// One warp's step over KEYS keys (column 0: key j0) for its 16 rows: S = Q K^T, the variants and
// masks, the online softmax (m_i in the log2 domain, l_i this lane's partial sums), acc += P V.
// The operands come from shared memory in the kernel's own layout, as ldmatrix row addresses:
// q_frag(ks, qa) fills Q's A fragment of k-step ks; k_addr(np, ks): K rows 16 np.. as the B
// operand (two n8 tiles); v_addr(kk, dp): V rows 16 kk.., columns 16 dp.. for ldmatrix.trans.
template <typename T, int HEAD_DIM, int KEYS, typename QFrag, typename KAddr, typename VAddr>
__device__ __forceinline__ void dec_tile(float (&acc)[HEAD_DIM / 8][4], float (&m_i)[2], float (&l_i)[2],
                                         QFrag q_frag, KAddr k_addr, VAddr v_addr, const DecRows& rows, int j0,
                                         bool variants, float softmax_scale, float softcap, float scale_log2) {
  constexpr int KSTEPS = HEAD_DIM / 16, NT = KEYS / 8, DT = HEAD_DIM / 8;
  const int t = threadIdx.x % 4;
  float S[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) S[nt][0] = S[nt][1] = S[nt][2] = S[nt][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    unsigned qa[4];
    q_frag(ks, qa);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned kb[4];
      ldmatrix_x4(kb, k_addr(np, ks));
      mma_m16n16k16<T>(S[2 * np], S[2 * np + 1], qa, kb);
    }
  }
  dec_mask_scores(S, rows, j0, t, variants, softmax_scale, softcap);
  float m_blk[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) m_blk[e / 2] = fmaxf(m_blk[e / 2], S[nt][e]);
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
  unsigned p_frag[KEYS / 16][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      S[nt][e] = softmax_weight(S[nt][e], scale_log2, m_base[e / 2]);
      l_i[e / 2] += S[nt][e];
    }
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) pack_a_frag<T>(p_frag[kk], S[2 * kk], S[2 * kk + 1]);
  // acc += P V: masked keys have P = 0, and every V row the kernel reads holds finite values.
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk)
#pragma unroll
    for (int dp = 0; dp < DT / 2; ++dp) {
      unsigned vb[4];
      ldmatrix_x4_trans(vb, v_addr(kk, dp));
      mma_m16n16k16<T>(acc[2 * dp], acc[2 * dp + 1], p_frag[kk], vb);
    }
}

// Where a block's merged rows go.  One split: they are the answer, written to o (the input
// dtype, strided) and lse, and the host launches no dec_combine.  Several: the split's partial
// rows in o_part / lse_part, for dec_combine.  Local row r is row qr0 + r of K/V head hk: token
// qr % Nq of query head hk h_per_kv + qr / Nq.
template <typename T>
struct DecSink {
  const DecBlock& blk;
  T* o;
  float *lse, *o_part, *lse_part;
  int split, num_splits, B, H, h_per_kv, Nq;
  long long o_sb, o_sn, o_sh;
  __device__ __forceinline__ long long part_row(int r) const {
    return blk.part_row(r, num_splits == 1 ? 0 : split, B, H, h_per_kv, Nq);
  }
  __device__ __forceinline__ void store_lse(int r, float x) const {
    if (num_splits > 1) lse_part[part_row(r)] = x;
    else if (lse) lse[part_row(r)] = x;  // (B, H, Nq): the split-0 index of o_part's rows
  }
  template <int HEAD_DIM>
  __device__ __forceinline__ void store_o(int r, int d, float x) const {
    if (num_splits > 1) {
      o_part[part_row(r) * HEAD_DIM + d] = x;
    } else {
      const int qr = blk.qr0 + r;
      o[blk.b * o_sb + (qr % Nq) * o_sn + (blk.hk * h_per_kv + qr / Nq) * o_sh + d] = static_cast<T>(x);
    }
  }
};
#define TILEATTN_DEC_SINK(blk, split) \
  DecSink<T> { blk, o, lse, o_part, lse_part, split, num_splits, B, H, h_per_kv, Nq, o_sb, o_sn, o_sh }

// Merge the WARPS warps of a block, each holding (m_i log2-domain, l_i, acc) for the same Br = 16
// rows over different keys, into the block's rows (sink: the output, or its split's partial
// rows).  `area`: shared memory of dec_merge_bytes, free for reuse; sync(): a barrier over the
// block's WARPS * 32 threads (tid = threadIdx.x below that).  Each warp writes m_i, l_i and its
// unnormalised acc; one thread per row turns them into each warp's weight 2^(m_w - m) / l and the
// row's lse; then the threads combine the accumulators element by element.
__host__ __device__ constexpr int dec_merge_bytes(int D, int Br, int WARPS) { return WARPS * Br * (D + 3) * 4; }
template <int HEAD_DIM, int Br, int WARPS, typename T, typename Sync>
__device__ __forceinline__ void dec_merge_warps(float* area, const float (&acc)[HEAD_DIM / 8][4], const float (&m_i)[2],
                                                const float (&l_i)[2], int rows, const DecSink<T>& sink, Sync sync) {
  constexpr int DT = HEAD_DIM / 8;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  float* m_s = area;                   // [warp][Br]
  float* l_s = m_s + WARPS * Br;       // [warp][Br]
  float* w_s = l_s + WARPS * Br;       // [warp][Br]
  float* acc_s = w_s + WARPS * Br;     // [warp][Br][HEAD_DIM]
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
  sync();
  if (tid < Br) {
    const int r = tid;
    float m = TILEATTN_NEG_INF;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) m = fmaxf(m, m_s[w * Br + r]);
    const float m_base = safe_max(m);
    float f[WARPS], l = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      f[w] = exp2_ftz(m_s[w * Br + r] - m_base);  // 0 for a warp that saw no key
      l += f[w] * l_s[w * Br + r];
    }
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // a row no warp saw outputs 0
#pragma unroll
    for (int w = 0; w < WARPS; ++w) w_s[w * Br + r] = f[w] * inv_l;
    constexpr float LN2 = 0.6931471805599453f;
    if (r < rows) sink.store_lse(r, row_lse(m * LN2, l));
  }
  sync();
  for (int i = tid; i < Br * HEAD_DIM; i += 32 * WARPS) {
    const int r = i / HEAD_DIM, d = i % HEAD_DIM;
    if (r >= rows) continue;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) o += w_s[w * Br + r] * acc_s[(w * Br + r) * HEAD_DIM + d];
    sink.template store_o<HEAD_DIM>(r, d, o);
  }
}

// The chunks' merge (num_splits > 1): one warp per query row (b, h, i), lanes over the head dim.  Weights
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
TILEATTN_SMEM_BYTES(dec_combine, 0);

}  // namespace tileattn
