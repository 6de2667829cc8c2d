// 3xTF32 helpers shared by the FP32-accurate tensor-core rungs (v2.2 on mma.sync, v2.3 on wgmma).
//
// Each FP32 operand x is split as x = hi + lo with hi = x with its low 13 mantissa bits cleared
// (exactly representable in TF32) and lo = x - hi (exact in FP32; the tensor core truncates it to
// TF32, costing ~2^-21 relative).  a*b ~= hi_a*hi_b + hi_a*lo_b + lo_a*hi_b; the dropped
// lo_a*lo_b is ~2^-22 relative: three TF32 products per FP32 product, FP32-level error.
#pragma once

#include "mma.cuh"  // ldmatrix_x4

namespace tileattn {

// x = hi + lo, hi exactly representable in TF32 (low 13 mantissa bits cleared), lo = x - hi exact.
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// split_tf32 of a 16-byte vector's four values (the rungs' split passes).
__device__ __forceinline__ void split_tf32x4(const float4& x, uint4& hi, uint4& lo) {
  split_tf32(x.x, hi.x, lo.x);
  split_tf32(x.y, hi.y, lo.y);
  split_tf32(x.z, hi.z, lo.z);
  split_tf32(x.w, hi.w, lo.w);
}

// P*V without a shared-memory round trip: an S accumulator fragment holds keys 2t and 2t+1 of
// each 8-key block, the A fragment of the next product wants k-indices t and t+4.  The k index of
// P*V is a sum over keys, so any permutation works if V's rows follow it: k-index t <-> key 2t,
// k-index t+4 <-> key 2t+1.  This is the position of `key` (within its group of 8) in that order.
__device__ __forceinline__ int permuted_key(int key) { return (key & ~7) | ((key & 1) << 2) | ((key & 7) >> 1); }

// ---- mma.sync m16n8k8 TF32 (v2.2, bwd_v2.2) ----
// Fragment layouts (PTX ISA, mma.m16n8k8 .tf32; lane = 4*g + t, g = lane/4 in 0..7, t = lane%4):
//   A 16x8 (row-major):  a0 = (g, t)  a1 = (g+8, t)  a2 = (g, t+4)  a3 = (g+8, t+4)
//   B 8x8  (k x n):      b0 = (k=t, n=g)             b1 = (k=t+4, n=g)
//   C 16x8 (fp32):       c0 = (g, 2t)  c1 = (g, 2t+1)  c2 = (g+8, 2t)  c3 = (g+8, 2t+1)

__device__ __forceinline__ void mma_tf32_m16n8k8(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8x8 b16 matrices (= four 8x4 FP32 matrices) from shared memory (mma.cuh's ldmatrix_x4);
// lane L gives the address of row L%8 of matrix L/8 and receives word (L/4, L%4) of each matrix.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const float* row_ptr) {
  ldmatrix_x4(r, static_cast<unsigned>(__cvta_generic_to_shared(row_ptr)));
}

// N FP32 fragment values as TF32 hi (and, for 3xTF32, lo) registers.
template <int N, bool SPLIT>
struct Tf32Frag {
  unsigned hi[N], lo[N];
  __device__ __forceinline__ void set(int i, float x) {
    if (SPLIT) split_tf32(x, hi[i], lo[i]);
    else hi[i] = __float_as_uint(x);  // the tensor core truncates to TF32
  }
};

// An FP32 A fragment (4 values).
template <bool SPLIT>
struct FragA : Tf32Frag<4, SPLIT> {
  // An m16n8 C fragment (rows g, g + 8; columns 2t, 2t + 1) as the A fragment of the next product
  // (a0..a3 = c0, c2, c1, c3): column 2t lands at k = t and 2t + 1 at k = t + 4, a permutation of
  // the 8 keys of the k-step that the B operand's rows must follow (v2.2's P V, bwd_v2.2's dQ).
  __device__ __forceinline__ void set_from_c(const float (&c)[4]) {
    this->set(0, c[0]);
    this->set(1, c[2]);
    this->set(2, c[1]);
    this->set(3, c[3]);
  }
};

// c += a*b with FP32 operands: 3 TF32 products (SPLIT) or 1.  b_hi/b_lo are pre-split B fragments.
template <bool SPLIT>
__device__ __forceinline__ void mma_fp32(float (&c)[4], const FragA<SPLIT>& a, const unsigned (&b_hi)[2],
                                         const unsigned (&b_lo)[2]) {
  if (SPLIT) {  // the small terms first
    mma_tf32_m16n8k8(c, a.lo, b_hi);
    mma_tf32_m16n8k8(c, a.hi, b_lo);
  }
  mma_tf32_m16n8k8(c, a.hi, b_hi);
}

// An FP32 B fragment (2 values).
template <bool SPLIT>
using FragB = Tf32Frag<2, SPLIT>;

}  // namespace tileattn
