// Tensor-core helpers for the mma.sync rungs (sm_80+): warp-level 16x8x16 MMA on fp16/bf16 with
// fp32 accumulators, ldmatrix loads of its operands from shared memory, fp32 -> 16-bit packing,
// and the XOR-swizzled shared-memory tile layout that makes those ldmatrix loads conflict-free.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type").
// In a warp, lane = 4 * g + t: g = lane / 4 (groupID, 0..7), t = lane % 4 (threadID_in_group).
// A register holds two 16-bit elements, the lower column index in the lower half.
//   A (16x16, row-major), 4 regs:  a[0] = A[g    ][2t, 2t+1]      a[1] = A[g + 8][2t, 2t+1]
//                                  a[2] = A[g    ][2t+8, 2t+9]    a[3] = A[g + 8][2t+8, 2t+9]
//   B (16x8, "col": B[k][n]), 2 regs: b[0] = B[2t, 2t+1][g]       b[1] = B[2t+8, 2t+9][g]
//   C/D (16x8, fp32), 4 floats:    c[0], c[1] = C[g][2t, 2t+1]     c[2], c[3] = C[g + 8][2t, 2t+1]
// So the C fragments of two neighbouring n-tiles (columns 0-7 and 8-15), packed pairwise to 16
// bits, are exactly the A fragment of a 16x16 tile: {c0c1 of tile 0, c2c3 of tile 0, c0c1 of
// tile 1, c2c3 of tile 1}.  FlashAttention-2 uses that to feed P = exp(S - m) straight back
// into P V without leaving registers.
//
// ldmatrix.m8n8.x4 loads four 8x8 matrices of 16-bit elements.  Lanes 8i..8i+7 give the
// addresses of the 8 rows (16 bytes each) of matrix i; register i of every lane receives
// matrix i's elements [lane / 4][2 (lane % 4), +1], i.e. exactly one A/B/C-style fragment
// register.  With .trans it receives [2 (lane % 4), +1][lane / 4] instead: the transpose, which
// turns row-major V (keys x head dim) into the "col" B operand of P V.
#pragma once

#include "softmax.cuh"  // cp_async_16 (common.cuh), the online-softmax steps
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace tileattn {

// ---- ldmatrix: four 8x8 16-bit matrices, shared memory -> registers. ----
// smem_addr is a shared-state-space byte address (__cvta_generic_to_shared), 16-byte aligned.
// volatile: the compiler must not hoist these reads above the __syncthreads that publishes
// the cp.async data they read (the asm has no other tie to that barrier).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// ---- stmatrix (sm_90): four 8x8 16-bit matrices, registers -> shared memory. ----
// r[i] is matrix i in the mma fragment layout (lane: row lane / 4, columns 2 (lane % 4) + 0, 1);
// .trans stores its transpose: lane 8 i + c gives the address of the 16 bytes that receive
// column c of matrix i.  "memory": the stores must stay before the fence / barrier that
// publishes them.
__device__ __forceinline__ void stmatrix_x4_trans(unsigned smem_addr, const unsigned (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#endif
}

// The same without .trans: lane 8 i + r gives the address of the 16 bytes that receive row r of
// matrix i.
__device__ __forceinline__ void stmatrix_x4(unsigned smem_addr, const unsigned (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
#endif
}

// ---- mma.sync m16n8k16, fp32 accumulate: d += A (16x16) * B (16x8), fragments as above. ----
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const unsigned (&a)[4],
                                                     unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4],
                                                            unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two neighbouring 8-column n-tiles from one A fragment and the four B registers of one
// ldmatrix_x4: d0 += A b[0..1], d1 += A b[2..3].
template <typename T>
__device__ __forceinline__ void mma_m16n16k16(float (&d0)[4], float (&d1)[4], const unsigned (&a)[4],
                                              const unsigned (&b)[4]) {
  mma_m16n8k16<T>(d0, a, b[0], b[1]);
  mma_m16n8k16<T>(d1, a, b[2], b[3]);
}

// ---- Two fp32 values -> one register of two 16-bit T, lo in the lower half (round to nearest). ----
template <typename T>
__device__ __forceinline__ unsigned pack2(float lo, float hi);

template <>
__device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);  // .x = lo sits in the lower 16 bits
  return *reinterpret_cast<const unsigned*>(&h);
}

template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}

// A register of two 16-bit T as two floats (lo first); pack2's inverse.  By value (no
// address taken: that split bwd_preprocess's 16-byte loads into 8-byte ones).
template <typename T>
__device__ __forceinline__ float2 unpack2(unsigned w);
template <>
__device__ __forceinline__ float2 unpack2<__half>(unsigned w) {
  return make_float2(__half2float(__ushort_as_half(w & 0xffffu)), __half2float(__ushort_as_half(w >> 16)));
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));  // bf16 is float's top half
}

// ---- 3xFP16 (bwd_v2.3, v2.4): an FP32 value as two fp16 halves under a power-of-two scale ----

// The largest power-of-two exponent a split operand's scale takes either way: the rungs' scale
// products (sums of two exponents and a constant) stay normal float32 numbers.
constexpr int SPLIT_EXP_MAX = 60;
constexpr int SPLIT_BLOCK_ROWS = 64;  // split_blocks (v2.4): rows under one exponent

// The exponent e that puts a tensor's largest |x| (amax) just under 2^15: amax < 2^E (frexp),
// e = 15 - E; 15 for an all-zero or non-finite tensor (whose results are 0 or NaN anyway).
__device__ __forceinline__ int split_exponent(float amax) {
  int E = 0;
  if (isfinite(amax)) frexpf(amax, &E);
  return min(max(15 - E, -SPLIT_EXP_MAX), SPLIT_EXP_MAX);
}

