// The body shared by the mma.sync rungs (v3, v3.1, v3.2): FlashAttention-2's forward on
// mma.sync m16n8k16 with fp32 accumulators, one warp per 16 MT query rows.  Each rung's file says
// what it adds and instantiates this body with its own MT, Q placement, loads and launch bounds;
// v3_mma.cu explains the design, v3_1_mma.cu the two row tiles and register savings, and
// v3_2_mma_tma.cu the TMA loads.  Compiled with VARIANTS (v3_1_variants_fwd only), the body also
// applies the score variants of the room fields (sliding window, softcap, ALiBi; common.cuh):
// every other instantiation compiles to the instructions it had before.
#pragma once

#include "softmax.cuh"
#include "mma.cuh"

namespace tileattn {

// Columns of a shared Q/K/V tile: the head dim padded to 16 (mma k-steps), and a 48-column
// remainder stored as a whole 64-column panel (see v3_mma.cu: fewer address registers than a
// 32 + 16 split).  api.panel_widths (the TMA boxes) is checked against it by tests/test_layout.py.
__host__ __device__ constexpr int fa2_mma_d_smem(int head_dim) {
  return (head_dim + 15) / 16 * 16 % 64 == 48 ? (head_dim + 15) / 16 * 16 + 16 : (head_dim + 15) / 16 * 16;
}

// Its shared memory (the carve-up below): Q, two stages of K and V, D_SMEM columns of 16-bit
// elements, and (TMA) 5 mbarriers.
__host__ __device__ constexpr int fa2_mma_smem_bytes(int head_dim, int Br, int Bc, bool tma) {
  return (Br + 4 * Bc) * fa2_mma_d_smem(head_dim) * 2 + (tma ? 5 * 8 : 0);
}

// The kernel body of the mma.sync rungs.  MT m16 row tiles per warp (v3: 1, v3.1 and v3.2: 2 up
// to D=128); Q_IN_REGS keeps Q's A fragments in registers for the whole loop instead of re-reading
// them by ldmatrix at every k-step; TMA (v3.2): Q, K and V arrive by tensor-memory-accelerator
// copies (through the tensor maps at `tmaps`, a __grid_constant__ parameter of the kernel), counted
// by mbarriers, instead of by cp.async.
// VARIANTS: the score variants, as v3.3's variants kernel applies them (mma.cuh: ScoreVariants,
// fragment_variants; the m16n8 C fragment is the layout those assume).  Query row i sits at key
// position i + causal_offset (also without a causal mask: the host passes the alignment it wants).
// The K/V loop covers only the blocks inside the window of some row of the Q block: blocks wholly
// outside are never loaded, a warp skips the blocks none of its rows sees, and only a block that
// crosses a row's window edge is masked.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, int MT, bool Q_IN_REGS, bool TMA,
          bool VARIANTS = false>
__device__ __forceinline__ void fa2_mma_body(TILEATTN_FWD_PARAMS(T), const TmaMaps* tmaps = nullptr) {
  static_assert(sizeof(T) == 2, "the mma.sync rungs take 16-bit (fp16 / bf16) inputs");
  static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM >= 16 && HEAD_DIM <= 256, "head dim: 16..256, step 8");
  constexpr int WROWS = 16 * MT;  // query rows per warp
  static_assert(Br % WROWS == 0 && Bc % 16 == 0, "whole warps of 16 MT rows; P V k-steps of 16 keys");
  constexpr int NTHREADS = 32 * Br / WROWS;
  constexpr int D_PAD = (HEAD_DIM + 15) / 16 * 16;      // k extent of Q K^T, n extent of P V
  constexpr int D_SMEM = fa2_mma_d_smem(HEAD_DIM);
  constexpr int KSTEPS = D_PAD / 16;  // k-steps of Q K^T (16 head-dim columns each)
  constexpr int NT = Bc / 8;          // n-tiles (8 keys) of S
  constexpr int DT = D_PAD / 8;       // n-tiles (8 columns) of O
  using QTile = SwizzledTile<Br, D_SMEM>;
  using KVTile = SwizzledTile<Bc, D_SMEM>;

