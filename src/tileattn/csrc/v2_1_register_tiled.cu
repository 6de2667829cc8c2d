// v2.1: v2 with register tiling, as a register-blocked SGEMM does.  Still FP32 on CUDA cores only
// (FFMA, no tensor cores); same Q-outer grid, online softmax and two-level causal mask as v2.
//
// What changes from v2, and why each idea should help (seed 4.2: v2 is latency-bound, one block of
// 4 warps per SM, every FFMA waiting on a scalar shared-memory load):
//  * Register tile per thread (the SGEMM idea).  Each thread owns TM=4 query rows x TN=Bc/8 keys
//    of S = Q K^T, and the same 4 rows x D/8 head-dim columns of acc (the unnormalised O~), both in
//    registers.  A float4 of Q (4 rows) and of K (TN keys) feeds 4*4*TN FFMAs, so shared-memory
//    traffic per FFMA drops from ~1 load per FFMA (v2: one Qs scalar per FFMA) to ~0.09 LDS.128.
//  * acc in registers, not shared: v2's Oacc [Br][D+1] was a third of its 97 KB of shared memory
//    and a shared read-modify-write of every output element every tile.  The freed shared memory
//    buys occupancy.
//  * Occupancy designed for (sm_90, 228 KB shared per SM): D=64 (Br=128, Bc=64, 256 threads,
//    101 KB, 128 registers): 2 blocks = 16 warps per SM, 4 per scheduler instead of v2's 1.  Each
//    warp also has 32 independent accumulators of ILP, so a ~30-cycle LDS is covered by the other
//    warps' FFMAs, and a block stalled at __syncthreads by the other block.  D=32 (Br=128, Bc=64,
//    69 KB): 2 blocks = 16 warps, register-bound.  D=128 (Br=64, Bc=32, 128 threads, 74.5 KB,
//    <= 170 registers): 3 blocks = 12 warps.  (sm_80's 164 KB fit only 1 block at D=64.)
//  * Conflict-free wide loads: every shared read is an LDS.128 that a warp serves in one wavefront
//    (layouts below).
//  * Softmax statistics in the log2 domain: scale_log2 = softmax_scale * log2(e) is folded into S,
//    so each P is one FADD + one MUFU.EX2.  m_i is shared by the 8 lanes of a row (3 xor-shuffles
//    per row per tile); l_i stays a per-lane partial sum (each lane's own keys) and is reduced once
//    at the end, since all 8 lanes rescale it by the same factor.  lse = (m_i + log2 l_i) * ln 2.
//  * P goes through shared memory (P [Br][Bc+4]): PV needs, for the thread's rows, P over all Bc
//    keys, but the thread holds only its TN.  The 8 lanes sharing a row are in one warp, and a warp
//    only reads the P rows it wrote, so the write->read order needs no extra barrier.
//  * K/V pipeline without a second copy of either (the official FA2's order): V_j is copied with
//    cp.async while S_j = Q K_j^T is computed, K_{j+1} while P_j V_j is.  Each copy overlaps half a
//    tile of math, and one K plus one V buffer (instead of two of each, +33 KB) is what lets two
//    blocks fit per SM at D=64.  Two __syncthreads per tile, each also the WAR guard of a buffer.
//
// Thread -> data map (tx = lane & 7, ty = 4 * warp + lane / 8; row group ty, column group tx):
//  S rows  ty + ROW_STRIDE * i, i < TM (ROW_STRIDE = Br / TM; a warp's 4 ty are adjacent rows)
//  S keys  tx + 8 * jj, jj < TN         (a warp's 8 tx are 8 adjacent K rows)
//  O cols  4 * (tx + 8 * h) + 0..3, h < D/32 (a warp's 8 tx: 8 adjacent float4 of one V row)
// Shared layouts (floats; the +4 pads shift each row by 4 banks):
//  Qs [Br][D+4]  read Qs[row][4*d4 .. +3]: 4 rows per warp, 4 bank groups apart -> 1 wavefront.
//  Ks [Bc][D+4]  read Ks[key][4*d4 .. +3]: 8 adjacent keys, 8 distinct bank groups -> 1 wavefront.
//                K stays row-major (cp.async copies 16 contiguous bytes; a transposed K would need
//                a register round trip) and is read along D, the reduction axis of S.
//  Vs [Bc][D]    read Vs[key][4*(tx + 8h) .. +3]: one row, 8 adjacent float4 -> 1 wavefront.
//  Ps [Br][Bc+4] slot tx*TN + jj of row r holds P[r][key tx + 8 jj] ("key-permuted"), so a thread
//                stores its TN keys as TN/4 STS.128; the PV loop reads slots in order, float4 at
//                a time, and maps slot s back to key s/TN + 8*(s%TN) at compile time.  Reads:
//                4 rows per warp, 4 bank groups apart -> 1 wavefront.
// Shared memory: 4 * (Br*(D+4) + Bc*(D+4) + Bc*D + Br*(Bc+4)) bytes, dynamic.
// Threads per block: 2 * Br (Br/TM row groups x 8 lanes), for every head dim.
//
// Measured effect (H200, B=4, H=8, N=8192, D=64, FP32): 14.3 ms / 38.4 TFLOP/s non-causal and
// 8.0 ms / 34.5 TFLOP/s causal, against v2's 29.5 ms / 18.7 and 18.7 ms / 14.7: 2.06x and 2.34x,
// relative error 1.7e-6 / 6e-7 vs float64.  The ideas were built together, so their separate
// shares are not measured; the occupancy (16 warps per SM vs 8) and the register tile (about 0.09
// LDS.128 per FFMA instead of about one LDS per FFMA) are the two that the seed's analysis named.
#include "softmax.cuh"

