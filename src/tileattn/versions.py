"""The registry: one entry per rung of the ladder.  It drives the API's dispatch, the tests and
the benchmark; nothing else keeps a list of versions.

Every kernel is a template ``tileattn::<kernel><T, HEAD_DIM, Br, Bc, CAUSAL>`` that takes the
field list of csrc/common.cuh (TILEATTN_FWD_FIELDS).  What a kernel's source already says (block
size, shared memory, parameter block) is read back from its cubin (_params.py), never repeated
here.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Kind = Literal["simt", "tensor_fp32", "mma"]
# What a rung computes at: "fp32" (FP32-level error, the default for FP32 inputs), "tf32" (one
# TF32 product per multiply, ~1e-3 error, only with precision="tf32"), "native" (fp16/bf16 inputs).
Precision = Literal["fp32", "tf32", "native"]
GridStyle = Literal["per_head", "q_outer", "persistent"]
_CTYPE = {
    "float32": "float",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float8_e4m3fn": "tileattn::fp8_e4m3",  # one byte, csrc/common.cuh (v3.5)
}


def name_expression(kernel: str, dtype: str, head_dim: int, Br: int, Bc: int, causal: bool) -> str:
    """The NVRTC name expression of one instantiation: every kernel, forward and backward, is
    ``tileattn::<kernel><T, HEAD_DIM, Br, Bc, CAUSAL>``."""
    return f"tileattn::{kernel}<{_CTYPE[dtype]}, {head_dim}, {Br}, {Bc}, {str(causal).lower()}>"


@dataclasses.dataclass(frozen=True)
class Version:
    name: str
    file: str  # under csrc/
    kernel: str  # template name inside namespace tileattn
    kind: Kind
    tiles: dict[int, tuple[int, int]]  # head dim -> (Br, Bc); its keys are the supported head dims
    # per_head: grid = B*H (K/V outer); q_outer: grid = (Tr, B*H); persistent: one CTA per SM (at most
    # Tr*B*H), each walking tiles (the kernel reads B*H from the bh_count field)
    grid_style: GridStyle
    dtypes: tuple[str, ...] = ("float32",)
    min_arch: int = 80  # compute capability major*10 + minor
    max_arch: int | None = None  # the newest arch it runs on: wgmma exists on sm_90a only, not on sm_100
    arch_specific: bool = False  # compile for sm_XYa (wgmma, setmaxnreg)
    workspace_per_row: int = 0  # float32 scratch per (b, h, query row): v1's m_i, l_i in HBM
    precision: Precision = "fp32"
    priority: int = 0  # version=None picks the highest-priority rung that takes the inputs
    summary: str = ""
    # Per-arch overrides of `tiles`, chosen by measurement on that arch: {min arch: {head dim:
    # (Br, Bc)}}; the highest min arch <= the device's arch that lists the head dim wins.
    arch_tiles: dict[int, dict[int, tuple[int, int]]] = dataclasses.field(default_factory=dict)
    # Spill bytes ptxas may report for an arch_tiles instantiation that measured faster than the
    # spill-free default tile (the rung's source says which and why); 0 for every default tile.
    arch_tile_spill_bytes: int = 0
    # Spill bytes ptxas may report for a default tile under some NVRTC release, per head dim (the
    # rung's source says which release and why); the compile tests hold every NVRTC to it.
    spill_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
    tensor_maps: bool = False  # reads tiles through TMA descriptors of q, k, v (api.py passes them as workspace)
    # False: the default dispatch passes over this rung for causal calls of fewer than
    # SHORT_CAUSAL_ROWS query rows (v3.7: its 192-row tiles waste more of the diagonal there).
    short_causal: bool = True
    # The operands the host splits into scaled fp16 hi / lo halves (api._split_blocks,
    # csrc/split_halves.cu) for the rung to read through its tensor maps, their block maxima in
    # the split_amax field: v2.4 ("q", "k", "v"); v2.5 splits q itself ("k", "v").
    split_operands: tuple[str, ...] = ()

    @property
    def head_dims(self) -> tuple[int, ...]:
        return tuple(sorted(self.tiles))

    def tile(self, head_dim: int, arch: int | None = None) -> tuple[int, int]:
        """(Br, Bc) at this head dim on this arch (major*10 + minor; None: the default tile)."""
        for min_arch in sorted(self.arch_tiles, reverse=True):
            if arch is not None and arch >= min_arch and head_dim in self.arch_tiles[min_arch]:
                return self.arch_tiles[min_arch][head_dim]
        return self.tiles[head_dim]

    def runs_on(self, arch: int) -> bool:
        return self.min_arch <= arch and (self.max_arch is None or arch <= self.max_arch)

    def arch_range(self) -> str:
        return f"sm_{self.min_arch}" + (
            "+" if self.max_arch is None else "" if self.max_arch == self.min_arch else f"-sm_{self.max_arch}"
        )

    def is_arch_tile(self, head_dim: int, arch: int | None) -> bool:
        return self.tile(head_dim, arch) != self.tiles[head_dim]

    def name_expression(self, dtype: str, head_dim: int, causal: bool, arch: int | None = None) -> str:
        return name_expression(self.kernel, dtype, head_dim, *self.tile(head_dim, arch), causal)

    def supports(self, dtype: str, head_dim: int, arch: int, precision: str | None = None) -> bool:
        """precision None means the default: FP32-level accuracy for FP32 inputs."""
        wanted = precision or ("fp32" if dtype == "float32" else "native")
        return (
            dtype in self.dtypes
            and head_dim in self.tiles
            and self.runs_on(arch)
            and (self.precision == wanted or self.precision == "native")
        )


def arch_number(arch: str) -> int:
    """'sm_90a' -> 90."""
    return int("".join(ch for ch in arch if ch.isdigit()))


_V1 = Version(
    name="v1",
    file="v1_kv_outer.cu",
    kernel="v1_fwd",
    kind="simt",
    tiles={32: (32, 32), 64: (32, 32), 128: (32, 32)},
    grid_style="per_head",
    workspace_per_row=2,
    summary="K/V outer, Q inner, grid = B*H; O, m, l round-trip HBM per K/V block",
)
_V1_BR48 = dataclasses.replace(
    _V1,
    name="v1_br48",
    tiles={32: (48, 48), 64: (48, 48), 128: (48, 48)},
    priority=1,
    summary="v1 with Br=Bc=48, the largest tile under 48 KB of static shared memory at D=64",
)
_V2_2 = Version(
    name="v2.2",
    file="v2_2_tf32x3.cu",
    kernel="v2_2_fwd",
    kind="tensor_fp32",
    tiles={32: (128, 64), 64: (128, 64), 128: (128, 32)},
    grid_style="q_outer",
    priority=5,
    summary="FA2 warp layout on mma.sync m16n8k8 TF32 tensor cores, each FP32 operand split hi + lo and 3 "
    "products summed (3xTF32): FP32-level error",
)
# The same kernel with one TF32 product per multiply: no lo halves in shared memory.
_V2_2_TF32 = dataclasses.replace(
    _V2_2,
    name="v2.2_tf32",
    kernel="v2_2_tf32_fwd",
    precision="tf32",
    summary="v2.2 with one TF32 product per multiply (opt-in precision='tf32'): ~3x fewer mma, ~1e-3 error",
)


_V2_3 = Version(
    name="v2.3",
    file="v2_3_wgmma_tf32x3.cu",
    kernel="v2_3_fwd",
    kind="tensor_fp32",
    tiles={32: (128, 64), 64: (128, 64), 128: (128, 32)},
    grid_style="q_outer",
    min_arch=90,
    max_arch=90,
    arch_specific=True,
    priority=6,
    summary="3xTF32 on Hopper wgmma: a producer warpgroup splits K/V into swizzled hi/lo tiles while two consumer "
    "warpgroups multiply (operands read from shared memory by the tensor core): FP32-level error",
)
_V2_3_TF32 = dataclasses.replace(
    _V2_3,
    name="v2.3_tf32",
    kernel="v2_3_tf32_fwd",
    tiles={32: (128, 128), 64: (128, 64), 128: (128, 32)},
    precision="tf32",
    summary="v2.3 with one TF32 product per multiply (opt-in precision='tf32'): ~3x fewer wgmma, ~1e-3 error",
)

# The default FP32 rung on sm_90 at D = 64 and 128 until v2.5 (priority above v2.3's): 3.2-5.5x SDPA efficient
# where v2.3 is 1.8-2.8x, with a lower error (2-8e-7 against 1-2e-6; bench/results/fp32.json).
_V2_4 = Version(
    name="v2.4",
    file="v2_4_wgmma_fp16x3.cu",
    kernel="v2_4_fwd",
    kind="tensor_fp32",
    tiles={64: (128, 64), 128: (128, 64)},
    grid_style="q_outer",
    min_arch=90,
    max_arch=90,
    arch_specific=True,
    priority=7,
    tensor_maps=True,
    split_operands=("q", "k", "v"),
    summary="3xFP16 on Hopper wgmma (bwd_v2.3's idea in the forward): q, k, v as fp16 hi + lo halves under "
    "power-of-two scales, three products per multiply, P V from zero per block merged by FFMA; v3.3's "
    "pipeline",
)

# The default FP32 rung on sm_90 at D = 64 and 128 (priority above v2.4's): the host's split pass
# over q was ~1/3 of the split's traffic, and the split ~30% of v2.4's call at N=1024 (B=32, H=8,
# D=64); here no copy of q is made.  fp32 suite at 63c0cc3 (H200, one run): v2.4 / v2.5 ms at
# N=8192 D=64 3.04 / 3.00, causal 1.69 / 1.63; D=128 5.08 / 5.15, causal 2.78 / 2.75; N=1024 D=64
# 0.50 / 0.48, causal 0.36 / 0.33; N=32768 D=64 equal (bench/results/fp32.json).
_V2_5 = dataclasses.replace(
    _V2_4,
    name="v2.5",
    kernel="v2_5_fwd",
    priority=8,
    split_operands=("k", "v"),
    summary="v2.4 with Q split by its own CTA: each consumer warpgroup loads its 64 rows of FP32 Q, finds "
    "their max and writes the fp16 halves into the swizzled tiles itself (no pass over q before the "
    "kernel)",
)


def _v3_tile(D: int) -> tuple[int, int]:
    """(Br, Bc) for v3 by head dim: as many registers as a block of 8 warps affords without spills
    (16 rows per warp, S and O fragments in registers; Q in registers up to D=128)."""
    if D <= 32:
        return 128, 64
    if D <= 64:
        return 128, 32  # fits 2 blocks per SM under 128 registers
    if D <= 128:
        return 128, 64
    if D <= 192:
        return 128, 32
    return 64, 32


def _v3_1_tile(D: int) -> tuple[int, int]:
    """(Br, Bc) for v3.1: 32 rows per warp up to D=128 (4 warps), then v3's 16-row layout."""
    if D <= 80:
        return 128, 64
    if D <= 192:
        return 128, 32
    return 64, 32


