// v3: FlashAttention-2's warp-level forward on tensor cores (mma.sync m16n8k16), fp16 and bf16.
//
// What changes from v2 (same loop nest: Q blocks outer, K/V streamed inner, online softmax,
// deferred normalisation, two-level causal mask), each a named idea of the FA2 paper (section 3.3)
// or of its CUDA implementation:
//  * One warp per 16 query rows instead of one thread per row: block = Br / 16 warps, and the
//    warps of a block share only the K/V tiles (no inter-warp reduction: FA2's "split Q", not
//    FA1's "split K").  Per warp and K/V block:  S (16 x Bc) = Q_w K_j^T  and  acc += P V_j,
//    both as m16n8k16 MMAs with fp32 accumulators that stay in registers.
//  * P never touches shared memory: the C fragment of S (fp32) maps element for element onto the
//    A fragment of the P V MMA (see mma.cuh), so P is exponentiated, packed to T and fed back.
//  * Q is copied once (cp.async) and held in registers as A fragments for the whole loop.  K
//    fragments come from ldmatrix, V fragments from ldmatrix.trans (V is row-major keys x D, the
//    MMA wants it "col"), both from XOR-swizzled shared tiles, so ldmatrix is conflict-free.
//  * Online softmax in the log2 domain: scores are scaled by scale_log2 = softmax_scale*log2(e)
//    once, so every weight is one ex2 (MUFU.EX2).  Row max and sum are reduced over the 4 lanes
//    of a quad (the lanes that share a row) with __shfl_xor_sync; the sum is reduced only once,
//    at the end, because every lane of a quad rescales its partial sum by the same factor.
//  * cp.async pipeline, two stages for K and two for V: block j+1 is copied while block j is
//    computed, and K and V are separate commit groups, so Q K_j^T starts as soon as K_j has
//    landed, while V_j is still in flight.
//  * Causal: K/V blocks entirely above the diagonal are never loaded; a warp whose 16 rows see
//    none of a (straddling) block skips its MMAs; element masks only where a block straddles the
//    diagonal or passes Nk.  Causal Q blocks are scheduled heaviest (last) first.
//
// Head dims: every multiple of 8 from 16 to 256.  The MMAs run over D_PAD = ceil(D / 16) * 16
// head-dim columns (an m16n8k16 k-step is 16); the padding columns are zero-filled by cp.async,
// so they add 0 to Q K^T, and the matching O columns are never written.  The shared tiles are
// D_SMEM = D_PAD columns wide, or D_PAD + 16 when D_PAD % 64 == 48 (see D_SMEM below).
//
// Shared memory (dynamic only): Q [Br][D_SMEM], K [2][Bc][D_SMEM], V [2][Bc][D_SMEM], 16-bit:
//     smem_bytes = 2 * D_SMEM * (Br + 4 * Bc)
// e.g. D=64, Br=128, Bc=32: 32 KB;  D=128, Br=128, Bc=64: 96 KB;  D=256, Br=64, Bc=32: 96 KB.
// The Q tile is reused at the end to stage O for coalesced 16-byte stores.
//
// Registers per thread (fp32 unless noted): acc D_PAD/2, S Bc/2, P Bc/4 (packed T), Q fragments
// D_PAD/4 (packed T).  At D_PAD > 128 the Q fragments would not fit next to acc, so there they
// are re-read from shared memory by ldmatrix at every k-step (as FA2's forward does at every D).
#include "common.cuh"
#include "mma.cuh"

