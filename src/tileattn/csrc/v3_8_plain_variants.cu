// v3.8: causal ALiBi and causal sliding windows on the plain causal kernel (v3.6 / v3.7's walk).
//
// Why: the variants kernels (v3.6 / v3.7 _variants) carry the code for every variant (window
// edges, softcap's tanh, ALiBi) behind runtime flags, and with nothing on they already run 3-4%
// below the plain causal kernel (ptxas schedules their loop differently, bench/NOTES.md); ALiBi
// costs them one FFMA a score more (fragment_alibi_keys).  On an H200 ALiBi ran 0.88x (D=64) and
// 0.93x (D=128) of plain causal's rate, a left window 4096 0.91x / 0.93x at the same work
// (bench/results/variants.json).  The two variants most models use alone (ALiBi: BLOOM, MPT;
// a left window: Mistral, Gemma's local layers) need no per-score work on the plain kernel:
//  * ALiBi (V38_ALIBI).  Under a causal mask every key a row sees is at or left of it, so the
//    bias is slope (j - pos) = slope_s c + slope_s (kv_start - first_pos) + slope_s (first_pos -
//    pos) in S's units (slope_s = slope / scale; c = j - kv_start, the key's column in its block).
//    slope_s c, the only term that varies along a row, is one more k16 step of S = Q K^T: A's row
//    is (hi, mid, lo, 0 ...), slope_s split into three bf16 terms (registers, per head), and B a
//    constant table whose row c is (c, c, c, 0 ...) in shared memory (v3_3_wgmma.cu,
//    alibi_key_table / alibi_slope_fragment).  bf16 whatever the inputs' dtype: fp16 could not
//    hold the slope of a tiny scale.  The block's term joins the row max and the exponent's
//    per-row constant (fragment_online_softmax's OFFSET, as in the variants kernels), and the
//    row's own term leaves m_i before lse is written.  The step adds a quarter to S's MMAs at
//    D = 64 (an eighth of the tile's), half that at D = 128.
//  * A left window (V38_WINDOW): the K/V loop starts at the first block some row of the tile sees
//    (skipped, not masked), and the blocks crossing the window's left edge for some row take the
//    causal mask's branch with a lower bound as well (fragment_online_softmax's LEFT).
// ALiBi at v3.7's tile at D = 64 (three consumers) and v3.6's at 128; the window at v3.6's at both
// (the variants kernel's window measured 5% slower on 192-row tiles).  With both, a softcap, or
// without a causal mask (|pos - j| is not linear across the diagonal), serving.attention_variants
// keeps the variants kernels.
#include "v3_3_wgmma.cu"

namespace tileattn {

// No ping-pong: at D = 64 the window ran 6% slower with v3.6's (0.537 against the variants
// kernel's 0.507 ms, bf16 B=2 H=16 N=8192 window 4096 on an H100, scripts/variants_probe.py).
#define TILEATTN_V3_8_KERNEL(NAME, BITS)                                                                          \
  template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>                                                  \
  __global__ void __launch_bounds__(v3_3_threads(Br), 1) NAME(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) { \
    v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*VARIANTS=*/false, /*PINGPONG=*/false,                                \
              /*PERSISTENT=*/true, BITS>(TILEATTN_FWD_ARGS, &tmaps);                                               \
  }
TILEATTN_V3_8_KERNEL(v3_8_alibi_fwd, V38_ALIBI)
TILEATTN_V3_8_KERNEL(v3_8_window_fwd, V38_WINDOW)
#undef TILEATTN_V3_8_KERNEL

// v3.6's carve-up, then ALiBi's key table (Bc rows of 128 bytes, 1024-byte aligned: O's stage is
// whole kilobytes).
TILEATTN_SMEM_BYTES(v3_8_alibi_fwd, v3_6_smem_bytes<HEAD_DIM>(Br, Bc) + Bc * 128);
TILEATTN_SMEM_BYTES(v3_8_window_fwd, v3_6_smem_bytes<HEAD_DIM>(Br, Bc));

}  // namespace tileattn