_V3 = Version(
    name="v3",
    file="v3_mma.cu",
    kernel="v3_fwd",
    kind="mma",
    dtypes=("bfloat16", "float16"),
    tiles={D: _v3_tile(D) for D in range(16, 257, 8)},
    grid_style="q_outer",
    precision="native",
    priority=10,
    summary="FA2 on mma.sync m16n8k16 (fp16/bf16, fp32 accumulation): S, O in registers, P fed back as the "
    "A operand, ldmatrix(.trans) from swizzled shared memory, cp.async K/V pipeline",
)
_V3_1 = dataclasses.replace(
    _V3,
    name="v3.1",
    file="v3_1_mma.cu",
    kernel="v3_1_fwd",
    tiles={D: _v3_1_tile(D) for D in range(16, 257, 8)},
    priority=11,
    # Hopper (measured on an H200, bf16, N=8192, vs PyTorch's FA2 in the same run): Bc=128 at D<=64
    # (1.00x vs 0.93x at Bc=64) and Bc=64 up to D=128 (0.96x / 0.99x causal vs 0.93x / 0.88x at
    # Bc=32).  From D=88 the Bc=64 tile spills 4-24 bytes: loop-invariant ldmatrix offsets
    # and the loop bound, reloaded from L1 a few times per K/V block (see v3_1_mma.cu).
    arch_tiles={90: {D: (128, 128) if D <= 64 else (128, 64) for D in range(16, 129, 8)}},
    arch_tile_spill_bytes=24,
    summary="v3 with 32 query rows per warp (two m16 tiles) up to D=128: every K/V fragment loaded by "
    "ldmatrix feeds two MMAs, halving shared-memory traffic per MMA",
)

_V3_2 = dataclasses.replace(
    _V3_1,
    name="v3.2",
    file="v3_2_mma_tma.cu",
    kernel="v3_2_fwd",
    # v3.1's head dims up to 128 (two m16 row tiles per warp) at v3.1's Hopper tiles, except Bc=32 at
    # D=104, 112, where Bc=64 spills here.
    tiles={D: (128, 128) if D <= 64 else (128, 32) if D in (104, 112) else (128, 64) for D in range(16, 129, 8)},
    arch_tiles={},
    arch_tile_spill_bytes=0,
    min_arch=90,
    tensor_maps=True,
    spill_bytes={128: 8},  # NVRTC 13.0, non-causal: read back in the epilogue only (v3_2_mma_tma.cu)
    priority=12,
    summary="v3.1 with Q, K, V tiles loaded by the tensor memory accelerator (one cp.async.bulk.tensor per "
    "tile panel from one thread, mbarrier completion): no per-thread copy code (sm_90)",
)

_V3_3 = dataclasses.replace(
    _V3_2,
    name="v3.3",
    file="v3_3_wgmma.cu",
    kernel="v3_3_fwd",
    tiles={64: (128, 128), 128: (128, 128), 192: (128, 64), 256: (128, 64)},
    max_arch=90,
    arch_specific=True,
    priority=13,
    summary="FA3-style: wgmma from TMA-loaded shared memory (V read N-major), a producer warpgroup issuing the "
    "copies and two consumer warpgroups of 64 rows, setmaxnreg 24/240 (sm_90a)",
)