namespace tileattn {

// Registers: ptxas is told the minimum number of resident blocks per SM, which caps it at
// 65536 / (threads * MIN_BLOCKS) registers (and at 255).  Left to itself (thread count only) it
// was seen to stop at an occupancy step (80 or 128 registers) and spill, so the cap is explicit:
// 2 blocks when the fragments a thread keeps live (acc + S + P + Q: v3_frag_regs) leave room
// under 128 registers at 256 threads, otherwise 1.  With the threshold 72, every recommended
// tile compiles without spills on sm_80 and sm_90a (NVRTC 13.5); D=64, Bc=32 uses 124-127.
__host__ __device__ constexpr int v3_frag_regs(int d_pad, int Bc) {
  return d_pad / 2 + Bc / 2 + Bc / 4 + (d_pad <= 128 ? d_pad / 4 : 0);
}
__host__ __device__ constexpr int v3_min_blocks(int head_dim, int Bc) {
  return v3_frag_regs((head_dim + 15) / 16 * 16, Bc) <= 72 ? 2 : 1;
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(2 * Br, v3_min_blocks(HEAD_DIM, Bc)) v3_fwd(TILEATTN_FWD_PARAMS(T)) {
  static_assert(sizeof(T) == 2, "v3 is a 16-bit (fp16 / bf16) rung");
  static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM >= 16 && HEAD_DIM <= 256, "head dim: 16..256, step 8");
  static_assert(Br % 16 == 0 && Bc % 16 == 0, "one warp per 16 rows; P V k-steps of 16 keys");
  constexpr int NTHREADS = 2 * Br;                  // Br / 16 warps
  constexpr int D_PAD = (HEAD_DIM + 15) / 16 * 16;  // k extent of Q K^T, n extent of P V
  // Width of the shared tiles: D_PAD, except that a 48-column remainder (D_PAD % 64 == 48) is
  // stored as a whole 64-column panel whose last 16 columns are never written nor read.  The
  // 32 + 16 split it would otherwise take costs a few more address registers: enough to spill
  // at D = 232, 240.
  constexpr int D_SMEM = D_PAD % 64 == 48 ? D_PAD + 16 : D_PAD;
  constexpr int KSTEPS = D_PAD / 16;  // k-steps of Q K^T (16 head-dim columns each)
  constexpr int NT = Bc / 8;          // n-tiles (8 keys) of S
  constexpr int DT = D_PAD / 8;       // n-tiles (8 columns) of O
  constexpr bool Q_IN_REGS = D_PAD <= 128;  // v3_frag_regs assumes the same threshold
  using QTile = SwizzledTile<Br, D_SMEM>;
  using KVTile = SwizzledTile<Bc, D_SMEM>;

  // [Q: Br x D_SMEM][K stage 0][K stage 1][V stage 0][V stage 1], every tile swizzled.
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* Qs = smem;
  unsigned char* Ks = smem + QTile::BYTES;
  unsigned char* Vs = Ks + 2 * KVTile::BYTES;
  // ldmatrix takes 32-bit shared-window addresses; compute them once from the generic pointers.
  const unsigned Qs_addr = static_cast<unsigned>(__cvta_generic_to_shared(Qs));
  const unsigned Ks_addr = static_cast<unsigned>(__cvta_generic_to_shared(Ks));
  const unsigned Vs_addr = static_cast<unsigned>(__cvta_generic_to_shared(Vs));

  const int bh = blockIdx.y + bh_offset;
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // fragment coordinates: row g (and g + 8), columns 2t, 2t+1
  // Causal Q blocks have more work the later they sit: launch them first, so the short ones
  // fill the tail of the grid instead of a long one running alone at the end.
  const int m_block = CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int q_start = m_block * Br;
  const int warp_row = q_start + warp * 16;  // first query row of this warp
  const int row0 = warp_row + g;             // this lane's two rows: row0 and row0 + 8

  // Causal, block level: keys past the last row's diagonal are never loaded.
  const int kv_limit = CAUSAL ? min(Nk, max(0, q_start + Br + causal_offset)) : Nk;
  const int Tc = (kv_limit + Bc - 1) / Bc;

  // Prologue: three commit groups, Q | K_0 | V_0 (empty groups when Tc == 0 keep the counts of
  // the cp_async_wait calls below the same in every case).
  tile_async_copy<T, Br, D_SMEM, HEAD_DIM, NTHREADS>(Qs, hs.q, q_sn, q_start, Nq, tid);
  cp_async_commit();
  if (Tc > 0) tile_async_copy<T, Bc, D_SMEM, HEAD_DIM, NTHREADS>(Ks, hs.k, k_sn, 0, Nk, tid);
  cp_async_commit();
  if (Tc > 0) tile_async_copy<T, Bc, D_SMEM, HEAD_DIM, NTHREADS>(Vs, hs.v, v_sn, 0, Nk, tid);
  cp_async_commit();

  // Per-lane ldmatrix row / chunk, from the x4 address pattern (lanes 8i..8i+7 -> matrix i):
  //  Q (A operand, 16 rows x 16 cols): matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15), in the
  //    order a[0..3]:  row = lane % 16, chunk = 2 ks + lane / 16.
  //  K (B operand of S, two n-tiles of 8 keys): matrices {keys 0-7: cols 0-7, 8-15} then
  //    {keys 8-15: cols 0-7, 8-15} = b0, b1 of n-tile 2np, b0, b1 of n-tile 2np+1:
  //    key = lane % 8 + 8 (lane / 16), chunk = 2 ks + (lane / 8) % 2.
  //  V (B operand of P V, .trans; two n-tiles of 8 head-dim columns): matrices {cols 0-7: keys
  //    0-7, 8-15} then {cols 8-15: keys 0-7, 8-15}: key = lane % 8 + 8 ((lane / 8) % 2),
  //    chunk = 2 dp + lane / 16.
  // Every 8-lane phase reads 8 consecutive rows starting at a multiple of 8: conflict-free.
  const int q_r = lane % 16, q_c = lane / 16;
  const int k_r = lane % 8 + 8 * (lane / 16), k_c = (lane / 8) % 2;
  const int v_r = lane % 8 + 8 * ((lane / 8) % 2), v_c = lane / 16;

  unsigned q_frag[Q_IN_REGS ? KSTEPS : 1][4];  // A fragments of this warp's 16 Q rows
  cp_async_wait<2>();                          // Q has landed (K_0, V_0 may be in flight)
  __syncthreads();
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
      ldmatrix_x4(q_frag[ks], Qs_addr + QTile::ldsm_offset(q_r, q_c, warp * 16, ks));
  }