// x ~= hi + lo, both fp16 (x already scaled): hi = x rounded, lo = the rest (exact in FP32)
// rounded; two values a register (pack2's order).
__device__ __forceinline__ void split_half2(float a, float b, unsigned& hi, unsigned& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(h);
  const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const unsigned*>(&h);
  lo = *reinterpret_cast<const unsigned*>(&l);
}

// 8 floats (x0, x1) times scale as hi + lo fp16 halves, two values a register (split_half2).
__device__ __forceinline__ void split_half8(float4 x0, float4 x1, float scale, uint4& hi, uint4& lo) {
  split_half2(x0.x * scale, x0.y * scale, hi.x, lo.x);
  split_half2(x0.z * scale, x0.w * scale, hi.y, lo.y);
  split_half2(x1.x * scale, x1.y * scale, hi.z, lo.z);
  split_half2(x1.z * scale, x1.w * scale, hi.w, lo.w);
}

// A block of SPLIT_BLOCK_ROWS rows of FP32 values in registers, before its split: chunk i =
// p THREADS + tid (8 floats, two 16-byte loads) is row i / (D / 8), columns 8 (i % (D / 8)) ..
// (row0: the block's first row, 16-byte aligned rows row_stride floats apart); rows at or past
// `rows` are zeros.  Returns the max |x| of this thread's chunks (fmaxf drops NaN: a NaN stays in
// the halves, and so in the result, whatever the scale).
template <int HEAD_DIM, int THREADS, int PER>
__device__ __forceinline__ float split_load_rows(const float* row0, long long row_stride, int rows, unsigned tid,
                                                 float4 (&x)[PER][2]) {
  constexpr int CHUNKS = HEAD_DIM / 8;
  static_assert(PER * THREADS == SPLIT_BLOCK_ROWS * CHUNKS, "whole chunks a thread");
  float m = 0.0f;
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    const unsigned i = p * THREADS + tid;  // (unsigned: / and % are shifts and masks, no sign fix-up)
    const int r = i / CHUNKS, c = 8 * (i % CHUNKS);
    x[p][0] = x[p][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < rows) {
      const float4* src = reinterpret_cast<const float4*>(row0 + r * row_stride + c);
      x[p][0] = src[0];
      x[p][1] = src[1];
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
      m = fmaxf(m, fmaxf(fmaxf(fabsf(x[p][j].x), fabsf(x[p][j].y)), fmaxf(fabsf(x[p][j].z), fabsf(x[p][j].w))));
  }
  return m;
}

// The max of THREADS threads' m (whole warps): a slot a warp in shared memory, sync() (a barrier
// over those threads), then every thread reads every slot.
template <int THREADS, typename Sync>
__device__ __forceinline__ float split_group_max(float m, float* slots, int tid, Sync sync) {
  m = lanes_max<32>(m);
  if (tid % 32 == 0) slots[tid / 32] = m;
  sync();
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) m = fmaxf(m, slots[w]);
  return m;
}

// ---- Fragment plumbing shared by the mma.sync kernels (fa2_mma.cuh, bwd_v2, dec_v1) ----
// Each lane's ldmatrix row and 16-byte chunk for the three operand roles: an A operand (16 rows,
// k-step chunks), a B operand read as two 8-row n-tiles (K in Q K^T), and a B operand read with
// .trans (V in P V: rows are the k dimension).
struct LdsmLane {
  int a_r, a_c, b_r, b_c, bt_r, bt_c;
};
__device__ __forceinline__ LdsmLane ldsm_lane(int lane) {
  return {lane % 16, lane / 16, lane % 8 + 8 * (lane / 16), (lane / 8) % 2, lane % 8 + 8 * ((lane / 8) % 2), lane / 16};
}

// Two C fragments of a 16-row tile (n-tiles 2 kk and 2 kk + 1: columns 16 kk .. 16 kk + 15),
// rounded to T, are exactly the A fragment of the next product's k-step over those columns
// (P V after Q K^T, dS K after dO V^T): no shuffle, no shared memory.
template <typename T>
__device__ __forceinline__ void pack_a_frag(unsigned (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);  // row g,   columns 2t, 2t+1
  a[1] = pack2<T>(c0[2], c0[3]);  // row g+8, columns 2t, 2t+1
  a[2] = pack2<T>(c1[0], c1[1]);  // row g,   columns 2t+8, +9
  a[3] = pack2<T>(c1[2], c1[3]);  // row g+8, columns 2t+8, +9
}

