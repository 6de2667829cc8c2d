"""The kernel cache loads only what this user compiled from exactly these sources and this
toolchain: its key follows every included file, the options and the versions; foreign,
group-writable and corrupted entries are recompiled; processes that start together compile a
kernel once.  All on the CPU (NVRTC needs no GPU)."""

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest

from tileattn import _nvrtc
from tileattn.versions import VERSIONS

V1 = VERSIONS["v1"]
EXPR = V1.name_expression("float32", 32, False)  # the quickest rung to compile (~0.5 s)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder and an empty in-memory cache for one test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("TILEATTN_CACHE_DIR", str(folder))
    monkeypatch.setattr(_nvrtc, "_memory_cache", {})
    monkeypatch.setattr(_nvrtc, "_warned", set())
    return folder


def _compile_counting(capfd) -> tuple[_nvrtc.Cubin, bool]:
    """Compile v1 and tell whether NVRTC ran (it announces itself on stderr)."""
    _nvrtc._memory_cache.clear()
    cubin = _nvrtc.compile_kernel(V1.file, EXPR, "sm_80")
    return cubin, "tileattn: compiling" in capfd.readouterr().err


def test_folder_is_absolute_and_private(cache, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TILEATTN_CACHE_DIR", "relative/cache")
    assert _nvrtc.cache_dir() == tmp_path / "relative" / "cache"
    os.chdir("/")  # a later change of directory must not move the cache
    _compile_counting(capfd)
    folder = tmp_path / "relative" / "cache"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for f in folder.glob("*.cubin"):
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f"{f.name} readable or writable by others"


def test_second_process_reads_the_entry(cache, capfd):
    first, compiled = _compile_counting(capfd)
    assert compiled
    again, compiled = _compile_counting(capfd)
    assert not compiled and again.data == first.data


def test_foreign_entry_is_recompiled_with_one_warning(cache, capfd, monkeypatch):
    first, _ = _compile_counting(capfd)
    # Seen from another user (uid + 1), every entry here is foreign.
    me = os.getuid()
    monkeypatch.setattr(_nvrtc, "_uid", lambda: me + 1)
    monkeypatch.setattr(os, "stat", _stat_as_owned_by(me + 1, os.stat, cache))
    with pytest.warns(_nvrtc.CacheWarning, match=r"owned by uid \d+, not by this user"):
        again, compiled = _compile_counting(capfd)
    assert compiled and again.data == first.data


def _stat_as_owned_by(uid, real_stat, folder):
    """os.stat that reports the cache folder itself as owned by `uid` (the folder check)."""

    def fake(path, *a, **kw):
        st = real_stat(path, *a, **kw)
        if os.fspath(path) == os.fspath(folder):
            return os.stat_result(
                (
                    st.st_mode,
                    st.st_ino,
                    st.st_dev,
                    st.st_nlink,
                    uid,
                    st.st_gid,
                    st.st_size,
                    st.st_atime,
                    st.st_mtime,
                    st.st_ctime,
                )
            )
        return st

    return fake


def test_planted_cubin_of_another_user_never_loads(cache, capfd):
    """A real foreign file: another user's cubin under our key, with a matching checksum."""
    if os.geteuid() != 0:  # CI runs as root; test_foreign_entry_... covers the logic for everyone
        pytest.skip("planting a file owned by another uid needs root")
    first, _ = _compile_counting(capfd)
    (cubin_file,) = cache.glob("*.cubin")
    (meta_file,) = cache.glob("*.json")
    planted = b"\x7fELF planted by someone else" + b"\0" * 64
    import hashlib
    import json

    meta = json.loads(meta_file.read_text())
    meta["sha256"] = hashlib.sha256(planted).hexdigest()
    for f, data in ((cubin_file, planted), (meta_file, json.dumps(meta).encode())):
        f.write_bytes(data)
        os.chown(f, 65534, 65534)  # nobody
    with pytest.warns(_nvrtc.CacheWarning, match=r"owned by uid 65534"):
        again, compiled = _compile_counting(capfd)
    assert compiled and again.data == first.data
    # The entry was replaced by this user's own file, not written through the planted one.
    assert cubin_file.stat().st_uid == os.getuid() and cubin_file.read_bytes() == first.data


def test_group_writable_entry_is_recompiled(cache, capfd):
    _compile_counting(capfd)
    (cubin_file,) = cache.glob("*.cubin")
    cubin_file.chmod(0o660)
    with pytest.warns(_nvrtc.CacheWarning, match=r"writable by group or others"):
        _, compiled = _compile_counting(capfd)
    assert compiled
    assert stat.S_IMODE(cubin_file.stat().st_mode) & 0o022 == 0  # rewritten private


def test_group_writable_folder_is_not_used(cache, capfd):
    _compile_counting(capfd)
    cache.chmod(0o770)
    with pytest.warns(_nvrtc.CacheWarning, match=r"writable by group or others \(mode drwxrwx---\)"):
        _, compiled = _compile_counting(capfd)
    assert compiled  # a valid entry in an untrusted folder is not read either
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning, not one per kernel
        _, compiled = _compile_counting(capfd)
    assert compiled


def test_corrupted_entries_are_recompiled(cache, capfd):
    first, _ = _compile_counting(capfd)
    (cubin_file,) = cache.glob("*.cubin")
    cubin_file.write_bytes(cubin_file.read_bytes()[:100])  # truncated: the checksum fails
    healed, compiled = _compile_counting(capfd)
    assert compiled and healed.data == first.data and cubin_file.read_bytes() == first.data
    (meta,) = cache.glob("*.json")
    meta.write_text("{not json")
    healed, compiled = _compile_counting(capfd)
    assert compiled and healed.data == first.data
    cubin_file.unlink()
    healed, compiled = _compile_counting(capfd)
    assert compiled and healed.data == first.data
    assert not list(cache.glob("*.tmp"))


def test_four_cold_processes_compile_once(cache):
    script = textwrap.dedent(f"""
        from tileattn import _nvrtc
        from tileattn.versions import VERSIONS
        v = VERSIONS["v1"]
        c = _nvrtc.compile_kernel(v.file, {EXPR!r}, "sm_80")
        print(len(c.data))
    """)
    env = dict(os.environ, TILEATTN_CACHE_DIR=str(cache))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert len({out for out, _ in results}) == 1
    compiles = sum(err.count("tileattn: compiling") for _, err in results)
    assert compiles == 1, f"{compiles} of 4 processes compiled the same kernel"


# ---- the key ----------------------------------------------------------------------------------


@pytest.fixture
def csrc_copy(tmp_path, monkeypatch):
    """A private copy of csrc/ that a test may edit."""
    copy = tmp_path / "csrc"
    shutil.copytree(_nvrtc.CSRC, copy)
    monkeypatch.setattr(_nvrtc, "CSRC", copy)
    return copy


@pytest.mark.parametrize("name", list(VERSIONS))
def test_key_follows_every_included_file(name, csrc_copy):
    v = VERSIONS[name]
    expr = v.name_expression(v.dtypes[0], v.head_dims[0], False)
    closure = _nvrtc.include_closure(v.file)
    key = _nvrtc.cache_key(v.file, expr, "sm_90a")
    for path in closure:
        original = path.read_bytes()
        path.write_bytes(original + b"\n// edited\n")
        assert _nvrtc.cache_key(v.file, expr, "sm_90a") != key, f"{name}: editing {path.name} kept the key"
        path.write_bytes(original)
    assert _nvrtc.cache_key(v.file, expr, "sm_90a") == key
    # A file outside the closure leaves the key alone (the key is the closure, not the folder).
    for path in set(csrc_copy.iterdir()) - {p.resolve() for p in closure}:
        path.write_bytes(path.read_bytes() + b"\n// edited\n")
    assert _nvrtc.cache_key(v.file, expr, "sm_90a") == key


def test_closure_follows_a_rung_that_includes_another():
    names = [p.name for p in _nvrtc.include_closure("v3_2_mma_tma.cu")]
    assert {"v3_2_mma_tma.cu", "v3_1_mma.cu", "fa2_mma.cuh", "mma.cuh", "common.cuh"} <= set(names)
    assert "wgmma.cuh" not in names


def test_key_follows_options_and_toolchain(monkeypatch):
    key = lambda: _nvrtc.cache_key(V1.file, EXPR, "sm_80")
    base = key()
    assert key() == base and _nvrtc.cache_key(V1.file, EXPR, "sm_90a") != base
    real_options = _nvrtc.nvrtc_option_list
    for attr, fake in [
        ("nvrtc_option_list", lambda opts: [*real_options(opts), "-lineinfo"]),
        ("nvrtc_full_version", lambda: "13.0 (wheel 13.0.99)"),
        ("headers_version", lambda: "CUDART_VERSION 13020"),
    ]:
        with monkeypatch.context() as m:
            m.setattr(_nvrtc, attr, fake)
            assert key() != base, f"the key ignores {attr}"
    import cuda.core

    with monkeypatch.context() as m:
        m.setattr(cuda.core, "__version__", "0.0.1", raising=False)
        assert key() != base, "the key ignores cuda.core's version"
    # The key hashes the options NVRTC really receives (include paths, arch, std, ptxas -v).
    opts = _nvrtc.nvrtc_option_list(_nvrtc._program_options(V1.file, "sm_80"))
    assert "-arch=sm_80" in opts and any(o.startswith("--include-path=") for o in opts)
