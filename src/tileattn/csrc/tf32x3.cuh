// 3xTF32 helpers shared by the FP32-accurate tensor-core rungs (v2.2 on mma.sync, v2.3 on wgmma).
//
// Each FP32 operand x is split as x = hi + lo with hi = x with its low 13 mantissa bits cleared
// (exactly representable in TF32) and lo = x - hi (exact in FP32; the tensor core truncates it to
// TF32, costing ~2^-21 relative).  a*b ~= hi_a*hi_b + hi_a*lo_b + lo_a*hi_b; the dropped
// lo_a*lo_b is ~2^-22 relative: three TF32 products per FP32 product, FP32-level error.
#pragma once

namespace tileattn {

// x = hi + lo, hi exactly representable in TF32 (low 13 mantissa bits cleared), lo = x - hi exact.
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// P*V without a shared-memory round trip: an S accumulator fragment holds keys 2t and 2t+1 of
// each 8-key block, the A fragment of the next product wants k-indices t and t+4.  The k index of
// P*V is a sum over keys, so any permutation works if V's rows follow it: k-index t <-> key 2t,
// k-index t+4 <-> key 2t+1.  This is the position of `key` (within its group of 8) in that order.
__device__ __forceinline__ int permuted_key(int key) { return (key & ~7) | ((key & 1) << 2) | ((key & 7) >> 1); }

}  // namespace tileattn
