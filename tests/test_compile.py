"""Every rung compiles under NVRTC without a GPU, keeps its arrays in registers, and its SASS holds
the instructions the rung exists for."""

import functools
import re

import pytest

from tileattn import _nvrtc, _params
from tileattn.testing import compile_archs, compile_in_parallel
from tileattn.versions import KERNEL_ENTRIES, VERSIONS, arch_number

ARCHS = compile_archs(["sm_80", "sm_90a"])
# Consumer Ampere/Ada (99 KB of shared memory) compile too; checked for the tensor-core rung.
EXTRA_ARCHS = {"v3": compile_archs(["sm_86", "sm_89"]), "v3.1": compile_archs(["sm_86", "sm_89"])}
# (rung, head dim, causal, arch) for every arch a rung runs on (v3.2 needs sm_90's TMA).
# (rung, head dim, causal): every head dim non-causal, plus the causal instantiation at D=64 (or the
# rung's first head dim: v3.6_wide runs D=128 only).
INSTANCES = [(name, D, False) for name, v in VERSIONS.items() for D in v.head_dims] + [
    (name, 64 if 64 in v.tiles else v.head_dims[0], True) for name, v in VERSIONS.items()
]
# What each rung must show in SASS: LDGSTS is cp.async.
MUST_HAVE = {
    "v1.1": ["LDGSTS"],
    "v2": ["LDGSTS"],
    "v2.1": ["LDGSTS", "LDS.128"],
    "v2.2": ["LDGSTS", "HMMA"],
    "v2.2_tf32": ["LDGSTS", "HMMA"],
    "v3": ["LDGSTS", "HMMA", "LDSM"],
    "v3.1": ["LDGSTS", "HMMA", "LDSM"],
    # UTMALDG: the TMA tile copy; SYNCS.*: the mbarrier that counts its bytes; no cp.async left.
    "v3.2": ["UTMALDG", "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK", "HMMA", "LDSM"],
    # HGMMA: warpgroup MMA; SYNCS.*: the producer/consumer mbarriers.
    "v2.3": ["HGMMA.64", "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK", "WARPGROUP.DEPBAR"],
    "v2.3_tf32": ["HGMMA.64", "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK", "WARPGROUP.DEPBAR"],
    # fp16 HGMMA on the split halves (three per multiply: test_v2_4_three_products), TMA copies.
    "v2.4": ["HGMMA.64", "UTMALDG", "SYNCS.PHASECHK", "USETMAXREG", "WARPGROUP.DEPBAR"],
    # v2.4's, with Q's rows loaded (16-byte loads) and split into shared memory by the consumers.
    "v2.5": ["HGMMA.64", "UTMALDG", "SYNCS.PHASECHK", "USETMAXREG", "WARPGROUP.DEPBAR", "LDG.E.128", "STS.128"],
    "v3.3": ["HGMMA.64", "UTMALDG", "SYNCS.PHASECHK", "USETMAXREG", "WARPGROUP.DEPBAR"],
    # BAR.ARV: the hand-over of the tensor core to the other consumer warpgroup (bar.arrive).
    "v3.4": ["HGMMA.64", "UTMALDG", "SYNCS.PHASECHK", "USETMAXREG", "WARPGROUP.DEPBAR", "BAR.ARV"],
    "v3.6": ["HGMMA.64", "UTMALDG", "SYNCS.PHASECHK", "USETMAXREG", "WARPGROUP.DEPBAR"],
    # S = Q K^T over 160-key blocks: HGMMA.64x160x16.
    "v3.6_wide": ["HGMMA.64x160x16", "UTMALDG", "SYNCS.PHASECHK", "USETMAXREG", "WARPGROUP.DEPBAR"],
    "v3.7": ["HGMMA.64", "UTMALDG", "SYNCS.PHASECHK", "USETMAXREG", "WARPGROUP.DEPBAR"],
}
MUST_NOT_HAVE_BY_RUNG = {
    "v3.2": ["LDGSTS"],
    "v2.3": ["HMMA", "LDSM"],
    "v2.3_tf32": ["HMMA", "LDSM"],
    "v2.4": ["HMMA", "LDSM", "LDGSTS"],
    "v2.5": ["HMMA", "LDSM", "LDGSTS"],
    "v3.3": ["HMMA", "LDSM", "LDGSTS"],
    "v3.4": ["HMMA", "LDSM", "LDGSTS"],
    "v3.6": ["HMMA", "LDSM", "LDGSTS"],
    "v3.6_wide": ["HMMA", "LDSM", "LDGSTS"],
    "v3.7": ["HMMA", "LDSM", "LDGSTS", "BAR.ARV"],  # three consumer warpgroups, no ping-pong
}
MUST_NOT_HAVE = {"simt": ["HMMA"]}  # CUDA-core rungs must not quietly use tensor cores


