// dec_v5: dec_v4's stages, each taken whole by one consumer warp, filled by the copy engine's
// tensor copies (TMA) instead of four warps of cp.async.
//
// dec_v4 reached 4.07 TB/s (H200, bf16, B=16, GQA 32:8, 16k keys, D=128), 0.93x cuDNN, with no
// sensitivity left to the stage size or the number of stages (bench/NOTES.md): the copies
// themselves are what is left.  There, 128 producer threads issue 16-byte cp.async (1,024 per
// 32-key stage, each with its own address arithmetic and a trip through the LSU and L1).  Here
// one thread issues four tensor copies per stage (K and V, two 64-column panels each at D=128),
// the copy engine walks the rows, and the stage lands in SwizzledTile's 128-byte swizzle, so
// ldmatrix stays conflict-free without the row padding (12 stages of 16 KB instead of 8 of 17).
// dec_v2 showed the copy engine slow at one 256-byte bulk copy per row; a tensor copy moves 32
// rows at once.
//
// A tensor copy takes Bc consecutive rows of one batch or one page, so dec_v5 serves contiguous
// caches and pages of a multiple of Bc rows (serving.py hands other page sizes to dec_v4 / dec_v3),
// and its tiles start at multiples of Bc.
#include "dec_pipeline.cuh"

namespace tileattn {

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(32 * (DEC_CONSUMERS + 1))
    dec_v5(TILEATTN_DEC_PARAMS(T), const __grid_constant__ TmaMaps tmaps) {
  dec_pipeline<T, HEAD_DIM, Br, Bc, CAUSAL, DecCopy::TMA, 1, DecTiles::WARP>(TILEATTN_DEC_ARGS, &tmaps);
}

TILEATTN_SMEM_BYTES(dec_v5, dec_pipe_smem(HEAD_DIM, Br, Bc, true, true));

}  // namespace tileattn
