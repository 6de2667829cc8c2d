// The online softmax, written once for the rungs that share its math: the key-limit/causal mask,
// the running max m_i with its rescale of l_i (and of O, by the factor returned), the weights
// 2^(s S - m) with the softmax scale folded into the exponent, and the log-sum-exp of a finished
// row.  Everything is per row and in registers; how a rung lays rows over threads (a quad of an
// mma fragment, a row group, a thread) stays in the rung, which calls these per row.
//
// Adopted where the SASS stays the same (scripts/sass_fingerprint.py: all 216 sm_90
// instantiations identical before and after): v3, v3.1, v3.2 (fa2_mma.cuh) and v3.3 use the whole
// step (folded_scale_log2, online_rescale, softmax_weight), v2.3 online_rescale; every rung masks
// with key_end and guards with safe_max.  v2.1 fuses l_i's rescale into its row-sum FFMA, v2.2
// keeps exp2f (the non-ftz path), and v1/v2 work in the natural-log domain (__expf): each would
// change its SASS by adopting the step, so each keeps its own.
#pragma once

#include "common.cuh"

namespace tileattn {

// The last key a query row may see (exclusive bound), given causal alignment: query row i sees
// key j iff j < Nk and (not causal, or j <= i + causal_offset).
template <bool CAUSAL>
__device__ __forceinline__ int key_end(int row, int Nk, int causal_offset) {
  return CAUSAL ? min(Nk, max(0, row + causal_offset + 1)) : Nk;
}

// Whether some score of the K/V block of keys kv_start .. kv_start + Bc - 1 is masked for the Q
// block of rows q_start .. (past Nk, or right of a row's diagonal when causal): only such blocks
// run the per-score mask.
template <bool CAUSAL>
__device__ __forceinline__ bool block_needs_mask(int kv_start, int Bc, int Nk, int q_start, int causal_offset) {
  return kv_start + Bc > Nk || (CAUSAL && kv_start + Bc - 1 > q_start + causal_offset);
}

// Online-softmax guard: when every score seen so far is -inf, m is -inf and exp(S - m)
// would be exp(-inf + inf) = NaN.  Subtracting 0 instead gives exp(-inf) = 0, the right weight.
__device__ __forceinline__ float safe_max(float m) { return m == TILEATTN_NEG_INF ? 0.0f : m; }

// 2^x on the SFU (MUFU.EX2), one instruction.  exp2f without fast math wraps the same
// instruction in a denormal-range fix-up; here results below 2^-126 flush to 0, which is
// harmless for softmax weights (they are added to sums >= 1).  ex2(-inf) = +0, the weight a
// masked score must get.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The scale in the log2 domain, folded into the exponent: 2^(s S - m), so S is never scaled on
// its own (one FFMA per score instead of FMUL + FADD).  That needs s > 0, so that the row max of
// the raw scores gives the row max of the scaled ones: the kernels take softmax_scale >= 0
// (api.py passes a negative one as (-q, -softmax_scale), which is exact).  softmax_scale = 0
// would turn a masked -inf into -inf * 0 = NaN, so s is clamped at 1e-30: every weight is then
// 2^(s S - s max S) = 1 in fp32, as with s = 0, for any score below 1e29 in magnitude.
__device__ __forceinline__ float folded_scale_log2(float softmax_scale) {
  return fmaxf(softmax_scale * TILEATTN_LOG2E, 1e-30f);
}

// The scale the folded exponent uses (folded_scale_log2 clamps it at 1e-30 log2e): the score
// variants divide by this one, so a scale of 0 (or below 1e-30) still gives finite,
// exact-in-the-limit scores (softcap s tanh(S s / c) / s -> S, ALiBi slope |p - j| / s times s).
__device__ __forceinline__ float folded_scale(float softmax_scale) {
  return folded_scale_log2(softmax_scale) * (1.0f / TILEATTN_LOG2E);
}

// tanh on the SFU (MUFU.TANH, sm_75+), one instruction, max relative error about 2^-11 (PTX ISA,
// tanh.approx.f32); tanhf is a longer, exact software sequence.  The soft-capping of
// wgmma's scores uses it (as FlashAttention's softcap does): each score already costs one SFU
// exp2, and a second one keeps the SFU at the tensor core's pace at D = 128.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One row's step of the online softmax, in the log2 domain: m_blk is this K/V block's row max of
// the scaled scores.  m_i becomes the running max, l_i is rebased to it, m_base is what this
// block's scores subtract (safe_max: 0 while the row has seen only -inf), and the return value
// is the factor O must be rebased by (0 on the row's first visible block, where m_i = -inf).
//
// tau > 0 (log2 units; the wgmma rungs' lazy_rescale_log2()): a lazy rebase.  The row keeps its max
// while the block's stays within tau of it, so the weights 2^(s S - m) reach at most 2^tau and the
// factor is exactly 1: O and l_i are rebased only on a real jump.  O / l_i and the lse m + log2 l
// do not depend on which max both are taken against, so the result is the same softmax; only the
// range of P grows (2^8 = 256, within bf16's and fp16's), and a row's largest weight is no longer
// exactly 1, so it rounds like the others when P is cast for P V: 4% more error in bf16 (2.24e-3 ->
// 2.33e-3 at D = 64), 2-3x more in e4m3, whose 3-bit mantissa made the exact 1 count (a NumPy model
// and tests/test_fp8.py, 2026-12-03): FP8 takes a small threshold with an offset instead
// (fp8_lazy_rescale_log2 below).
__device__ __forceinline__ float online_rescale(float& m_i, float& l_i, float m_blk, float& m_base, float tau = 0.0f) {
  if (tau > 0.0f && m_blk <= m_i + tau) {  // (m_i = -inf: only a block of -inf stays, with m_base 0)
    m_base = safe_max(m_i);
    return 1.0f;
  }
  const float m_new = fmaxf(m_i, m_blk);
  m_base = safe_max(m_new);
  const float alpha = exp2_ftz(m_i - m_base);
  m_i = m_new;
  l_i *= alpha;
  return alpha;
}

// The lazy rebase's threshold in the fp16 / bf16 wgmma rungs (v3.3's body): a row's max moves
// only when a block's exceeds it by more than 8 (a factor of 2^8), and a warp none of whose rows
// moved skips O's rescale (one FMUL per O element a block: at D = 128 as many as the block's
// exponentials).  Measured on an H200 (scripts/fwd_probe.py, bf16, B*N = 32768, H = 16, two runs
// each, bench/NOTES.md): +3-6% at D = 64 and 128, N = 8192, causal and not; +13% on v3.6 at
// D = 256.  The same idea as FlashAttention-4's conditional rescaling on Blackwell.  (A function:
// as a namespace-scope constant it made two compiles of every kernel including this header differ
// in their bytes, which tests/test_cache.py holds equal.)
__device__ __forceinline__ constexpr float lazy_rescale_log2() { return 8.0f; }

// FP8's rebase (v3.5: P rounded to e4m3 for P V): a threshold of 2 with the weights lifted by 2^6.
// e4m3 keeps 3 mantissa bits, so the exact rebase's largest weight of exactly 1 counted: at the
// bf16 threshold of 8 O's error grew 2-3x on peaky rows.  A threshold of 2 rounds a row's largest
// weight only within [1, 4], and the offset (FlashAttention-3's FP8 max offset) lifts the small
// weights out of e4m3's subnormals (below 2^-6), which takes back part of it: O's error 0.99-1.45x
// of the exact final max's in a float64 model (scripts/fp8_rebase_model.py, flat to peaky rows),
// while a warp rebases on 9% of blocks instead of 51% at N = 8192 D = 128 (20% against 96% at
// N = 1024).  tau + offset <= 8: P <= 2^8, below e4m3's largest 448.  l_i sums the lifted weights,
// so lse takes the offset back out of m_i (v3.3's FP8 epilogue); O = acc / l_i does not see it.
// Measured on an H100 against the exact rebase in one call (scripts/fp8_probe.py, kernel alone,
// B*N = 32768, H = 16, bench/NOTES.md): D = 128 N = 8192 2.53-2.59 ms against 2.63-2.66, causal
// 1.34 against 1.39-1.41 (a threshold of 8 without the offset: 2.50 / 1.39); D = 256 2-5%; D = 64
// within 1%.  O's relative error against float64: unchanged where P's rounding dominates (2.5e-2
// at unit-variance scores), 8.9e-3 against 5.6e-3 for peaky ones (q, k x3).
__device__ __forceinline__ constexpr float fp8_lazy_rescale_log2() { return 2.0f; }
__device__ __forceinline__ constexpr float fp8_p_offset_log2() { return 6.0f; }

// Which rebase a rung's online softmax takes (mma.cuh fragment_online_softmax): exact, the lazy one
// of 16-bit P, or FP8's with its offset.
enum class Rebase { exact, lazy_16bit, lazy_e4m3 };

// The weight of a raw score S given the folded scale and the row's m_base: 2^(s S - m_base).
__device__ __forceinline__ float softmax_weight(float S, float scale_log2, float m_base) {
  return exp2_ftz(fmaf(S, scale_log2, -m_base));
}

// log-sum-exp of a finished row (natural log); a row that saw no key has l = 0 and gets -inf.
__device__ __forceinline__ float row_lse(float m, float l) {
  return l > 0.0f ? m + __logf(l) : TILEATTN_NEG_INF;
}

}  // namespace tileattn
