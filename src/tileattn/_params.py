"""The forward kernels' arguments: TILEATTN_FWD_FIELDS of csrc/common.cuh, written once there.

Every forward kernel takes that list as separate parameters (TILEATTN_FWD_PARAMS; the rungs that
load through TMA add a by-value TmaMaps), and FwdParams<T> is the same list as one struct.  What
the host knows of it:
  * FWD_FIELDS: each field's name and C type, in order, held to the C++ list by
    tests/test_layout.py (a FwdParams initialised field by field, by name, read back from a cubin);
  * from each cubin a plan loads (the compiler's own .nv.info records): the offset and size of each
    kernel parameter (EIATTR_KPARAM_INFO), checked against FWD_FIELDS' types when the plan is
    built; the block size (EIATTR_MAX_THREADS, the kernel's __launch_bounds__, which every rung
    declares as exactly the block it is written for); and, from a __device__ variable beside the
    kernel, its dynamic shared memory (TILEATTN_SMEM_BYTES).
A call packs the forward fields (FWD_ARGS) at the compiler's offsets with one ``struct.pack_into``;
the fields the next features add (FWD_ROOM) keep the "off" values written once into each buffer.
"""

from __future__ import annotations

import struct

# TILEATTN_FWD_FIELDS as struct codes: Q = 64-bit address, q = long long, i = int, f = float.
# The forward fields, packed on every call:
FWD_ARGS: list[tuple[str, str]] = [
    ("q", "Q"),
    ("k", "Q"),
    ("v", "Q"),
    ("o", "Q"),
    ("lse", "Q"),
    ("workspace", "Q"),
    ("Nq", "i"),
    ("Nk", "i"),
    ("H", "i"),
    ("h_per_kv", "i"),
    ("q_sb", "q"),
    ("q_sh", "q"),
    ("q_sn", "q"),
    ("k_sb", "q"),
    ("k_sh", "q"),
    ("k_sn", "q"),
    ("v_sb", "q"),
    ("v_sh", "q"),
    ("v_sn", "q"),
    ("o_sb", "q"),
    ("o_sh", "q"),
    ("o_sn", "q"),
    ("softmax_scale", "f"),
    ("causal_offset", "i"),
    ("bh_offset", "i"),
]
# The room to grow (variable-length batches, paged KV, sliding window, softcap, ALiBi, FP8 descale
# factors, the persistent rungs' B * H), with the value that means "off"; v3.3 and v3.1's varlen
# kernel read cu_seqlens and bottom_right, v3.3's variants kernel the window, softcap and ALiBi
# fields, v3.5 descale, v3.6 bh_count.
FWD_ROOM: list[tuple[str, str, object]] = [
    ("cu_seqlens_q", "Q", 0),
    ("cu_seqlens_k", "Q", 0),
    ("seqused_k", "Q", 0),
    ("page_table", "Q", 0),
    ("page_table_stride", "q", 0),
    ("page_size", "i", 0),
    ("window_left", "i", -1),
    ("window_right", "i", -1),
    ("softcap", "f", 0.0),
    ("bottom_right", "i", 0),
    ("alibi_slopes", "Q", 0),
    ("alibi_sb", "q", 0),
    ("descale", "Q", 0),
    ("bh_count", "i", 0),
    ("split_amax", "Q", 0),
]
FWD_FIELDS = FWD_ARGS + [(name, code) for name, code, _ in FWD_ROOM]


