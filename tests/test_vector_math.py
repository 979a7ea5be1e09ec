"""The vectorizable float32 ``exp`` and ``sigmoid`` of the contraction rules' epilogues
(tvm_roialign.schedules.vector_math): within one unit in the last place of float64 NumPy over
the whole float32 range, the IEEE special values kept, and no call of the C library left."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from _targets import NATIVE as HOST
from tvm import te, tirx

from tvm_roialign.schedules.vector_math import vectorize_exp

_COUNT = 1 << 16


@pytest.fixture(scope="module")
def exp_and_sigmoid():
    """``(built function, assembly)`` of ``exp`` and ``sigmoid`` over a vector of ``_COUNT``
    floats, rewritten and vectorized by 16 lanes."""
    a = te.placeholder((_COUNT,), "float32", name="a")
    e = te.compute((_COUNT,), lambda i: tirx.exp(a[i]), name="e")
    s = te.compute((_COUNT,), lambda i: tirx.sigmoid(a[i]), name="s")
    sch = tvm.s_tir.Schedule(vectorize_exp(te.create_prim_func([a, e, s])))
    for name in ("e", "s"):
        (loop,) = sch.get_loops(sch.get_sblock(name))
        sch.vectorize(sch.split(loop, [None, 16])[1])
    lib = tvm.tirx.build(sch.mod, target=HOST)
    return lib, lib.inspect_source("asm") if HOST.kind.name == "llvm" else ""


def _run(lib, x):
    out = [tvm.runtime.tensor(np.zeros(_COUNT, "float32")) for _ in range(2)]
    lib(tvm.runtime.tensor(x), *out)
    return out[0].numpy(), out[1].numpy()


def test_exp_and_sigmoid_within_one_ulp(exp_and_sigmoid, rng):
    lib, asm = exp_and_sigmoid
    assert "expf" not in asm
    x = np.concatenate(
        [rng.uniform(-104, 89, _COUNT // 2), rng.uniform(-6, 6, _COUNT // 2)]
    ).astype("float32")
    exp, sigmoid = _run(lib, x)
    wide = x.astype("float64")
    expected = np.exp(wide)
    normal = (expected >= np.finfo("float32").tiny) & (expected <= np.finfo("float32").max)
    ulp = np.spacing(expected[normal].astype("float32")).astype("float64")
    assert np.max(np.abs(exp[normal] - expected[normal]) / ulp) <= 1.0
    # below ln(FLT_MIN): zero where expf gives a denormal
    assert np.all(exp[x < np.log(np.finfo("float32").tiny)] < np.finfo("float32").tiny)
    expected_sigmoid = 1.0 / (1.0 + np.exp(-wide))
    assert np.max(np.abs(sigmoid - expected_sigmoid)) <= 2 * np.finfo("float32").eps


def test_special_values(exp_and_sigmoid):
    lib, _ = exp_and_sigmoid
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, 100.0, -200.0], "float32")
    x = np.resize(specials, _COUNT)
    exp, sigmoid = _run(lib, x)
    np.testing.assert_array_equal(exp[: len(specials)], [np.nan, np.inf, 0.0, 1.0, np.inf, 0.0])
    np.testing.assert_array_equal(sigmoid[: len(specials)], [np.nan, 1.0, 0.0, 0.5, 1.0, 0.0])