// ---- Swizzled shared-memory tile of 16-bit elements ----
//
// A [ROWS][COLS] tile (COLS % 16 == 0) is stored as 16-byte chunks (8 elements).  Shared memory
// has 32 banks of 4 bytes, so one 128-byte line holds 8 chunks, one per "bank group".  An
// ldmatrix phase reads 8 rows x one 16-byte chunk; with a plain row-major layout whose row
// pitch is a multiple of 128 bytes, all 8 rows hit the same bank group: an 8-way conflict.
//
// Layout: the columns are split into panels of 64, 32 or 16 elements (rows of 128, 64 or 32
// bytes, W = 8, 4 or 2 chunks): as many 64-column panels as fit, then the rest (16, 32 or 48
// columns) as a 32- and/or a 16-column panel.  Each panel is its own row-major [ROWS][W chunks]
// block, so 8 / W consecutive rows share one 128-byte line, and the chunk index inside the
// panel is XORed with bits of the row:
//     physical chunk = chunk ^ swz(row),  swz(row) = (row / (8 / W)) % W
//   W = 8: swz = row % 8         (rows of 128 B: one row per line)
//   W = 4: swz = (row / 2) % 4   (rows of  64 B: two rows per line, row % 2 picks the half)
//   W = 2: swz = (row / 4) % 2   (rows of  32 B: four rows per line)
// For any 8 consecutive rows starting at a multiple of 8 and one logical chunk, the 8 physical
// chunks land on 8 distinct bank groups: ldmatrix (and the row-major cp.async fill, and the
// epilogue's 4-byte stores) are conflict-free.  swz depends on row % 8 only.
// Panels are padded by nothing, so the tile is exactly ROWS * COLS * 2 bytes.
template <int ROWS, int COLS>
struct SwizzledTile {
  static_assert(COLS % 16 == 0 && COLS > 0, "ldmatrix k-steps need whole 16-column blocks");
  static_assert(ROWS % 8 == 0, "swizzle pattern repeats every 8 rows");
  static constexpr int CHUNKS = COLS / 8;  // 16-byte chunks per row
  static constexpr int FULL = CHUNKS / 8;  // 64-column panels
  static constexpr int REM = CHUNKS % 8;   // 0, 2, 4 or 6 chunks in the narrow panels
  static constexpr int NPANELS = FULL + ((REM & 4) ? 1 : 0) + ((REM & 2) ? 1 : 0);
  static constexpr int BYTES = ROWS * COLS * 2;

  // Width (in chunks) and first logical chunk of panel p.
  __host__ __device__ static constexpr int panel_width(int p) {
    return p < FULL ? 8 : (p == FULL && (REM & 4)) ? 4 : 2;
  }
  __host__ __device__ static constexpr int panel_chunk0(int p) {
    return p < FULL ? 8 * p : (p == FULL) ? 8 * FULL : 8 * FULL + ((REM & 4) ? 4 : 0);
  }
  __host__ __device__ static constexpr int panel_of(int c) {
    return c < 8 * FULL ? c / 8 : ((REM & 4) && c < 8 * FULL + 4) ? FULL : NPANELS - 1;
  }
  __host__ __device__ static constexpr int swz(int row, int W) { return (row / (8 / W)) % W; }

  // Byte offset of logical chunk c of row r.  Earlier panels hold ROWS * chunk0 chunks; c0 is a
  // multiple of W, so XORing c itself with swz < W stays inside the panel.
  __device__ __forceinline__ static int offset(int r, int c) {
    const int p = panel_of(c), W = panel_width(p), c0 = panel_chunk0(p);
    return (ROWS * c0 + r * W + ((c ^ swz(r, W)) - c0)) * 16;
  }
  // offset(r, c) for tiles of whole 64-column panels only (REM == 0): panel c / 8, width 8,
  // swizzle r % 8, in unsigned shifts and masks.  The general form divides by the panel's width,
  // which for a c known only at run time is a real integer division (the backward's dS stores
  // spent ~600 instructions a thread per Q block on it, 6ce5495).  Where c is a compile-time
  // constant both give the same offsets; the forward rungs keep the general form, the SASS their
  // tests and benchmarks ran.
  __device__ __forceinline__ static int offset_panels(int r, int c) {
    static_assert(REM == 0, "whole 64-column panels");
    const unsigned ur = r, uc = c;
    return static_cast<int>((ROWS * 8 * (uc >> 3) + ur * 8 + ((uc ^ ur) & 7)) * 16);
  }
  // Byte offset of the row address one lane gives to ldmatrix: row row_base + lane_r, chunk
  // 2 kb + lane_c (kb: 16-column block, lane_c 0 or 1).  row_base must be a multiple of 8, so
  // the swizzle depends on the lane alone; then everything that varies with the unrolled
  // (row_base, kb) is either a compile-time constant (folded into the instruction's immediate
  // offset) or one of W/2 per-lane values of ((2 kb - c0) ^ x), so the compiler keeps a handful
  // of address registers instead of one per ldmatrix.
  __device__ __forceinline__ static int ldsm_offset(int lane_r, int lane_c, int row_base, int kb) {
    const int c = 2 * kb, p = panel_of(c), W = panel_width(p), c0 = panel_chunk0(p);
    const int x = lane_c ^ swz(lane_r, W);  // (c0 + 2 kb' + lane_c) ^ swz = c0 + ((2 kb') ^ x)
    return (ROWS * c0 + row_base * W + lane_r * W + ((c - c0) ^ x)) * 16;
  }
  // The same row address as tile_addr + ldsm_offset(...), computed so that the unrolled
  // (row_base, kb) enter only as an XOR immediate and an add immediate:
  //     ((tile_addr + lane part) ^ ((2 kb - c0) * 16)) + (ROWS c0 + row_base W) * 16.
  // The lane part (row lane_r, chunk x = lane_c ^ swz(lane_r, W)) has zero bits between bit 4
  // and bit 4 + log2(W) apart from x, so XORing the chunk step into those bits equals adding it
  // to the chunk index, and the add constant is a multiple of 16 W that leaves them alone.
  // Needs tile_addr % (16 W) == 0 (tiles start at multiples of 128 bytes).  The result: one
  // register per panel width for the lane part and one LOP3 per distinct kb, instead of one
  // live register per (kb, lane) offset for the whole K/V loop.
  __device__ __forceinline__ static unsigned ldsm_addr(unsigned tile_addr, int lane_r, int lane_c, int row_base,
                                                       int kb) {
    const int c = 2 * kb, p = panel_of(c), W = panel_width(p), c0 = panel_chunk0(p);
    const unsigned lane_part = tile_addr + (lane_r * W + (lane_c ^ swz(lane_r, W))) * 16;
    return (lane_part ^ ((c - c0) * 16)) + (ROWS * c0 + row_base * W) * 16;
  }
  // Byte offset of element (r, col), col even: the 4-byte pair store of the epilogue.
  __device__ __forceinline__ static int offset_elem(int r, int col) {
    return offset(r, col / 8) + (col % 8) * 2;
  }
};

