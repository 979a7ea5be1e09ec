"""Shared pytest configuration: the one tolerance table of the suite, and fixtures."""

import numpy as np
import pytest

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
