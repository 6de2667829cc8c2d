"""The kernels' parameter block exists once, in C++: the host reads each parameter's offset and
size back from the compiled cubin and packs at those offsets.  Here every instantiation of the
compile matrix is checked: the compiler's sizes are the C types the host packs."""

import pytest
from test_compile import ARCHS, INSTANCES

from tileattn import _nvrtc, _params
from tileattn.versions import VERSIONS, arch_number


@pytest.mark.parametrize(
    "name,D,causal,arch",
    [(n, D, c, a) for n, D, c in INSTANCES for a in ARCHS if VERSIONS[n].runs_on(arch_number(a))],
    ids=lambda x: str(x),
)
def test_parameter_block_matches_the_compiler(name, D, causal, arch):
    v = VERSIONS[name]
    cubin = _nvrtc.compile_kernel(v.file, v.name_expression(v.dtypes[0], D, causal, arch_number(arch)), arch)
    layout = _params.kernel_params(cubin.data, cubin.lowered_name)
    expected = [_params.struct.calcsize("<" + code) for _, code in _params.arg_codes(v.tensor_maps)]
    assert [size for _, size in layout] == expected
    pack, offsets = _params.packer(cubin.data, cubin.lowered_name, v.tensor_maps)
    assert offsets == [off for off, _ in layout] and pack.size == layout[-1][0] + layout[-1][1]
    # The block size is the kernel's own __launch_bounds__, read back the same way.
    assert 32 <= _params.block_threads(cubin.data, cubin.lowered_name) <= 1024


def test_a_mismatch_is_caught(monkeypatch):
    v = VERSIONS["v2"]
    cubin = _nvrtc.compile_kernel(v.file, v.name_expression("float32", 64, False), "sm_80")
    args = list(_params.FWD_ARGS)
    args[6] = ("Nq", "q")  # the host would pack Nq as 8 bytes; the kernel takes an int
    monkeypatch.setattr(_params, "FWD_ARGS", args)
    with pytest.raises(RuntimeError, match=r"csrc and _params.py disagree"):
        _params.packer(cubin.data, cubin.lowered_name, False)
    with pytest.raises(RuntimeError, match=r"disagree"):  # a TMA rung without its maps, too
        monkeypatch.undo()
        _params.packer(cubin.data, cubin.lowered_name, True)
