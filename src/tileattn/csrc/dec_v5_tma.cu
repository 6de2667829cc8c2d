// dec_v5: dec_v4's stages, each taken whole by one consumer warp, filled by the copy engine's
// tensor copies (TMA) instead of four warps of cp.async.
//
// dec_v4 reached 4.07 TB/s (H200, bf16, B=16, GQA 32:8, 16k keys, D=128), 0.93x cuDNN, with no
// sensitivity left to the stage size or the number of stages (bench/NOTES.md): the copies
// themselves are what is left.  There, 128 producer threads issue 16-byte cp.async (1,024 per
// 32-key stage, each with its own address arithmetic and a trip through the LSU and L1).  Here
// one thread per consumer warp issues a tensor copy per 64-column panel of K and of V (four per
// 64-key stage at D=128) for that warp's tiles, the copy engine walks the rows, and the stage lands in SwizzledTile's 128-byte
// swizzle, so ldmatrix stays conflict-free without the row padding.  dec_v2 showed the copy
// engine slow at one 256-byte bulk copy per row; a tensor copy moves a whole tile's rows.
// Measured (scripts/decode_sweep.py, the shape above): 4.18-4.29 TB/s, 0.97-0.98x cuDNN of the
// same run.
//
// A tensor copy takes consecutive rows of one batch or one page, so dec_v5 serves contiguous
// caches, pages of a multiple of its tile (its tiles start at multiples of Bc) and pages of 8,
// 16 or 32 rows (one copy per page, several per tile); serving.py hands other page sizes to
// dec_v4 / dec_v3.  Each producer is one thread, and its per-copy integer work shows (one thread
// for all four warps held 16-row pages to 0.86-0.91x of contiguous, four reach 0.97x): it looks
// the block table up eight copies ahead and never divides by the page size in the loop.
#include "dec_pipeline.cuh"

namespace tileattn {

constexpr int DEC5_PRODUCERS = 4;  // one per consumer warp, each lane 0 issuing that warp's tiles

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(32 * (DEC_CONSUMERS + DEC5_PRODUCERS))
    dec_v5(TILEATTN_DEC_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  dec_pipeline<T, HEAD_DIM, Br, Bc, CAUSAL, DecCopy::TMA, DEC5_PRODUCERS, DecTiles::WARP>(TILEATTN_DEC_ARGS, &tmaps);
}

TILEATTN_SMEM_BYTES(dec_v5, dec_pipe_smem(HEAD_DIM, Br, Bc, true, true));

}  // namespace tileattn