def _job(name, D, causal, arch, dtype=None):
    v = VERSIONS[name]
    return v.file, v.name_expression(dtype or v.dtypes[0], D, causal, arch_number(arch)), arch


@pytest.fixture(scope="module", autouse=True)
def compile_everything_in_parallel():
    """Fill the session's kernel cache with every instantiation below (testing.compile_in_parallel)."""
    jobs = {_job(n, D, c, a) for n, D, c in INSTANCES for a in ARCHS if VERSIONS[n].runs_on(arch_number(a))}
    jobs |= {_job(n, D, c, a) for n, D, c in INSTANCES for a in EXTRA_ARCHS.get(n, []) if D in (64, 128, 256)}
    jobs |= {_job(n, D, True, "sm_90a", dt) for n, D, dt in _every_dtype_instances()}
    compile_in_parallel(jobs, disassemble={_job(n, D, c, "sm_90a") for n, D, c in INSTANCES})  # test_sass's


@functools.cache
def compiled(name, D, causal, arch):
    return _nvrtc.compile_kernel(*_job(name, D, causal, arch))


def spill_budget(name, D, arch):
    """Spill bytes allowed: 0, except for a rung's documented arch-specific tiles and its documented
    per-head-dim budgets (versions.py says which and why)."""
    v = VERSIONS[name]
    return max(v.arch_tile_spill_bytes if v.is_arch_tile(D, arch_number(arch)) else 0, v.spill_bytes.get(D, 0))


@pytest.mark.parametrize(
    "name,D,causal,arch",
    [(n, D, c, a) for n, D, c in INSTANCES for a in ARCHS if VERSIONS[n].runs_on(arch_number(a))],
    ids=lambda x: str(x),
)
def test_compiles_without_stack_or_spills(name, D, causal, arch):
    res = compiled(name, D, causal, arch).resources
    assert res["registers"] is not None, "ptxas -v report missing"
    budget = spill_budget(name, D, arch)
    assert res["stack_bytes"] <= budget and res["spill_stores"] <= budget and res["spill_loads"] <= 2 * budget, res
    cubin = compiled(name, D, causal, arch)
    threads = _params.block_threads(cubin.data, cubin.lowered_name)  # the kernel's __launch_bounds__
    assert res["registers"] * threads <= 65536, f"a block of {threads} threads would not fit"
    assert not cubin.wgmma_serialized, "ptxas serialised the kernel's wgmma (C7514)"


@pytest.mark.parametrize(
    "name,D,causal,arch", [(n, D, c, a) for n, D, c in INSTANCES for a in EXTRA_ARCHS.get(n, []) if D in (64, 128, 256)]
)
def test_compiles_on_consumer_archs(name, D, causal, arch):
    res = compiled(name, D, causal, arch).resources
    assert res["stack_bytes"] == 0 and res["spill_stores"] == 0, res


