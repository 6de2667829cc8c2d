// v2.4: FP32-accurate attention on Hopper's wgmma as 3xFP16 (sm_90a): q, k, v as fp16 hi + lo
// halves under power-of-two scales (split_halves.cu), three fp16 products per multiply, on v3.3's
// warp-specialised pipeline.  The default FP32 rung on sm_90 at D = 64 and 128.
//
// Why: v2.3 (3xTF32 on wgmma) reaches 1.8-2.0x SDPA efficient at D=128 (issue 13 asks for 3x).
// Its TF32 operands must be K-major, so its producer warpgroup splits and transposes V into hi /
// lo tiles per block, and TF32 runs at half fp16's tensor-core rate.  The backward's bwd_v2.3
// (bwd_v2_3_fp16x3.cu) showed the fp16 form: fp16 has TF32's 11-bit significand, so x = hi + lo
// carries 22 bits at twice the rate, fp16 wgmma reads V N-major as v3.3 does, and power-of-two
// scales (exact) give fp16 the range: P in [0, 1] by 2^15, and q, k, v by an exponent per block of
// 64 rows that puts the block's max |x| just under 2^15 (split_halves.cu split_blocks: one pass per
// tensor, once per call, not once per CTA).  A block's exponent is a per-block factor of S (Q's
// rows: its 64-row block is a consumer warpgroup's; K's: the K/V block's) and of P V_j, both
// computed from zero per block, so it is undone where the block's result is used: in the
// softmax's scale for S, and in O's rescale for P V_j.
//
// The CTA is v3.3's (one Q block of Br = 128 rows, a producer warp issuing TMA copies of Q once
// and of K_j, V_j per block into two stages, two consumer warpgroups of 64 rows), with each copy
// doubled (hi, lo) and, per K/V block:
//   S = Q_lo K_hi + Q_hi K_lo + Q_hi K_hi (small terms first), from zero, over D;
//   the online softmax in FP32 without the lazy rebase (P <= 1, so P 2^15 fits fp16);
//   PV = P_lo V_hi + P_hi V_lo + P_hi V_hi from zero (P's halves as register A fragments), merged
//   into O by FFMA, O = O scale_old 2^(ev_j - ev_{j-1}) + PV: the tensor core's accumulation across
//   blocks is not round-to-nearest (v2_2_tf32x3.cu measured the error growing with N when O
//   accumulated inside the MMAs).  O is kept in V_j's units (2^(15 + ev_j)), so the change of
//   units rides the per-row FFMA factor; it overflows only if V's block maxima differ by ~2^98.
// S_{j+1} is issued with P_j V_j, and its softmax runs under P_j V_j (v3.3's overlap).
// Registers (240 a consumer thread): O, PV (64 + 64 at D=128), S (32) and P's halves (32) all live.
// Shared memory: Q hi + lo, two stages of K and V hi + lo: 192 KB at D=128 (Bc = 64), 96 KB at D=64.
#include "common.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

namespace tileattn {

constexpr int V2_4_WG = 128;
constexpr float V2_4_P_SCALE = 32768.0f;  // 2^15: P in [0, 1] as fp16 halves

// v2.5's Q: one consumer warpgroup's 64 rows of FP32 Q (q_rows: its first row, rows q_sn
// elements apart, 16-byte aligned; `rows` of them exist, the rest are zeros) split into fp16
// hi / lo halves under the exponent of their max |x|, written into the 128-byte-swizzled K-major
// tiles the TMA copy would have written (hi at tile, lo Q_BYTES on; a 64-column panel every Br
// rows; 16-byte chunk c of row r at chunk c ^ (r % 8)).  Each thread holds D / 16 chunks of 8
// floats until the max is known.  warp_max: the warpgroup's 4 slots in shared memory; named
// barrier 1 + cwg.  Returns the exponent.
template <int HEAD_DIM, int Br>
__device__ __forceinline__ int v2_4_split_q(const float* q_rows, long long q_sn, int rows, unsigned tile, int Q_BYTES,
                                            float* warp_max, int cwg) {
  constexpr int CHUNKS = HEAD_DIM / 8, PER = SPLIT_BLOCK_ROWS * CHUNKS / V2_4_WG;  // D / 16 chunks a thread
  const int tid = threadIdx.x % V2_4_WG;
  float4 x[PER][2];
  float m = split_load_rows<HEAD_DIM, V2_4_WG>(q_rows, q_sn, rows, tid, x);
  m = split_group_max<V2_4_WG>(m, warp_max, tid, [&] { named_barrier_sync<V2_4_WG>(1 + cwg); });
  const int e = split_exponent(m);
  const float scale = scalbnf(1.0f, e);
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    const int i = p * V2_4_WG + tid, r = i / CHUNKS, c = i % CHUNKS;
    uint4 hi, lo;
    split_half8(x[p][0], x[p][1], scale, hi, lo);
    const unsigned at = tile + (c / 8) * Br * 128 + r * 128 + (((c % 8) ^ (r % 8)) * 16);
    st_shared_v4(at, __uint_as_float(hi.x), __uint_as_float(hi.y), __uint_as_float(hi.z), __uint_as_float(hi.w));
    st_shared_v4(at + Q_BYTES, __uint_as_float(lo.x), __uint_as_float(lo.y), __uint_as_float(lo.z),
                 __uint_as_float(lo.w));
  }
  fence_proxy_async_smem();          // the generic-proxy stores, before the tensor core reads them
  named_barrier_sync<V2_4_WG>(1 + cwg);  // every warp's rows, before any warp's wgmma
  return e;
}