def fwd_args(Nq, Nk, H, H_kv, strides, softmax_scale, causal_offset, ptrs=(0,) * 6, bh_offset=0) -> list:
    """The forward fields in FWD_ARGS order: the pointers q, k, v, o, lse, workspace (zeros in a
    prepared call's template, filled in per call), the sizes, then q's, k's, v's and O's (batch,
    head, row) strides (``strides``: four sequences, their first three entries taken), the scale
    and the two offsets."""
    return [*ptrs, Nq, Nk, H, H // H_kv, *(x for s in strides for x in s[:3]), softmax_scale, causal_offset, bh_offset]


def room(**values) -> list:
    """The room fields' values in order: those named, the rest "off".  The kernels launched outside
    the plans (FP8, the packed and variants kernels) build their forward fields with it, so a
    field added to the room leaves their argument lists whole."""
    unknown = values.keys() - {name for name, _, _ in FWD_ROOM}
    assert not unknown, f"not room fields: {sorted(unknown)}"
    return [values.get(name, off) for name, _, off in FWD_ROOM]


TMA_MAPS_BYTES = 6 * 128  # TmaMaps: q, k, v with 64-column boxes, then with the narrow last panel's box


def struct_size() -> int:
    """sizeof(FwdParams): the members, padded to the struct's alignment (8: its widest member)."""
    end = struct.calcsize("@" + "".join(code for _, code in FWD_FIELDS))
    return -(-end // 8) * 8


_EIATTR_MAX_THREADS = 0x05  # __launch_bounds__' maxThreadsPerBlock, as (x, y, z)
_EIATTR_KPARAM_INFO = 0x17
_EIFMT_SVAL = 0x04


def _elf_sections(data: bytes) -> list[tuple[str, int, bytes, int]]:
    """(name, type, contents, link) of each section of a 64-bit little-endian ELF file (a cubin)."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    return [
        (data[names + h[0] : data.index(b"\0", names + h[0])].decode(), h[1], data[h[4] : h[4] + h[5]], h[6])
        for h in headers
    ]


_SHT_SYMTAB = 2


def symbol_bytes(data: bytes, symbol: str) -> bytes:
    """The initial bytes of a global variable in a cubin (its symbol's slice of its section)."""
    sections = _elf_sections(data)
    for _, kind, symtab, link in sections:
        if kind != _SHT_SYMTAB:
            continue
        strtab = sections[link][2]
        for i in range(0, len(symtab), 24):  # Elf64_Sym
            name_at, _, _, shndx, value, size = struct.unpack_from("<IBBHQQ", symtab, i)
            if strtab[name_at : strtab.index(b"\0", name_at)].decode() == symbol:
                return sections[shndx][2][value : value + size]
    raise KeyError(f"no symbol {symbol} in the cubin")


def smem_bytes(cubin) -> int:
    """The dynamic shared memory a kernel carves up, as its source declares it next to the carve-up
    (TILEATTN_SMEM_BYTES in csrc/common.cuh), read from the cubin: C++ is the one place it is written."""
    (value,) = struct.unpack("<i", symbol_bytes(cubin.data, cubin.smem_lowered_name))
    return value


def _kernel_info(cubin: bytes, lowered_name: str) -> tuple[dict[int, tuple[int, int]], tuple[int, ...] | None]:
    """From the kernel's .nv.info section (the compiler's own record): each parameter's
    (offset, size) by ordinal, and the block size __launch_bounds__ declared (or None)."""
    for name, _, sec, _ in _elf_sections(cubin):
        if name != f".nv.info.{lowered_name}":
            continue
        params, max_threads, i = {}, None, 0
        while i + 4 <= len(sec):
            fmt, attr = sec[i], sec[i + 1]
            if fmt == _EIFMT_SVAL:
                (size,) = struct.unpack_from("<H", sec, i + 2)
                if attr == _EIATTR_KPARAM_INFO:
                    _, ordinal, offset, flags = struct.unpack_from("<IHHI", sec, i + 4)
                    params[ordinal] = (offset, (flags >> 18) & 0x3FFF)
                elif attr == _EIATTR_MAX_THREADS:
                    max_threads = struct.unpack_from("<III", sec, i + 4)
                i += 4 + size
            else:  # the other formats carry a 2-byte value in the entry itself
                i += 4
        return params, max_threads
    raise KeyError(f"no .nv.info section for {lowered_name} in the cubin")


def kernel_params(cubin: bytes, lowered_name: str) -> list[tuple[int, int]]:
    """(offset, size) in bytes of each parameter of the kernel, by ordinal."""
    params, _ = _kernel_info(cubin, lowered_name)
    return [params[o] for o in range(len(params))]


def block_threads(cubin: bytes, lowered_name: str) -> int:
    """Threads per block: the maxThreadsPerBlock of the kernel's __launch_bounds__, which every
    rung declares as exactly the block it is written for.  C++ is the one place it is written."""
    _, max_threads = _kernel_info(cubin, lowered_name)
    if max_threads is None:
        raise RuntimeError(f"tileattn: {lowered_name} declares no __launch_bounds__, so its block size is unknown")
    x, y, z = max_threads
    return x * y * z


class Layout:
    """A kernel's parameter block as the compiler laid it out: its size, the offset of each
    parameter, ``pack`` (pack_into of the packed-per-call fields at their offsets, nothing else
    written), where the TmaMaps parameter starts (TMA rungs, else None) and the block's initial
    bytes (zeros and the room fields' "off" values)."""

    def __init__(self, params: list[tuple[int, int]], tensor_maps: bool, args=FWD_ARGS, room=FWD_ROOM):
        self.offsets = [offset for offset, _ in params]
        self.size = params[-1][0] + params[-1][1]
        fmt, pos = "<", 0
        for (offset, size), (_, code) in zip(params, args):
            fmt += "x" * (offset - pos) + code
            pos = offset + size
        self.pack = struct.Struct(fmt).pack_into
        self.tma_offset = self.offsets[-1] if tensor_maps else None
        init = bytearray(self.size)
        for (offset, _), (_, code, value) in zip(params[len(args) :], room):
            struct.pack_into("<" + code, init, offset, value)
        self.init = bytes(init)


def arg_codes(tensor_maps: bool, fields=None) -> list[tuple[str, str]]:
    return (FWD_FIELDS if fields is None else fields) + ([("tmaps", f"{TMA_MAPS_BYTES}s")] if tensor_maps else [])


def packer(cubin: bytes, lowered_name: str, tensor_maps: bool, args=None, room=None) -> Layout:
    """The kernel's parameter block: the forward fields (default) or ``args`` then ``room`` (the
    backward's BWD_ARGS, no room).  Raises if its parameters are not the ones the host passes
    (count or any size)."""
    args = FWD_ARGS if args is None else args
    room = FWD_ROOM if room is None else room
    params = kernel_params(cubin, lowered_name)
    codes = arg_codes(tensor_maps, args + [(name, code) for name, code, _ in room])
    sizes = [struct.calcsize("<" + code) for _, code in codes]
    if [size for _, size in params] != sizes:
        raise RuntimeError(
            f"tileattn: the parameters of {lowered_name} are {[size for _, size in params]} bytes, but the "
            f"host passes {sizes} ({[name for name, _ in codes]}): csrc and _params.py disagree"
        )
    return Layout(params, tensor_maps, args, room)


# TILEATTN_BWD_FIELDS (csrc/bwd_common.cuh), in order: all packed on every call.
BWD_ARGS: list[tuple[str, str]] = (
    [
        (name, "Q")
        for name in (
            *("q", "k", "v", "o", "dout", "lse", "Di"),
            *("dq_accum", "dk_accum", "dv_accum", "dq_semaphore", "split_amax"),
        )
    ]
    + [(name, "i") for name in ("Nq", "Nk", "H", "h_per_kv")]
    + [(f"{t}_{s}", "q") for t in ("q", "k", "v", "o", "do") for s in ("sb", "sh", "sn")]
    + [("dk_out", "Q"), ("dv_out", "Q"), ("dkv_sb", "q"), ("dkv_sh", "q"), ("dkv_sn", "q")]
    + [("softmax_scale", "f"), ("causal_offset", "i"), ("bh_offset", "i")]
    + [("tail_from", "i"), ("tail_segments", "i"), ("tail_accum", "Q"), ("dq_zero", "i"), ("tail_zero", "i")]
    + [("window_left", "i"), ("window_right", "i"), ("softcap", "f"), ("alibi_slopes", "Q"), ("alibi_sb", "q")]
    + [("cu_seqlens_q", "Q"), ("cu_seqlens_k", "Q"), ("num_seqs", "i"), ("bottom_right", "i")]
)


# TILEATTN_DEC_FIELDS (csrc/dec_common.cuh), in order: all packed on every call.
DEC_ARGS: list[tuple[str, str]] = (
    [
        (name, "Q")
        for name in (
            "q",
            "k_cache",
            "v_cache",
            "o",
            "lse",
            "o_part",
            "lse_part",
            "cache_seqlens",
            "block_table",
            "alibi_slopes",
        )
    ]  # fmt: skip
    + [
        (name, "i")
        for name in ("B", "Nq", "H", "h_per_kv", "Nk", "num_splits", "page_size", "window_left", "window_right")
    ]
    + [("bt_stride", "q"), ("alibi_sb", "q")]
    + [(f"{t}_{s}", "q") for t in ("q", "k", "v", "o") for s in ("sb", "sn", "sh")]
    + [("softmax_scale", "f"), ("softcap", "f")]
)

# TILEATTN_VT_FIELDS (csrc/v3_5_fp8.cu): v3.5's V^T copy.
VT_ARGS: list[tuple[str, str]] = [("v", "Q"), ("vt", "Q"), ("Nk", "i"), ("Nk_pad", "i"), ("H_kv", "i")] + [
    (f"v_{s}", "q") for s in ("sb", "sh", "sn")
]

# TILEATTN_DQC_FIELDS (csrc/bwd_dq_convert.cu): bwd_v5's dQ, blocked float32 -> the gradient.
DQC_ARGS: list[tuple[str, str]] = (
    [("dq_accum", "Q"), ("dq", "Q"), ("Nq", "i"), ("H", "i"), ("tiles_per_bh", "i")]
    + [(f"dq_{s}", "q") for s in ("sb", "sh", "sn")]
    + [("cu_seqlens_q", "Q"), ("num_seqs", "i"), ("chunk_rows", "i")]
)

# TILEATTN_SPLIT_BLOCKS_FIELDS (csrc/split_halves.cu), in order.
SPLIT_BLOCKS_ARGS: list[tuple[str, str]] = [
    ("src", "Q"),
    ("dst", "Q"),
    ("amax", "Q"),
    ("amax_sb", "q"),
    ("H", "i"),
    ("N", "i"),
] + [(f"s_{s}", "q") for s in ("sb", "sh", "sn")]

# The parameter lists of the kernels outside the forward ladder (versions.KernelEntry.fields).
ENTRY_ARGS = {
    "bwd": BWD_ARGS,
    "dec": DEC_ARGS,
    "fwd": FWD_FIELDS,
    "vt": VT_ARGS,
    "dqc": DQC_ARGS,
    "split_blocks": SPLIT_BLOCKS_ARGS,
}
