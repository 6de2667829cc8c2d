// The 3xFP16 rungs' operands (bwd_v2_3_fp16x3.cu, v2_4_wgmma_fp16x3.cu): one FP32 tensor (q, k, v
// or dO) as x 2^e = hi + lo in fp16 (mma.cuh's split_exponent, split_half2), an exponent per
// block of 64 rows, both halves and the block's max |x| written in one pass; the rungs derive the
// same exponents from the same maxima.
//
// Why a kernel: the split in torch ops (scale, round, subtract, round) took about eight passes
// over the tensor and three temporaries of its size; here each thread reads its floats once (16-byte
// loads) and writes their hi and lo halves by 16-byte stores.
#pragma once

#include "common.cuh"
#include "mma.cuh"

namespace tileattn {

constexpr int SPLIT_THREADS = 256;

// 8 floats times scale as hi + lo fp16: hi at out, lo at out + lo_offset, one 16-byte store each.
__device__ __forceinline__ void split_store8(float4 x0, float4 x1, float scale, __half* out, long long lo_offset) {
  uint4 hi, lo;
  split_half8(x0, x1, scale, hi, lo);
  // (st.global.v4: written as uint4 assignments, nvcc split the hi store into four 4-byte ones.)
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(out), "r"(hi.x), "r"(hi.y), "r"(hi.z), "r"(hi.w));
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(out + lo_offset), "r"(lo.x), "r"(lo.y), "r"(lo.z),
               "r"(lo.w));
}

// src: (B, H, N, D) float32, any strides with a contiguous head dim and 16-byte aligned rows;
// dst: (B, 2 H, N, D) fp16 contiguous (head h's hi at h, its lo at H + h).  A CTA takes one block
// of SPLIT_BLOCK_ROWS rows of one (b, h), finds its max |x| (written to amax[b amax_sb + h
// ceil(N / 64) + block], where the rungs read it) and splits the block under its own exponent.
// One pass, where an exponent per tensor needs the tensor's maximum first (a second read of it:
// 0.427 -> 0.358 ms for v2.4 at B=32, H=8, N=1024, D=64, causal, on an H200); and a block of small
// values keeps its bits when another block of the tensor holds large ones.  Rows past N are
// neither read nor written (the rungs' TMA copies fill them with zeros).
// Grid: B H ceil(N / 64) blocks (x only).
#define TILEATTN_SPLIT_BLOCKS_FIELDS(X, SEP)                                                      \
  X(const float* __restrict__, src) SEP X(__half* __restrict__, dst) SEP X(float* __restrict__, amax) SEP \
  X(const long long, amax_sb) SEP X(const int, H) SEP X(const int, N) SEP X(const long long, s_sb) SEP      \
  X(const long long, s_sh) SEP X(const long long, s_sn)

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(SPLIT_THREADS)
    split_blocks(TILEATTN_SPLIT_BLOCKS_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)) {
  constexpr int CHUNKS = HEAD_DIM / 8;                            // 8 floats: two 16-byte loads
  constexpr int PER = SPLIT_BLOCK_ROWS * CHUNKS / SPLIT_THREADS;  // chunks a thread (D / 32)
  const int TB = (N + SPLIT_BLOCK_ROWS - 1) / SPLIT_BLOCK_ROWS;
  const int blk = (int)(blockIdx.x % TB);
  const long long bh = blockIdx.x / TB;
  const int h = (int)(bh % H);
  const long long b = bh / H;
  float4 x[PER][2];
  const int n0 = blk * SPLIT_BLOCK_ROWS;
  float m = split_load_rows<HEAD_DIM, SPLIT_THREADS>(src + b * s_sb + h * s_sh + n0 * s_sn, s_sn, N - n0, threadIdx.x, x);
  __shared__ float warp_max[SPLIT_THREADS / 32];
  m = split_group_max<SPLIT_THREADS>(m, warp_max, threadIdx.x, [] { __syncthreads(); });
  if (threadIdx.x == 0) amax[b * amax_sb + h * TB + blk] = m;
  const float scale = scalbnf(1.0f, split_exponent(m));
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    const int i = p * SPLIT_THREADS + threadIdx.x, n = n0 + i / CHUNKS, c = 8 * (i % CHUNKS);
    if (n < N)
      split_store8(x[p][0], x[p][1], scale, dst + ((b * 2 * H + h) * N + n) * HEAD_DIM + c, (long long)H * N * HEAD_DIM);
  }
}
TILEATTN_SMEM_BYTES(split_blocks, 0);

}  // namespace tileattn
