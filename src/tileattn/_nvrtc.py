"""Run-time compilation and launch: the only module that imports ``cuda.core``.

A rung's CUDA source is compiled by NVRTC for one (kernel instantiation, arch) on first use, with
the CUDA headers of the ``nvidia-cuda-runtime`` wheel, so no toolkit is needed.  Cubins are kept
in memory and on disk (``TILEATTN_CACHE_DIR``, default ``~/.cache/tileattn``) under a hash of
everything that changes the binary: the source and the headers it includes, the instantiation,
the options, the arch and the NVRTC version.  Compilation needs no GPU, so CPU tests compile every
rung and read its ptxas report and SASS.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
_NVRTC_OPTIONS = ("-std=c++17", "--use_fast_math=false")


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries its log."""


@dataclasses.dataclass(frozen=True)
class Cubin:
    """One compiled kernel instantiation."""

    name_expression: str  # e.g. "tileattn::v2_fwd<float, 64, 128, 32, true>"
    lowered_name: str  # the mangled symbol inside the cubin
    arch: str  # e.g. "sm_90a"
    data: bytes
    log: str  # NVRTC + ptxas -v output
    compile_seconds: float = 0.0  # how long NVRTC took when this cubin was built (cold compile)

    @property
    def resources(self) -> dict:
        """Registers, stack frame and spill bytes from the ptxas -v report."""
        return parse_ptxas(self.log)


