// bwd_v5's (and bwd_v6's) dQ, from its blocked float32 accumulator to the gradient in the
// caller's layout and dtype: one thread block per 64 x 64 tile (FlashAttention-3's and cuDNN's backwards end with the
// same kind of pass: cuDNN's convert_dq_to_16bits ran 54 us at D=64, B=4 H=16 N=8192 on an H200).
//
// The accumulator (bwd_v5_dq_bulk.cu): per (batch, head), its padded query rows as 64-row strips,
// each strip as D / 64 tiles of 64 columns, each tile's 4096 floats in the wgmma accumulator's order
// [n8][warp][g][t][hh][e]: value 2 hh + e of thread 32 warp + 4 g + t's 8-column group n8 is row
// 16 warp + 8 hh + g, column 8 n8 + 2 t + e (PTX ISA, "wgmma ... register fragment").  Whatever the
// rung's Br, tile i of a (batch, head) is rows 64 (i / (D / 64)).., columns 64 (i % (D / 64))..
//
// Why a kernel: torch's copy of the same permutation (an 11-dimensional view whose innermost run is
// two floats) moved it at a fraction of the copy bandwidth.  Here the reads are 16-byte and
// coalesced, the tile is put in row order in shared memory (rows of DQC_ROW floats: the float2
// stores of a half-warp, rows g = 0..3 by columns 2 t, fall in 32 different banks), and each thread
// writes 8 consecutive columns of a row as one 16-byte store (two for float32 gradients).
#pragma once

#include "bwd_common.cuh"  // varlen_block
#include "common.cuh"
#include "mma.cuh"

namespace tileattn {

// dq: the gradient, T (the inputs' dtype, or float32 for float32 gradients), any strides with a
// contiguous head dim and 16-byte aligned rows; tiles_per_bh: the accumulator's tiles per
// (batch, head), its padded rows / 64 x D / 64.  Grid: B * H * tiles_per_bh blocks (x only: no
// 65535 limit on B * H).  cu_seqlens_q non-null (bwd_v5_varlen, a batch of one): the head's
// chunks of chunk_rows (the rung's Br) rows are numbered over num_seqs packed sequences
// (bwd_common.cuh's varlen_block), and a chunk's rows go to its sequence's rows of dq, those past
// the sequence nowhere.
#define TILEATTN_DQC_FIELDS(X, SEP)                                                          \
  X(const float* __restrict__, dq_accum) SEP X(T* __restrict__, dq) SEP X(const int, Nq) SEP \
  X(const int, H) SEP X(const int, tiles_per_bh) SEP X(const long long, dq_sb) SEP         \
  X(const long long, dq_sh) SEP X(const long long, dq_sn) SEP                              \
  X(const int* __restrict__, cu_seqlens_q) SEP X(const int, num_seqs) SEP X(const int, chunk_rows)
constexpr int DQC_THREADS = 256, DQC_ROW = 72;

// Eight floats -> eight T at dst (16-byte aligned), as one 16-byte store (two for float).
template <typename T>
__device__ __forceinline__ void store8(T* dst, float4 a, float4 b) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4*>(dst)[0] = a;
    reinterpret_cast<float4*>(dst)[1] = b;
  } else {
    *reinterpret_cast<uint4*>(dst) = make_uint4(pack2<T>(a.x, a.y), pack2<T>(a.z, a.w), pack2<T>(b.x, b.y),
                                                pack2<T>(b.z, b.w));
  }
}

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(DQC_THREADS) bwd_dq_convert(TILEATTN_DQC_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)) {
  static_assert(HEAD_DIM % 64 == 0, "whole 64-column tiles (bwd_v5's head dims)");
  constexpr int WC = HEAD_DIM / 64;
  __shared__ __align__(16) float tile[64 * DQC_ROW];
  const long long bh = blockIdx.x / tiles_per_bh;
  const int i_tile = blockIdx.x % tiles_per_bh, col0 = 64 * (i_tile % WC);
  // The strip's first row of dq (dst's row 0 below) and its rows there.
  int row0 = 64 * (i_tile / WC), rows = Nq - row0;
  if (cu_seqlens_q) {  // chunk row0 / chunk_rows: its sequence and first row in it
    int first;
    const int b = varlen_block(cu_seqlens_q, num_seqs, row0 / chunk_rows, chunk_rows, first);
    first += row0 % chunk_rows;
    rows = cu_seqlens_q[b + 1] - cu_seqlens_q[b] - first;
    row0 = cu_seqlens_q[b] + first;
    if (rows <= 0) return;  // a chunk's padding past its sequence (uniform over the block)
  }
  const float4* src = reinterpret_cast<const float4*>(dq_accum) + (long long)blockIdx.x * 1024;
#pragma unroll
  for (int i = threadIdx.x; i < 1024; i += DQC_THREADS) {  // i = ((n8 * 4 + warp) * 8 + g) * 4 + t
    const float4 x = src[i];
    const int r = 16 * (i / 32 % 4) + i / 4 % 8, c = 8 * (i / 128) + 2 * (i % 4);
    *reinterpret_cast<float2*>(tile + r * DQC_ROW + c) = make_float2(x.x, x.y);  // hh = 0
    *reinterpret_cast<float2*>(tile + (r + 8) * DQC_ROW + c) = make_float2(x.z, x.w);  // hh = 1
  }
  __syncthreads();
  T* dst = dq + bh / H * dq_sb + bh % H * dq_sh + col0;
#pragma unroll
  for (int i = threadIdx.x; i < 64 * 8; i += DQC_THREADS) {
    const int r = i / 8, c = 8 * (i % 8);
    if (r >= rows) continue;  // the strip's padding past the last query row (of its sequence)
    const float* s = tile + r * DQC_ROW + c;
    store8(dst + (row0 + r) * dq_sn + c, *reinterpret_cast<const float4*>(s), *reinterpret_cast<const float4*>(s + 4));
  }
}
TILEATTN_SMEM_BYTES(bwd_dq_convert, 0);

}  // namespace tileattn