  // [Q: Br x D_SMEM][K stage 0][K stage 1][V stage 0][V stage 1], every tile swizzled, then
  // (TMA) the mbarriers of Q, K stage 0, 1 and V stage 0, 1.  1024-byte alignment: TMA's
  // 128-byte swizzle is a function of the shared address bits 4-9, which then equal SwizzledTile's.
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* Qs = smem;
  unsigned char* Ks = smem + QTile::BYTES;
  unsigned char* Vs = Ks + 2 * KVTile::BYTES;
  const unsigned Qs_addr = static_cast<unsigned>(__cvta_generic_to_shared(Qs));
  const unsigned Ks_addr = static_cast<unsigned>(__cvta_generic_to_shared(Ks));
  const unsigned Vs_addr = static_cast<unsigned>(__cvta_generic_to_shared(Vs));
  const unsigned bar_addr = Vs_addr + 2 * KVTile::BYTES;  // TMA: 5 mbarriers of 8 bytes
  const unsigned Q_bar = bar_addr, K_bar = bar_addr + 8, V_bar = bar_addr + 24;  // + 8 * stage
  static_assert(QTile::BYTES + 4 * KVTile::BYTES + (TMA ? 5 * 8 : 0) == fa2_mma_smem_bytes(HEAD_DIM, Br, Bc, TMA),
                "the carve-up is what the host allocates");

  const int bh = blockIdx.y + bh_offset;
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // fragment coordinates: row g (and g + 8), columns 2t, 2t+1
  const int q_start = q_block<CAUSAL>() * Br;
  const int warp_row = q_start + warp * WROWS;  // first query row of this warp
  // This lane's rows: row r = 2 mt + h is warp_row + 16 mt + 8 h + g.
  const int row0 = warp_row + g;

  // Causal, block level: keys past the last row's diagonal are never loaded.
  const int kv_limit = CAUSAL ? min(Nk, max(0, q_start + Br + causal_offset)) : Nk;
  // Keys kv_lo .. kv_hi - 1 hold every key some row of the block sees: K/V blocks j_lo .. j_lo +
  // Tc - 1, counted by j = 0 .. Tc - 1 for the stages.  Without VARIANTS, j_lo is 0.  With a
  // window, the first row's left edge and the last row's right edge bound them (positions rise
  // with the rows); kv_lo <= kv_hi, so Tc >= 0 even when no row sees any key.
  int kv_lo = 0, kv_hi = kv_limit;
  if constexpr (VARIANTS) {
    if (!CAUSAL && window_right >= 0) kv_hi = min(kv_hi, max(0, q_start + Br + causal_offset + window_right));
    if (window_left >= 0) kv_lo = min(kv_hi, max(0, q_start + causal_offset - window_left));
  }
  const int j_lo = kv_lo / Bc;
  const int Tc = (kv_hi + Bc - 1) / Bc - j_lo;

  // TMA: one thread issues each tile (tma_tile_load: one copy per panel, zero-filled tails)
  // through the kernel's tensor maps (api.py encodes them).
  const int b_ = bh / H, h_ = bh % H;  // (HeadSlice computes them too; reusing those spills at D=64)
  enum { QMAP = 0, KMAP = 1, VMAP = 2 };
  auto tma_tile = [&](int map, unsigned dst, unsigned bar, int rows, int first_row) {
    tma_tile_load<D_SMEM>(tmaps, map, dst, bar, rows, first_row, map == QMAP ? h_ : h_ / h_per_kv, b_);
  };