namespace tileattn {
namespace v2_1 {

// Shared memory per SM, for the occupancy target below: 228 KB on sm_90 / sm_100, 164 KB on
// sm_80 / sm_87, 100 KB on the consumer parts (sm_86, sm_89, sm_120).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 870)
constexpr int SMEM_PER_SM = 164 * 1024;
#elif defined(__CUDA_ARCH__) && \
    (__CUDA_ARCH__ == 900 || __CUDA_ARCH__ == 1000 || __CUDA_ARCH__ == 1030)
constexpr int SMEM_PER_SM = 228 * 1024;
#else
constexpr int SMEM_PER_SM = 100 * 1024;
#endif

constexpr int TPR = 8;  // lanes sharing one row group: a quarter warp, reduced with xor 1, 2, 4
constexpr int TM = 4;   // query rows per thread

template <int HEAD_DIM, int Br, int Bc>
struct Config {
  static constexpr int THREADS = Br / TM * TPR;     // = 2 * Br
  static constexpr int ROW_STRIDE = Br / TM;        // distance between a thread's rows
  static constexpr int TN = Bc / TPR;               // keys per thread
  static constexpr int DH = HEAD_DIM / (4 * TPR);   // float4 columns of acc per row per thread
  static constexpr int LDQK = HEAD_DIM + 4;         // Qs, Ks row pitch (floats)
  static constexpr int LDV = HEAD_DIM;              // Vs row pitch
  static constexpr int LDP = Bc + 4;                // Ps row pitch
  static constexpr int SMEM_BYTES = 4 * (Br * LDQK + Bc * LDQK + Bc * LDV + Br * LDP);
  // Blocks per SM that shared memory allows (1 KB reserved per block) ...
  static constexpr int SMEM_BLOCKS = SMEM_PER_SM / (SMEM_BYTES + 1024);
  // ... and that registers allow without going under 128 per thread (the S loop needs ~128).
  static constexpr int REG_BLOCKS = 65536 / (THREADS * 128);
  // Passed to __launch_bounds__: ptxas caps registers at 64K / (MIN_BLOCKS * THREADS), so the
  // occupancy the shared memory allows is not lost to registers.
  static constexpr int MIN_BLOCKS =
      SMEM_BLOCKS < 1 ? 1 : (SMEM_BLOCKS < REG_BLOCKS ? SMEM_BLOCKS : REG_BLOCKS);