// ---- Tensor-memory-accelerator copies (sm_90): the copy engine moves whole tiles, an mbarrier counts bytes ----
// A CTA-local mbarrier completes a phase when its pending arrivals (1 here: the thread that
// announces the bytes) reach zero and every announced byte has landed.  Waiting on the phase
// also makes the copied data visible to the waiting thread.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes the mbarrier inits visible to the async proxy (the copy engine) before first use.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// The one arrival of a phase, announcing how many bytes its copies will deliver.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Generic-proxy shared-memory writes (st.shared) ordered before the async proxy's accesses to
// the same bytes (wgmma's operand reads, a later TMA copy into them): each writing thread fences
// before it signals the consumer.
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// 16 bytes (four floats) at shared address addr; st_shared_zero16: 16 zero bytes.
__device__ __forceinline__ void st_shared_v4(unsigned addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void st_shared_zero16(unsigned addr) { st_shared_v4(addr, 0.0f, 0.0f, 0.0f, 0.0f); }
// A plain arrival on a CTA-local mbarrier (release): one of the `count` the phase waits for.
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spin until the phase with this parity (0, 1, 0, ... for the phases in order) has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// A barrier over THREADS threads of the block (whole warps) on hardware barrier `id` (1..15;
// __syncthreads is 0): warp-specialised kernels sync one role's warps without the others.
template <int THREADS>
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
// Arrive on barrier `id` (counting THREADS in all) without waiting: the producer side of a
// barrier whose consumers bar.sync on it.
template <int THREADS>
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory");
}
// Whether `pred` holds in every one of the THREADS threads that meet at barrier `id`
// (bar.red.and.pred): a warpgroup's vote, where a warp's own (__all_sync) is not enough because
// what follows is a collective instruction (wgmma) that all four warps must issue alike.
template <int THREADS>
__device__ __forceinline__ bool named_barrier_all(int id, bool pred) {
  unsigned all;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.and.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(all)
      : "r"(static_cast<unsigned>(pred)), "r"(id), "n"(THREADS)
      : "memory");
  return all != 0;
}
// One box of a 4-d tensor map (coordinates innermost first: column, row, head, batch) from
// global to shared memory at dst, completion counted on mbarrier bar.  tmap is the generic address
// of the 128-byte CUtensorMap (a __grid_constant__ kernel parameter: TmaMaps, common.cuh).
// The CTA's own shared addresses are valid shared::cluster addresses.
__device__ __forceinline__ void tma_load_4d(unsigned dst, const void* tmap, int c0, int c1, int c2, int c3,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// The other way: the box at coordinates (c0, c1, c2, c3) of the map's tensor from shared memory at
// src, in this thread's current bulk group (bulk_commit, bulk_wait_read below); the copy engine
// leaves out the box's elements past the tensor's bounds.
__device__ __forceinline__ void tma_store_4d(const void* tmap, int c0, int c1, int c2, int c3, unsigned src) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(tmap),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}

