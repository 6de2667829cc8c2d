import os
import tempfile

import pytest


def pytest_configure(config):
    # Each test session compiles into its own cache folder unless one is given, so CPU tests
    # really exercise NVRTC and never read a stale cubin.
    os.environ.setdefault("TILEATTN_CACHE_DIR", tempfile.mkdtemp(prefix="tileattn-test-cache-"))


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        # A rung made for another arch (v3.2 and v2.3 need sm_90) is skipped on this GPU, by name.
        from tileattn.versions import VERSIONS

        major, minor = torch.cuda.get_device_capability()
        arch = major * 10 + minor
        for item in items:
            version = getattr(item, "callspec", None) and item.callspec.params.get("version")
            if "gpu" in item.keywords and version in VERSIONS and not VERSIONS[version].runs_on(arch):
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"{version} runs on {VERSIONS[version].arch_range()}, this GPU is sm_{arch}"
                    )
                )
        return
    skip = pytest.mark.skip(reason="no CUDA device present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
