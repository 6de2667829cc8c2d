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
        return
    skip = pytest.mark.skip(reason="no CUDA device present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