// A bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory to
// shared memory at dst, completion counted on mbarrier bar: no tensor map, so any row of any
// strided or paged tensor can be a source.
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared memory at src, each
// float32 added into dst's in global memory (the adds done at L2, as red.global.add does, all in
// one instruction of one thread), in this thread's current bulk group.  Bulk groups (this and
// tma_store_4d): commit closes the group, and wait_read<N> returns once at most N of the thread's
// groups still read shared memory (their source bytes may be overwritten; the global writes may
// still be in flight, and complete before the grid does).
__device__ __forceinline__ void bulk_reduce_add(float* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// ... and once at most N of them are still in flight at all (their writes to global memory done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// 16 bytes global -> shared (address dst) by this thread's cp.async; and the arrival, on a
// CTA-local mbarrier, of this thread's cp.asyncs so far once they have landed (.noinc: the
// barrier's count must include these arrivals).
__device__ __forceinline__ void cp_async_16_to(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_mbar_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// One tile of `rows` x COLS 16-bit values in SwizzledTile's layout, as one TMA copy per panel
// (box: the panel's 64, 32 or 16 columns x rows), counted on mbarrier bar.  The copy engine's
// 128-, 64- and 32-byte swizzles are exactly SwizzledTile's XOR patterns for those panel widths;
// rows past N and columns past the head dim arrive as zeros (their bytes still count).  tmaps:
// the kernel's tensor maps (TmaMaps): q, k, v (map 0, 1, 2) with 64-column boxes, then the same
// with the narrow last panel's box.  head: the map's head index.
template <int COLS>
__device__ __forceinline__ void tma_tile_load(const TmaMaps* tmaps, int map, unsigned dst, unsigned bar, int rows,
                                              int first_row, int head, int batch) {
  using Panels = SwizzledTile<8, COLS>;  // the panels depend on the columns only
  static_assert(Panels::NPANELS <= COLS / 64 + 1, "TMA: at most one narrow panel (32 or 16 columns)");
  mbar_arrive_expect_tx(bar, rows * COLS * 2);
#pragma unroll
  for (int p = 0; p < Panels::NPANELS; ++p) {
    const int W = Panels::panel_width(p), c0 = Panels::panel_chunk0(p);
    tma_load_4d(dst + rows * c0 * 16, tmaps->desc[map + (W == 8 ? 0 : 3)], c0 * 8,
                first_row, head, batch, bar);
  }
}

// ---- The accumulator fragment of mma.sync m16n8 and wgmma m64nN, shared by the rungs that ----
// ---- keep S and O in it (lane = 4g + t: rows g and g + 8, columns 2t and 2t + 1 of each n8 ----
// ---- tile i, as values 4i, 4i + 1 (row g) and 4i + 2, 4i + 3 (row g + 8)) ----

// Online softmax of one K/V block's scores S (NS / 4 8-key tiles) for this thread's two rows
// row_a and row_a + 8, in place: keys past the row's last key are masked on the blocks that reach
// them (past Nk; the diagonal when causal), the rows rebase to the new max in the log2 domain
// (scale_log2 > 0 folded into one FFMA per score), and S becomes exp2(S * scale - m).  m_i, l_i
// (this thread's partial row sums) are updated; scale_old is the factor O must be rebased by.
// OFFSET: the thread's true scores are S + offset (fragment_alibi_keys): the offset joins the
// row max before the quad's reduction and the exponent's per-row constant, not each score.
// REBASE (softmax.cuh): exact; lazy at lazy_rescale_log2() for 16-bit P (scale_old is then 1 on
// most blocks); or lazy at fp8_lazy_rescale_log2() for e4m3 P (v3.5), with the weights lifted by
// 2^fp8_p_offset_log2() (the caller takes it out of m_i before lse).
template <bool CAUSAL, int NS, bool OFFSET = false, Rebase REBASE = Rebase::exact>
__device__ __forceinline__ void fragment_online_softmax(float (&S)[NS], float (&m_i)[2], float (&l_i)[2],
                                                        float (&scale_old)[2], float scale_log2, int kv_start,
                                                        int Bc, int q_start, int row_a, int t, int Nk,
                                                        int causal_offset, float offset = 0.0f) {
  // (block_needs_mask's test, written out: through the helper ptxas evaluates it differently in
  // 51 v3.3-v3.8 kernels, SASS that has not run on a GPU.)
  const bool needs_mask = kv_start + Bc > Nk || (CAUSAL && kv_start + Bc - 1 > q_start + causal_offset);
  float m_tile[2] = {TILEATTN_NEG_INF, TILEATTN_NEG_INF};
  // Two loops, not one with `needs_mask && key >= kend`: ptxas turned that one into an ISETP and
  // an FSEL per score run on every block (a predicate, not a branch), a third of the softmax's
  // instructions spent on the few blocks that cross the diagonal or Nk.  With the max in both
  // arms the branch stays a branch (warp-uniform: needs_mask depends on the block only).
  if (needs_mask) {
    const int kend_a = key_end<CAUSAL>(row_a, Nk, causal_offset);
    const int kend_b = key_end<CAUSAL>(row_a + 8, Nk, causal_offset);
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int r = i % 4, key = kv_start + (i / 4) * 8 + 2 * t + (r & 1);
      if (key >= (r < 2 ? kend_a : kend_b)) S[i] = TILEATTN_NEG_INF;
      m_tile[r / 2] = fmaxf(m_tile[r / 2], S[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < NS; ++i) m_tile[(i % 4) / 2] = fmaxf(m_tile[(i % 4) / 2], S[i]);
  }
  float m_base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the quad holds the row
    const float m_blk = lanes_max<4>(OFFSET ? m_tile[h] + offset : m_tile[h]);
    constexpr float tau = REBASE == Rebase::lazy_16bit  ? lazy_rescale_log2()
                          : REBASE == Rebase::lazy_e4m3 ? fp8_lazy_rescale_log2()
                                                        : 0.0f;
    scale_old[h] = online_rescale(m_i[h], l_i[h], m_blk * scale_log2, m_base[h], tau);
    if (REBASE == Rebase::lazy_e4m3) m_base[h] -= fp8_p_offset_log2();
    if (OFFSET) m_base[h] = fmaf(-offset, scale_log2, m_base[h]);  // 2^(s (S + offset) - m) = 2^(s S - m')
  }
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    S[i] = softmax_weight(S[i], scale_log2, m_base[(i % 4) / 2]);
    l_i[(i % 4) / 2] += S[i];
  }
}

// The score variants of one block (v3.3's variants kernel; csrc/common.cuh has their meaning),
// set up once per block of query rows: everything in the raw-score domain the folded exponent
// expects (2^(S s log2e - m) with s = folded_scale), so softcap c gives S -> (c / s) tanh(S s / c)
// and ALiBi subtracts (slope / s) |pos - j|.  Window bounds are per row: keys lo .. hi inclusive.
// With a softcap the fragment keeps tanh(S s / c) alone and the factor c / s rides the exponent's
// scale (exp_scale_log2: the kernel's one FFMA a score already multiplies by it), so ALiBi's
// slope is counted in those units too (slope / c): one FMUL a score fewer than scaling back.
struct ScoreVariants {
  float cap_s, inv_cap_s;  // c / s and s / c; softcap false: unused
  float slope_s;           // ALiBi slope / s, or slope / c with a softcap; alibi false: unused
  int left, right;         // the window, -1 unbounded (right is -1 under a causal mask: it rules)
  bool softcap, alibi;
  int first_pos, last_pos;  // the positions of the block's first and last query rows
  int pos[2];               // this thread's rows' positions
};

// The per-head part of ScoreVariants, from the room fields (common.cuh) of head h_ of sequence b_
// (the rows' positions are the caller's).  The softcap's and the slope's divisions by the scale
// run once per thread, not per score.  Under a causal mask the diagonal is the right edge.
template <bool CAUSAL>
__device__ __forceinline__ ScoreVariants head_variants(float softmax_scale, float softcap, const float* alibi_slopes,
                                                       long long alibi_sb, int b_, int h_, int window_left,
                                                       int window_right) {
  ScoreVariants var{};
  const float s = folded_scale(softmax_scale);
  var.softcap = softcap > 0.0f;
  var.cap_s = softcap / s;
  var.inv_cap_s = s / softcap;
  var.alibi = alibi_slopes != nullptr;
  var.slope_s = var.alibi ? alibi_slopes[b_ * alibi_sb + h_] / (var.softcap ? softcap : s) : 0.0f;
  var.left = window_left;
  var.right = CAUSAL ? -1 : window_right;
  return var;
}

// The exponent's scale (folded_scale_log2) for scores in ScoreVariants's units: times c / s with
// a softcap, whose fragment holds tanh(S s / c) (max and rebase are then in those units too;
// m_i, in log2 units, and lse are unchanged).
__device__ __forceinline__ float exp_scale_log2(const ScoreVariants& var, float scale_log2) {
  return var.softcap ? scale_log2 * var.cap_s : scale_log2;
}

// Whether the block's first key lies left of some row's window (the block's last row's, the
// rightmost edge), for a window with a left bound (var.left >= 0).  Uniform over the rows' block.
__device__ __forceinline__ bool window_left_edge(const ScoreVariants& var, int kv_start) {
  return kv_start < var.last_pos - var.left;
}

// Whether the block of keys kv_start .. kv_start + Bc - 1 crosses the window's left or right edge
// for some row of the block of query rows (first_pos .. last_pos): only such blocks run the
// window's per-score mask.  Uniform over the rows' block.
__device__ __forceinline__ bool window_edge(const ScoreVariants& var, int kv_start, int Bc) {
  return (var.left >= 0 && window_left_edge(var, kv_start)) ||
         (var.right >= 0 && kv_start + Bc - 1 > var.first_pos + var.right);
}

// The window's mask of one K/V block's fragment S (keys kv_start .. kv_start + Bc - 1): keys
// outside lo[r] .. hi[r] of this thread's row r (rows g and g + 8) get -inf.
template <int NS>
__device__ __forceinline__ void fragment_mask_keys_outside(float (&S)[NS], const int (&lo)[2], const int (&hi)[2],
                                                           int kv_start, int t) {
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int r = (i % 4) / 2, key = kv_start + (i / 4) * 8 + 2 * t + (i & 1);
    if (key < lo[r] || key > hi[r]) S[i] = TILEATTN_NEG_INF;
  }
}

