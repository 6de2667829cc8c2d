// Helpers shared by every rung: the uniform kernel signature, per-head addressing,
// cp.async wrappers and the -inf guards of the online softmax.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace tileattn {

// NVRTC ships no <cmath>, so INFINITY is undefined; this is the IEEE bit pattern of +inf.
#define TILEATTN_NEG_INF (-__int_as_float(0x7f800000))
// log2(e): rungs that use exp2 fold it into softmax_scale once, on the host side of the loop.
#define TILEATTN_LOG2E 1.4426950408889634f

// The TMA descriptors of the rungs that load tiles through the copy engine (v3.2, v3.3): six
// 128-byte CUtensorMaps, q, k, v with 64-column boxes, then q, k, v with the narrow last panel's
// box (mma.cuh: tma_tile_load).  They travel by value as one `const __grid_constant__` kernel
// parameter: the copy engine reads them from the launch's own parameter space, so no device buffer
// exists that a later call could free or overwrite while this kernel (or a CUDA graph) still runs.
// 64-byte alignment is what cp.async.bulk.tensor requires of a tensor map.
struct alignas(64) TmaMaps {
  unsigned long long desc[6][16];
};

// Every rung's kernel takes exactly these arguments, in this order (api.py builds them once).
// Strides are in elements; the last dim (head dim) is contiguous.  h_per_kv = H / H_kv (GQA);
// query row i of a head sees key j iff j <= i + causal_offset (0: top-left, Nk - Nq: bottom-right).
// bh_offset lets the host split B*H over several launches when it exceeds gridDim.y's 65535.
#define TILEATTN_FWD_PARAMS(T)                                                             \
  const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,               \
  T* __restrict__ o, float* __restrict__ lse, float* __restrict__ workspace,               \
  const int Nq, const int Nk, const int H, const int h_per_kv,                             \
  const long long q_sb, const long long q_sh, const long long q_sn,                        \
  const long long k_sb, const long long k_sh, const long long k_sn,                        \
  const long long v_sb, const long long v_sh, const long long v_sn,                        \
  const long long o_sb, const long long o_sh, const long long o_sn,                        \
  const float softmax_scale, const int causal_offset, const int bh_offset

// The same arguments, passed on (a kernel entry calling a shared __device__ body).
#define TILEATTN_FWD_ARGS                                                                  \
  q, k, v, o, lse, workspace, Nq, Nk, H, h_per_kv, q_sb, q_sh, q_sn, k_sb, k_sh, k_sn, v_sb,  \
      v_sh, v_sn, o_sb, o_sh, o_sn, softmax_scale, causal_offset, bh_offset

// Base pointers of one (batch, head) slice.  lse is laid out (B, H, Nq), contiguous.
template <typename T>
struct HeadSlice {
  const T* q; const T* k; const T* v; T* o; float* lse;
};

#define TILEATTN_HEAD_SLICE(T, bh)                                                         \
  [&]() {                                                                                  \
    const int b_ = (bh) / H, h_ = (bh) % H, hk_ = h_ / h_per_kv;                           \
    return tileattn::HeadSlice<T>{q + b_ * q_sb + h_ * q_sh, k + b_ * k_sb + hk_ * k_sh,   \
                                  v + b_ * v_sb + hk_ * v_sh, o + b_ * o_sb + h_ * o_sh,   \
                                  lse + (long long)(bh) * Nq};                             \
  }()

// The Q block a q_outer CTA takes: with a causal mask the later blocks have more keys to see,
// so they are launched first (block x = gridDim.x - 1 first) and the short ones fill the tail.
template <bool CAUSAL>
__device__ __forceinline__ int q_block() { return CAUSAL ? gridDim.x - 1 - blockIdx.x : blockIdx.x; }

// The last key a query row may see (exclusive bound), given causal alignment.
template <bool CAUSAL>
__device__ __forceinline__ int key_end(int row, int Nk, int causal_offset) {
  return CAUSAL ? min(Nk, max(0, row + causal_offset + 1)) : Nk;
}

// Online-softmax guard: when every score seen so far is -inf, m is -inf and exp(S - m)
// would be exp(-inf + inf) = NaN.  Subtracting 0 instead gives exp(-inf) = 0, the right weight.
__device__ __forceinline__ float safe_max(float m) { return m == TILEATTN_NEG_INF ? 0.0f : m; }

// log-sum-exp of a finished row; a row that saw no key has l = 0 and gets -inf.
__device__ __forceinline__ float row_lse(float m, float l) {
  return l > 0.0f ? m + __logf(l) : TILEATTN_NEG_INF;
}

// 2^x on the SFU (MUFU.EX2), one instruction.  exp2f without fast math wraps the same
// instruction in a denormal-range fix-up; here results below 2^-126 flush to 0, which is
// harmless for softmax weights (they are added to sums >= 1).  ex2(-inf) = +0, the weight a
// masked score must get.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Reductions over the LANES consecutive lanes that hold one row's slices (4: a quad of an mma
// fragment; 8: v2.1's row groups); every lane gets the result.
template <int LANES>
__device__ __forceinline__ float lanes_max(float x) {
#pragma unroll
  for (int mask = 1; mask < LANES; mask *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, mask));
  return x;
}
template <int LANES>
__device__ __forceinline__ float lanes_sum(float x) {
#pragma unroll
  for (int mask = 1; mask < LANES; mask *= 2) x += __shfl_xor_sync(0xffffffffu, x, mask);
  return x;
}

// ---- cp.async (sm_80+): 16-byte global->shared copies that bypass registers. ----
// src_bytes = 0 makes the hardware write 16 zero bytes without reading src (tail rows).
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// One K/V block of Bc rows of FP32 into shared buffers Ks, Vs ([Bc][D], unpadded) with 16-byte
// cp.async copies spread over NTHREADS threads.  Rows past Nk are zero-filled by the copy itself,
// and their scores are masked to -inf by the caller, so they carry no weight.
template <int HEAD_DIM, int Bc, int NTHREADS>
__device__ __forceinline__ void kv_async_copy(const float* k, const float* v, long long k_sn,
                                              long long v_sn, float* Ks, float* Vs, int kv_start,
                                              int Nk) {
  constexpr int VEC_PER_ROW = HEAD_DIM / 4;
  for (int i = threadIdx.x; i < Bc * VEC_PER_ROW; i += NTHREADS) {
    const int r = i / VEC_PER_ROW, c4 = (i % VEC_PER_ROW) * 4;
    const bool ok = kv_start + r < Nk;
    const int src_row = ok ? kv_start + r : 0;  // a zero-filled copy still needs a valid address
    cp_async_16(Ks + r * HEAD_DIM + c4, k + src_row * k_sn + c4, ok);
    cp_async_16(Vs + r * HEAD_DIM + c4, v + src_row * v_sn + c4, ok);
  }
}

}  // namespace tileattn