  // acc[dt]: O columns 8 dt + 2t, +1 of rows row0 (elements 0, 1) and row0 + 8 (elements 2, 3).
  float acc[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
  // Running max (log2 domain, scaled) and this lane's partial row sum, for rows row0, row0 + 8.
  float m_i[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
  float l_i[2] = {0.0f, 0.0f};
  const float scale_log2 = softmax_scale * TILEATTN_LOG2E;
  // Keys [0, key_end) are visible to a row: past Nk or past its diagonal is masked.
  const int key_end0 = key_end<CAUSAL>(row0, Nk, causal_offset);
  const int key_end1 = key_end<CAUSAL>(row0 + 8, Nk, causal_offset);

  for (int j = 0; j < Tc; ++j) {
    const int stage = j & 1;
    const int kv_start = j * Bc;
    cp_async_wait<1>();  // K_j has landed (V_j may still be in flight)
    // Publishes K_j to every warp, and tells us every warp is done with block j-1, whose
    // stage (j+1)&1 the prefetch below overwrites.
    __syncthreads();
    if (j + 1 < Tc)
      tile_async_copy<T, Bc, D_SMEM, HEAD_DIM, NTHREADS>(Ks + (stage ^ 1) * KVTile::BYTES, hs.k, k_sn,
                                                        kv_start + Bc, Nk, tid);
    cp_async_commit();
    if (j + 1 < Tc)
      tile_async_copy<T, Bc, D_SMEM, HEAD_DIM, NTHREADS>(Vs + (stage ^ 1) * KVTile::BYTES, hs.v, v_sn,
                                                        kv_start + Bc, Nk, tid);
    cp_async_commit();

    // A warp skips a block none of its rows can use (m_i, l_i, acc unchanged): all 16 rows past
    // Nq (the last Q block), or, on the diagonal, all 16 rows ending before kv_start.  It still
    // reaches both barriers.
    const bool warp_active = warp_row < Nq && (!CAUSAL || kv_start <= warp_row + 15 + causal_offset);
    // P as the A operand of P V: p_frag[kk] covers keys 16 kk .. 16 kk + 15 of the block.
    unsigned p_frag[Bc / 16][4];
    if (warp_active) {
      const unsigned K_addr = Ks_addr + stage * KVTile::BYTES;
      // 1. S = Q_w K_j^T (16 x Bc per warp), fp32 in registers.  S[nt]: keys 8 nt + 2t, +1.
      float S[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) S[nt][0] = S[nt][1] = S[nt][2] = S[nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        unsigned qa[4];
        if constexpr (Q_IN_REGS) {
          qa[0] = q_frag[ks][0], qa[1] = q_frag[ks][1], qa[2] = q_frag[ks][2], qa[3] = q_frag[ks][3];
        } else {
          ldmatrix_x4(qa, Qs_addr + QTile::ldsm_offset(q_r, q_c, warp * 16, ks));
        }
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          unsigned kb[4];
          ldmatrix_x4(kb, K_addr + KVTile::ldsm_offset(k_r, k_c, 16 * np, ks));
          mma_m16n8k16<T>(S[2 * np], qa, kb[0], kb[1]);
          mma_m16n8k16<T>(S[2 * np + 1], qa, kb[2], kb[3]);
        }
      }

      // 2. Scale into the log2 domain, then mask: -inf after scaling, whatever softmax_scale's
      //    sign.  Element masks only on a block that passes Nk or straddles this warp's diagonal.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[nt][e] *= scale_log2;
      const bool need_mask =
          kv_start + Bc > Nk || (CAUSAL && kv_start + Bc - 1 > warp_row + causal_offset);
      if (need_mask) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = kv_start + 8 * nt + 2 * t + (e & 1);
            if (key >= (e < 2 ? key_end0 : key_end1)) S[nt][e] = TILEATTN_NEG_INF;
          }
      }

      // 3. Block row max, over this lane's 2 Bc/8 values then over the quad (lanes 4g..4g+3).
      float m_blk[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        m_blk[0] = fmaxf(m_blk[0], fmaxf(S[nt][0], S[nt][1]));
        m_blk[1] = fmaxf(m_blk[1], fmaxf(S[nt][2], S[nt][3]));
      }
      float m_base[2], alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m_blk[r] = lanes_max<4>(m_blk[r]);
        const float m_new = fmaxf(m_i[r], m_blk[r]);
        // safe_max: a row masked so far has m_new = -inf; subtracting 0 instead keeps
        // ex2(-inf - (-inf)) = NaN out of P and alpha (they become ex2(-inf) = 0).
        m_base[r] = safe_max(m_new);
        alpha[r] = exp2_ftz(m_i[r] - m_base[r]);  // 0 on the first visible block (m_i = -inf)
        m_i[r] = m_new;
        l_i[r] *= alpha[r];
      }

