"""Run-time compilation and launch: the only module that talks to NVRTC and the CUDA driver.

A rung's CUDA source is compiled by NVRTC for one (kernel instantiation, arch) on first use, with
the CUDA headers of the ``nvidia-cuda-runtime`` wheel, so no toolkit is needed.  Which NVRTC: the
one the ``nvidia-cuda-nvrtc`` wheel installs, which pip pairs with torch's CUDA build (torch's
CUDA 13.0 builds pin it to 13.0.x); README says so and a CPU test checks the pairing.

Kernel cache.  Cubins are kept in memory and on disk (``TILEATTN_CACHE_DIR``, default
``~/.cache/tileattn``, always made absolute and created with mode 0700) under a key that hashes
everything that changes the binary: the closure of ``#include "..."`` files the source really
pulls in, the instantiation, the arch, the exact NVRTC option list, NVRTC's full version, the CUDA
headers' version and cuda.core's version.  An entry is loaded only when it and its folder belong
to the current user and nobody else may write them; anything else is recompiled, with one warning.
A per-key file lock makes N processes that start together compile a kernel once.

Compilation needs no GPU, so CPU tests compile every rung and read its ptxas report and SASS.
Launches go through the driver (``cuLaunchKernel`` on a ``CUkernel``), on the caller's stream,
with the caller's current context restored afterwards.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries its log."""


class CacheWarning(UserWarning):
    """A kernel-cache entry or folder was not trusted and is being ignored (recompiled)."""