  static_assert(Br % 16 == 0, "4 row groups per warp: Br must be a multiple of 16");
  static_assert(Bc % 32 == 0, "TN must be a multiple of 4 (P is stored as float4)");
  static_assert(HEAD_DIM % 32 == 0, "acc columns are whole float4s spread over 8 lanes");
};

// Copy ROWS rows of HEAD_DIM floats, global rows row0.. of a head slice, into dst [ROWS][LD] with
// 16-byte cp.async.  Thread t always copies float4 column c4 = t % (D/4) of rows t / (D/4) + pass *
// ROWS_PER_PASS, so it keeps only src_c4 = slice + 4*c4 and dst_thr live across the loop (per-pass
// 64-bit addresses held from one tile to the next were what spilled).  Rows at or past nrows are
// zero-filled by the copy itself: a tail K row gives S = 0 (masked to -inf anyway), a tail V row
// is 0 rather than stale data that 0 * NaN would turn into NaN, a tail Q row computes values nobody
// writes.
template <int ROWS, int HEAD_DIM, int LD, int NTHREADS>
__device__ __forceinline__ void tile_async_copy(const float* src_c4, long long sn, float* dst_thr,
                                                int row0, int nrows) {
  constexpr int VEC_PER_ROW = HEAD_DIM / 4;
  static_assert(NTHREADS % VEC_PER_ROW == 0, "a thread keeps one column for every pass");
  constexpr int ROWS_PER_PASS = NTHREADS / VEC_PER_ROW;
  const int r = threadIdx.x / VEC_PER_ROW;
#pragma unroll
  for (int pass = 0; pass < (ROWS + ROWS_PER_PASS - 1) / ROWS_PER_PASS; ++pass) {
    const int row = r + pass * ROWS_PER_PASS;
    if (ROWS % ROWS_PER_PASS == 0 || row < ROWS) {
      const bool ok = row0 + row < nrows;
      // A zero-filled copy still gets a valid address: row 0 of the slice.
      cp_async_16(dst_thr + pass * ROWS_PER_PASS * LD, src_c4 + (ok ? row0 + row : 0) * sn, ok);
    }
  }
}

__device__ __forceinline__ float component(const float4& v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;  // e is an unrolled constant
}

}  // namespace v2_1

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v2_1::Config<HEAD_DIM, Br, Bc>::THREADS,
                                  v2_1::Config<HEAD_DIM, Br, Bc>::MIN_BLOCKS)
    v2_1_fwd(TILEATTN_FWD_PARAMS(T)) {
  static_assert(sizeof(T) == 4, "v2.1 is an FP32 rung");
  using C = v2_1::Config<HEAD_DIM, Br, Bc>;
  constexpr int TM = v2_1::TM, TN = C::TN, DH = C::DH, THREADS = C::THREADS;
  constexpr int ROW_STRIDE = C::ROW_STRIDE, LDQK = C::LDQK, LDV = C::LDV, LDP = C::LDP;

  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;              // [Br][D+4], resident for the whole loop
  float* Ks = Qs + Br * LDQK;    // [Bc][D+4], K_j
  float* Vs = Ks + Bc * LDQK;    // [Bc][D],   V_j
  float* Ps = Vs + Bc * LDV;     // [Br][Bc+4], P_j, key-permuted rows

  const int bh = blockIdx.y + bh_offset;
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  const int lane = threadIdx.x & 31;
  const int tx = lane & 7;                          // column group
  const int ty = (threadIdx.x >> 5) * 4 + (lane >> 3);  // row group
  const int q_start = blockIdx.x * Br;

  // Causal, block level: keys past the last valid row's diagonal are never visited.
  const int q_end = min(q_start + Br, Nq);
  const int kv_limit = CAUSAL ? min(Nk, max(0, q_end + causal_offset)) : Nk;
  const int Tc = (kv_limit + Bc - 1) / Bc;

  // Per-thread copy addresses (see tile_async_copy): column c4 of row threadIdx.x / (D/4).
  const int copy_c4 = 4 * (threadIdx.x % (HEAD_DIM / 4));
  const int copy_r = threadIdx.x / (HEAD_DIM / 4);
  const float* k_c4 = hs.k + copy_c4;
  const float* v_c4 = hs.v + copy_c4;
  float* ks_thr = Ks + copy_r * LDQK + copy_c4;
  float* vs_thr = Vs + copy_r * LDV + copy_c4;
  v2_1::tile_async_copy<Br, HEAD_DIM, LDQK, THREADS>(hs.q + copy_c4, q_sn,
                                                    Qs + copy_r * LDQK + copy_c4, q_start, Nq);
  if (Tc > 0) v2_1::tile_async_copy<Bc, HEAD_DIM, LDQK, THREADS>(k_c4, k_sn, ks_thr, 0, Nk);
  cp_async_commit();

  // acc[i][4h+e]: row ty + ROW_STRIDE*i, head-dim column 4*(tx + 8h) + e.  m_i in the log2
  // domain (max of S * scale_log2), identical across the row's 8 lanes; l_i a per-lane partial.
  float acc[TM][4 * DH];
  float m_i[TM], l_i[TM];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    m_i[i] = TILEATTN_NEG_INF;
    l_i[i] = 0.0f;
#pragma unroll
    for (int n = 0; n < 4 * DH; ++n) acc[i][n] = 0.0f;
  }
  const float scale_log2 = softmax_scale * TILEATTN_LOG2E;

  const float* q_thr = Qs + ty * LDQK;        // + i*ROW_STRIDE*LDQK + 4*d4
  const float* k_thr = Ks + tx * LDQK;        // + jj*8*LDQK + 4*d4
  float* p_wr = Ps + ty * LDP + tx * TN;      // + i*ROW_STRIDE*LDP + 4*q4
  const float* p_rd = Ps + ty * LDP;          // + i*ROW_STRIDE*LDP + 4*s4
  const float* v_thr = Vs + 4 * tx;           // + key*LDV + 32*h

  for (int j = 0; j < Tc; ++j) {
    const int kv_start = j * Bc;
    // K_j (and Q) have landed and are visible; every warp is past P_{j-1} V_{j-1}, so Vs and
    // Ps are free to overwrite.
    cp_async_wait<0>();
    __syncthreads();
    v2_1::tile_async_copy<Bc, HEAD_DIM, LDV, THREADS>(v_c4, v_sn, vs_thr, kv_start, Nk);
    cp_async_commit();

    // 1. S = Q K_j^T, TM x TN per thread; each d4 step: TM + TN LDS.128, 4*TM*TN FFMA.
    //    Not unrolled: ptxas issues a step's TM + TN float4 loads (48 registers at D=64) up
    //    front, and unrolling lets it hoist the next step's too, which spills at 128 registers.
    //    One step of 128 FFMA per warp hides its load latency behind the other warps.
    float S[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int jj = 0; jj < TN; ++jj) S[i][jj] = 0.0f;
#pragma unroll 1
    for (int d4 = 0; d4 < HEAD_DIM / 4; ++d4) {
      float4 qv[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i)
        qv[i] = *reinterpret_cast<const float4*>(q_thr + i * ROW_STRIDE * LDQK + 4 * d4);
#pragma unroll
      for (int jj = 0; jj < TN; ++jj) {
        const float4 kv = *reinterpret_cast<const float4*>(k_thr + jj * 8 * LDQK + 4 * d4);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          S[i][jj] = fmaf(qv[i].x, kv.x, S[i][jj]);
          S[i][jj] = fmaf(qv[i].y, kv.y, S[i][jj]);
          S[i][jj] = fmaf(qv[i].z, kv.z, S[i][jj]);
          S[i][jj] = fmaf(qv[i].w, kv.w, S[i][jj]);
        }
      }
    }

    // 2. Scale into the log2 domain, then mask (masking first would give -inf * 0 = NaN for a
    //    zero softmax_scale, +inf for a negative one).  Element masks only on the tail tile and
    //    on tiles that reach past the block's first diagonal; the branch is uniform over the block.
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int jj = 0; jj < TN; ++jj) S[i][jj] *= scale_log2;
    // (block_needs_mask's test, written out: through the helper its causal kernels' SASS changes.)
    const bool needs_mask =
        kv_start + Bc > Nk || (CAUSAL && kv_start + Bc - 1 > q_start + causal_offset);
    if (needs_mask) {
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const int end = key_end<CAUSAL>(q_start + ty + i * ROW_STRIDE, Nk, causal_offset);
#pragma unroll
        for (int jj = 0; jj < TN; ++jj)
          if (kv_start + tx + 8 * jj >= end) S[i][jj] = TILEATTN_NEG_INF;
      }
    }

    // 3. Online softmax per row: m_new over the 8 lanes, P = 2^(S - m_new), rescale l_i and acc
    //    by alpha = 2^(m_old - m_new), store P for the PV loop.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      float mx = S[i][0];
