// dec_v3: dec_v2's warp-specialised decode pipeline (dec_pipeline.cuh) with four producer warps
// moving the K/V rows by cp.async, 16 bytes per thread, instead of one warp issuing a bulk copy
// per row.  dec_v2 stopped at 2.0 TB/s (H200) with ~190 KB in flight per SM: the copy engine's
// rate for 256-byte copies, not the bytes in flight, limited it.  cp.async has no per-copy
// engine cost; each producer thread's copies arrive on the stage's full mbarrier when they land
// (cp.async.mbarrier.arrive.noinc), so the consumers still wait on one barrier per tile and the
// producers never wait for their own copies.  Any page size, any strides, as dec_v2.
#include "dec_pipeline.cuh"

namespace tileattn {

constexpr int DEC3_PRODUCERS = 4;

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(32 * (DEC_CONSUMERS + DEC3_PRODUCERS)) dec_v3(TILEATTN_DEC_PARAMS(T)) {
  dec_pipeline<T, HEAD_DIM, Br, Bc, CAUSAL, DecCopy::CP_ASYNC, DEC3_PRODUCERS>(TILEATTN_DEC_ARGS);
}

TILEATTN_SMEM_BYTES(dec_v3, dec_pipe_smem(HEAD_DIM, Br, Bc));

}  // namespace tileattn