      // 4. P = 2^(S - m) in fp32 (summed unrounded into l_i), packed to T as P V's A fragment.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          S[nt][e] = exp2_ftz(S[nt][e] - m_base[e / 2]);
          l_i[e / 2] += S[nt][e];
        }
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) {
        p_frag[kk][0] = pack2<T>(S[2 * kk][0], S[2 * kk][1]);          // row g,   keys 2t, 2t+1
        p_frag[kk][1] = pack2<T>(S[2 * kk][2], S[2 * kk][3]);          // row g+8, keys 2t, 2t+1
        p_frag[kk][2] = pack2<T>(S[2 * kk + 1][0], S[2 * kk + 1][1]);  // row g,   keys 2t+8, +9
        p_frag[kk][3] = pack2<T>(S[2 * kk + 1][2], S[2 * kk + 1][3]);  // row g+8, keys 2t+8, +9
      }
      // 5. Rebase the accumulator to the new max (deferred normalisation: no division here).
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        acc[dt][0] *= alpha[0];
        acc[dt][1] *= alpha[0];
        acc[dt][2] *= alpha[1];
        acc[dt][3] *= alpha[1];
      }
    }

    cp_async_wait<2>();  // V_j has landed (K_{j+1}, V_{j+1} may be in flight)
    __syncthreads();     // ... and is visible to every warp
    if (warp_active) {
      // 6. acc += P V_j: k-steps of 16 keys, two 8-column n-tiles of O per ldmatrix.trans.
      const unsigned V_addr = Vs_addr + stage * KVTile::BYTES;
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          unsigned vb[4];
          ldmatrix_x4_trans(vb, V_addr + KVTile::ldsm_offset(v_r, v_c, 16 * kk, dp));
          mma_m16n8k16<T>(acc[2 * dp], p_frag[kk], vb[0], vb[1]);
          mma_m16n8k16<T>(acc[2 * dp + 1], p_frag[kk], vb[2], vb[3]);
        }
      }
    }
  }

  // Epilogue.  Row sums: the quad's partial sums, all rebased to the same m_i, add up.
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_i[r] = lanes_sum<4>(l_i[r]);
    inv_l[r] = l_i[r] > 0.0f ? 1.0f / l_i[r] : 0.0f;  // a row that saw no key outputs 0
  }
  // O = acc / l, staged in this warp's own 16 rows of the Q tile (no other warp touches them,
  // and its Q reads are done), then written as whole 16-byte pieces of each row.
  __syncwarp();
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int col = 8 * dt + 2 * t;
    *reinterpret_cast<unsigned*>(Qs + QTile::offset_elem(warp * 16 + g, col)) =
        pack2<T>(acc[dt][0] * inv_l[0], acc[dt][1] * inv_l[0]);
    *reinterpret_cast<unsigned*>(Qs + QTile::offset_elem(warp * 16 + g + 8, col)) =
        pack2<T>(acc[dt][2] * inv_l[1], acc[dt][3] * inv_l[1]);
  }
  __syncwarp();
  constexpr int CHUNKS = D_PAD / 8;  // even, so 16 rows x CHUNKS is a whole number of warp passes
#pragma unroll
  for (int it = 0; it < 16 * CHUNKS / 32; ++it) {
    const int i = lane + 32 * it;
    const int r = i / CHUNKS, c = i % CHUNKS;
    const int grow = warp_row + r;
    if (grow < Nq && c * 8 < HEAD_DIM)  // rows past Nq and the zero padding columns stay unwritten
      *reinterpret_cast<uint4*>(hs.o + grow * o_sn + c * 8) =
          *reinterpret_cast<const uint4*>(Qs + QTile::offset(warp * 16 + r, c));
  }
  // lse in natural log: m_i is log2-scaled, so m_i * ln(2) is the max of softmax_scale * S.
  if (t == 0) {
    constexpr float LN2 = 0.6931471805599453f;
    if (row0 < Nq) hs.lse[row0] = row_lse(m_i[0] * LN2, l_i[0]);
    if (row0 + 8 < Nq) hs.lse[row0 + 8] = row_lse(m_i[1] * LN2, l_i[1]);
  }
}

}  // namespace tileattn