// Q_IN_CTA (v2.5): the consumer warpgroups split their own rows of Q (FP32 from q, strided) into
// the hi / lo tiles, under an exponent per warpgroup from its rows' max |x|; the producer copies
// K and V only, and the host splits k and v alone.
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL, bool Q_IN_CTA>
__device__ __forceinline__ void v2_4_body(TILEATTN_FWD_PARAMS(T), const TmaMaps& tmaps) {
  static_assert(sizeof(T) == 4, "v2.4 is an FP32 rung (its tiles are fp16 halves)");
  static_assert(Br == 128 && Bc == 64 && (HEAD_DIM == 64 || HEAD_DIM == 128), "v3.3's CTA; O and PV in registers");
  static_assert(Bc == SPLIT_BLOCK_ROWS && Br == 2 * SPLIT_BLOCK_ROWS, "a K/V block, a warpgroup's rows: one exponent");
  using H16 = Wgmma16<__half>;
  constexpr int STAGES = 2;
  constexpr int Q_BYTES = Br * HEAD_DIM * 2, KV_BYTES = Bc * HEAD_DIM * 2;  // one half of a tile
  constexpr unsigned Q_LO = Q_BYTES >> 4, KV_LO = KV_BYTES >> 4;         // lo tiles, in descriptor units

  // Q hi, Q lo, then per stage K hi, K lo, then per stage V hi, V lo; then KVBarriers<2>.
  extern __shared__ __align__(1024) unsigned char smem[];
  const unsigned s_q = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  auto s_k = [&](int s) { return s_q + 2 * Q_BYTES + s * 2 * KV_BYTES; };
  auto s_v = [&](int s) { return s_q + 2 * Q_BYTES + (STAGES + s) * 2 * KV_BYTES; };
  const KVBarriers<STAGES> bars{s_q + 2 * Q_BYTES + 4 * STAGES * KV_BYTES};
  // Q_IN_CTA: each consumer warp's max |x| of its warpgroup's Q rows (after the barriers).
  float* const q_max = reinterpret_cast<float*>(smem + 2 * Q_BYTES + 4 * STAGES * KV_BYTES + 8 * KVBarriers<STAGES>::COUNT);
  if (threadIdx.x == 0) bars.init(2, 2 * V2_4_WG);  // full barriers: the hi and the lo copy
  __syncthreads();

  const int bh = blockIdx.y + bh_offset, q_start = q_block<CAUSAL>() * Br;
  const int b = bh / H, h = bh % H, hk = h / h_per_kv, H_kv = H / h_per_kv;
  const int kv_hi = CAUSAL ? min(Nk, max(0, q_start + Br + causal_offset)) : Nk;
  const int Tc = (kv_hi + Bc - 1) / Bc;  // K/V blocks some row of this Q block sees

  if (threadIdx.x < V2_4_WG) {
    // ---------------- producer: one thread issues every copy (maps: the split q, k, v) ----------------
    setmaxnreg_dec<24>();
    if (threadIdx.x != 0) return;
    if (!Q_IN_CTA) {
      tma_tile_load<HEAD_DIM>(&tmaps, 0, s_q, bars.q, Br, q_start, h, b);
      tma_tile_load<HEAD_DIM>(&tmaps, 0, s_q + Q_BYTES, bars.q, Br, q_start, H + h, b);
    }
    for (int n = 0; n < Tc; ++n) {
      const int st = KVBarriers<STAGES>::stage(n);
      bars.wait_k_empty(n);
      tma_tile_load<HEAD_DIM>(&tmaps, 1, s_k(st), bars.k_full(n), Bc, n * Bc, hk, b);
      tma_tile_load<HEAD_DIM>(&tmaps, 1, s_k(st) + KV_BYTES, bars.k_full(n), Bc, n * Bc, H_kv + hk, b);
      bars.wait_v_empty(n);
      tma_tile_load<HEAD_DIM>(&tmaps, 2, s_v(st), bars.v_full(n), Bc, n * Bc, hk, b);
      tma_tile_load<HEAD_DIM>(&tmaps, 2, s_v(st) + KV_BYTES, bars.v_full(n), Bc, n * Bc, H_kv + hk, b);
    }
    return;
  }

  // ---------------- consumers: warpgroup cwg takes rows 64 cwg .. of the Q block ----------------
  setmaxnreg_inc<240>();
  const int cwg = threadIdx.x / V2_4_WG - 1;
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  constexpr int NS = Bc / 2, NO = HEAD_DIM / 2;  // accumulator values per thread: S (64 x Bc), O (64 x D)
  // The blocks' maxima split_blocks wrote (api._split_blocks: per batch, q's (H, TQ), k's and v's
  // (H_kv, TK) in turn), from which their exponents: S's unscale folds into the softmax's scale
  // (softmax_scale >= 0: the host negates q otherwise), V's into O's rescale.
  // (Q_IN_CTA: k's and v's only; q's exponent is the warpgroup's own, v2_4_split_q.)
  const int TQ = Q_IN_CTA ? 0 : (Nq + SPLIT_BLOCK_ROWS - 1) / SPLIT_BLOCK_ROWS;
  const int TK = (Nk + SPLIT_BLOCK_ROWS - 1) / SPLIT_BLOCK_ROWS;
  const float* const amax_b = split_amax + (long long)b * (H * TQ + 2 * H_kv * TK);
  const float* const amax_q = amax_b + h * TQ;
  const float* const amax_k = amax_b + H * TQ + hk * TK;
  const float* const amax_v = amax_k + H_kv * TK;
  const int q_row0 = q_start + cwg * 64;  // this warpgroup's first row of Q
  const int eq = Q_IN_CTA ? v2_4_split_q<HEAD_DIM, Br>(q + b * q_sb + h * q_sh + q_row0 * q_sn, q_sn, Nq - q_row0,
                                                      s_q + cwg * 64 * 128, Q_BYTES, q_max + 4 * cwg, cwg)
                          : split_exponent(amax_q[min(q_start / SPLIT_BLOCK_ROWS + cwg, TQ - 1)]);  // (rows past Nq: unused)
  const float folded_log2 = folded_scale_log2(softmax_scale);
  int ev = 0;  // V's exponent of the block whose P V was last merged into O (or is in flight)
  // Block n's maxima are loaded one block ahead, so their latency hides under block n - 1's work.
  float amax_kn = amax_k[0], amax_vn = amax_v[0];
  const unsigned long long dq = wgmma_desc_sw128(s_q + cwg * 64 * 128);
  const int row_a = q_start + cwg * 64 + warp * 16 + g;  // this thread's rows: row_a, row_a + 8

  float acc[NO], m_i[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF}, l_i[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < NO; ++i) acc[i] = 0.0f;
  unsigned p_hi[Bc / 16][4], p_lo[Bc / 16][4];  // P 2^15 as A fragments of P V

  // S = Q K_n^T from zero (asynchronous: issued and committed): the two lo products over all of D
  // (K's lo first, as bwd_v2.3's S^T = K Q^T takes them), then hi hi.
  auto issue_s = [&](float (&S)[NS], int n) {
    const unsigned long long dk = wgmma_desc_sw128(s_k(KVBarriers<STAGES>::stage(n)));
    wgmma_fence();
#pragma unroll
    for (int pass = 0; pass < 3; ++pass)
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
        H16::ss(S, dq + (sw128_k_step(kk, Br) >> 4) + x3_b_lo(pass, Q_LO),
                dk + (sw128_k_step(kk, Bc) >> 4) + x3_a_lo(pass, KV_LO), pass > 0 || kk > 0);
    wgmma_commit();
  };
  // pv = P V_n from zero (asynchronous), V N-major: k16 step ks 16 key rows on, D's next 64 columns
  // the next panel.
  auto issue_pv = [&](float (&pv)[NO], int n) {
    const unsigned long long dv = wgmma_desc_sw128(s_v(KVBarriers<STAGES>::stage(n)), Bc * 128);
    fence_operands(p_hi);
    fence_operands(p_lo);
    wgmma_fence();
#pragma unroll
    for (int pass = 0; pass < 3; ++pass)
#pragma unroll
      for (int ks = 0; ks < Bc / 16; ++ks)
        H16::rs_bt(pv, pass == 0 ? p_lo[ks] : p_hi[ks], dv + ((ks * 16 * 128) >> 4) + x3_b_lo(pass, KV_LO),
                   pass > 0 || ks > 0);
    wgmma_commit();
  };
  // Block n's online softmax (no lazy rebase: P stays <= 1) in place, under its own exponents;
  // rescale: the factor that takes O into V_n's units and to the new row max (0 on the first block,
  // whose scale_old is 0 and O 0).
  auto softmax = [&](float (&S)[NS], int n, float (&rescale)[2]) {
    const int ek = split_exponent(amax_kn), ev_n = split_exponent(amax_vn);
    if (n + 1 < Tc) amax_kn = amax_k[n + 1], amax_vn = amax_v[n + 1];
    float scale_old[2];
    fragment_online_softmax<CAUSAL, NS>(S, m_i, l_i, scale_old, scalbnf(folded_log2, -(eq + ek)), n * Bc, Bc, q_start,
                                        row_a, t, Nk, causal_offset);
    rescale[0] = scalbnf(scale_old[0], ev_n - ev);
    rescale[1] = scalbnf(scale_old[1], ev_n - ev);
    ev = ev_n;
  };
  // P 2^15 as hi / lo A fragments (k16 step ks = S's n8 tiles 2 ks, 2 ks + 1, v3.3's mapping).
  auto split_p = [&](const float (&S)[NS]) {
#pragma unroll
    for (int i = 0; i < NS; i += 2) {
      const int n8 = i / 4, r = (n8 % 2) * 2 + (i % 4) / 2;
      split_half2(S[i] * V2_4_P_SCALE, S[i + 1] * V2_4_P_SCALE, p_hi[n8 / 2][r], p_lo[n8 / 2][r]);
    }
  };
  // O = O rescale + P V_n: the merge by FFMA, once P V_n is done.
  auto merge = [&](const float (&pv)[NO], const float (&rescale)[2]) {
#pragma unroll
    for (int i = 0; i < NO; ++i) acc[i] = fmaf(acc[i], rescale[(i % 4) / 2], pv[i]);
  };

  if (!Q_IN_CTA) mbar_wait(bars.q, 0);  // even with no K/V block: no copy may outlive the CTA
  // Intra-warpgroup pipelining (v3.3's): S_{n+1} and P_n V_n are issued together, and block n+1's
  // softmax runs on the CUDA cores while the tensor core does P_n V_n; P's halves and pv belong to
  // the in-flight P V until its wait, so block n+1's P is split only after it.
  if (Tc > 0) {
    float rescale[2];
    {
      float S[NS];
      bars.wait_k_full(0);
      issue_s(S, 0);
      wgmma_wait<0>();
      fence_operands(S);
      mbar_arrive(bars.k_empty(0));
      softmax(S, 0, rescale);
      split_p(S);
    }
    for (int n = 0; n + 1 < Tc; ++n) {  // straight-line body: ptxas tracks the two groups
      float S[NS], pv[NO], rescale_next[2];
      bars.wait_k_full(n + 1);
      issue_s(S, n + 1);
      bars.wait_v_full(n);
      issue_pv(pv, n);
      wgmma_wait<1>();  // S_{n+1} done (groups complete in order), P_n V_n may still run
      fence_operands(S);
      mbar_arrive(bars.k_empty(n + 1));
      softmax(S, n + 1, rescale_next);
      wgmma_wait<0>();
      fence_operands(pv);
      mbar_arrive(bars.v_empty(n));
      merge(pv, rescale);
      rescale[0] = rescale_next[0];
      rescale[1] = rescale_next[1];
      split_p(S);
    }
    float pv[NO];
    bars.wait_v_full(Tc - 1);
    issue_pv(pv, Tc - 1);
    wgmma_wait<0>();
    fence_operands(pv);
    mbar_arrive(bars.v_empty(Tc - 1));
    merge(pv, rescale);
  }

  const float o_unscale = scalbnf(1.0f, -(15 + ev));  // P's 2^15 and the last V block's 2^ev
#pragma unroll
  for (int i = 0; i < NO; ++i) acc[i] *= o_unscale;
  const HeadSlice<T> hs = TILEATTN_HEAD_SLICE(T, bh);
  fragment_store_rows<T, HEAD_DIM>(acc, m_i, l_i, row_a, t, Nq, hs.o, o_sn, lse ? hs.lse : nullptr);
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(3 * V2_4_WG, 1) v2_4_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  v2_4_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*Q_IN_CTA=*/false>(TILEATTN_FWD_ARGS, tmaps);
#endif
}

// v2.5: v2.4 with Q split by its own CTA (no pass over q before the kernel).
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(3 * V2_4_WG, 1) v2_5_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  v2_4_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*Q_IN_CTA=*/true>(TILEATTN_FWD_ARGS, tmaps);
#endif
}

// Q hi + lo, two stages of K and V hi + lo, 9 mbarriers (KVBarriers<2>); v2.5 eight floats more
// (its warps' maxima of Q).
TILEATTN_SMEM_BYTES(v2_4_fwd, (2 * Br + 8 * Bc) * HEAD_DIM * 2 + 9 * 8);
TILEATTN_SMEM_BYTES(v2_5_fwd, (2 * Br + 8 * Bc) * HEAD_DIM * 2 + 9 * 8 + 8 * 4);

}  // namespace tileattn