// Apply the variants to one K/V block's fragment S (keys kv_start .. kv_start + Bc - 1, this
// thread's rows pos[0], pos[1]), before fragment_online_softmax masks causality and Nk.  The
// window's mask runs only on the blocks that cross an edge (the others are inside for every
// row, or skipped: the kernel's loop covers only blocks some row sees).  Per score, ALiBi is an
// FADD and an FFMA (the distance as a float: one I2F per row and block), softcap an FMUL and
// the SFU's tanh (its factor c / s is exp_scale_log2's).
template <int NS>
__device__ __forceinline__ void fragment_variants(float (&S)[NS], const ScoreVariants& var, int kv_start, int Bc, int t) {
  if (var.softcap) {
#pragma unroll
    for (int i = 0; i < NS; ++i) S[i] = tanh_approx(S[i] * var.inv_cap_s);
  }
  if (var.alibi) {
    // pos - key = (pos - kv_start - 2t) - (8 (i / 4) + (i & 1)): a per-row float minus a constant.
    const float d0[2] = {static_cast<float>(var.pos[0] - kv_start - 2 * t),
                         static_cast<float>(var.pos[1] - kv_start - 2 * t)};
#pragma unroll
    for (int i = 0; i < NS; ++i)
      S[i] = fmaf(-var.slope_s, fabsf(d0[(i % 4) / 2] - static_cast<float>((i / 4) * 8 + (i & 1))), S[i]);
  }
  // (window_edge's test, written out: through the helper ptxas laid out the non-causal variants
  // kernels differently, 30 of them, v3.1's through v3.7's.)
  const bool left_edge = var.left >= 0 && kv_start < var.last_pos - var.left;
  const bool right_edge = var.right >= 0 && kv_start + Bc - 1 > var.first_pos + var.right;
  if (left_edge || right_edge) {
    const int lo[2] = {var.left >= 0 ? var.pos[0] - var.left : kv_start, var.left >= 0 ? var.pos[1] - var.left : kv_start};
    const int hi[2] = {var.right >= 0 ? var.pos[0] + var.right : kv_start + Bc,
                       var.right >= 0 ? var.pos[1] + var.right : kv_start + Bc};
    fragment_mask_keys_outside(S, lo, hi, kv_start, t);
  }
}

