// v3.9: a causal sliding window (Mistral's, Gemma's) on the plain causal kernel's walk.
//
// Why: the window runs on the variants kernels (v3.6 / v3.7 _variants), which carry softcap's and
// ALiBi's run-time branches and state beside it: a window of 4096 keys at 0.87x (D=64) / 0.90x
// (D=128) of plain causal's rate at the same work (H100, bench/results/variants_h100.json at
// e641033).  Under a causal mask the window adds only a left edge:
//  * the walk's first block is the window's (j_lo from window_left, as the variants kernels'), so
//    blocks left of every row's window are skipped, not masked;
//  * the blocks that cross the left edge (two or three a Q block) mask the keys left of each
//    row's window (mma.cuh fragment_window_left) and take the ordinary softmax; every other block
//    is the plain kernel's, the speculative softmax included (v3_3_wgmma.cu).
// The tiles are plain causal's (versions.V3_9_WINDOW), as v3.8's: v3.7's three consumer
// warpgroups (Br = 192) at D = 64, v3.6's (128, 128) at D = 128.  Why three at D = 64: v3.6's
// plain kernel runs at 0.90x of v3.7's there (ncu at e641033,
// bench/results/profiles/ncu_softcap_xu_e641033_h100.txt), and a window at (128, 128) on the
// plain kernel was no faster than the variants kernel (the thirty-first session's
// v3_8_window_fwd).  Counted for N=8192 with a 4096-key window, the useful share of the scores
// computed at 192 x 128 is 0.971x plain causal's (0.985x at 128 x 128) and 11.7% of the blocks
// take the mask (6.0% under plain causal): about 0.95x of plain causal is the estimate.  (v3.7's
// variants kernel ran the window 0.94x as fast as v3.6's at 15eef2d; it pays for softcap's and
// ALiBi's branches on every block.)  Measured on an H100 (scripts/variants_probe.py, bf16 B=2
// H=16 N=8192, a 4096-key window; bench/results/sweeps/window_v3_9_probe_997296a_h100.log):
// 0.508 / 0.693 ms at D = 64 / 128 against the variants kernel's 0.512 / 0.704, i.e. 0.88x /
// 0.91x of plain causal at the same work, short of the estimate; the default for a causal window
// alone since (serving._packed_path).
#include "v3_3_wgmma.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1)
    v3_9_window_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*VARIANTS=*/false, /*PINGPONG=*/false,
            /*PERSISTENT=*/true, /*ALIBI=*/false, /*WINDOW=*/true>(TILEATTN_FWD_ARGS, &tmaps);
}

TILEATTN_SMEM_BYTES(v3_9_window_fwd, v3_6_smem_bytes<HEAD_DIM>(Br, Bc));

}  // namespace tileattn