def parse_ptxas(log: str) -> dict:
    out = {"registers": None, "stack_bytes": None, "spill_stores": None, "spill_loads": None}
    if m := re.search(r"Used (\d+) registers", log):
        out["registers"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log):
        out["stack_bytes"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    return out


@functools.cache
def cuda_include_dir() -> str:
    from cuda.pathfinder import find_nvidia_header_directory

    path = find_nvidia_header_directory("cudart")
    if path is None:
        raise RuntimeError(
            "tileattn: CUDA headers not found; install the 'nvidia-cuda-runtime' wheel "
            "(pip install nvidia-cuda-runtime)"
        )
    return path


@functools.cache
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def cache_dir() -> Path:
    env = os.environ.get("TILEATTN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tileattn"


def _source_digest(source_file: str) -> str:
    """Hash of a rung's source and every header in csrc/ (they are all small)."""
    h = hashlib.sha256()
    for p in [CSRC / source_file, *sorted(CSRC.glob("*.cuh"))]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _cache_key(source_file: str, name_expression: str, arch: str) -> str:
    h = hashlib.sha256()
    for part in (_source_digest(source_file), name_expression, arch, nvrtc_version(), *_NVRTC_OPTIONS):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _read_cached(path: Path) -> Cubin | None:
    """A cache entry is <key>.json (metadata + sha256 of the cubin) and <key>.cubin.
    Anything missing, unparsable or whose checksum fails is treated as a miss."""
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
        data = path.with_suffix(".cubin").read_bytes()
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            return None
        return Cubin(meta["name_expression"], meta["lowered_name"], meta["arch"], data, meta["log"],
                     meta.get("compile_seconds", 0.0))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, then rename: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_cached(path: Path, cubin: Cubin) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path.with_suffix(".cubin"), cubin.data)
        meta = dataclasses.asdict(cubin)
        del meta["data"]
        meta["sha256"] = hashlib.sha256(cubin.data).hexdigest()
        _atomic_write(path.with_suffix(".json"), json.dumps(meta).encode())
    except OSError as e:  # a read-only cache is not an error, just a slower next start
        print(f"tileattn: could not write kernel cache {path.parent}: {e}", file=sys.stderr)


_memory_cache: dict[str, Cubin] = {}


def compile_kernel(source_file: str, name_expression: str, arch: str, *, use_cache: bool = True) -> Cubin:
    """Compile one kernel instantiation from ``csrc/<source_file>`` for ``arch`` (e.g. "sm_90a").

    Works without a GPU.  Prints a one-line notice on stderr while NVRTC runs.
    """
    key = _cache_key(source_file, name_expression, arch)
    if use_cache:
        if key in _memory_cache:
            return _memory_cache[key]
        if (cached := _read_cached(cache_dir() / key)) is not None:
            _memory_cache[key] = cached
            return cached

    from cuda.core import Program, ProgramOptions

    opts = ProgramOptions(
        arch=arch,
        std="c++17",
        ptxas_options=["-v"],
        include_path=[str(CSRC), cuda_include_dir()],
        name=source_file,
    )
    src = (CSRC / source_file).read_text()
    print(f"tileattn: compiling {name_expression} for {arch} ...", file=sys.stderr, end="", flush=True)
    t0 = time.perf_counter()
    program = Program(src, code_type="c++", options=opts)
    log_lines: list[str] = []

    class _Log:
        def write(self, s):
            log_lines.append(s)

    try:
        obj = program.compile("cubin", name_expressions=(name_expression,), logs=_Log())
    except Exception as e:  # cuda.core raises a generic error; keep NVRTC's log in ours
        print(" failed", file=sys.stderr)
        raise CompileError(f"NVRTC failed to compile {name_expression} ({source_file}, {arch}):\n"
                           f"{''.join(log_lines)}\n{e}") from None
    seconds = time.perf_counter() - t0
    print(f" {seconds:.1f} s", file=sys.stderr)
    lowered = obj.symbol_mapping[name_expression]
    lowered = lowered.decode() if isinstance(lowered, bytes) else lowered
    cubin = Cubin(name_expression, lowered, arch, bytes(obj.code), "".join(log_lines), seconds)
    _memory_cache[key] = cubin
    if use_cache:
        _write_cached(cache_dir() / key, cubin)
    return cubin


def sass(cubin: Cubin) -> str:
    """Disassembly of a cubin, via the cuobjdump of the nvidia-cuda-cuobjdump wheel (or PATH)."""
    tool = _find_tool("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin.data)
        f.flush()
        return subprocess.run([tool, "-sass", f.name], check=True, capture_output=True, text=True).stdout


def _find_tool(name: str) -> str:
    import shutil

    try:
        import nvidia

        for base in nvidia.__path__:
            for cand in Path(base).glob(f"cu*/bin/{name}"):
                return str(cand)
    except ImportError:
        pass
    if path := shutil.which(name):
        return path
    raise RuntimeError(f"{name} not found: pip install nvidia-cuda-{name}")


# ---------------------------------------------------------------------------------------------
# GPU side: device arch, module load, launch on torch's current stream.


@functools.cache
def device_arch(device_index: int) -> tuple[int, int]:
    from cuda.core import Device

    return Device(device_index).compute_capability


def arch_string(cc: tuple[int, int], *, arch_specific: bool = False) -> str:
    """sm_XY, or sm_XYa when a rung uses arch-specific instructions (wgmma, setmaxnreg)."""
    return f"sm_{cc[0]}{cc[1]}" + ("a" if arch_specific else "")


class _TorchStream:
    """Hands torch's current stream to cuda.core through the __cuda_stream__ protocol."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


@dataclasses.dataclass
class LoadedKernel:
    kernel: object  # cuda.core Kernel
    smem_limit_set: int = 0


_loaded: dict[tuple[int, str], LoadedKernel] = {}


def load(cubin: Cubin, device_index: int) -> LoadedKernel:
    key = (device_index, cubin.lowered_name + cubin.arch + hashlib.sha1(cubin.data).hexdigest())
    if key not in _loaded:
        from cuda.core import Device, ObjectCode

        Device(device_index).set_current()
        # Look the kernel up by its mangled name: cuda.core versions differ in the types their
        # symbol_mapping takes (str or bytes), the mangled name works in all of them.
        obj = ObjectCode.from_cubin(cubin.data)
        _loaded[key] = LoadedKernel(obj.get_kernel(cubin.lowered_name))
    return _loaded[key]


def tensor_map_4d(ptr: int, dtype: str, dims: tuple[int, ...], strides_bytes: tuple[int, ...],
                  box: tuple[int, int]) -> bytes:
    """The 128-byte CUtensorMap (TMA descriptor) of a 4-d 16-bit tensor: dims innermost first
    (columns, rows, heads, batch), strides in bytes of dims 1..3, box = (columns, rows) of one copy
    with 64, 32 or 16 columns, swizzled over 128, 64 or 32 bytes (SwizzledTile's panel layouts),
    zeros for elements outside the tensor."""
    import numpy as np
    from cuda.bindings import driver

    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    data_type = {"bfloat16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                 "float16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}[dtype]
    err, tmap = driver.cuTensorMapEncodeTiled(
        data_type, 4, ptr, [u64(d) for d in dims], [u64(s) for s in strides_bytes],
        [u32(box[0]), u32(box[1]), u32(1), u32(1)], [u32(1)] * 4,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        {64: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, 32: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
         16: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B}[box[0]],
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({err}) for dims {dims}, strides {strides_bytes}, box {box}")
    return np.array(tmap.opaque, dtype=np.uint64).tobytes()


def max_dynamic_smem(device_index: int) -> int:
    from cuda.core import Device

    return Device(device_index).properties.max_shared_memory_per_block_optin


def launch(lk: LoadedKernel, device_index: int, stream_handle: int, grid, block, smem: int, args) -> None:
    """Launch on the given stream (torch's current one), raising the dynamic shared-memory limit
    the first time a kernel needs more than the default 48 KB."""
    from cuda.core import Device, LaunchConfig
    from cuda.core import launch as cc_launch

    if smem > 48 * 1024 and lk.smem_limit_set < smem:
        from cuda.bindings import driver

        (err,) = driver.cuKernelSetAttribute(
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem,
            lk.kernel.handle,
            Device(device_index).device_id,
        )
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"tileattn: cannot raise dynamic shared memory to {smem} bytes: {err}")
        lk.smem_limit_set = smem
    Device(device_index).set_current()  # the calling thread may not have the context current yet
    cc_launch(_stream(device_index, stream_handle), LaunchConfig(grid=grid, block=block, shmem_size=smem),
              lk.kernel, *args)


_streams: dict[tuple[int, int], object] = {}


def _stream(device_index: int, handle: int):
    """A cuda.core Stream wrapping (not owning) torch's stream, made once per stream handle."""
    key = (device_index, handle)
    if key not in _streams:
        from cuda.core import Device

        dev = Device(device_index)
        dev.set_current()
        _streams[key] = dev.create_stream(_TorchStream(handle))
    return _streams[key]
