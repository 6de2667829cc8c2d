// v3.8: causal ALiBi on the tensor core, its K/V blocks from the diagonal leftwards.
//
// Why: ALiBi adds -slope |pos - j| to each score.  The variants kernels (v3.6 / v3.7 _variants)
// spend one FFMA a score on it (fragment_alibi_keys) and carry the variants' code for the window
// and softcap, and ran 0.88x (D=64) and 0.93x (D=128) of plain causal's rate on an H200
// (bench/results/variants.json): the softmax's instructions, not the tensor core, bound them.
// Under a causal mask every key a row sees is at or left of it, so the bias is slope (j - pos)
// = slope_s c + slope_s (kv_start - first_pos) + slope_s (first_pos - pos) in S's units
// (slope_s = slope / scale; c = j - kv_start, the key's column in its block):
//  * slope_s c, the only term that varies along a row, is one more k16 step of S = Q K^T: A's
//    row is (hi, mid, lo, 0 ...), slope_s split into three bf16 terms (registers, per head), and
//    B a constant table whose row c is (c, c, c, 0 ...) in shared memory (v3_3_wgmma.cu,
//    alibi_key_table / alibi_slope_fragment).  bf16 whatever the inputs' dtype: fp16 could not
//    hold the slope of a tiny scale.  At D = 64 it adds a quarter to S's MMAs, an eighth to the
//    tile's; at D = 128 half that.
//  * The block's term joins the row max and the exponent's per-row constant
//    (fragment_online_softmax's OFFSET, as the variants kernels' ALiBi), and the row's own term
//    leaves m_i before lse is written: no instruction a score.
// The rest is the plain causal kernel: v3.7's three consumers at D = 64, v3.6's two at D = 128
// (neither takes v3.6's ping-pong, which is D = 64 at Br = 128).  Causal ALiBi alone; with a
// window or softcap, or without a causal mask (|pos - j| is not linear across the diagonal),
// serving.attention_variants keeps the variants kernels.
// Measured (H100, bf16 B=2 H=16 N=8192, time as a ratio to plain causal's, four calls,
// bench/NOTES.md): 0.90-0.92x at D = 64 and 0.93-0.94x at D = 128, against 0.85-0.88x and
// 0.90-0.92x for the variants kernels in the same calls.  The time grows by about the step's
// share of the MMAs (+9-11% / +7%): the step sits on S's path to the softmax.
//  * Then (the fortieth session) the walk from the diagonal leftwards with the speculative
//    softmax (v3_3_wgmma.cu, REVERSE): the bias falls along that walk, so the
//    diagonal block's row max holds and the check passes.  0.864x -> 0.970x at D = 64, 0.875x ->
//    0.954x at D = 128 in one process (H100, the same shape).
#include "v3_3_wgmma.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1)
    v3_8_alibi_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*VARIANTS=*/false, /*PINGPONG=*/false,
            /*PERSISTENT=*/true, /*ALIBI=*/true>(TILEATTN_FWD_ARGS, &tmaps);
}

// v3.6's carve-up, then the key table (Bc rows of 128 bytes, 1024-byte aligned: O's stage is
// whole kilobytes).
TILEATTN_SMEM_BYTES(v3_8_alibi_fwd, v3_6_smem_bytes<HEAD_DIM>(Br, Bc) + Bc * 128);

}  // namespace tileattn