@dataclasses.dataclass(frozen=True)
class Cubin:
    """One compiled kernel instantiation."""

    name_expression: str  # e.g. "tileattn::v2_fwd<float, 64, 128, 32, true>"
    lowered_name: str  # the mangled symbol inside the cubin
    arch: str  # e.g. "sm_90a"
    data: bytes
    log: str  # NVRTC + ptxas -v output
    compile_seconds: float = 0.0  # how long NVRTC took when this cubin was built (cold compile)
    smem_lowered_name: str = ""  # the kernel's <kernel>_smem_bytes variable (common.cuh: TILEATTN_SMEM_BYTES)

    @property
    def resources(self) -> dict:
        """Registers, stack frame and spill bytes from the ptxas -v report."""
        return parse_ptxas(self.log)

    @property
    def wgmma_serialized(self) -> bool:
        """ptxas's C7514: it made every wgmma of the kernel wait for the one before (an accumulator
        touched while in flight, a pipeline it cannot follow), which a wgmma rung must never ship."""
        return "wgmma.mma_async instructions are serialized" in self.log


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
    """NVRTC's major.minor, as the library reports it."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def nvrtc_full_version() -> str:
    """NVRTC's full version: major.minor from the library, the patch level from the wheel that
    ships it, and the library file itself (path, size, mtime), so that a toolkit's NVRTC or a
    reinstalled wheel of the same name is never mistaken for another."""
    from cuda.pathfinder import load_nvidia_dynamic_lib

    lib = load_nvidia_dynamic_lib("nvrtc").abs_path
    st = os.stat(lib)
    wheel = _dist_version("nvidia-cuda-nvrtc") or _dist_version("nvidia-cuda-nvrtc-cu12")
    return f"{nvrtc_version()} (wheel {wheel}; {os.path.realpath(lib)} {st.st_size} {st.st_mtime_ns})"


@functools.cache
def headers_version() -> str:
    """CUDART_VERSION of the headers kernels compile against, and the wheel that ships them."""
    text = (Path(cuda_include_dir()) / "cuda_runtime_api.h").read_text(errors="replace")
    m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", text)
    wheel = _dist_version("nvidia-cuda-runtime")
    return f"CUDART_VERSION {m.group(1) if m else '?'} (wheel {wheel}; {cuda_include_dir()})"


# Experiment switches (scripts/*_probe.py --define, or the environment's TILEATTN_DEFINES, space
# separated, for a test run of a switched build): macros defined in every kernel this process
# compiles, as "NAME" or "NAME=VALUE".  Part of the options, so of the cache key: each build
# stays cached beside the plain one.
EXPERIMENT_DEFINES: list = os.environ.get("TILEATTN_DEFINES", "").split()


def _program_options(source_file: str, arch: str):
    from cuda.core import ProgramOptions

    return ProgramOptions(
        arch=arch,
        std="c++17",
        ptxas_options=["-v"],
        include_path=[str(CSRC), cuda_include_dir()],
        name=source_file,
        define_macro=[tuple(d.split("=", 1)) if "=" in d else d for d in EXPERIMENT_DEFINES] or None,
    )


def nvrtc_option_list(opts) -> list[str]:
    """The exact option strings cuda.core hands to nvrtcCompileProgram."""
    raw = opts.as_bytes("nvrtc") if hasattr(opts, "as_bytes") else opts._prepare_nvrtc_options()
    return [o.decode() if isinstance(o, bytes) else str(o) for o in raw]


# ---------------------------------------------------------------------------------------------
# Cache key: the include closure, the options, the toolchain.

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def include_closure(source_file: str) -> list[Path]:
    """The rung's file and every file it pulls in through ``#include "..."``, recursively, resolved
    as the preprocessor does (the including file's folder first, then csrc/).  A superset of what
    one instantiation uses (an include inside an #if still counts), so a change to any file a
    kernel may include changes its key.  <...> includes are the CUDA headers, covered by
    headers_version()."""
    seen: dict[Path, None] = {}
    todo = [CSRC / source_file]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen[path] = None
        for name in _INCLUDE.findall(path.read_text()):
            for base in (path.parent, CSRC):
                if (base / name).exists():
                    todo.append((base / name).resolve())
                    break
            else:
                raise CompileError(f'{path.name} includes "{name}", which is not in {CSRC}')
    return list(seen)


def cache_key(source_file: str, name_expression: str, arch: str) -> str:
    import cuda.core

    h = hashlib.sha256()
    parts = [
        name_expression,
        arch,
        *nvrtc_option_list(_program_options(source_file, arch)),
        nvrtc_full_version(),
        headers_version(),
        f"cuda.core {getattr(cuda.core, '__version__', '?')}",
    ]
    for path in sorted(include_closure(source_file)):
        parts += [
            str(path.relative_to(CSRC.resolve()) if path.is_relative_to(CSRC.resolve()) else path),
            hashlib.sha256(path.read_bytes()).hexdigest(),
        ]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


# ---------------------------------------------------------------------------------------------
# Disk cache: trusted entries only, atomic writes, one compile per key across processes.


_resolved_dirs: dict[str, Path] = {}


def cache_dir() -> Path:
    """The cache folder as an absolute path.  A relative TILEATTN_CACHE_DIR is resolved against
    the working directory of its first use, once: a later chdir does not move the cache."""
    env = os.environ.get("TILEATTN_CACHE_DIR")
    if not env:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        env = os.path.join(base, "tileattn")
    if env not in _resolved_dirs:
        _resolved_dirs[env] = Path(os.path.abspath(os.path.expanduser(env)))
    return _resolved_dirs[env]


def _uid() -> int:
    return os.getuid()


_warned: set[str] = set()


def _distrust(what: str, why: str) -> None:
    """One warning per distrusted path and reason, through `warnings`."""
    if (what, why) not in _warned:
        _warned.add((what, why))
        warnings.warn(f"tileattn: ignoring kernel cache {what}: {why}; compiling instead", CacheWarning, stacklevel=4)


def _trusted(path: Path, st: os.stat_result) -> str | None:
    """None if path (already stat'ed) is ours and writable by us alone, else the reason."""
    if st.st_uid != _uid():
        return f"owned by uid {st.st_uid}, not by this user (uid {_uid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.filemode(st.st_mode)})"
    return None


def _cache_folder() -> Path | None:
    """The cache folder, created 0700 if missing; None (memory only) if it cannot be trusted."""
    path = cache_dir()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(path)
    except OSError as e:
        _distrust(str(path), f"cannot create it ({e})")
        return None
    if (why := _trusted(path, st)) is not None:
        _distrust(str(path), why)
        return None
    return path


def _read_cached(path: Path) -> Cubin | None:
    """A cache entry is <key>.json (metadata + sha256 of the cubin) and <key>.cubin.  Anything
    missing, unparsable, foreign, writable by others or whose checksum fails is a miss."""
    try:
        files = {}
        for suffix in (".json", ".cubin"):
            # Open without following a link, then check what was opened (no check-then-use race).
            fd = os.open(path.with_suffix(suffix), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                if (why := _trusted(path.with_suffix(suffix), os.fstat(f.fileno()))) is not None:
                    _distrust(str(path.with_suffix(suffix)), why)
                    return None
                files[suffix] = f.read()
        meta = json.loads(files[".json"])
        data = files[".cubin"]
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            return None
        return Cubin(
            meta["name_expression"],
            meta["lowered_name"],
            meta["arch"],
            data,
            meta["log"],
            meta["compile_seconds"],
            meta["smem_lowered_name"],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp file (mode 0600) in the same folder, then rename: readers never see half a
    file, and a foreign file of the same name is replaced, not written through."""
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
        _atomic_write(path.with_suffix(".cubin"), cubin.data)
        meta = dataclasses.asdict(cubin)
        del meta["data"]
        meta["sha256"] = hashlib.sha256(cubin.data).hexdigest()
        _atomic_write(path.with_suffix(".json"), json.dumps(meta).encode())
    except OSError as e:  # a read-only cache is not an error, just a slower next start
        print(f"tileattn: could not write kernel cache {path.parent}: {e}", file=sys.stderr)


_memory_cache: dict[str, Cubin] = {}
_compile_lock = threading.Lock()  # one compile at a time per process; the file lock covers processes


def compile_kernel(
    source_file: str, name_expression: str, arch: str, *, use_cache: bool = True, announce: bool = True
) -> Cubin:
    """Compile one kernel instantiation from ``csrc/<source_file>`` for ``arch`` (e.g. "sm_90a").

    Works without a GPU.  Prints a one-line notice on stderr while NVRTC runs (unless announce
    is False: `python -m tileattn compile` shows its own progress).
    """
    key = cache_key(source_file, name_expression, arch)
    if use_cache and key in _memory_cache:
        return _memory_cache[key]
    with _compile_lock:
        if use_cache and key in _memory_cache:
            return _memory_cache[key]
        folder = _cache_folder() if use_cache else None
        if folder is None:
            cubin = _compile(source_file, name_expression, arch, announce)
        else:
            from filelock import FileLock

            # Whoever holds the key's lock compiles; the others wait, then read its entry.
            with FileLock(str(folder / f"{key}.lock"), mode=0o600):
                cubin = _read_cached(folder / key)
                if cubin is None:
                    cubin = _compile(source_file, name_expression, arch, announce)
                    _write_cached(folder / key, cubin)
        if use_cache:
            _memory_cache[key] = cubin
        return cubin


def smem_expression(name_expression: str) -> str:
    """The name expression of a kernel's dynamic-shared-memory size: TILEATTN_SMEM_BYTES (common.cuh)
    defines ``<kernel>_smem_bytes`` with the kernel's template arguments."""
    name, args = name_expression.split("<", 1)
    return f"&{name}_smem_bytes<{args}"


def _compile(source_file: str, name_expression: str, arch: str, announce: bool = True) -> Cubin:
    from cuda.core import Program

    opts = _program_options(source_file, arch)
    src = (CSRC / source_file).read_text()
    if announce:
        print(f"tileattn: compiling {name_expression} for {arch} ...", file=sys.stderr, end="", flush=True)
    t0 = time.perf_counter()
    program = Program(src, code_type="c++", options=opts)
    log_lines: list[str] = []

    class _Log:
        def write(self, s):
            log_lines.append(s)

    try:
        smem_name = smem_expression(name_expression)
        obj = program.compile("cubin", name_expressions=(name_expression, smem_name), logs=_Log())
    except Exception as e:  # cuda.core raises a generic error; keep NVRTC's log in ours
        if announce:
            print(" failed", file=sys.stderr)
        raise CompileError(
            f"NVRTC failed to compile {name_expression} ({source_file}, {arch}):\n{''.join(log_lines)}\n{e}"
        ) from None
    seconds = time.perf_counter() - t0
    if announce:
        print(f" {seconds:.1f} s", file=sys.stderr)
    lowered, smem_lowered = (
        n.decode() if isinstance(n, bytes) else n for n in (obj.symbol_mapping[e] for e in (name_expression, smem_name))
    )
    return Cubin(name_expression, lowered, arch, bytes(obj.code), "".join(log_lines), seconds, smem_lowered)


# Disassemblies by sha256 of the cubin, for this process: the tests read one kernel's SASS several
# times, and testing.compile_in_parallel fills it from its workers (cuobjdump takes ~0.5 s a kernel).
_sass_memo: dict[str, str] = {}


def sass_key(cubin: Cubin) -> str:
    return hashlib.sha256(cubin.data).hexdigest()


def sass(cubin: Cubin) -> str:
    """Disassembly of a cubin, via the cuobjdump of the nvidia-cuda-cuobjdump wheel (or PATH).
    cuobjdump runs nvdisasm (the nvidia-cuda-nvdisasm wheel), which it looks for on PATH: the
    folder of the one found is put first."""
    key = sass_key(cubin)
    if key in _sass_memo:
        return _sass_memo[key]
    tool, nvdisasm = _find_tool("cuobjdump"), _find_tool("nvdisasm")
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(nvdisasm).parent), os.environ.get("PATH", "")]))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin.data)
        f.flush()
        text = subprocess.run([tool, "-sass", f.name], check=True, capture_output=True, text=True, env=env).stdout
    _sass_memo[key] = text
    return text