def _every_dtype_instances():
    return [
        (n, D, dt)
        for n, v in VERSIONS.items()
        if len(v.dtypes) > 1 and v.runs_on(90)
        for dt in v.dtypes[1:]
        for D in v.head_dims[:: max(1, len(v.head_dims) // 4)]
    ]


@pytest.mark.parametrize("name", [n for n, v in VERSIONS.items() if len(v.dtypes) > 1])
def test_every_dtype_compiles(name):
    for n, D, dtype in _every_dtype_instances():
        if n == name:
            cubin = _nvrtc.compile_kernel(*_job(name, D, True, "sm_90a", dtype))
            budget = spill_budget(name, D, "sm_90a")
            assert cubin.resources["stack_bytes"] <= budget and cubin.resources["spill_stores"] <= budget, (dtype, D)


@pytest.mark.parametrize("name,D,causal", INSTANCES, ids=lambda x: str(x))
def test_sass(name, D, causal):
    sass = _nvrtc.sass(compiled(name, D, causal, "sm_90a"))
    assert "FFMA" in sass
    for op in MUST_HAVE.get(name, []):
        assert op in sass, f"{name} D={D}: no {op} in SASS"
    for op in MUST_NOT_HAVE.get(VERSIONS[name].kind, []) + MUST_NOT_HAVE_BY_RUNG.get(name, []):
        assert op not in sass, f"{name} D={D}: {op} in SASS"
    # Local memory means a register array was demoted: the rungs promise none (beyond a documented
    # arch-tile spill of a few scalars, see spill_budget).
    if spill_budget(name, D, "sm_90a") == 0:
        assert "LDL" not in sass and "STL" not in sass, f"{name} D={D}: local memory in SASS"


@pytest.mark.parametrize(
    "name,D,causal", [i for i in INSTANCES if i[0] in ("v3.3", "v3.4", "v3.6", "v3.6_wide", "v3.7")], ids=str
)
def test_speculative_softmax(name, D, causal):
    """The 16-bit rungs on v3.3's body take the speculative softmax on unmasked blocks (v3_3_wgmma.cu
    speculative_softmax), whose check is a warpgroup's vote, bar.red.and.pred (BAR.RED.AND in SASS;
    nothing else in these kernels reduces over a barrier).  The ping-pong's causal kernels (v3.4,
    v3.6 at D = 64) keep the ordinary softmax (measured slower there), and so does v3.3 at D = 256
    (its fp16 causal kernel kept 8 bytes of stack)."""
    pingpong = name == "v3.4" or (name == "v3.6" and D == 64)
    expected = not (pingpong and causal) and not (name == "v3.3" and D == 256)
    sass = _nvrtc.sass(compiled(name, D, causal, "sm_90a"))
    assert ("BAR.RED.AND" in sass) == expected, (name, D, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["v3.3", "v3.7_variants"])
def test_d64_exponentials_precede_pv_wait(name, causal):
    """v3.3 at D = 64 pins its P V wait behind the softmax (wgmma_wait_all_after), and so does
    v3.7's variants kernel: in the loop, every MUFU.EX2 of a block (64 scores and 2 rescales per
    thread) issues between the wait for S (gsb0 <= 1) and the wait for P V (gsb0 == 0), while P V
    runs on the tensor core.  With the speculative softmax (v3.3) the loop has two paths: its 64
    exponentials, then (on a failed check) the wait for S issued again, which also waits for P V,
    and the ordinary path's 66; a passed check jumps past them to the P V wait."""
    if name in VERSIONS:
        cubin = compiled(name, 64, causal, "sm_90a")
    else:
        e = KERNEL_ENTRIES[name]
        cubin = _nvrtc.compile_kernel(e.file, e.name_expression("bfloat16", 64, causal), "sm_90a")
    sass = _nvrtc.sass(cubin)
    ops = [line for line in sass.splitlines() if "DEPBAR" in line or "MUFU" in line]
    s_wait = next(i for i, op in enumerate(ops) if "DEPBAR.LE gsb0, 0x1" in op)
    exponentials = [0]  # MUFU.EX2 after the S wait, between consecutive gsb0 == 0 waits
    for op in ops[s_wait:]:
        if "DEPBAR.LE gsb0, 0x0" in op:
            exponentials.append(0)
        exponentials[-1] += "MUFU.EX2" in op
    expected = [64, 66] if "BAR.RED.AND" in sass else [66]
    assert exponentials[: len(expected)] == expected


@pytest.mark.parametrize(
    "name,D",
    [("v3.3", 64), ("v3.3", 128), ("v3.4", 64), ("v3.6", 64), ("v3.6", 128), ("v3.6_wide", 128), ("v3.7", 64)],
)
@pytest.mark.parametrize("causal", [False, True])
def test_unmasked_blocks_take_the_max_alone(name, D, causal):
    """fragment_online_softmax keeps the key mask behind a branch: a block that needs no mask
    takes its row max as one run of FMNMX (64 scores a thread at Bc = 128), with no ISETP / FSEL
    between them.  When the mask was one predicated loop, ptxas ran an ISETP and an FSEL per score
    on every block (the longest FMNMX run was 12-55 in 9 of these 12 builds) and the softmax issued a
    third more instructions (bench/NOTES.md, 2026-12-03)."""
    longest = run = 0
    for line in _nvrtc.sass(compiled(name, D, causal, "sm_90a")).splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m:
            run = run + 1 if m.group(1).startswith("FMNMX") else 0
            longest = max(longest, run)
    Bc = VERSIONS[name].tile(D, 90)[1]
    assert longest >= Bc // 2, f"{name} D={D} causal={causal}: longest FMNMX run {longest}"


@pytest.mark.parametrize("name,D", [("v3.3", 64), ("v3.4", 64), ("v3.6", 128), ("v3.6", 256), ("v3.7", 64)])
def test_o_rescale_behind_a_warp_vote(name, D):
    """The lazy rebase (softmax.cuh's lazy_rescale_log2): O's rescale, one FMUL per element a
    thread holds (D / 2), runs behind a branch on a warp vote, taken only when a row's max moved."""
    ops = []
    for line in _nvrtc.sass(compiled(name, D, False, "sm_90a")).splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4}\*/\s+((?:@!?U?P\w+\s+)?[A-Z][A-Z0-9_.]+)", line)
        if m:
            ops.append(m.group(1))
    assert any(op.startswith("VOTE.ANY") for op in ops)
    runs = [i for i in range(1, len(ops)) if ops[i].startswith("FMUL") and not ops[i - 1].startswith("FMUL")]
    longest = max(runs, key=lambda i: next(j for j in range(i, len(ops)) if not ops[j].startswith("FMUL")) - i)
    length = next(j for j in range(longest, len(ops)) if not ops[j].startswith("FMUL")) - longest
    assert length >= D // 2 and re.match(r"@!?P\d BRA", ops[longest - 1]), (length, ops[longest - 1])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name,D", [("v3.6", 64), ("v3.6", 128), ("v3.6", 256), ("v3.7", 64)])
def test_persistent_o_through_a_shared_stage(name, D, causal):
    """The persistent rungs write O by stmatrix into a swizzled shared-memory stage (D / 16
    STSM.x4 a thread) and copy it out by the copy engine's tensor stores (UTMASTG, one a 64-column
    panel from one lane); at D = 256 the stage holds 128 columns (all that fits beside v3.6's
    192 KB), so a row goes in two passes of each.  No bulk copy a row (UBLKCP) is left."""
    sass = _nvrtc.sass(compiled(name, D, causal, "sm_90a"))
    found = tuple(len(re.findall(p, sass)) for p in (r"\bSTSM\b", r"\bUTMASTG\b", r"\bUBLKCP\b"))
    assert found == (D // 16, D // 64, 0), found


def test_compile_error_carries_log(tmp_path, monkeypatch):
    monkeypatch.setattr(_nvrtc, "CSRC", tmp_path)
    (tmp_path / "bad.cu").write_text("template <typename T> __global__ void k(T x) { undefined_thing; }\n")
    with pytest.raises(_nvrtc.CompileError, match="undefined_thing"):
        _nvrtc.compile_kernel("bad.cu", "k<float>", "sm_90a")


@pytest.mark.parametrize("name", ["v2.4", "v2.5"])
@pytest.mark.parametrize("D", VERSIONS["v2.4"].head_dims)
def test_v2_4_three_products(name, D):
    """v2.4 multiplies fp16 halves three times a product: S (m64n64, Bc = 64) over D / 16 k-steps,
    P V (m64nD) over Bc / 16, each x3, each issued at two sites (the pipeline's first S and last
    P V outside its loop); the hi and lo tiles of Q, K and V by TMA (per 64-column panel).  v2.5
    copies K and V only (its consumers split Q: D / 16 pairs of 16-byte loads a thread, the hi and
    lo 16-byte shared stores of each)."""
    sass = _nvrtc.sass(compiled(name, D, False, "sm_90a"))
    Br, Bc = VERSIONS[name].tiles[D]
    s_ops = 2 * (3 * D // 16 + (3 * Bc // 16 if D == 64 else 0))  # at D=64 P V is m64n64 too
    assert sass.count("HGMMA.64x64x16.F32") == s_ops and "HGMMA.64x64x16.F32.BF16" not in sass
    if D == 128:
        assert sass.count("HGMMA.64x128x16.F32") == 2 * 3 * Bc // 16
    if name == "v2.4":
        assert sass.count("UTMALDG") == 2 * 3 * D // 64
    else:
        assert sass.count("UTMALDG") == 2 * 2 * D // 64
        assert sass.count("LDG.E.128") == 2 * D // 16 and sass.count("STS.128") == 2 * D // 16


@pytest.mark.parametrize("name,D", [("v3.6", 64), ("v3.7", 64), ("v3.6", 128)])
def test_trace_diagnostic_compiles(name, D, monkeypatch):
    """The tile trace (TILEATTN_DEFINES=TILEATTN_TRACE=1, csrc/v3_3_wgmma.cu, read by
    scripts/tile_trace.py): the rungs it is read on compile with it, spill-free and unserialised,
    with the clock reads (CS2R) the default build lacks; its global keeps its unmangled name."""
    e = VERSIONS[name]
    default = _nvrtc.sass(compiled(name, D, True, "sm_90a"))  # (before the define: compiled() is cached)
    monkeypatch.setattr(_nvrtc, "EXPERIMENT_DEFINES", ["TILEATTN_TRACE=1"])
    cubin = _nvrtc.compile_kernel(e.file, e.name_expression("bfloat16", D, True), "sm_90a", announce=False)
    res, sass = cubin.resources, _nvrtc.sass(cubin)
    assert res["stack_bytes"] == 0 and res["spill_stores"] == 0, res
    assert not cubin.wgmma_serialized
    assert sass.count("CS2R") > default.count("CS2R")
    assert b"tileattn_trace" in cubin.data


def assert_setmaxnreg_fits_the_pool(cubin):
    """A warp-specialised kernel's producer gives registers back (setmaxnreg.dec, SASS
    USETMAXREG.DEALLOC.CTAPOOL) and its consumer warpgroups take them (USETMAXREG.TRY_ALLOC): the
    pool is the CTA's own allocation, the launch's registers a thread times its threads, not the
    register file.  A consumer asking for more than the pool holds waits for ever (the sorted
    tail's first GPU run hung so: a 32-register producer beside two 240-register consumers is 512
    a thread of each warpgroup, the pool 3 x 168 = 504)."""
    sass = _nvrtc.sass(cubin)
    dealloc = {int(x, 16) for x in re.findall(r"USETMAXREG\.DEALLOC\.CTAPOOL (0x[0-9a-f]+)", sass)}
    alloc = {int(x, 16) for x in re.findall(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL \w+, (0x[0-9a-f]+)", sass)}
    if not dealloc and not alloc:
        return None
    assert len(dealloc) == 1 and len(alloc) == 1, (dealloc, alloc)
    warpgroups = _params.block_threads(cubin.data, cubin.lowered_name) // 128
    producer, consumer = dealloc.pop(), alloc.pop()
    pool = cubin.resources["registers"] * warpgroups
    assert producer + (warpgroups - 1) * consumer <= pool, (cubin.lowered_name, producer, consumer, pool)
    return producer, consumer


@pytest.mark.parametrize("name,D,causal", [i for i in INSTANCES if "USETMAXREG" in MUST_HAVE.get(i[0], [])], ids=str)
def test_setmaxnreg_fits_the_pool(name, D, causal):
    assert assert_setmaxnreg_fits_the_pool(compiled(name, D, causal, "sm_90a")) is not None


def _warp_specialised_entry_jobs():
    """One instantiation a head dim (first dtype, causal where it has it) of every sm_90a kernel
    outside the ladder: the tile height, which sets the warpgroups, follows the head dim."""
    return [
        (e.file, e.name_expression(e.dtypes[0], D, e.causal_variants[-1]), "sm_90a")
        for e in KERNEL_ENTRIES.values()
        if e.arch_specific
        for D in e.head_dims
    ]


def test_setmaxnreg_fits_the_pool_outside_the_ladder():
    """The same check for the backward, FP8, packed and variants kernels: each that hands registers
    over (bwd_v4-v6, v3.3-v3.9's kernels) asks the pool for no more than it holds."""
    jobs = _warp_specialised_entry_jobs()
    compile_in_parallel(jobs)
    handed_over = [job for job in jobs if assert_setmaxnreg_fits_the_pool(_nvrtc.compile_kernel(*job)) is not None]
    assert len(handed_over) >= 20, handed_over  # (a regex that stopped matching would pass every kernel)


def test_sorted_tail_registers():
    """The sorted tail of the causal walk (csrc/common.cuh sorted_tail_rounds): v3.7's 192-row tiles
    take it by default, their producer with 32 registers (the tail's arithmetic spilled in 24) and
    the three consumers 160 as before (32 + 3 x 160 = 4 x 128); v3.6's 128-row tiles do not (two
    consumers at 240 beside a 24-register producer).  Their experiment switch
    (TILEATTN_SORTED_TAIL_128=2) gives v3.6 the tail spill-free at 232 registers a consumer, with
    the tile's body once (as many HGMMA as the default: one call site of the tile in the walk).
    (v3.5-v3.9 were spill-free under it with NVRTC 13.0 but FP8 at D = 256, bench/NOTES.md.)"""
    assert assert_setmaxnreg_fits_the_pool(compiled("v3.7", 64, True, "sm_90a")) == (32, 160)
    assert assert_setmaxnreg_fits_the_pool(compiled("v3.6", 128, True, "sm_90a")) == (24, 240)
    e = VERSIONS["v3.6"]
    default = _nvrtc.sass(compiled("v3.6", 128, True, "sm_90a"))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_nvrtc, "EXPERIMENT_DEFINES", ["TILEATTN_SORTED_TAIL_128=2"])
        cubin = _nvrtc.compile_kernel(e.file, e.name_expression("bfloat16", 128, True), "sm_90a", announce=False)
    res = cubin.resources
    assert res["stack_bytes"] == 0 and res["spill_stores"] == 0, res
    assert not cubin.wgmma_serialized
    assert _nvrtc.sass(cubin).count("HGMMA") == default.count("HGMMA")
    assert assert_setmaxnreg_fits_the_pool(cubin) == (32, 232)