#pragma unroll
      for (int jj = 1; jj < TN; ++jj) mx = fmaxf(mx, S[i][jj]);
      mx = lanes_max<8>(mx);
      const float m_new = fmaxf(m_i[i], mx);
      // safe_max: while the row has seen only -inf, subtract 0 so that 2^(-inf - (-inf)) = NaN
      // becomes 2^(-inf) = 0, for P and for alpha alike.
      const float m_base = safe_max(m_new);
      const float alpha = exp2_ftz(m_i[i] - m_base);
      m_i[i] = m_new;
      float row_sum = 0.0f;
#pragma unroll
      for (int jj = 0; jj < TN; ++jj) {
        S[i][jj] = exp2_ftz(S[i][jj] - m_base);  // S now holds P
        row_sum += S[i][jj];
      }
      l_i[i] = fmaf(l_i[i], alpha, row_sum);
#pragma unroll
      for (int n = 0; n < 4 * DH; ++n) acc[i][n] *= alpha;
#pragma unroll
      for (int q4 = 0; q4 < TN / 4; ++q4)
        *reinterpret_cast<float4*>(p_wr + i * ROW_STRIDE * LDP + 4 * q4) =
            make_float4(S[i][4 * q4], S[i][4 * q4 + 1], S[i][4 * q4 + 2], S[i][4 * q4 + 3]);
    }

    // V_j has landed; every warp is done reading Ks (so K_{j+1} may overwrite it) and its own P
    // rows are visible to the warp.
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < Tc) {
      v2_1::tile_async_copy<Bc, HEAD_DIM, LDQK, THREADS>(k_c4, k_sn, ks_thr, kv_start + Bc, Nk);
      cp_async_commit();
    }

    // 4. acc += P V_j over the Bc key slots, 4 at a time: TM P float4s (4 slots each) and 4*DH V
    //    float4s feed 16*TM*DH FFMA.  Slot s holds key s/TN + 8*(s%TN) (see Ps above).
