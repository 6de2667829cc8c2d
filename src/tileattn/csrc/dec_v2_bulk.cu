// dec_v2: split-KV decoding on Hopper (sm_90+): dec_v1's rows, splits and merges
// (dec_common.cuh) in a warp-specialised pipeline (dec_pipeline.cuh), the K/V rows moved by the
// copy engine instead of by the computing warps.
//
// Decode reads every K/V byte once and does ~2 FLOPs per byte of it, so the kernel is a copy whose
// speed is set by how many bytes are in flight per SM.  dec_v1's warps gather 16 bytes per
// cp.async per thread and keep one tile ahead each: 1.3 TB/s at B=16, GQA 32:8, 16k keys
// (H200).  Here one producer warp issues one cp.async.bulk per K or V row (any row of a
// contiguous or paged cache: no tensor map, so page size 1 works as well as 256), STAGES tiles
// ahead of four consumer warps: 2.0 TB/s, and no higher at any size measured, with two blocks per
// SM and up to six tiles (192 KB) in flight per SM.  The rate of 256-byte bulk copies, not the
// bytes in flight, is the limit (bench/NOTES.md); dec_v3 moves the same rows with cp.async.
#include "dec_pipeline.cuh"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(32 * (DEC_CONSUMERS + 1)) dec_v2(TILEATTN_DEC_PARAMS(T)) {
  dec_pipeline<T, HEAD_DIM, Br, Bc, CAUSAL, DecCopy::BULK, 1>(TILEATTN_DEC_ARGS);
}

TILEATTN_SMEM_BYTES(dec_v2, dec_pipe_smem(HEAD_DIM, Br, Bc));

}  // namespace tileattn