_V3_4 = dataclasses.replace(
    _V3_3,
    name="v3.4",
    file="v3_4_pingpong.cu",
    kernel="v3_4_fwd",
    # D=64 only: there v3.3's softmax costs about as much as its MMAs (v3_4_pingpong.cu); at D=128
    # the ping-pong measured within 1.5% of v3.3.
    tiles={64: (128, 128)},
    priority=14,
    summary="v3.3 with the two consumer warpgroups taking turns at the tensor core (ping-pong on named "
    "barriers): one's softmax runs under the other's MMAs (sm_90a)",
)

_V3_6 = dataclasses.replace(
    _V3_3,
    name="v3.6",
    file="v3_6_persistent.cu",
    kernel="v3_6_fwd",
    grid_style="persistent",
    # D = 256 at v3.3's (128, 64): 1.13-1.19x v3.3 at N = 8192 with the lazy rebase (scripts/fwd_probe.py,
    # bf16, 2026-12-03, bench/NOTES.md); 192 stays on v3.3 until a run times it.
    tiles={64: (128, 128), 128: (128, 128), 256: (128, 64)},
    priority=15,
    summary="v3.3 (v3.4 at D=64) as a persistent kernel: a CTA per SM walks the tiles (causal: pairs of a long and "
    "a short Q block, equal work), the next tile's Q and K/V loading under the current tile's last P V and stores "
    "(sm_90a)",
)

_V3_7 = dataclasses.replace(
    _V3_6,
    name="v3.7",
    file="v3_7_three_consumers.cu",
    kernel="v3_7_fwd",
    tiles={64: (192, 128)},
    # Causal, NVRTC 13.0: Tr = ceil(Nq / 192) (a multiply-high, not v3.6's shift) is computed before
    # the roles split and kept on the stack across setmaxnreg: one STL a CTA, an LDL a tile per role,
    # none in the K/V loop (SASS).
    spill_bytes={64: 8},
    short_causal=False,
    priority=16,
    summary="v3.6 at D=64 with three consumer warpgroups (Br=192, 160 registers each) in place of the ping-pong: a "
    "third warpgroup's GEMMs ready while two run their softmax (sm_90a)",
)

# v3.6 at D = 128 with K/V blocks of 160 keys (S by m64n160k16): the softmax's per-block costs (the
# row max's shuffles, the rebase test, the barriers, the wgmma issue and waits) spread over 25% more
# keys.  Shared memory 225 KB (Q, two stages of 160-row K and V, O's stage); 192 keys fit only
# without O's stage and measured slower.  Measured on an H100 (scripts/tile_sweep.py, bf16, H=16,
# B*N = 32768, one run beside cuDNN, bench/NOTES.md): N = 8192 without a mask 3.299 against
# 3.488 ms (1.086x against 1.028x cuDNN), causal 1.752 against 1.735; N = 1024 0.502 against
# 0.461 (the last block of 7 is 40% empty).  So the dispatch took it for calls without a causal
# mask of at least 8192 keys, until the speculative softmax (v3_3_wgmma.cu) took the row max's
# per-block cost away: then v3.6's 128 keys ran faster at every length of the mma suite (H100,
# steady clock, bf16 without a mask, ratio to cuDNN: N = 4096 1.112x against 1.052x, 8192 1.129x
# against 1.072x, 32768 1.143x against 1.094x; bench/results/mma_steady_h100.json).  A rung the
# dispatch passes over (priority below v3.6's), kept as the measured step.
_V3_6_WIDE = dataclasses.replace(
    _V3_6,
    name="v3.6_wide",
    tiles={128: (128, 160)},
    priority=14,
    summary="v3.6 at D=128 with 160-key K/V blocks: the softmax's per-block costs spread over 25% more keys; "
    "since the speculative softmax slower than v3.6, which the dispatch takes (sm_90a)",
)

VERSIONS: dict[str, Version] = {
    v.name: v
    for v in [
        _V1,
        _V1_BR48,
        Version(
            name="v1.1",
            file="v1_1_kv_outer_async.cu",
            kernel="v1_1_fwd",
            kind="simt",
            tiles={32: (64, 64), 64: (64, 64), 128: (64, 32)},
            grid_style="per_head",
            workspace_per_row=2,
            priority=2,
            summary="v1 + cp.async double-buffered K/V, Br=64",
        ),
        Version(
            name="v2",
            file="v2_q_outer.cu",
            kernel="v2_fwd",
            kind="simt",
            tiles={32: (128, 32), 64: (128, 32), 128: (128, 32)},
            grid_style="q_outer",
            priority=3,
            summary="Q outer, one thread per row, Q/Oacc in shared, m/l in registers, deferred "
            "normalisation, cp.async double buffer, two-level causal mask",
        ),
        Version(
            name="v2.1",
            file="v2_1_register_tiled.cu",
            kernel="v2_1_fwd",
            kind="simt",
            tiles={32: (128, 64), 64: (128, 64), 128: (64, 32)},
            # Qs [Br][D+4], Ks [Bc][D+4], Vs [Bc][D], Ps [Br][Bc+4]
            grid_style="q_outer",
            priority=4,
            summary="v2 register-tiled like an SGEMM: 4 rows x Bc/8 keys of S and 4 rows x D/8 of O per "
            "thread in registers, LDS.128 reads, exp2 with folded scale, 16 warps per SM",
        ),
        _V2_2,
        _V2_2_TF32,
        _V2_3,
        _V2_3_TF32,
        _V2_4,
        _V2_5,
        _V3,
        _V3_1,
        _V3_2,
        _V3_3,
        _V3_4,
        _V3_6,
        _V3_6_WIDE,
        _V3_7,
    ]
}


# Where a causal call counts as short for Version.short_causal.  Measured on an H200 (bf16, D=64,
# causal, v3.7 against v3.6 in one run, bench/results/sweeps/mma_middles_last_96c6cdf.json): 0.91x
# at N=1024 (192-row blocks waste more of the diagonal there), 1.04x at 2048, 1.07-1.13x from 4096.
SHORT_CAUSAL_ROWS = 2048


def short_causal(causal: bool, Nq: int) -> bool:
    """The default dispatch's first shape rule: a causal call of fewer than SHORT_CAUSAL_ROWS query rows."""
    return bool(causal) and Nq < SHORT_CAUSAL_ROWS


# Where a call without a causal mask counts as long for FP8's 192-key blocks (v3.5_wide, fp8.py):
# the shortest length measured where wide blocks win, first for bf16's 160-key v3.6_wide at D=128
# on an H100 (tile_sweep.py beside cuDNN; bench/results/sweeps/wide_blocks_probe_af0d624_h100.log
# and spec_softmax_wide_first_call_0c17585_h100.log; N = 1024 0.92x v3.6, 2048 0.997x, 4096
# 0.994x, 8192 1.06x, 32768 1.075x, before the speculative softmax), and for FP8 (docs/fp8.md).
LONG_KEYS = 8192


def long_plain(causal: bool, Nk: int) -> bool:
    """FP8's shape rule (fp8.py): a call without a causal mask of at least LONG_KEYS keys."""
    return not causal and Nk >= LONG_KEYS


def select(
    dtype: str,
    head_dim: int,
    arch: int,
    precision: str | None = None,
    short_causal: bool = False,
) -> Version | None:
    """The fastest registered rung that takes these inputs on this arch at this precision, or None.
    short_causal: a causal call of fewer than SHORT_CAUSAL_ROWS query rows."""
    candidates = [
        v
        for v in VERSIONS.values()
        if v.supports(dtype, head_dim, arch, precision) and (v.short_causal or not short_causal)
    ]
    return max(candidates, key=lambda v: v.priority, default=None)