#pragma unroll
    for (int s4 = 0; s4 < Bc / 4; ++s4) {
      float4 pv[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i)
        pv[i] = *reinterpret_cast<const float4*>(p_rd + i * ROW_STRIDE * LDP + 4 * s4);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int s = 4 * s4 + e;
        const int key = s / TN + 8 * (s % TN);
#pragma unroll
        for (int h = 0; h < DH; ++h) {
          const float4 vv = *reinterpret_cast<const float4*>(v_thr + key * LDV + 32 * h);
#pragma unroll
          for (int i = 0; i < TM; ++i) {
            const float p = v2_1::component(pv[i], e);
            acc[i][4 * h + 0] = fmaf(p, vv.x, acc[i][4 * h + 0]);
            acc[i][4 * h + 1] = fmaf(p, vv.y, acc[i][4 * h + 1]);
            acc[i][4 * h + 2] = fmaf(p, vv.z, acc[i][4 * h + 2]);
            acc[i][4 * h + 3] = fmaf(p, vv.w, acc[i][4 * h + 3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();  // Tc == 0 left the Q copy in flight; never exit with a copy pending

  // Epilogue: the single HBM write of O, normalised by one reciprocal per row; lse in natural log.
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    float l = l_i[i];
    l = lanes_sum<8>(l);
    const int grow = q_start + ty + i * ROW_STRIDE;
    if (grow < Nq) {
      const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;  // a row that saw no key outputs 0
      float* orow = hs.o + grow * o_sn;
#pragma unroll
      for (int h = 0; h < DH; ++h)
        *reinterpret_cast<float4*>(orow + 4 * (tx + 8 * h)) =
            make_float4(acc[i][4 * h] * inv_l, acc[i][4 * h + 1] * inv_l,
                        acc[i][4 * h + 2] * inv_l, acc[i][4 * h + 3] * inv_l);
      // l >= 1 once any key is seen (the max key contributes 2^0); l = 0 means none: -inf.
      if (tx == 0 && lse)
        hs.lse[grow] = l > 0.0f ? (m_i[i] + log2f(l)) * 0.6931471805599453f : TILEATTN_NEG_INF;
    }
  }
}

TILEATTN_SMEM_BYTES(v2_1_fwd, v2_1::Config<HEAD_DIM, Br, Bc>::SMEM_BYTES);

}  // namespace tileattn
