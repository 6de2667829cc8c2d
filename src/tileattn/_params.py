"""The kernels' argument block, as the compiler laid it out.

Every rung's kernel takes the argument list TILEATTN_FWD_PARAMS of csrc/common.cuh (plus, for the
rungs that load through TMA, one by-value TmaMaps).  Two facts about a kernel exist once, in C++,
and are read back from the cubin a launch plan loads (the compiler's own .nv.info records):
  * the offset and size of each parameter (EIATTR_KPARAM_INFO): the plan packs the call's values
    at exactly those offsets (one ``struct.pack_into``) and hands cuLaunchKernel one pointer per
    parameter into that buffer;
  * the block size (EIATTR_MAX_THREADS, from the kernel's __launch_bounds__, which every rung
    declares as exactly the block it is written for).
What the host keeps is only the C type of each argument, checked against the compiler's sizes for
every instantiation (CPU test) and again when a plan is built.
"""

from __future__ import annotations

import struct

# TILEATTN_FWD_PARAMS, in order, as struct codes: Q = 64-bit address, q = long long, i = int, f = float.
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
TMA_MAPS_BYTES = 6 * 128  # TmaMaps: q, k, v with 64-column boxes, then with the narrow last panel's box
TMA_ARG = ("tmaps", f"{TMA_MAPS_BYTES}s")

_EIATTR_MAX_THREADS = 0x05  # __launch_bounds__' maxThreadsPerBlock, as (x, y, z)
_EIATTR_KPARAM_INFO = 0x17
_EIFMT_SVAL = 0x04


def arg_codes(tensor_maps: bool) -> list[tuple[str, str]]:
    return FWD_ARGS + ([TMA_ARG] if tensor_maps else [])


def elf_sections(data: bytes):
    """(name, bytes) of each section of a 64-bit little-endian ELF file (a cubin)."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    for h in headers:
        end = data.index(b"\0", names + h[0])
        yield data[names + h[0] : end].decode(), data[h[4] : h[4] + h[5]]


def _kernel_info(cubin: bytes, lowered_name: str) -> tuple[dict[int, tuple[int, int]], tuple[int, ...] | None]:
    """From the kernel's .nv.info section (the compiler's own record): each parameter's
    (offset, size) by ordinal, and the block size __launch_bounds__ declared (or None)."""
    for name, sec in elf_sections(cubin):
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


def packer(cubin: bytes, lowered_name: str, tensor_maps: bool) -> tuple[struct.Struct, list[int]]:
    """A struct that packs the arguments at the compiler's offsets, and those offsets.  Raises if
    the kernel's parameters are not the ones the host passes (count or any size)."""
    layout = kernel_params(cubin, lowered_name)
    args = arg_codes(tensor_maps)
    sizes = [struct.calcsize("<" + code) for _, code in args]
    if [s for _, s in layout] != sizes:
        raise RuntimeError(
            f"tileattn: the parameters of {lowered_name} are {[s for _, s in layout]} bytes, but the host "
            f"packs {sizes} ({[n for n, _ in args]}): csrc and _params.py disagree"
        )
    fmt, pos = "<", 0
    for (offset, size), (_, code) in zip(layout, args):
        fmt += "x" * (offset - pos) + code
        pos = offset + size
    return struct.Struct(fmt), [offset for offset, _ in layout]