def _find_tool(name: str) -> str:
    import shutil

    try:
        import nvidia

        for base in nvidia.__path__:
            for cand in sorted(Path(base).glob(f"cu*/bin/{name}")):
                return str(cand)
    except ImportError:
        pass
    if path := shutil.which(name):
        return path
    raise RuntimeError(f"{name} not found: pip install nvidia-cuda-{name} (or: pip install 'tileattn[test]')")


# ---------------------------------------------------------------------------------------------
# GPU side: device arch, module load, launch on the caller's stream.  Through the driver API
# (cuda.bindings): a kernel takes one by-value struct of TMA descriptors, which cuda.core's
# launch cannot pass, and a launch must leave the thread's current context as it found it.


def _check(result, what: str):
    """cuda.bindings returns (CUresult, *values): raise on an error, return the values."""
    from cuda.bindings import driver

    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"tileattn: {what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else values


@functools.cache
def device_arch(device_index: int) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(device_index)


def arch_string(cc: tuple[int, int], *, arch_specific: bool = False) -> str:
    """sm_XY, or sm_XYa when a rung uses arch-specific instructions (wgmma, setmaxnreg)."""
    return f"sm_{cc[0]}{cc[1]}" + ("a" if arch_specific else "")


@functools.cache
def _primary_context(device_index: int):
    """The handle of the device's primary context (the one torch uses), retained for the
    process's life."""
    from cuda.bindings import driver

    _check(driver.cuInit(0), "cuInit")
    dev = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
    return int(_check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain"))


@dataclasses.dataclass
class LoadedKernel:
    kernel: object  # CUkernel (context-independent: cuLibraryGetKernel)
    library: object  # CUlibrary, kept alive with the kernel
    function: int  # the CUkernel's handle, which cuLaunchKernel takes as a CUfunction
    smem_limit_set: dict = dataclasses.field(default_factory=dict)  # device index -> bytes allowed


_loaded: dict[tuple[str, str], LoadedKernel] = {}
_load_lock = threading.Lock()


def load(cubin: Cubin) -> LoadedKernel:
    """Load a cubin as a context-independent library; its kernel runs on any device of its arch."""
    key = (cubin.lowered_name, hashlib.sha256(cubin.data).hexdigest())
    with _load_lock:
        if key not in _loaded:
            from cuda.bindings import driver

            _check(driver.cuInit(0), "cuInit")
            lib = _check(driver.cuLibraryLoadData(cubin.data, None, None, 0, None, None, 0), "cuLibraryLoadData")
            kernel = _check(driver.cuLibraryGetKernel(lib, cubin.lowered_name.encode()), "cuLibraryGetKernel")
            _loaded[key] = LoadedKernel(kernel, lib, int(kernel))
        return _loaded[key]


@functools.cache
def _tma_enums():
    from cuda.bindings import driver

    return (
        driver.cuuint64_t,
        driver.cuuint32_t,
        {
            "bfloat16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            "float16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        },
        {
            64: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            32: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
            16: driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
        },
    )


def tensor_map_4d(
    ptr: int,
    dtype: str,
    dims: tuple[int, ...],
    strides_bytes: tuple[int, ...],
    box: tuple[int, int],
    l2_promotion: int = 128,
) -> bytes:
    """The 128-byte CUtensorMap (TMA descriptor) of a 4-d 16-bit tensor: dims innermost first
    (columns, rows, heads, batch), strides in bytes of dims 1..3, box = (columns, rows) of one copy
    with 64, 32 or 16 columns, swizzled over 128, 64 or 32 bytes (SwizzledTile's panel layouts),
    zeros for elements outside the tensor, L2 fills of l2_promotion bytes (0, 64, 128, 256) per
    miss.  Host bytes only (api._tensor_maps caches them per layout): they travel to the kernel
    by value, as a __grid_constant__ parameter, never through a device buffer that a later call
    could free or overwrite under a running kernel."""
    from cuda.bindings import driver

    u64, u32, data_types, swizzles = _tma_enums()
    promotion = f"L2_{l2_promotion}B" if l2_promotion else "NONE"
    err, tmap = driver.cuTensorMapEncodeTiled(
        data_types[dtype],
        4,
        ptr,
        [u64(d) for d in dims],
        [u64(s) for s in strides_bytes],
        [u32(box[0]), u32(box[1]), u32(1), u32(1)],
        [u32(1)] * 4,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzles[box[0]],
        getattr(driver.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{promotion}"),
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({err}) for dims {dims}, strides {strides_bytes}, box {box}")
    return b"".join(int(x).to_bytes(8, "little") for x in tmap.opaque)


def _device_attribute(name: str, device_index: int) -> int:
    from cuda.bindings import driver

    # cuInit is idempotent and cheap; without it a query made before torch (or a launch) has
    # touched CUDA in this process fails with CUDA_ERROR_NOT_INITIALIZED.
    _check(driver.cuInit(0), "cuInit")
    attr = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return _check(driver.cuDeviceGetAttribute(attr, device_index), "cuDeviceGetAttribute")


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of the device: the grid of a persistent rung (one CTA per SM)."""
    return _device_attribute("MULTIPROCESSOR_COUNT", device_index)


@functools.cache
def max_dynamic_smem(device_index: int) -> int:
    return _device_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", device_index)


def set_max_dynamic_smem(lk: LoadedKernel, device_index: int, smem: int) -> None:
    """Let the kernel use more than the default 48 KB of dynamic shared memory on this device."""
    from cuda.bindings import driver

    if smem > 48 * 1024 and lk.smem_limit_set.get(device_index, 0) < smem:
        dev = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        _check(
            driver.cuKernelSetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem, lk.kernel, dev
            ),
            f"raising dynamic shared memory to {smem} bytes",
        )
        lk.smem_limit_set[device_index] = smem


def function_in_context(lk: LoadedKernel, device_index: int, smem: int) -> tuple[int, int]:
    """(CUfunction, CUcontext): the kernel as a function of the device's primary context, with its
    dynamic shared memory raised to ``smem``.  A launch of the CUkernel itself makes the driver
    look its function up in the current context every time; this is done once per plan."""
    from cuda.bindings import driver

    set_max_dynamic_smem(lk, device_index, smem)
    ctx = _primary_context(device_index)
    # cuKernelGetFunction answers for the current context: make the device's current for the call.
    _check(driver.cuCtxPushCurrent(driver.CUcontext(ctx)), "cuCtxPushCurrent")
    try:
        function = _check(driver.cuKernelGetFunction(lk.kernel), "cuKernelGetFunction")
        if smem > 48 * 1024:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(driver.cuFuncSetAttribute(function, attr, smem), f"raising dynamic shared memory to {smem} bytes")
    finally:
        _check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")
    return int(function), ctx


# cuLaunchKernel's `extra` keys: the whole parameter block as one buffer.
_LAUNCH_PARAM_END, _LAUNCH_PARAM_BUFFER_POINTER, _LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2


class ParamBuffer(threading.local):
    """A host image of a kernel's parameter block (the compiler's offsets), one per thread, and
    the `extra` array that hands it to cuLaunchKernel whole (one copy, instead of one per
    parameter through kernelParams).  cuLaunchKernel copies the block when it is called, so the
    buffer is free again as soon as the launch returns; per thread, so concurrent callers never
    share one."""

    def __init__(self, init: bytes):
        self.buf = ctypes.create_string_buffer(init, max(len(init), 1))
        self.size = ctypes.c_size_t(len(init))
        self.extra = (ctypes.c_void_p * 5)(
            _LAUNCH_PARAM_BUFFER_POINTER,
            ctypes.addressof(self.buf),
            _LAUNCH_PARAM_BUFFER_SIZE,
            ctypes.addressof(self.size),
            _LAUNCH_PARAM_END,
        )
        self.extra_addr = ctypes.addressof(self.extra)


class _Libcuda:
    """The three driver entry points of the launch path, called through ctypes: a cuda.bindings
    call converts each argument into a Python object (a few microseconds a launch); these take
    plain integers."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")  # the driver: a system library, never a wheel
        self.launch = lib.cuLaunchKernel
        self.launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self.launch.restype = ctypes.c_int
        self.get_current = lib.cuCtxGetCurrent
        self.get_current.argtypes = [ctypes.c_void_p]
        self.get_current.restype = ctypes.c_int
        self.set_current = lib.cuCtxSetCurrent
        self.set_current.argtypes = [ctypes.c_void_p]
        self.set_current.restype = ctypes.c_int


@functools.cache
def _libcuda() -> _Libcuda:
    return _Libcuda()


class _CurrentContext(threading.local):
    def __init__(self):
        self.slot = ctypes.c_void_p()
        self.addr = ctypes.addressof(self.slot)


_current = _CurrentContext()


def launch(function: int, ctx: int, stream: int, grid_x: int, grid_y: int, block: int, smem: int, extra: int) -> None:
    """cuLaunchKernel of a function of context ``ctx`` (function_in_context) with its parameter
    block (ParamBuffer.extra_addr), on the given stream (torch's current one for the inputs'
    device).  The context is made current for the call only: a thread that had another context
    current (another device) or none gets it back, so a call on cuda:1 never moves the caller off
    cuda:0."""
    cu = _libcuda()
    cu.get_current(_current.addr)
    prev = _current.slot.value
    if prev != ctx:
        _check_int(cu.set_current(ctx), "cuCtxSetCurrent")
    try:
        err = cu.launch(function, grid_x, grid_y, 1, block, 1, 1, smem, stream, None, extra)
    finally:
        if prev != ctx:
            _check_int(cu.set_current(prev), "cuCtxSetCurrent")
    if err:
        _check_int(err, "cuLaunchKernel")


def _check_int(err: int, what: str) -> None:
    if err:
        from cuda.bindings import driver

        _check((driver.CUresult(err),), what)
