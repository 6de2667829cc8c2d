// The 3xFP16 rungs' operands (bwd_v2_3_fp16x3.cu, v2_4_wgmma_fp16x3.cu): one FP32 tensor (q, k, v
// or dO) as x 2^e = hi + lo in fp16 (mma.cuh's split_exponent, split_half2), both halves written
// in one pass; the rungs derive the same exponents from the same maxima.
//
// Why a kernel: the same split in torch ops (scale, round, subtract, round) took about eight
// passes over the tensor and three temporaries of its size; here each thread reads 8 floats (two
// 16-byte loads) once and writes their hi and lo halves as one 16-byte store each.
#pragma once

#include "common.cuh"
#include "mma.cuh"

namespace tileattn {

// src: (B, H, N, D) float32, any strides with a contiguous head dim and 16-byte aligned rows;
// dst: (B, 2 H, N, D) fp16 contiguous (head h's hi at h, its lo at H + h); amax[which]: src's
// largest |x| (api._split_halves); rows = B H N.  Grid: ceil(rows D / 8 / SPLIT_THREADS) blocks (x only).
#define TILEATTN_SPLIT_FIELDS(X, SEP)                                                                \
  X(const float* __restrict__, src) SEP X(__half* __restrict__, dst) SEP                          \
  X(const float* __restrict__, amax) SEP X(const int, which) SEP X(const int, H) SEP X(const int, N) SEP \
  X(const long long, rows) SEP X(const long long, s_sb) SEP X(const long long, s_sh) SEP          \
  X(const long long, s_sn)
constexpr int SPLIT_THREADS = 256;

template <typename T, int HEAD_DIM, int Br, int Bc, bool CAUSAL>
__global__ void __launch_bounds__(SPLIT_THREADS) bwd_split(TILEATTN_SPLIT_FIELDS(TILEATTN_DECLARE_, TILEATTN_COMMA_)) {
  static_assert(HEAD_DIM % 8 == 0, "whole 32-byte chunks a row");
  constexpr int CHUNKS = HEAD_DIM / 8;  // 8 floats a thread: two 16-byte loads, a 16-byte store a half
  const long long i = (long long)blockIdx.x * SPLIT_THREADS + threadIdx.x;
  if (i >= rows * CHUNKS) return;
  const long long row = i / CHUNKS;
  const int c = 8 * (int)(i % CHUNKS), n = (int)(row % N), h = (int)(row / N % H);
  const long long b = row / N / H;
  const float scale = scalbnf(1.0f, split_exponent(amax[which]));  // exact: a power of two
  const float4* x = reinterpret_cast<const float4*>(src + b * s_sb + h * s_sh + n * s_sn + c);
  const float4 x0 = x[0], x1 = x[1];
  uint4 hi, lo;
  split_half2(x0.x * scale, x0.y * scale, hi.x, lo.x);
  split_half2(x0.z * scale, x0.w * scale, hi.y, lo.y);
  split_half2(x1.x * scale, x1.y * scale, hi.z, lo.z);
  split_half2(x1.z * scale, x1.w * scale, hi.w, lo.w);
  __half* const out = dst + ((b * 2 * H + h) * N + n) * HEAD_DIM + c;
  // (st.global.v4: written as uint4 assignments, nvcc split the hi store into four 4-byte ones.)
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(out), "r"(hi.x), "r"(hi.y), "r"(hi.z), "r"(hi.w));
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(out + (long long)H * N * HEAD_DIM), "r"(lo.x),
               "r"(lo.y), "r"(lo.z), "r"(lo.w));
}
TILEATTN_SMEM_BYTES(bwd_split, 0);

}  // namespace tileattn