  if constexpr (TMA) {
    if (tid == 0) {
      for (int b = 0; b < 5; ++b) mbar_init(bar_addr + 8 * b, 1);
      mbar_fence_init();
      tma_tile(QMAP, Qs_addr, Q_bar, Br, q_start);
      if (Tc > 0) {
        tma_tile(KMAP, Ks_addr, K_bar, Bc, j_lo * Bc);
        tma_tile(VMAP, Vs_addr, V_bar, Bc, j_lo * Bc);
      }
    }
  } else {
    // Prologue: three commit groups, Q | K_0 | V_0 (empty groups when Tc == 0 keep the counts
    // of the cp_async_wait calls below the same in every case).
    tile_async_copy<T, Br, D_SMEM, HEAD_DIM, NTHREADS>(Qs, hs.q, q_sn, q_start, Nq, tid);
    cp_async_commit();
    if (Tc > 0) tile_async_copy<T, Bc, D_SMEM, HEAD_DIM, NTHREADS>(Ks, hs.k, k_sn, j_lo * Bc, Nk, tid);
    cp_async_commit();
    if (Tc > 0) tile_async_copy<T, Bc, D_SMEM, HEAD_DIM, NTHREADS>(Vs, hs.v, v_sn, j_lo * Bc, Nk, tid);
    cp_async_commit();
  }

  // Per-lane ldmatrix row / chunk, as in v3 (Q: A operand; K: B operand, two key n-tiles;
  // V: .trans B operand, two head-dim n-tiles).  Row tile mt of Q adds 16 mt to the row base.
  const auto [q_r, q_c, k_r, k_c, v_r, v_c] = ldsm_lane(lane);

  unsigned q_frag[Q_IN_REGS ? KSTEPS : 1][MT][4];  // A fragments of this warp's 16 MT Q rows
  if constexpr (TMA) {
    __syncthreads();  // the mbarrier inits are visible to every thread
    mbar_wait(Q_bar, 0);
  } else {
    cp_async_wait<2>();  // Q has landed (K_0, V_0 may be in flight)
    __syncthreads();
  }
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(q_frag[ks][mt], QTile::ldsm_addr(Qs_addr, q_r, q_c, warp * WROWS + 16 * mt, ks));
  }

  // acc[mt][dt]: O columns 8 dt + 2t, +1 of rows row0 + 16 mt (elements 0, 1) and + 8 (2, 3).
  float acc[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) acc[mt][dt][0] = acc[mt][dt][1] = acc[mt][dt][2] = acc[mt][dt][3] = 0.0f;
  // Running max (log2 domain, scaled) and this lane's partial row sum, per row r = 2 mt + h.
  float m_i[2 * MT], l_i[2 * MT];
