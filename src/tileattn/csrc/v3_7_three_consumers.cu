// v3.7: v3.6 at D=64 with three consumer warpgroups (Br = 192) in place of the ping-pong (sm_90a).
//
// Why (v3.6 at D=64, measured on an H200, bf16: 0.82-0.88x cuDNN against 0.90-1.00x at D=128):
// at D=64 a 64 x 128 block of scores costs the SFU as long as its two GEMMs cost the tensor core
// (one MUFU.EX2 a score at 16 a clock per SM, 256 FLOPs a score at ~4096 a clock), so the tensor
// core idles whenever both of v3.6's consumer warpgroups are in their softmax at once, and the
// ping-pong can only order two.  Here:
//  * Three consumer warpgroups of 64 query rows share each K/V block (Br = 192, as
//    FlashAttention-3 chooses at D <= 64): a third warpgroup's GEMMs are ready to issue while
//    the other two run their softmax, and every K/V block loaded feeds 1.5x the rows.
//  * 512 threads: the consumers get 160 registers each (32 + 3 * 160 = 512, the CTA's pool; the
//    producer keeps 32 for the causal walk's sorted tail, common.cuh), enough at D = 64 (S 64,
//    O 32, P 32 registers); at D = 128 a 192 x 128 tile spills 232 bytes, a 192 x 64 tile none
//    (NVRTC 13.0; not yet timed).
//  * No ping-pong (it orders two warpgroups); the main loop's P V wait stays pinned behind the
//    exponentials, as in v3.3 at D = 64.
//  * Everything else is v3.6: persistent CTAs over persistent_tile's order, the K/V pipeline
//    running across tiles, Q's empty barrier.
// Measured on an H200 (bf16, H=16, B*N = 32768, against v3.6 and cuDNN in the same run,
// bench/results/sweeps/mma_v3.7_d18257b.json): 1.06-1.16x v3.6 without a mask (1.02x cuDNN at
// N = 8192 and 32768).  Causal, with persistent_tile's middles-last order for v3.7's odd Tr
// (sweeps/mma_middles_last_96c6cdf.json): 1.04x v3.6 at N = 2048, 1.07-1.13x from 4096, but 0.91x
// at N = 1024, where a 192-row block's diagonal spans two 128-key blocks and more of the computed
// scores are masked; so the default dispatch keeps v3.6 for causal calls under
// versions.SHORT_CAUSAL_ROWS query rows.
#include "v3_3_wgmma.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1) v3_7_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, false, /*PINGPONG=*/false, /*PERSISTENT=*/true>(TILEATTN_FWD_ARGS, &tmaps);
}

// v3.6's layout (v3_6_smem_bytes): Q (192 rows), 2 stages of K and V, 10 mbarriers and O's stage.
TILEATTN_SMEM_BYTES(v3_7_fwd, v3_6_smem_bytes<HEAD_DIM>(Br, Bc));

// The score variants on the same walk (versions.V3_7_VARIANTS: flash_attn_func's dense calls at
// D = 64 with ALiBi alone, where the plain dispatch would take v3.7), the P V wait pinned behind
// the exponentials as in v3_7_fwd.  Measured on an H200 against v3.6's variants kernel (Br = 128,
// no ping-pong; scripts/variants_probe.py, bf16 causal N=8192, two runs, bench/NOTES.md): ALiBi
// 0.817x -> 0.881-0.890x of plain causal time, nothing on 0.962x -> 0.968-0.971x.  The others
// stay on v3.6's variants kernel: window 4096 went 1.206x -> 1.134-1.147x (each tile's 192-row
// diagonal a larger share of its fewer blocks), softcap 0.731x -> 0.663-0.673x (its two MUFU a
// score, tanh and exp2, make the SFU the limit, and a third warpgroup's softmax only queues there).
template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(v3_3_threads(Br), 1)
    v3_7_variants_fwd(TILEATTN_FWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  v3_3_body<T, HEAD_DIM, Br, Bc, CAUSAL, /*VARIANTS=*/true, /*PINGPONG=*/false, /*PERSISTENT=*/true>(TILEATTN_FWD_ARGS,
                                                                                                    &tmaps);
}

TILEATTN_SMEM_BYTES(v3_7_variants_fwd, v3_6_smem_bytes<HEAD_DIM>(Br, Bc));

}  // namespace tileattn