// v3.9's window (v3_9_window.cu): a causal sliding window alone, so only the left edge masks, on
// window_left_edge's blocks (the host passes window_left >= 0): fragment_variants's mask without
// the right edge or a branch on which variants are on; the diagonal and Nk are
// fragment_online_softmax's.  A row may lose
// every key of the walk's first block (its window starts in the next): its max stays -inf there,
// which online_rescale takes as the variants kernels' rows do.
template <int NS>
__device__ __forceinline__ void fragment_window_left(float (&S)[NS], const ScoreVariants& var, int kv_start, int t) {
  if (window_left_edge(var, kv_start)) {
    const int lo[2] = {var.pos[0] - var.left, var.pos[1] - var.left};
    const int hi[2] = {0x7fffffff, 0x7fffffff};  // (no right edge: the comparison folds away)
    fragment_mask_keys_outside(S, lo, hi, kv_start, t);
  }
}

// ALiBi under a causal mask as one FFMA a score (v3.3's variants kernel).  Every visible key j is
// at most the row's position p, so -slope (p - j) = slope (j - p0) - slope (p - p0), p0 the
// block's first row's position: the second term is a row constant (it cancels in the softmax;
// the caller takes it out of m_i before lse), and the first is slope c (c the score's column in
// the thread's fragment, an immediate) plus slope (kv_start + 2t - p0) for the whole thread,
// returned as fragment_online_softmax's offset.  Keys counted from p0 keep the values near the
// diagonal, where the weights are large, small enough for fp32 to hold exactly (from 0, slope j
// at 128k keys would have an ulp of 0.008).
template <int NS>
__device__ __forceinline__ float fragment_alibi_keys(float (&S)[NS], const ScoreVariants& var, int kv_start, int t) {
#pragma unroll
  for (int i = 0; i < NS; ++i) S[i] = fmaf(var.slope_s, static_cast<float>((i / 4) * 8 + (i & 1)), S[i]);
  return var.slope_s * static_cast<float>(kv_start + 2 * t - var.first_pos);
}

// v3.8's block term (causal ALiBi with the key's column on the tensor core, v3_8_alibi_mma.cu):
// slope_s (kv_start - p0), one offset for the whole block, which joins the row max and the
// exponent's per-row constant (fragment_online_softmax's OFFSET, or the speculative softmax's m_i).
__device__ __forceinline__ float alibi_block_offset(const ScoreVariants& var, int kv_start) {
  return var.slope_s * static_cast<float>(kv_start - var.first_pos);
}

// Two adjacent output values in the output dtype.
__device__ __forceinline__ void store_pair(float* dst, float a, float b) { *reinterpret_cast<float2*>(dst) = make_float2(a, b); }
template <typename T>
__device__ __forceinline__ void store_pair(T* dst, float a, float b) { *reinterpret_cast<unsigned*>(dst) = pack2<T>(a, b); }

// Epilogue: finish l_i across the quad, write this thread's pairs of O / l for rows row_a and
// row_a + 8 (rows past Nq skipped; a row that saw no key outputs 0) and their lse (natural log;
// m_i is log2-scaled; lse null: not asked for).
template <typename T, int HEAD_DIM>
__device__ __forceinline__ void fragment_store_rows(const float (&acc)[HEAD_DIM / 2], const float (&m_i)[2],
                                                    const float (&l_i)[2], int row_a, int t, int Nq, T* o,
                                                    long long o_sn, float* lse) {
  constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = lanes_sum<4>(l_i[h]);
    const int row = row_a + 8 * h;
    if (row >= Nq) continue;
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n)
      store_pair(o + row * o_sn + n * 8 + 2 * t, acc[4 * n + 2 * h] * inv_l, acc[4 * n + 2 * h + 1] * inv_l);
    if (t == 0 && lse) lse[row] = row_lse(m_i[h] * LN2, l);
  }
}