#pragma unroll
  for (int r = 0; r < 2 * MT; ++r) {
    m_i[r] = TILEATTN_NEG_INF;
    l_i[r] = 0.0f;
  }
  // VARIANTS: the per-head part of the variants, in the raw-score domain of the folded exponent
  // (mma.cuh: ScoreVariants); the rows' positions are set per row tile where they are used.
  ScoreVariants var{};
  if constexpr (VARIANTS)
    var = head_variants<CAUSAL>(softmax_scale, softcap, alibi_slopes, alibi_sb, b_, h_, window_left, window_right);
  // The softmax scale folded into the exponent (softmax.cuh: folded_scale_log2), times c / s with
  // a softcap, whose fragments hold tanh alone (mma.cuh: exp_scale_log2).
  const float scale_log2 = exp_scale_log2(var, folded_scale_log2(softmax_scale));

  for (int j = 0; j < Tc; ++j) {
    const int stage = j & 1;
    const int kv_start = (j_lo + j) * Bc;
    if constexpr (TMA) {
      // K_j has landed (phase j / 2 of its stage's barrier); the barrier below then tells us
      // every warp is done with block j-1, whose stage the prefetch overwrites.
      mbar_wait(K_bar + 8 * stage, (j >> 1) & 1);
      __syncthreads();
      if (tid == 0 && j + 1 < Tc) {
        tma_tile(KMAP, Ks_addr + (stage ^ 1) * KVTile::BYTES, K_bar + 8 * (stage ^ 1), Bc, kv_start + Bc);
        tma_tile(VMAP, Vs_addr + (stage ^ 1) * KVTile::BYTES, V_bar + 8 * (stage ^ 1), Bc, kv_start + Bc);
      }
    } else {
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
    }

    // A warp skips a block none of its rows can use: all 16 MT rows past Nq, or, on the
    // diagonal, all of them ending before kv_start, or (VARIANTS) the block is left of its first
    // row's window or right of its last row's.  It still reaches both barriers (with TMA:
    // the block barrier and the wait for V_j).  (A row
    // tile with no visible key in an active warp is handled by the masks: its P is all 0.)
    bool warp_active = warp_row < Nq && (!CAUSAL || kv_start <= warp_row + WROWS - 1 + causal_offset);
    if constexpr (VARIANTS)
      warp_active = warp_active && (var.left < 0 || kv_start + Bc - 1 >= warp_row + causal_offset - var.left) &&
                    (var.right < 0 || kv_start <= warp_row + WROWS - 1 + causal_offset + var.right);
    // P as the A operand of P V: p_frag[mt][kk] covers keys 16 kk .. 16 kk + 15 of row tile mt.
    unsigned p_frag[MT][Bc / 16][4];
    if (warp_active) {
      const unsigned K_addr = Ks_addr + stage * KVTile::BYTES;
      // 1. S = Q_w K_j^T (16 MT x Bc per warp).  S[mt][nt]: keys 8 nt + 2t, +1 of row tile mt.
      float S[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) S[mt][nt][0] = S[mt][nt][1] = S[mt][nt][2] = S[mt][nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        unsigned qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (Q_IN_REGS) {
#pragma unroll
            for (int i = 0; i < 4; ++i) qa[mt][i] = q_frag[ks][mt][i];
          } else {
            ldmatrix_x4(qa[mt], QTile::ldsm_addr(Qs_addr, q_r, q_c, warp * WROWS + 16 * mt, ks));
          }
        }
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          unsigned kb[4];  // one K load, MT row tiles: the point of v3.1
          ldmatrix_x4(kb, KVTile::ldsm_addr(K_addr, k_r, k_c, 16 * np, ks));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_m16n8k16<T>(S[mt][2 * np], qa[mt], kb[0], kb[1]);
            mma_m16n8k16<T>(S[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
          }
        }
      }

      // 1b. VARIANTS: softcap and ALiBi on every score, the window's mask on a block that crosses
      //     an edge of some row of the row tile (fragment_variants), before the masks below set
      //     their -inf (softcap would turn -inf into -cap).  S[mt] as NT * 4 values is
      //     fragment_variants's layout: value 4 nt + e is row g + 8 (e / 2), key 8 nt + 2t + e % 2.
      if constexpr (VARIANTS) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ScoreVariants vm = var;
          vm.first_pos = warp_row + 16 * mt + causal_offset;
          vm.last_pos = vm.first_pos + 15;
          vm.pos[0] = row0 + 16 * mt + causal_offset;
          vm.pos[1] = vm.pos[0] + 8;
          fragment_variants(reinterpret_cast<float(&)[NT * 4]>(S[mt]), vm, kv_start, Bc, t);
        }
      }

      // 2. Mask the raw scores to -inf, only on a block that passes Nk or straddles this warp's
      //    diagonal.  Row r's visible-key bound is recomputed here, not kept in registers.
      const bool need_mask =
          kv_start + Bc > Nk || (CAUSAL && kv_start + Bc - 1 > warp_row + causal_offset);
      if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int kend = key_end<CAUSAL>(row0 + 16 * mt + 8 * h, Nk, causal_offset) - kv_start - 2 * t;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e)
                if (8 * nt + e >= kend) S[mt][nt][2 * h + e] = TILEATTN_NEG_INF;
          }
      }

      // 3. Block row max of the raw scores, over this lane's 2 Bc/8 values per row then over the
      //    quad, scaled once per row (max(s S) = s max(S) for s > 0, see scale_log2).
      float m_blk[2 * MT], m_base[2 * MT], alpha[2 * MT];
