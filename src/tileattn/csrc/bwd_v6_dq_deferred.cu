// bwd_v6: bwd_v5 with each Q block's dQ product issued one block later, so that the two consumer
// warpgroups no longer meet once per Q block.  fp16 / bf16, head dims 64 (Br = 128) and 128, sm_90a.
//
// Why: where the two warpgroups share dS (D=128, and D=64 at Br = 128), bwd_v5 multiplies dQ = dS K
// right after a named barrier that both reach once their own dS rows are written.  That meeting
// keeps them in step: both run their elementwise step (P^T, dS^T) at the same time, with the tensor
// core idle, then both queue their products at once.  ncu's source counters at D=128 (bf16 B=4
// H=16 N=8192, bench/NOTES.md): the consumers' largest stalls are the waits for their own products
// (15% of all warp samples between the S^T / dP^T and the dQ waits) and the barrier (5.6%).
// Here block n's dQ is issued in block n + 1, behind that block's dV and dK products: the other
// warpgroup's half of dS(n) has had a whole block to arrive, so the warpgroups may drift apart by
// up to about half a block and one's elementwise step runs under the other's products.  The
// meeting becomes two mbarriers per dS buffer: ds_full (all 256 consumer threads arrive once their
// rows are written; a warpgroup waits before it reads both halves) and ds_empty (arrive once the
// dQ product that read the buffer is complete; wait before writing it again, two blocks on).
// The registers in flight are bwd_v5's: block n - 1's dQ accumulators beside block n's dV / dK
// fragments, as block n's were.  bwd_v4_ws.cu holds the body (DEFER_DQ).
#include "bwd_v4_ws.cu"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(3 * BWD_V4_WG, 1)
    bwd_v6(TILEATTN_BWD_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  bwd_v4_body<T, HEAD_DIM, Br, Bc, CAUSAL, true, true>(TILEATTN_BWD_ARGS, &tmaps);
}

// bwd_v5's, and the two dS buffers' full / empty mbarriers.
TILEATTN_SMEM_BYTES(bwd_v6, bwd_v4_smem(HEAD_DIM, Br, Bc, true, true));

}  // namespace tileattn