# ---- backward ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """A kernel outside the forward ladder: ``tileattn::<kernel><T, HEAD_DIM, Br, Bc, CAUSAL>``.
    Backward rungs take TILEATTN_BWD_PARAMS (csrc/bwd_common.cuh), grid (ceil(Nk / Bc), B*H): K/V
    blocks outer, after the preprocessing kernel (D_i = rowsum(dO * O)); the decode kernels take
    TILEATTN_DEC_PARAMS (csrc/dec_v1_splitkv.cu)."""

    name: str
    file: str
    kernel: str
    tiles: dict[int, tuple[int, int]]  # head dim -> (Br, Bc)
    dtypes: tuple[str, ...]
    fields: str = "bwd"  # its parameter list: _params.ENTRY_ARGS["bwd"] or ["dec"]
    summary: str = ""
    min_arch: int = 80  # compute capability major*10 + minor
    spill_bytes: dict[int, int] = dataclasses.field(default_factory=dict)  # documented budgets, by head dim
    causal_variants: tuple[bool, ...] = (False, True)  # (False,): a kernel that ignores CAUSAL
    max_arch: int | None = None  # as Version: wgmma kernels run on sm_90 only
    arch_specific: bool = False  # compiled for sm_XYa (wgmma, setmaxnreg)
    tensor_maps: bool = False  # takes a TmaMaps parameter after its fields
    deterministic: bool = True  # backward: honours dq_semaphore (deterministic=True)
    precision: Precision = "native"  # as Version's: "fp32" / "tf32" for the FP32 backward rungs
    # Backward: dq_accum in Q-block chunks of Br x D floats in the wgmma accumulator's order
    # (bwd_v5_dq_bulk.cu), which backward._dq_from_blocks permutes back.
    dq_blocked: bool = False
    # Backward: reads q, k, v, dO as scaled fp16 hi / lo halves (api._split_blocks) through
    # its tensor maps, and their maxima, which set the scales, in the `split_amax` field
    # (bwd_v2_3_fp16x3.cu).
    split_operands: bool = False
    # Decode kernels and page sizes: "any"; "tile" (runs any, but the default choice skips it for
    # pages shorter than its tile: slower there, serving._decode_entry); "copy_engine" (its tensor
    # copies take whole boxes of one page: a contiguous cache, pages of a multiple of Bc, or of a
    # multiple of 8 rows that divides Bc; serving._takes_pages).
    page_rule: str = "any"
    # Packed sequences (cu_seqlens) launch as (total_q // Br + sequences, heads): a tile per
    # (sequence, Q block), csrc/common.cuh's packed_tile; otherwise (longest sequence's Q blocks,
    # sequences x heads).
    packed_tiles: bool = False
    # Dense calls only, launched as min(SMs, units) CTAs that walk csrc/common.cuh's
    # persistent_tile order (a unit: a tile, causal a pair), reading B * H from bh_count.
    persistent: bool = False
    # Backward rungs whose last partial wave of K/V blocks runs as split blocks after the others in
    # the same launch (bwd_common.cuh's bwd_work, backward._tail_plan).
    tail_split: bool = False

    def runs_on(self, arch: int) -> bool:
        return self.min_arch <= arch and (self.max_arch is None or arch <= self.max_arch)

    @property
    def head_dims(self) -> tuple[int, ...]:
        return tuple(sorted(self.tiles))

    def instantiations(self):
        """Every (dtype, head dim, causal) the entry compiles."""
        return [(dt, D, causal) for dt in self.dtypes for D in self.head_dims for causal in self.causal_variants]

    def name_expression(self, dtype: str, head_dim: int, causal: bool) -> str:
        return name_expression(self.kernel, dtype, head_dim, *self.tiles[head_dim], causal)


# D_i = rowsum(dO * O): BWD_PRE_ROWS rows per block, each by 4-32 lanes (bwd_common.cuh).
BWD_PRE_ROWS = 8
BWD_PREPROCESS = KernelEntry(
    name="bwd_preprocess",
    file="bwd_common.cuh",
    kernel="bwd_preprocess",
    tiles={D: (BWD_PRE_ROWS, 0) for D in (*range(16, 129, 16), 160, 192, 224, 256)},
    dtypes=("float32", "float16", "bfloat16"),
    causal_variants=(False,),
)

# One warpgroup per 64 keys; bwd_v5 (below) is 1.5-1.7x faster, and 3-6x in deterministic mode.
_BWD_V3 = KernelEntry(
    name="bwd_v3",
    file="bwd_v3_wgmma.cu",
    kernel="bwd_v3",
    tiles={64: (64, 64), 128: (64, 64)},
    dtypes=("float16", "bfloat16"),
    summary="bwd_v2's loop nest on wgmma (one warpgroup): S^T, dP^T with keys as M, P^T and dS^T "
    "from their accumulators as the register A operand of dV and dK, dQ = dS K from shared memory",
    min_arch=90,
    max_arch=90,
    arch_specific=True,
    # At 255 registers, S^T and dP^T (32 each) beside dK and dV (64 each at D=128), the P^T and dS^T
    # fragments, step 5's dQ and the next Q block's row statistics: ptxas spills 32-40 bytes at
    # D=128 under NVRTC 13.0 (80-92 before the dS stores' fix, 6ce5495 / 4f9549b; D=64: 0), loop
    # invariants (addresses, indices), stored once and reloaded per Q block.
    spill_bytes={64: 16, 128: 112},
)
# 1.4-1.8x bwd_v2 on an H200; the default on sm_90 at D = 64 and 128 until bwd_v5.
_BWD_V4 = dataclasses.replace(
    _BWD_V3,
    name="bwd_v4",
    file="bwd_v4_ws.cu",
    kernel="bwd_v4",
    tiles={64: (64, 128), 128: (64, 128)},
    summary="bwd_v3's products on a warp-specialised CTA of 128 keys: a producer warp streams Q_i, dO_i "
    "(TMA), lse_i, D_i into three stages; two consumer warpgroups of 64 keys share them (sm_90a)",
    tensor_maps=True,
    deterministic=False,
    # D=128: dK and dV (64 registers each) beside step 4's dQ (32) and the P^T / dS^T fragments
    # (32) of the dV / dK products still in flight, in the consumers' 240 registers: ptxas spills
    # 0-8 bytes under NVRTC 13.0 (104-152 before the dS stores' offsets lost their integer
    # division, 6ce5495).  D=64: none.
    spill_bytes={128: 32},
)
# bwd_v4 with dQ through shared memory and one bulk reduction a warpgroup per Q block: the default
# on sm_90 at D = 64 and 128, deterministic or not (backward.default_rung), 1.1-1.4x bwd_v4 on an H200.
_BWD_V5 = dataclasses.replace(
    _BWD_V4,
    name="bwd_v5",
    file="bwd_v5_dq_bulk.cu",
    kernel="bwd_v5",
    summary="bwd_v4 with dQ written to shared memory in the accumulator's order and added by one bulk "
    "reduction (cp.reduce.async.bulk) a warpgroup per Q block, issued by a producer warp",
    # D=64: 128 query rows a block (S^T and dP^T m64n128, dQ split by rows; bwd_v4_ws.cu).
    tiles={64: (128, 128), 128: (64, 128)},
    dq_blocked=True,
    deterministic=True,  # the producer's dQ warp orders the reductions (bwd_v4_ws.cu)
    # D=128: 16 bytes of loop invariants, stored once and reloaded per Q block (NVRTC 13.0: up to
    # 48 bytes of loads), beside bwd_v4's registers and the dQ tile's address and phase.  D=64
    # (Br = 128: S^T and dP^T 64 registers each beside dK, dV and the fragments): 136 bytes of
    # stack, 152 / 180 bytes of spill stores / loads under NVRTC 13.0, nearly all on the masked
    # path of edge blocks; the unmasked path stores and reloads about 5 values a Q block.  The
    # tail's epilogue (bwd_tail_finish) took D=64's to 168 / 212 bytes and D=128's to 0 under NVRTC
    # 13.0, and D=128 non-causal's to 24 / 32 / 60 bytes (stack / stores / loads) under 13.5; the
    # tail in the main launch (bwd_work's 1-D grid) D=64 non-causal's to 188 / 232 under 13.0.
    spill_bytes={64: 240, 128: 64},
    tail_split=True,
)

# D=256 on sm_90 (bwd_v5's registers hold dK, dV rows of D <= 128): the head dim split between the
# consumer warpgroups, 64 keys a CTA; the default there unless deterministic (backward.default_rung).
_BWD_V6 = dataclasses.replace(
    _BWD_V5,
    name="bwd_v6",
    file="bwd_v6_dsplit.cu",
    kernel="bwd_v6",
    summary="bwd_v5's pipeline with the head dim split between the two consumer warpgroups (each owns "
    "half of dK, dV, dQ's columns; S^T, dP^T split by query rows, P and dS shared through shared "
    "memory): D=256, dQ by red.global.add.v4 into bwd_v5's blocked layout",
    tiles={256: (64, 64)},
    deterministic=False,
    spill_bytes={},
    tail_split=False,
)

# bwd_v5's blocked dQ accumulator -> the gradient (the inputs' dtype, or float32), in the caller's
# layout: a 64 x 64 tile a block.  Its dtype is the gradient's; Br, Bc are unused (the tile is 64
# rows for every Br).
BWD_DQ_CONVERT = KernelEntry(
    name="bwd_dq_convert",
    file="bwd_dq_convert.cu",
    kernel="bwd_dq_convert",
    tiles={D: (64, 0) for D in (*_BWD_V5.tiles, *_BWD_V6.tiles)},
    dtypes=("float32", "float16", "bfloat16"),
    fields="dqc",
    summary="bwd_v5's and bwd_v6's dQ tiles (the wgmma accumulator's order) -> row order in shared "
    "memory -> the gradient's dtype and layout",
    causal_variants=(False,),
)

# The 3xFP16 rungs' operands (v2.4, bwd_v2.3): an FP32 tensor as scaled fp16 hi / lo halves, an
# exponent per block of 64 rows, each block's max |x| found and written by the CTA that splits it
# (one pass); Br, Bc unused.
SPLIT_BLOCKS = KernelEntry(
    name="split_blocks",
    file="split_halves.cu",
    kernel="split_blocks",
    tiles={D: (0, 0) for D in (64, 128)},
    dtypes=("float32",),
    fields="split_blocks",
    summary="the 3xFP16 rungs' operands: an FP32 tensor as fp16 hi + lo halves under an exponent per block of 64 rows "
    "(from the block's max |x|, written beside them), in one pass",
    causal_variants=(False,),
)

# FP32 on mma.sync tensor cores: the FP32 backward where bwd_v2.3 does not run (sm_80, D=32,
# deterministic; backward.default_rung), bwd_v2.2_tf32 with precision="tf32".
_BWD_V2_2 = KernelEntry(
    name="bwd_v2.2",
    file="bwd_v2_2_tf32x3.cu",
    kernel="bwd_v2_2",
    # Bc = 32 at D=128: K and V hi / lo, Q and dO, P^T / dS^T in 151 KB.  At D=64 too: 85 KB and 186
    # registers, two blocks an SM, 8-10% faster than Bc = 64's one (H200, bench/NOTES.md).
    tiles={32: (64, 64), 64: (64, 32), 128: (64, 32)},
    dtypes=("float32",),
    precision="fp32",
    # D=128 causal on sm_90: 255 registers and 4 bytes of spills (8 of stack) under NVRTC 13.0,
    # since dQ's passes hold 32 partial sums (measured faster than 16, bench/NOTES.md).
    spill_bytes={128: 8},
    summary="bwd_v2's loop nest for FP32 on mma.sync m16n8k8 TF32, every operand split hi + lo and 3 "
    "products summed (3xTF32): FP32-level error",
)
_BWD_V2_2_TF32 = dataclasses.replace(
    _BWD_V2_2,
    name="bwd_v2.2_tf32",
    kernel="bwd_v2_2_tf32",
    # Bc = 64 at D=64: two stages, one block an SM, 10% faster here than Bc = 32's two blocks.
    tiles={32: (64, 64), 64: (64, 64), 128: (64, 32)},
    precision="tf32",
    summary="bwd_v2.2 with one TF32 product per multiply (opt-in precision='tf32'): ~3x fewer mma, ~1e-3 error",
)

# FP32 on Hopper's wgmma: each operand as two scaled fp16 halves (api._split_blocks), three
# products per multiply; the default FP32 backward on sm_90 at D = 64 and 128.
_BWD_V2_3 = KernelEntry(
    name="bwd_v2.3",
    file="bwd_v2_3_fp16x3.cu",
    kernel="bwd_v2_3",
    tiles={64: (64, 64), 128: (64, 64)},
    dtypes=("float32",),
    precision="fp32",
    min_arch=90,
    max_arch=90,
    arch_specific=True,
    tensor_maps=True,
    split_operands=True,
    dq_blocked=True,
    deterministic=False,
    summary="FP32 on wgmma as 3xFP16: q, k, v, dO (and P, dS) as fp16 hi + lo halves under power-of-two "
    "scales, three products per multiply (FP32-level error, fp16's rate, transposed tiles allowed); "
    "bwd_v6's warp-specialised CTA of 64 keys, dV and dK summed across Q blocks in FP32",
)

# The autograd formula (backward.py) picks, for FP32, bwd_v2.3 on sm_90 at D = 64 and 128 unless
# deterministic, else bwd_v2.2 (bwd_v2.2_tf32 with precision="tf32"); for fp16/bf16 bwd_v5 on sm_90
# at D = 64 and 128, bwd_v6 at 256 unless deterministic, bwd_v2 elsewhere
# (backward.default_rung); an input that requires grad at a head dim none takes raises
# (api._check_backward_exists).
BWD_VERSIONS: dict[str, KernelEntry] = {
    v.name: v
    for v in [
        KernelEntry(
            name="bwd_v1",
            file="bwd_v1_simt.cu",
            kernel="bwd_v1",
            tiles={32: (64, 64), 64: (64, 64), 128: (32, 64)},
            dtypes=("float32",),
            precision="fp32",
            summary="FA2 backward on CUDA cores, FP32: K/V blocks outer, P from the forward's lse, dS in "
            "shared memory, dK/dV in registers, dQ by float32 atomics",
        ),
        KernelEntry(
            name="bwd_v2",
            file="bwd_v2_mma.cu",
            kernel="bwd_v2",
            # Bc = 32 above D=128: the step-4 warps split the head dim in two (bwd_v2_mma.cu).
            tiles={**{D: (64, 64) for D in range(16, 129, 16)}, **{D: (64, 32) for D in (160, 192, 224, 256)}},
            dtypes=("float16", "bfloat16"),
            summary="bwd_v1 on mma.sync m16n8k16 (fp32 accumulators): S, dP, dQ from row fragments, "
            "P^T dO and dS^T Q through ldmatrix.trans of 16-bit P, dS tiles",
            # D=96..128 (and 224, 256, whose warps hold 112, 128 columns): dK_j and dV_j (up to 128
            # fp32 registers) beside S and dP at 255 registers spill 8-32 bytes (NVRTC 13.0); the
            # Hopper rung is meant to replace it there.  D=256 causal for sm_80 under NVRTC 13.5:
            # 48 bytes since the epilogue may write dK, dV straight into the gradients (store_dkdv).
            spill_bytes={96: 16, 112: 32, 128: 32, 224: 16, 256: 48},
        ),
        _BWD_V2_2,
        _BWD_V2_2_TF32,
        _BWD_V2_3,
        _BWD_V3,
        _BWD_V4,
        _BWD_V5,
        _BWD_V6,
    ]
}


# ---- serving (issue 12, being built) ---------------------------------------------------------

# Split-KV decoding over a contiguous or paged KV cache (serving.decode_with_kvcache): per
# (split, batch x K/V head x block of Br = 16 query rows), Bc keys per tile, then, with two splits
# or more, dec_combine (DEC_COMBINE_ROWS rows, one warp each, per block) merges them through their
# lse (one split: the decode kernel writes the output itself).  The
# fastest entry whose min_arch the device meets runs (serving.py).
# dec_v1 is not at D=256: its 128 accumulator registers beside the row gathers spill 12-24 bytes
# under NVRTC 13.0 and 60-72 under 13.5 (sm_80); it needs the head dim split across warps.
DEC_V1 = KernelEntry(
    name="dec_v1",
    file="dec_v1_splitkv.cu",
    kernel="dec_v1",
    fields="dec",
    tiles={64: (16, 32), 128: (16, 32)},
    dtypes=("float16", "bfloat16"),
    summary="split-KV decode: GQA query rows as the MMA's M, keys split over blocks and warps, "
    "merged through lse; paged caches of any page size",
    # D=64 keeps Q's fragments in registers; beside the variants' per-row bounds and slopes and
    # the IEEE divisions' slow-path call, ptxas (at 168 registers, three blocks per SM) spills 12
    # bytes (16 of stack) under NVRTC 13.0.  Hopper runs dec_v4 / dec_v3; this is the fallback.  (Fast
    # divisions bring it to 4 bytes on sm_90, 0 on sm_80: not yet run on a GPU.)
    spill_bytes={64: 16},
)
DEC_V2 = KernelEntry(
    name="dec_v2",
    file="dec_v2_bulk.cu",
    kernel="dec_v2",
    fields="dec",
    tiles={64: (16, 128), 128: (16, 64), 256: (16, 64)},
    dtypes=("float16", "bfloat16"),
    summary="dec_v1 with one producer warp issuing a cp.async.bulk per K/V row, STAGES tiles ahead "
    "on mbarriers; four consumer warps share each tile",
    min_arch=90,
)
DEC_V3 = KernelEntry(
    name="dec_v3",
    file="dec_v3_cpasync.cu",
    kernel="dec_v3",
    fields="dec",
    tiles=DEC_V2.tiles,
    dtypes=("float16", "bfloat16"),
    summary="dec_v2 with four producer warps copying the K/V rows by cp.async, each thread's copies "
    "arriving on the stage's mbarrier when they land",
    min_arch=90,
)
DEC_V4 = dataclasses.replace(
    DEC_V3,  # its producers, dtypes and arch; its own stages and consumers
    name="dec_v4",
    file="dec_v4_warptiles.cu",
    kernel="dec_v4",
    # Stages of 32 keys (16 at D=256), each taken whole by one consumer warp; as many as fit in
    # ~200 KB (one block per SM: 8 at D=128).  H200, bf16, B=16, GQA 32:8, 16k keys, D=128, one
    # split: Bc=16 3.91, Bc=32-64 3.97-4.00 TB/s (scripts/decode_sweep.py; bench/results/checks).
    tiles={64: (16, 32), 128: (16, 32), 256: (16, 16)},
    summary="dec_v3's cp.async producers with small stages, each taken whole by one consumer warp: "
    "many tiles in flight, each consumer waiting only for its own",
    page_rule="tile",
)
DEC_V5 = dataclasses.replace(
    DEC_V4,  # its stages and consumers; the copy engine fills them
    name="dec_v5",
    file="dec_v5_tma.cu",
    kernel="dec_v5",
    summary="dec_v4's warp-owned stages filled by tensor copies (TMA, 128-byte swizzle), one issuing "
    "thread per consumer warp, instead of 128 threads of cp.async; contiguous caches, pages of a "
    "multiple of its tile or of a multiple of 8 rows dividing it",
    # 64-key stages (32 at D=256; 4 to 12 stages in ~200 KB): H200, bf16, B=16, GQA 32:8, 16k keys,
    # D=128, scripts/decode_sweep.py: contiguous 4.17-4.29 TB/s at Bc = 32 and 64 alike (0.97-0.98x
    # cuDNN); with one producer thread 16-row pages ran at 0.91x of contiguous at Bc = 64 and 0.86x
    # at 32 (a tile of 16-row pages is one copy per page), with four 0.98x at both (b180741).
    tiles={64: (16, 64), 128: (16, 64), 256: (16, 32)},
    tensor_maps=True,
    page_rule="copy_engine",
)
DEC_VERSIONS = (DEC_V1, DEC_V2, DEC_V3, DEC_V4, DEC_V5)
DEC_COMBINE_ROWS = 8
DEC_COMBINE = KernelEntry(
    name="dec_combine",
    file="dec_v1_splitkv.cu",
    kernel="dec_combine",
    fields="dec",
    tiles={D: (DEC_COMBINE_ROWS, 0) for D in sorted({D for e in DEC_VERSIONS for D in e.tiles})},
    dtypes=DEC_V1.dtypes,
    causal_variants=(False,),
)
DEC_ENTRIES = (*DEC_VERSIONS, DEC_COMBINE)


# v3.3 as the packed paths launch it, every forward field packed per call (csrc/common.cuh's room
# included): V3_3_PACKED, the rung's own kernel, reads cu_seqlens (flash_attn_varlen_func);
# V3_3_VARIANTS, its body compiled with VARIANTS (csrc/v3_3_wgmma.cu), also the sliding window,
# softcap and ALiBi (flash_attn_func and flash_attn_varlen_func).
def _v3_3_packed(name: str, kernel: str, summary: str) -> KernelEntry:
    return KernelEntry(
        name=name,
        file=_V3_3.file,
        kernel=kernel,
        tiles=_V3_3.tiles,
        dtypes=_V3_3.dtypes,
        fields="fwd",
        summary=summary,
        min_arch=_V3_3.min_arch,
        max_arch=_V3_3.max_arch,
        arch_specific=_V3_3.arch_specific,
        tensor_maps=_V3_3.tensor_maps,
        packed_tiles=True,
    )


V3_3_PACKED = _v3_3_packed("v3.3_packed", _V3_3.kernel, "v3.3 over packed variable-length sequences (cu_seqlens)")
V3_3_VARIANTS = _v3_3_packed(
    "v3.3_variants",
    "v3_3_variants_fwd",
    "v3.3 with a sliding window (blocks outside skipped), softcap (tanh on the SFU) and ALiBi",
)

# The score variants on v3.6's persistent walk (csrc/v3_6_persistent.cu): flash_attn_func's dense
# calls with a window, softcap or ALiBi on Hopper at v3.6's head dims (packed sequences stay on
# V3_3_VARIANTS, whose tiles come from packed_tile).
V3_6_VARIANTS = dataclasses.replace(
    V3_3_VARIANTS,
    name="v3.6_variants",
    file=_V3_6.file,
    kernel="v3_6_variants_fwd",
    tiles={D: _V3_6.tiles[D] for D in (64, 128)},  # (D = 256: not timed with variants; v3.3's kernel)
    summary="v3.6's persistent walk with a sliding window, softcap and ALiBi (dense calls)",
    packed_tiles=False,
    persistent=True,
)

# The same at D = 64 on v3.7's three consumer warpgroups (csrc/v3_7_three_consumers.cu): dense
# calls with ALiBi alone (no window, no softcap), where the plain dispatch would take v3.7 (not a
# short causal call); serving.attention_variants chooses.
V3_7_VARIANTS = dataclasses.replace(
    V3_6_VARIANTS,
    name="v3.7_variants",
    file=_V3_7.file,
    kernel="v3_7_variants_fwd",
    tiles=_V3_7.tiles,  # spill-free (NVRTC 13.0), causal included
    summary="v3.7's three consumer warpgroups with the score variants (dense calls with ALiBi alone at D=64)",
)

# The plain causal kernels' tiles, which v3.8 and v3.9 (the plain causal kernel with one variant)
# keep: v3.7's three consumer warpgroups at D = 64, v3.6's (128, 128) at D = 128.
_PLAIN_CAUSAL_TILES = {64: _V3_7.tiles[64], 128: _V3_6.tiles[128]}

# Causal ALiBi alone on the tensor core (csrc/v3_8_alibi_mma.cu): the plain causal kernels' walk,
# v3.7's tile at D = 64 and v3.6's at D = 128, with the key term as one more k16 step of S;
# serving.attention_variants takes it for dense causal calls with ALiBi and no other variant.
V3_8_ALIBI = dataclasses.replace(
    V3_6_VARIANTS,
    name="v3.8_alibi",
    file="v3_8_alibi_mma.cu",
    kernel="v3_8_alibi_fwd",
    tiles=_PLAIN_CAUSAL_TILES,
    causal_variants=(True,),
    spill_bytes=_V3_7.spill_bytes,
    summary="causal ALiBi's key term as one more k16 step of S = Q K^T (a constant key table against the "
    "slope in registers): plain causal's kernel, no instruction a score (dense calls)",
)

# A causal sliding window alone on the plain causal kernel (csrc/v3_9_window.cu): v3.7's tile at
# D = 64 and v3.6's at D = 128 (as v3.8), the window's first block for j_lo and the left edge's mask
# on the blocks that cross it; serving.attention_variants's default for a causal window alone at
# its head dims (1-2% faster than v3.6's variants kernel on an H100, docs/serving.md).
V3_9_WINDOW = dataclasses.replace(
    V3_6_VARIANTS,
    name="v3.9_window",
    file="v3_9_window.cu",
    kernel="v3_9_window_fwd",
    tiles=_PLAIN_CAUSAL_TILES,
    causal_variants=(True,),
    summary="a causal sliding window alone on plain causal's kernel: blocks left of the window skipped, the left "
    "edge masked on the blocks that cross it, the speculative softmax elsewhere (dense calls)",
)

# Variable-length batches on the mma.sync path (flash_attn_varlen_func off Hopper, and on Hopper at
# the head dims v3.3 has not): v3.1's body run per sequence (csrc/fa2_mma.cuh), at v3.1's default
# (spill-free) tiles, for the common head dims.
V3_1_VARLEN = KernelEntry(
    name="v3.1_varlen",
    file="v3_1_mma.cu",
    kernel="v3_1_varlen_fwd",
    tiles={D: _v3_1_tile(D) for D in (32, 64, 80, 96, 128, 160, 192, 256)},
    dtypes=("float16", "bfloat16"),
    fields="fwd",
    summary="v3.1 over packed variable-length sequences: each block's sequence as a batch of one",
    # D=192 causal on sm_90 (NVRTC 13.0): the per-sequence lengths and offset beside v3.1's 255
    # registers spill 8 bytes; Hopper runs v3.3 at D=192, so this is sm_90's fallback only.
    spill_bytes={192: 8},
)

# The score variants on the mma.sync path (flash_attn_func and flash_attn_varlen_func with a
# window, softcap or ALiBi off Hopper, at the head dims v3.3 has not, or with version="v3.1"): the
# varlen kernel's body compiled with VARIANTS (csrc/v3_1_mma.cu), packed or dense, at its tiles.
# Spill-free at every head dim on sm_80 and sm_90 (NVRTC 13.0), D=192 causal included.
V3_1_VARIANTS = dataclasses.replace(
    V3_1_VARLEN,
    name="v3.1_variants",
    kernel="v3_1_variants_fwd",
    summary="v3.1 with a sliding window (blocks outside skipped), softcap (tanh on the SFU) and ALiBi, packed or dense",
    spill_bytes={},
)

# FP8 (e4m3) inputs, bf16 output: v3.3's body on 8-bit wgmma walked as v3.6's (persistent), launched with every field
# (its descale factors are a room field) by fp8.py, which also writes the V^T it reads.
V3_5_FP8 = KernelEntry(
    name="v3.5",
    file="v3_5_fp8.cu",
    kernel="v3_5_fwd",
    # Bc = 256 at D=64 (two V^T panels): 517 against 464 TFLOP/s at Bc = 128, non-causal N=8192
    # (413 / 408 causal; H200, scripts/fp8_probe.py); at D=128 it spills 144 bytes and ran 645 / 728.
    tiles={64: (128, 256), 128: (128, 128), 256: (128, 128)},
    dtypes=("float8_e4m3fn",),
    fields="fwd",
    summary="v3.6 (v3.3 persistent) on FP8: e4m3 Q, K and V^T (wgmma k32), per-(batch, KV head) descale "
    "factors folded into the exponent, P rounded to e4m3 for P V, bf16 output (sm_90a)",
    min_arch=90,
    max_arch=90,
    arch_specific=True,
    tensor_maps=True,
)

# v3.5 at D = 128 with K/V blocks of 192 keys (S by m64n192k32, V^T in 64-key panels under the
# 64-byte swizzle), for calls without a causal mask of at least LONG_KEYS keys (fp8.attention):
# measured on an H100 (scripts/fp8_probe.py, kernel alone, B*N = 32768, H = 16, one call,
# bench/NOTES.md) N = 8192 2.446 against 2.623 ms, causal 1.389 against 1.382, N = 1024 0.422
# against 0.416 (causal 0.299 against 0.280).  256 spills (above).
V3_5_FP8_WIDE = dataclasses.replace(
    V3_5_FP8,
    name="v3.5_wide",
    tiles={128: (128, 192)},
    summary="v3.5 at D=128 with 192-key K/V blocks, for calls without a causal mask of at least LONG_KEYS keys",
)

# v3.5's V^T (fp8.v_transposed): one byte-permuting copy of V per call, a block per 128 keys.
V3_5_VT = KernelEntry(
    name="v3.5_vt",
    file="v3_5_fp8.cu",
    kernel="v3_5_v_transpose",
    tiles={D: (0, 32) for D in V3_5_FP8.tiles},
    dtypes=V3_5_FP8.dtypes,
    fields="vt",
    summary="V (any strides) -> V^T (B, H_kv, D, keys) e4m3, keys permuted in groups of 32 for v3.5's P V",
    causal_variants=(False,),
    min_arch=90,
    max_arch=90,
    arch_specific=True,
)

# The forward kernels the packed paths launch with every field (serving._launch_packed).
PACKED_ENTRIES = (
    V3_3_PACKED, V3_3_VARIANTS, V3_6_VARIANTS, V3_7_VARIANTS, V3_8_ALIBI, V3_9_WINDOW, V3_1_VARLEN, V3_1_VARIANTS,
)  # fmt: skip

# The gradients of the score variants (a sliding window, softcap, ALiBi): bwd_v2's body with the
# forward's scores rebuilt (bwd_common.cuh frag_p_ds_variants), for flash_attn_func's variants
# path (backward.attention_backward's `variants`).  Not a rung of the ladder: the same loop nest.
BWD_V2_VARIANTS = dataclasses.replace(
    BWD_VERSIONS["bwd_v2"],
    name="bwd_v2_variants",
    kernel="bwd_v2_variants",
    summary="bwd_v2 with the forward's window, softcap (tanh's derivative on dS) and ALiBi",
    # dq_semaphore's ordered adds wait for K/V blocks 0, 1, ... of a Q block; under a left window
    # the first ones never visit it (a hang): no deterministic mode.
    deterministic=False,
    # bwd_v2's spills at D = 96 .. 128 and 224, 256 (255 registers), a little more at 96 .. 128
    # (the variants' constants live beside dK_j, dV_j, S and dP; NVRTC 13.0, sm_80 and sm_90).
    spill_bytes={96: 32, 112: 40, 128: 36, 224: 16, 256: 48},
)

# flash_attn_varlen_func's backward: bwd_v2's body over packed sequences in one launch
# (bwd_v2_mma.cu's VARLEN, bwd_common.cuh's bwd_varlen_sequence), at the varlen forward's head
# dims (v3.1's).  Kernels of their own: in the dense ones the per-sequence lengths cost registers
# and spills.  Their spill budgets: the most of sm_80 and sm_90 under NVRTC 13.0 (bwd_v2's own plus
# up to 20 bytes at D = 96, 128; the variants' up to 52 at D = 256 and 40 at D = 96).
_VARLEN_DIMS = (32, 64, 80, 96, 128, 160, 192, 256)
BWD_V2_VARLEN = dataclasses.replace(
    BWD_VERSIONS["bwd_v2"],
    name="bwd_v2_varlen",
    kernel="bwd_v2_varlen",
    tiles={D: BWD_VERSIONS["bwd_v2"].tiles[D] for D in _VARLEN_DIMS},
    summary="bwd_v2 over packed sequences, one launch (flash_attn_varlen_func's gradients)",
    deterministic=False,
    spill_bytes={96: 20, 128: 40, 256: 52},
)
BWD_V2_VARIANTS_VARLEN = dataclasses.replace(
    BWD_V2_VARIANTS,
    name="bwd_v2_variants_varlen",
    kernel="bwd_v2_variants_varlen",
    tiles={D: BWD_V2_VARIANTS.tiles[D] for D in _VARLEN_DIMS},
    summary="bwd_v2_variants over packed sequences, one launch",
    spill_bytes={80: 32, 96: 72, 128: 56, 256: 100},
)

# flash_attn_varlen_func's backward on Hopper (fp16 / bf16, D = 64 and 128; backward.special_rung):
# bwd_v5's body over packed sequences in one launch (bwd_v5_dq_bulk.cu), bwd_v2_varlen's grid.
BWD_V5_VARLEN = dataclasses.replace(
    _BWD_V5,
    name="bwd_v5_varlen",
    kernel="bwd_v5_varlen",
    summary="bwd_v5 over packed sequences, one launch (flash_attn_varlen_func's gradients on Hopper)",
    deterministic=False,
    tail_split=False,
    # bwd_v5's budgets: under NVRTC 13.0 D=64 takes 136 / 156 / 236 bytes (stack / spill stores /
    # loads; bwd_v5's 120 / 120 / 136, the sequence's bounds and offsets beside its registers),
    # D=128 8-16 / 8-16 / 16-36 (bwd_v5's 0-24 / 0-20 / 0-36); under 13.5 at most 96 / 108 / 188.
    spill_bytes={64: 240, 128: 64},
)

# The score variants' gradients on Hopper (fp16 / bf16, D = 64 and 128; backward.special_rung):
# bwd_v5's body with the forward's scores rebuilt (bwd_wgmma.cuh's bwd_p_ds_variants), dense and
# over packed sequences, where bwd_v2_variants and bwd_v2_variants_varlen run elsewhere.
BWD_V5_VARIANTS = dataclasses.replace(
    BWD_V5_VARLEN,
    name="bwd_v5_variants",
    kernel="bwd_v5_variants",
    summary="bwd_v5 with the forward's window, softcap (tanh's derivative on dS) and ALiBi",
    # NVRTC 13.0: 32-56 bytes of stack, 28-60 / 48-148 bytes of spill stores / loads (every block
    # takes the per-score path, so there is no second, unmasked copy of the loop to keep, as in
    # bwd_v5); NVRTC 13.5 at D=64: up to 64 / 84 / 172 (stack / stores / loads), D=128 as 13.0.
    spill_bytes={64: 180, 128: 80},
)
BWD_V5_VARIANTS_VARLEN = dataclasses.replace(
    BWD_V5_VARIANTS,
    name="bwd_v5_variants_varlen",
    kernel="bwd_v5_variants_varlen",
    summary="bwd_v5_variants over packed sequences, one launch",
)

# Every kernel outside the forward ladder, by name (api.entry_kernel loads them).
KERNEL_ENTRIES: dict[str, KernelEntry] = {
    e.name: e
    for e in (
        *(BWD_PREPROCESS, *BWD_VERSIONS.values(), BWD_V2_VARIANTS, BWD_V2_VARLEN, BWD_V2_VARIANTS_VARLEN),
        *(BWD_V5_VARLEN, BWD_V5_VARIANTS, BWD_V5_VARIANTS_VARLEN),
        *(BWD_DQ_CONVERT, SPLIT_BLOCKS),
        *(*DEC_ENTRIES, *PACKED_ENTRIES, V3_5_FP8, V3_5_FP8_WIDE, V3_5_VT),
    )
}
