"""What the host must know of a kernel exists once, in C++, and is read back or checked:
* the argument list (TILEATTN_FWD_FIELDS): names, order and types, for every dtype, through a
  FwdParams initialised field by field and read back from a cubin;
* each instantiation's parameter block, block size and dynamic shared memory, read from its
  cubin (for every instantiation of the compile matrix);
* the TMA box widths api.panel_widths hands the copy engine, held to the tiles' D_SMEM."""

import pytest
from test_compile import ARCHS, INSTANCES

from tileattn import _nvrtc, _params, api
from tileattn.versions import VERSIONS, arch_number

_CTYPES = ("float", "__half", "__nv_bfloat16")


def _compile_probe(source: str, names=(), arch: str = "sm_90a", std: str = "c++17"):
    """Compile a translation unit that includes csrc headers; NVRTC errors fail the test.  Returns
    the cubin and the lowered names of ``names``."""
    from cuda.core import Program, ProgramOptions

    log = []

    class _Log:
        def write(self, s):
            log.append(s)

    opts = ProgramOptions(arch=arch, std=std, include_path=[str(_nvrtc.CSRC), _nvrtc.cuda_include_dir()])
    try:
        obj = Program(source, code_type="c++", options=opts).compile("cubin", name_expressions=names, logs=_Log())
    except Exception as e:
        pytest.fail(f"{e}\n{''.join(log)}")
    lowered = [obj.symbol_mapping[n] for n in names]
    return bytes(obj.code), [n.decode() if isinstance(n, bytes) else n for n in lowered]


def _markers() -> list:
    """A distinct nonzero value per non-pointer member (pointers: 0, the only constant a
    __device__ pointer can be initialised with)."""
    return [
        0 if code == "Q" else 1000.5 + i if code == "f" else (0x5A5A0000 if code == "i" else 0x5A5A5A5A00000000) + i
        for i, (_, code) in enumerate(_params.FWD_FIELDS)
    ]


def test_fwd_params_layout_matches_the_compiler():
    """A __device__ FwdParams per dtype, initialised member by member with C++20 designated
    initializers in _params.FWD_FIELDS' order (a name or order that differs does not compile),
    read from the cubin: its bytes must be exactly the C layout of _params' types for the same
    values, so every type's size agrees (the kernels' parameter offsets, which follow the same
    types, are read from each cubin)."""
    values = _markers()
    expected = _params.struct.pack("@" + "".join(code for _, code in _params.FWD_FIELDS), *values)
    expected += bytes(_params.struct_size() - len(expected))
    literal = lambda code, value: "nullptr" if code == "Q" else repr(value) + {"f": "f", "q": "LL"}.get(code, "")
    lines = ['#include "common.cuh"']
    for i, ctype in enumerate(_CTYPES):
        inits = ", ".join(
            f".{name} = {literal(code, value)}" for (name, code), value in zip(_params.FWD_FIELDS, values)
        )
        lines.append(f"__device__ tileattn::FwdParams<{ctype}> probe{i} = {{{inits}}};")
    names = [f"&probe{i}" for i in range(len(_CTYPES))]
    cubin, lowered = _compile_probe("\n".join(lines), names, std="c++20")
    for ctype, symbol in zip(_CTYPES, lowered):
        assert _params.symbol_bytes(cubin, symbol) == expected, f"FwdParams<{ctype}>"


def test_a_layout_mismatch_is_caught():
    fields = list(_params.FWD_FIELDS)
    fields[6], fields[7] = fields[7], fields[6]  # Nk before Nq: out of order, does not compile
    inits = ", ".join(f".{name} = {{}}" for name, _ in fields)
    with pytest.raises(pytest.fail.Exception, match="out-of-order"):
        _compile_probe(f'#include "common.cuh"\n__device__ tileattn::FwdParams<float> p = {{{inits}}};', std="c++20")


