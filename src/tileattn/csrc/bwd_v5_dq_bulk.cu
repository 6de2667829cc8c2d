// bwd_v5: bwd_v4 with dQ added by the copy engine: each consumer warpgroup writes a Q block's dQ
// to shared memory and a producer warp adds the whole tile into dq_accum with one bulk reduction
// (cp.reduce.async.bulk .add.f32).  fp16 / bf16, head dims 64 and 128, sm_90a.
//
// Why: bwd_v4's dQ adds are 16 red.global.add.v2 a thread, 128 warp-wide REDG a CTA per Q block
// (at D=64 twice as many a key as at D=128: each warpgroup adds its own keys' part).  They queue
// in the load/store unit (ncu at 6ce5495, D=64: lg_throttle 1.14 and long_scoreboard 1.68 stall
// cycles per issued instruction, the latter on dQ's registers, which the next dQ product may
// overwrite only once every RED has read them; bench/results/profiles/ncu_pipes_bwd_v4_6ce5495.txt).
// Here a warpgroup's part of the block is eight 16-byte shared stores a thread, conflict-free, in
// the accumulator's own order; one thread of the producer warpgroup (warps 1 and 2, idle in
// bwd_v4) hands the 16 KB tile to the copy engine, waits until it has been read and frees the
// tile (mbarriers dq_full / dq_empty).  FlashAttention-3's backward adds dQ the same way (Shah et
// al. 2024).
//
// The price: dq_accum is blocked, (B, H, ceil(Nq / Br), Br x D) with each chunk in the
// accumulator's order, padded to whole Q blocks; backward.py's _dq_from_blocks permutes it back
// (and rounds it to the inputs' dtype) in the one copy every rung's accumulator already takes.
#include "bwd_v4_ws.cu"

namespace tileattn {

// The kernels of bwd_v4_ws.cu's body with the bulk dQ (registered in versions.py), each with its
// shared memory: bwd_v4's, and the two warpgroups' dQ tiles (32 KB: 226 KB at D=128) and their 4
// mbarriers.
#define TILEATTN_BWD_V5_KERNEL(kernel, VARLEN, VARIANTS)                                              \
  template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>                                    \
  __global__ void __launch_bounds__(3 * BWD_V4_WG, 1)                                                 \
      kernel(TILEATTN_BWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {                         \
    bwd_v4_body<T, HEAD_DIM, Br, Bc, CAUSAL, true, VARLEN, VARIANTS>(TILEATTN_BWD_ARGS, &tmaps);       \
  }                                                                                                   \
  TILEATTN_SMEM_BYTES(kernel, bwd_v4_smem(HEAD_DIM, Br, Bc, true))

TILEATTN_BWD_V5_KERNEL(bwd_v5, false, false);

// flash_attn_varlen_func's backward on Hopper: the same body over packed sequences in one launch
// (bwd_v4_ws.cu's VARLEN), where bwd_v2_varlen (mma.sync) ran before.  A CTA per (sequence's K/V
// block, head) from bwd_varlen_sequence, as bwd_v2_varlen's grid; the copy engine reads each
// sequence's rows of the packed tensors from its offsets (one map over all of them), and the
// consumers zero the rows a tile holds past its sequence.  dq_accum: per head, Q-block chunks
// numbered over every sequence as the K/V blocks are (bwd_common.cuh's varlen_block: sequence b's
// from (cu_seqlens_q[b] - cu_seqlens_q[0]) / Br + b on), which bwd_dq_convert reads back.  A
// kernel of its own so that the dense one keeps its registers and instructions; no tail split and
// no deterministic mode (serving's per-sequence fallback takes deterministic calls).
TILEATTN_BWD_V5_KERNEL(bwd_v5_varlen, true, false);

// The gradients of the score variants (a sliding window, softcap, ALiBi) on Hopper, dense and over
// packed sequences: the same body with the forward's scores rebuilt (bwd_wgmma.cuh's
// bwd_p_ds_variants), where bwd_v2_variants (mma.sync) ran before.  No deterministic mode (a
// window's K/V blocks do not all add into a Q block from j = 0, which the ordered adds wait for)
// and no tail split.
TILEATTN_BWD_V5_KERNEL(bwd_v5_variants, false, true);
TILEATTN_BWD_V5_KERNEL(bwd_v5_variants_varlen, true, true);

}  // namespace tileattn
