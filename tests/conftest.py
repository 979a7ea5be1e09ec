"""Shared pytest configuration: the one tolerance table of the suite, the ``cuda`` marker, fixtures.

``@pytest.mark.cuda`` marks a test that needs a CUDA GPU (TVM built with CUDA and a device, and
torch with CUDA where the test compares with it): it is skipped, with that reason, where there is
none. The targets the tests build for are named once in ``tests/_targets.py``.
"""

import functools

import numpy as np
import pytest
import tvm

import tvm_roialign  # noqa: F401  (registers on import)

#: Every numeric comparison of the suite, by the dtype of the values compared: ``rtol = atol =
#: TOLERANCE[dtype]``. float16: one rounding of an output of magnitude ~1 (accumulation is float32);
#: float32: float32 rounding of the value sums (the geometry is exact, see test_exactness.py);
#: float64: summation order only.
TOLERANCE = {"float16": 4e-3, "float32": 1e-5, "float64": 1e-9}


@pytest.fixture(scope="session")
def tol():
    """:data:`TOLERANCE` (``tol[dtype]``)."""
    return TOLERANCE


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@functools.cache
def cuda_available() -> bool:
    """A CUDA device for TVM (and for torch, where torch is installed)."""
    try:
        if not tvm.cuda(0).exist:
            return False
    except Exception:  # noqa: BLE001 - a TVM built without CUDA
        return False
    try:
        import torch
    except ImportError:
        return True
    return bool(torch.cuda.is_available())


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU (TVM and torch)")
    for item in items:
        if item.get_closest_marker("cuda") is not None and not cuda_available():
            item.add_marker(skip)