@pytest.mark.parametrize(
    "name,D,causal,arch",
    [(n, D, c, a) for n, D, c in INSTANCES for a in ARCHS if VERSIONS[n].runs_on(arch_number(a))],
    ids=lambda x: str(x),
)
def test_read_back_from_every_instantiation(name, D, causal, arch):
    v = VERSIONS[name]
    cubin = _nvrtc.compile_kernel(v.file, v.name_expression(v.dtypes[0], D, causal, arch_number(arch)), arch)
    # The parameter block: TILEATTN_FWD_PARAMS, then the TMA rungs' maps.
    sizes = [size for _, size in _params.kernel_params(cubin.data, cubin.lowered_name)]
    assert sizes == [_params.struct.calcsize("<" + code) for _, code in _params.arg_codes(v.tensor_maps)]
    layout = _params.packer(cubin.data, cubin.lowered_name, v.tensor_maps)
    assert layout.offsets[0] == 0 and len(layout.init) == layout.size
    assert (layout.tma_offset is not None) == v.tensor_maps
    # The block size (__launch_bounds__) and the shared memory (TILEATTN_SMEM_BYTES).
    assert 32 <= _params.block_threads(cubin.data, cubin.lowered_name) <= 1024
    # (A GPU with less than a rung needs, e.g. v2 at D=128 on an A100, gets a ValueError from the plan.)
    smem = _params.smem_bytes(cubin)
    assert 0 < smem <= 227 * 1024, f"{smem} bytes of shared memory: more than any GPU allows"


def test_room_fields_start_off():
    v = VERSIONS["v2"]
    cubin = _nvrtc.compile_kernel(v.file, v.name_expression("float32", 64, False), "sm_80")
    layout = _params.packer(cubin.data, cubin.lowered_name, False)
    offsets = dict(zip((name for name, _ in _params.FWD_FIELDS), layout.offsets))
    unpack = lambda buf, name, code: _params.struct.unpack_from("<" + code, buf, offsets[name])[0]
    assert all(unpack(layout.init, name, code) == off for name, code, off in _params.FWD_ROOM)
    assert unpack(layout.init, "window_left", "i") == -1 and unpack(layout.init, "q", "Q") == 0
    # A call packs the forward fields only: the room keeps its "off" values.
    buf = bytearray(layout.init)
    layout.pack(buf, 0, *range(1, 7), *([5] * 19))
    assert unpack(buf, "q", "Q") == 1 and unpack(buf, "bh_offset", "i") == 5
    assert buf[offsets["cu_seqlens_q"] :] == layout.init[offsets["cu_seqlens_q"] :]


def test_room_values_in_order():
    """_params.room: every room field, the named ones set and the rest off (the FP8 and packed
    launches build their forward fields with it; a hand-written list broke all of them once, when
    split_amax was added)."""
    values = _params.room(softcap=0.5, bh_count=7)
    assert len(_params.FWD_ARGS) + len(values) == len(_params.FWD_FIELDS)
    expected = {name: off for name, _, off in _params.FWD_ROOM} | {"softcap": 0.5, "bh_count": 7}
    assert values == [expected[name] for name, _, _ in _params.FWD_ROOM]
    with pytest.raises(AssertionError, match="not room fields"):
        _params.room(softcapp=0.5)


def test_a_mismatch_is_caught(monkeypatch):
    v = VERSIONS["v2"]
    cubin = _nvrtc.compile_kernel(v.file, v.name_expression("float32", 64, False), "sm_80")
    monkeypatch.setattr(_params, "FWD_ROOM", _params.FWD_ROOM[:-2])  # members the host forgot
    monkeypatch.setattr(_params, "FWD_FIELDS", _params.FWD_FIELDS[:-2])
    with pytest.raises(RuntimeError, match=r"csrc and _params.py disagree"):
        _params.packer(cubin.data, cubin.lowered_name, False)
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match=r"disagree"):  # a TMA rung's maps on a kernel without them
        _params.packer(cubin.data, cubin.lowered_name, True)


def test_tma_boxes_match_the_tiles():
    """api.panel_widths (the TMA boxes of v3.2) cover fa2_mma_d_smem columns: whole 64-column
    panels, then one narrow panel of SwizzledTile's remainder."""
    lines = ['#include "fa2_mma.cuh"', "using namespace tileattn;"]
    for D in VERSIONS["v3.2"].head_dims:
        widths = api.panel_widths(D)
        narrow = widths[-1] if widths[-1] != 64 else 0
        lines.append(
            f"static_assert(fa2_mma_d_smem({D}) % 64 == {narrow} && (fa2_mma_d_smem({D}) >= 64) == "
            f'{str(64 in widths).lower()} && SwizzledTile<64, fa2_mma_d_smem({D})>::REM * 8 == {narrow}, "D={D}");'
        )
    _compile_probe("\n".join(lines))
