// dec_v4: dec_v3's producers (four warps of cp.async, arriving on the stage's mbarrier) with
// small stages that each belong to one consumer warp (DecTiles::WARP in dec_pipeline.cuh).
//
// dec_v3 reached 3.83 TB/s (H200, bf16, B=16, GQA 32:8, 16k keys, D=128), 85% of DRAM's peak by
// ncu, where cuDNN's decode kernel sustains 93%.  Its stages are 64 keys (35 KB) shared by all
// four consumer warps, three per block: a stage is ready when the last of its ~2,200 16-byte
// copies lands, and only two are in flight while the third is read.  Here a stage is 32 keys
// (17 KB at D=128) taken whole by one warp (tile n: warp n % 4, in stages of its own), 8 of them
// in one block per SM, each consumer waiting only for its own tile.  One block per SM also means
// one split where B x H_kv fills the SMs, so the block writes the output itself and the merge
// kernel does not run (num_splits = 1, dec_common.cuh).
//
// Measured (bench/NOTES.md): 4.07 TB/s at the shape above, 0.93x cuDNN; 32-64 keys per stage
// within 1% of each other, 16 keys 2% below.  At 16-token pages it runs at 0.86-0.91x its
// contiguous speed where dec_v3 keeps 0.97x (measured, not yet explained: both look the block
// table up per row), so serving.py hands pages shorter than a stage to dec_v3.  It also trails
// dec_v3 on many short sequences (B=64, 32 K/V heads, 1k keys: 0.95x), where one block per SM
// leaves more of each block's start-up exposed.
#include "dec_pipeline.cuh"

namespace tileattn {

constexpr int DEC4_PRODUCERS = 4;

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(32 * (DEC_CONSUMERS + DEC4_PRODUCERS)) dec_v4(TILEATTN_DEC_PARAMS(T)) {
  dec_pipeline<T, HEAD_DIM, Br, Bc, CAUSAL, DecCopy::CP_ASYNC, DEC4_PRODUCERS, DecTiles::WARP>(TILEATTN_DEC_ARGS);
}

TILEATTN_SMEM_BYTES(dec_v4, dec_pipe_smem(HEAD_DIM, Br, Bc, true));

}  // namespace tileattn