#pragma unroll
      for (int r = 0; r < 2 * MT; ++r) m_blk[r] = TILEATTN_NEG_INF;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          m_blk[2 * mt] = fmaxf(m_blk[2 * mt], fmaxf(S[mt][nt][0], S[mt][nt][1]));
          m_blk[2 * mt + 1] = fmaxf(m_blk[2 * mt + 1], fmaxf(S[mt][nt][2], S[mt][nt][3]));
        }
#pragma unroll
      for (int r = 0; r < 2 * MT; ++r)
        alpha[r] = online_rescale(m_i[r], l_i[r], lanes_max<4>(m_blk[r]) * scale_log2, m_base[r]);

      // 4. Rebase the accumulator to the new max (deferred normalisation: no division here).
      //    Before P, so that alpha is dead before P is live.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          acc[mt][dt][0] *= alpha[2 * mt];
          acc[mt][dt][1] *= alpha[2 * mt];
          acc[mt][dt][2] *= alpha[2 * mt + 1];
          acc[mt][dt][3] *= alpha[2 * mt + 1];
        }
      // 5. P = 2^(s S - m) in fp32, one FFMA + one MUFU.EX2 per score (summed unrounded into
      //    l_i), packed to T as P V's A fragment.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            S[mt][nt][e] = softmax_weight(S[mt][nt][e], scale_log2, m_base[2 * mt + e / 2]);
            l_i[2 * mt + e / 2] += S[mt][nt][e];
          }
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk) pack_a_frag<T>(p_frag[mt][kk], S[mt][2 * kk], S[mt][2 * kk + 1]);
      }
    }

    if constexpr (TMA) {
      // V_j has landed and is visible to this thread: no block-wide barrier.  Every warp waits,
      // also one that skips the block, so no copy is still in flight when the CTA exits.
      mbar_wait(V_bar + 8 * stage, (j >> 1) & 1);
    } else {
      cp_async_wait<2>();  // V_j has landed (K_{j+1}, V_{j+1} may be in flight)
      __syncthreads();     // ... and is visible to every warp
    }
    if (warp_active) {
      // 6. acc += P V_j: k-steps of 16 keys, two 8-column n-tiles of O per ldmatrix.trans, each
      //    used by the MT row tiles.
      const unsigned V_addr = Vs_addr + stage * KVTile::BYTES;
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) {
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          unsigned vb[4];  // one V load, MT row tiles
          ldmatrix_x4_trans(vb, KVTile::ldsm_addr(V_addr, v_r, v_c, 16 * kk, dp));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_m16n8k16<T>(acc[mt][2 * dp], p_frag[mt][kk], vb[0], vb[1]);
            mma_m16n8k16<T>(acc[mt][2 * dp + 1], p_frag[mt][kk], vb[2], vb[3]);
          }
        }
      }
    }
  }

  // Epilogue.  Row sums: the quad's partial sums, all rebased to the same m_i, add up.
  float inv_l[2 * MT];
#pragma unroll
  for (int r = 0; r < 2 * MT; ++r) {
    l_i[r] = lanes_sum<4>(l_i[r]);
    inv_l[r] = l_i[r] > 0.0f ? 1.0f / l_i[r] : 0.0f;  // a row that saw no key outputs 0
  }
  // O = acc / l, staged in this warp's own 16 MT rows of the Q tile (no other warp touches
  // them, and this warp's Q reads are done), then written as whole 16-byte pieces of each row.
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int col = 8 * dt + 2 * t;
      const int r_lo = warp * WROWS + 16 * mt + g;
      *reinterpret_cast<unsigned*>(Qs + QTile::offset_elem(r_lo, col)) =
          pack2<T>(acc[mt][dt][0] * inv_l[2 * mt], acc[mt][dt][1] * inv_l[2 * mt]);
      *reinterpret_cast<unsigned*>(Qs + QTile::offset_elem(r_lo + 8, col)) =
          pack2<T>(acc[mt][dt][2] * inv_l[2 * mt + 1], acc[mt][dt][3] * inv_l[2 * mt + 1]);
    }
  __syncwarp();
  constexpr int CHUNKS = D_PAD / 8;  // even, so 16 MT rows x CHUNKS is a whole number of warp passes