// fragment_store_rows for a warp's 16 rows of 16-bit O (rows row0 .. row0 + 15 of head (b, h)),
// through shared memory and the copy engine: the warp writes O / l into `stage` by stmatrix, in
// the layout the copy engine reads with the 128-byte swizzle (a 64-column panel of 16 rows x 128
// bytes, 2 KB, 16-byte chunk c of row r at chunk c ^ (r % 8): stmatrix's eight rows of a matrix
// land in distinct banks), then lane 0 issues one tensor store (map, box 64 columns x 16 rows)
// a panel.  The copy engine drops the rows past the tensor's Nq, and the warp goes on to its next
// tile while the copies run.  In place of HEAD_DIM / 4 four-byte stores a thread (long-scoreboard
// and lg_throttle stalls at short sequences, bench/NOTES.md) or a bulk copy a row (sixteen lanes'
// UBLKCP, which the uniform datapath issues one lane at a time).  A stage narrower than the head
// (D = 256: 128 columns, all that fits beside v3.6's 192 KB) takes the row in passes, each
// waiting for the last pass's copies to have read the stage.  Before it writes the stage the warp
// waits for its last call's copies to have read it; the caller waits once more before the CTA
// exits.  The map's base and strides must be 16-byte aligned (the caller checks: o_tma_aligned).
template <int HEAD_DIM>
constexpr int O_STAGE_COLS = HEAD_DIM > 128 ? 128 : HEAD_DIM;
template <int HEAD_DIM>
constexpr int O_STAGE_WARP_BYTES = 16 * O_STAGE_COLS<HEAD_DIM> * 2;  // one warp's 16 rows, 1024-byte aligned
template <typename T, int HEAD_DIM>
__device__ __forceinline__ void fragment_store_rows_tma(const float (&acc)[HEAD_DIM / 2], const float (&m_i)[2],
                                                        const float (&l_i)[2], int row_a, int lane, int Nq, float* lse,
                                                        unsigned stage, const void* tmap, int row0, int h, int b) {
  static_assert(sizeof(T) == 2 && HEAD_DIM % 64 == 0, "16-bit O, whole 64-column panels");
  constexpr float LN2 = 0.6931471805599453f;
  constexpr int COLS = O_STAGE_COLS<HEAD_DIM>;
  const int t = lane % 4;
  float inv_l[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const float l = lanes_sum<4>(l_i[h2]);
    inv_l[h2] = l > 0.0f ? 1.0f / l : 0.0f;
    const int row = row_a + 8 * h2;
    if (t == 0 && lse && row < Nq) lse[row] = row_lse(m_i[h2] * LN2, l);
  }
  // stmatrix.x4 n: matrices (rows 0-7, 8-15) x (columns 16 n .. 16 n + 7, + 8 .. + 15), i.e. n8
  // tiles 2n, 2n + 1 of acc; lane 8 i + r addresses row r + 8 (i % 2), chunk 2 (n % 4) + i / 2 of
  // panel n / 4.  Swizzled: chunk (2 (n % 4) + i / 2) ^ r = 2 (n % 4) ^ (i / 2 ^ r), so a lane's
  // address is its own row and chunk XOR the column pair's constant.
  const unsigned my_row = stage + (lane % 8 + 8 * (lane / 8 % 2)) * 128;
  const unsigned my_chunk = ((lane / 16) ^ (lane % 8)) * 16;
#pragma unroll
  for (int pass = 0; pass < HEAD_DIM / COLS; ++pass) {
    if (lane == 0) bulk_wait_read<0>();
    __syncwarp();
#pragma unroll
    for (int n = 0; n < COLS / 16; ++n) {
      unsigned r[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tile = pass * COLS / 8 + 2 * n + i / 2, h2 = i % 2;
        r[i] = pack2<T>(acc[4 * tile + 2 * h2] * inv_l[h2], acc[4 * tile + 2 * h2 + 1] * inv_l[h2]);
      }
      stmatrix_x4(my_row + (n / 4) * 2048 + (my_chunk ^ (32 * (n % 4))), r);
    }
    fence_proxy_async_smem();  // the stage's generic-proxy writes, before the copy engine reads them
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int p = 0; p < COLS / 64; ++p) tma_store_4d(tmap, pass * COLS + 64 * p, row0, h, b, stage + p * 2048);
      bulk_commit();
    }
  }
}

// Copy rows [row0, row0 + ROWS) of one head's (N, HEAD_DIM) matrix into a SwizzledTile of
// COLS columns with 16-byte cp.async.  Rows >= nrows and the columns from HEAD_DIM up to the
// next multiple of 16 are zero-filled by the copy itself (src-size 0); columns past that (the
// unused end of a widened panel) are left alone.  Walks panel by panel, row-major inside a
// panel, so 8 consecutive threads fill one 128-byte line of shared memory (conflict-free) and
// read consecutive 16-byte pieces of a global row.  A thread keeps one chunk column per panel
// and steps down the rows, so its per-copy work is a pointer add and a compare.
template <typename T, int ROWS, int COLS, int HEAD_DIM, int NTHREADS>
__device__ __forceinline__ void tile_async_copy(unsigned char* tile, const T* g, long long sn,
                                                int row0, int nrows, int tid) {
  using Tile = SwizzledTile<ROWS, COLS>;
  constexpr int USED = (HEAD_DIM + 15) / 16 * 2;  // chunks an MMA k-step (16 columns) reads
  static_assert(NTHREADS % 8 == 0, "a thread keeps its chunk column: W must divide NTHREADS");
#pragma unroll
  for (int p = 0; p < Tile::NPANELS; ++p) {
    const int W = Tile::panel_width(p), c0 = Tile::panel_chunk0(p);  // constants once unrolled
    const int RSTEP = NTHREADS / W;                                   // rows per pass
    const int r_first = tid / W, c = c0 + tid % W;
    // Only the last panel can reach past HEAD_DIM (by one chunk, when HEAD_DIM % 16 == 8) or
    // past USED (by two, when the panel was widened).
    const bool col_ok = (c0 + W) * 8 <= HEAD_DIM || c * 8 < HEAD_DIM;
    const bool col_used = c0 + W <= USED || c < USED;
    const int rows_left = nrows - row0 - r_first;  // rows of this thread's column still in range
    const T* src0 = g + (row0 + r_first) * sn + c * 8;
    // The swizzle repeats every 8 rows: when a pass steps a multiple of 8 rows, every copy of
    // this thread lands at its first offset plus a constant (an immediate, not a register).
    const int dst0 = Tile::offset(r_first, c);
#pragma unroll
    for (int it = 0; it < (ROWS + RSTEP - 1) / RSTEP; ++it) {
      if (col_used && (ROWS % RSTEP == 0 || r_first + it * RSTEP < ROWS)) {
        const bool ok = col_ok && it * RSTEP < rows_left;
        const int dst = RSTEP % 8 == 0 ? dst0 + it * RSTEP * W * 16 : Tile::offset(r_first + it * RSTEP, c);
        // A zero-fill still needs a mapped address: the head's first row.
        cp_async_16(tile + dst, ok ? src0 + it * RSTEP * sn : g, ok);
      }
    }
  }
}

}  // namespace tileattn
