"""Shared pytest configuration."""

import numpy as np
import pytest

import tvm_roialign  # noqa: F401  (registers on import)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