#pragma unroll
  for (int it = 0; it < WROWS * CHUNKS / 32; ++it) {
    const int i = lane + 32 * it;
    const int r = i / CHUNKS, c = i % CHUNKS;
    const int grow = warp_row + r;
    if (grow < Nq && c * 8 < HEAD_DIM)  // rows past Nq and the zero padding columns stay unwritten
      *reinterpret_cast<uint4*>(hs.o + grow * o_sn + c * 8) =
          *reinterpret_cast<const uint4*>(Qs + QTile::offset(warp * WROWS + r, c));
  }
  // lse in natural log: m_i is log2-scaled, so m_i * ln(2) is the max of softmax_scale * S.
  if (t == 0) {
    constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
    for (int r = 0; r < 2 * MT; ++r)
      if (lse && row0 + 8 * r < Nq) hs.lse[row0 + 8 * r] = row_lse(m_i[r] * LN2, l_i[r]);
  }
}

// Variable-length batches on the cp.async rungs (flash_attn_varlen_func off Hopper, and at the
// head dims v3.3 has not): grid (Q blocks of the longest sequence, sequences x heads), q, k, v, o
// packed (total, H, D) with batch strides 0 and cu_seqlens_q / cu_seqlens_k (common.cuh).  Each
// block runs the dense body on its sequence alone, as a batch of one: the pointers start at the
// sequence's first rows, Nq and Nk are its lengths (so cp.async zero-fills K/V rows past its
// keys: nothing of the next sequence is read), the causal offset is its own when bottom_right,
// and bh_offset moves the block's (b, h) to (0, h).  lse is (H, total_q): the body's row h Nq'
// (Nq' = seq_q) lands on h total_q + q0 through a base of lse + h (total_q - seq_q) + q0.
// VARIANTS (v3_1_variants_fwd, which serves flash_attn_func's variants too): cu_seqlens_q may be
// null, a dense batch, passed to the body as given; packed, the sequence's ALiBi slopes row
// (alibi_sb: (B, H) slopes) moves with it, as the body sees batch 0.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, int MT, bool Q_IN_REGS, bool VARIANTS = false>
__device__ __forceinline__ void fa2_mma_varlen_body(TILEATTN_FWD_PARAMS(T)) {
  const int bh = blockIdx.y + bh_offset, b = bh / H, h = bh % H;
  const bool packed = !VARIANTS || cu_seqlens_q != nullptr;
  int q0 = 0, k0 = 0, seq_q = Nq, seq_k = Nk;
  if (packed) {
    q0 = cu_seqlens_q[b];
    k0 = cu_seqlens_k[b];
    seq_q = cu_seqlens_q[b + 1] - q0;
    seq_k = cu_seqlens_k[b + 1] - k0;
  }
  if (q_block<CAUSAL>() * Br >= seq_q) return;  // a Q block past a short sequence
  float* lse_seq = !packed ? lse : lse ? lse + (long long)h * (Nq - seq_q) + q0 : nullptr;
  const float* slopes = VARIANTS && packed && alibi_slopes ? alibi_slopes + b * alibi_sb : alibi_slopes;
  fa2_mma_body<T, HEAD_DIM, Br, Bc, CAUSAL, MT, Q_IN_REGS, /*TMA=*/false, VARIANTS>(
      q + q0 * q_sn, k + k0 * k_sn, v + k0 * v_sn, o + q0 * o_sn, lse_seq, workspace, seq_q, seq_k, H, h_per_kv,
      packed ? 0 : q_sb, q_sh, q_sn, packed ? 0 : k_sb, k_sh, k_sn, packed ? 0 : v_sb, v_sh, v_sn,
      packed ? 0 : o_sb, o_sh, o_sn, softmax_scale, packed && bottom_right ? seq_k - seq_q : causal_offset,
      packed ? bh_offset - b * H : bh_offset, nullptr, nullptr, seqused_k, page_table, page_table_stride,
      page_size, window_left, window_right, softcap, 0, slopes, alibi_sb, descale, bh_count, split_amax);
}

}  // namespace tileattn
