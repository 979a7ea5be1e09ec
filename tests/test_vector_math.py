"""The vectorizable float32 ``exp``, ``sigmoid`` and ``erf`` of the schedule rules
(tvm_roialign.schedules.vector_math): ``exp`` within one unit in the last place of float64 NumPy
over the whole float32 range, ``erf`` within 4e-7 of Python's ``math.erf`` (six units in the last
place near 1), the IEEE special values kept, and no call of the C library left."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from _targets import NATIVE as HOST
from tvm import te, tirx

from tvm_roialign.schedules.vector_math import vectorize_math

_COUNT = 1 << 16


@pytest.fixture(scope="module")
def exp_and_sigmoid():
    """``(built function, assembly)`` of ``exp``, ``sigmoid`` and ``erf`` over a vector of
    ``_COUNT`` floats, rewritten and vectorized by 16 lanes."""
    a = te.placeholder((_COUNT,), "float32", name="a")
    e = te.compute((_COUNT,), lambda i: tirx.exp(a[i]), name="e")
    s = te.compute((_COUNT,), lambda i: tirx.sigmoid(a[i]), name="s")
    f = te.compute((_COUNT,), lambda i: tirx.erf(a[i]), name="f")
    sch = tvm.s_tir.Schedule(vectorize_math(te.create_prim_func([a, e, s, f])))
    for name in ("e", "s", "f"):
        (loop,) = sch.get_loops(sch.get_sblock(name))
        sch.vectorize(sch.split(loop, [None, 16])[1])
    lib = tvm.tirx.build(sch.mod, target=HOST)
    return lib, lib.inspect_source("asm") if HOST.kind.name == "llvm" else ""


def _run(lib, x):
    out = [tvm.runtime.tensor(np.zeros(_COUNT, "float32")) for _ in range(3)]
    lib(tvm.runtime.tensor(x), *out)
    return tuple(o.numpy() for o in out)


def test_exp_and_sigmoid_within_one_ulp(exp_and_sigmoid, rng):
    lib, asm = exp_and_sigmoid
    assert "expf" not in asm and "erff" not in asm
    x = np.concatenate(
        [rng.uniform(-104, 89, _COUNT // 2), rng.uniform(-6, 6, _COUNT // 2)]
    ).astype("float32")
    exp, sigmoid, _ = _run(lib, x)
    wide = x.astype("float64")
    expected = np.exp(wide)
    normal = (expected >= np.finfo("float32").tiny) & (expected <= np.finfo("float32").max)
    ulp = np.spacing(expected[normal].astype("float32")).astype("float64")
    assert np.max(np.abs(exp[normal] - expected[normal]) / ulp) <= 1.0
    # below ln(FLT_MIN): zero where expf gives a denormal
    assert np.all(exp[x < np.log(np.finfo("float32").tiny)] < np.finfo("float32").tiny)
    expected_sigmoid = 1.0 / (1.0 + np.exp(-wide))
    assert np.max(np.abs(sigmoid - expected_sigmoid)) <= 2 * np.finfo("float32").eps


def test_sigmoid_relative_in_the_negative_tail(exp_and_sigmoid, rng):
    """``sigmoid`` from ``exp(-|x|)``: relative accuracy also where the value is tiny (within four
    units in the last place of float64's down to float32's least normal; below it, zero or a
    value under the least normal), and ``sigmoid(x) + sigmoid(-x)`` within an ulp of 1."""
    lib, _ = exp_and_sigmoid
    x = np.concatenate([rng.uniform(-90, -10, _COUNT // 2), rng.uniform(-10, 10, _COUNT // 2)])
    x = x.astype("float32")
    _, sigmoid, _ = _run(lib, x)
    expected = 1.0 / (1.0 + np.exp(-x.astype("float64")))
    tiny = np.finfo("float32").tiny
    normal = expected >= tiny
    ulp = np.spacing(expected[normal].astype("float32")).astype("float64")
    assert np.max(np.abs(sigmoid[normal] - expected[normal]) / ulp) <= 4.0
    assert np.all(sigmoid[~normal] < tiny)
    _, mirrored, _ = _run(lib, -x)
    both = np.abs(x) < 10
    eps = np.finfo("float32").eps
    assert np.max(np.abs(sigmoid[both] + mirrored[both] - 1.0)) <= eps


def test_special_values(exp_and_sigmoid):
    lib, _ = exp_and_sigmoid
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, 100.0, -200.0], "float32")
    x = np.resize(specials, _COUNT)
    exp, sigmoid, erf = _run(lib, x)
    np.testing.assert_array_equal(exp[: len(specials)], [np.nan, np.inf, 0.0, 1.0, np.inf, 0.0])
    np.testing.assert_array_equal(sigmoid[: len(specials)], [np.nan, 1.0, 0.0, 0.5, 1.0, 0.0])
    np.testing.assert_array_equal(erf[: len(specials)], [np.nan, 1.0, -1.0, 0.0, 1.0, -1.0])


def test_erf_within_4e7(exp_and_sigmoid, rng):
    lib, _ = exp_and_sigmoid
    # a dense grid over [-4.5, 4.5] (steps of 2.7e-4) and random points near zero
    x = np.concatenate(
        [np.linspace(-4.5, 4.5, _COUNT // 2), rng.standard_normal(_COUNT // 2) * 1e-3]
    ).astype("float32")
    _, _, erf = _run(lib, x)
    expected = np.array([math.erf(v) for v in x.astype("float64")])
    assert np.max(np.abs(erf - expected)) <= 4e-7
    # near zero, relative to erf's own size
    small = np.abs(x) < 0.1
    assert np.max(np.abs(erf[small] - expected[small]) / np.abs(expected[small])) <= 3e-7


def test_stored_erf_coefficients_are_the_fit():
    """The stored coefficients are what the fit in vector_math gives, within the solver's rounding:
    its least-squares system is ill-conditioned, and the last digits depend on the CPU's LAPACK
    kernels (1.7e-6 relative between a Zen 3, where they were stored, and a Zen 4)."""
    from tvm_roialign.schedules import vector_math

    numerator, denominator = vector_math._erf_coefficients()
    np.testing.assert_allclose(vector_math._ERF_NUMERATOR, numerator, rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(vector_math._ERF_DENOMINATOR, denominator, rtol=1e-5, atol=1e-12)


def test_rules_epilogues_match_float64(rng):
    """A matmul + GELU (the rewritten ``erf`` in the matmul rule's epilogue) and a depthwise conv +
    sigmoid (the rewritten ``exp``) against float64 PyTorch."""
    import torch
    from tvm import relax

    from tvm_roialign.pipeline import build

    weight = (rng.standard_normal((64, 96)) / 8).astype("float32")
    taps = rng.standard_normal((3, 3, 1, 32)).astype("float32")
    bb = relax.BlockBuilder()
    m = relax.Var("m", relax.TensorType([50, 64], "float32"))
    x = relax.Var("x", relax.TensorType([1, 9, 11, 32], "float32"))
    with bb.function("main", [m, x]):
        with bb.dataflow():
            z = bb.emit(relax.op.nn.gelu(relax.op.matmul(m, relax.const(weight))))
            d = relax.op.nn.conv2d(
                x, relax.const(taps), padding=1, groups=32, data_layout="NHWC", kernel_layout="HWIO"
            )
            out = bb.emit_output(relax.Tuple([z, bb.emit(relax.op.sigmoid(d))]))
        bb.emit_func_output(out)
    a = (rng.standard_normal((50, 64)) * 3).astype("float32")
    data = rng.standard_normal((1, 9, 11, 32)).astype("float32")
    vm = relax.VirtualMachine(build(bb.get(), HOST).executable, tvm.cpu())
    z, d = (t.numpy() for t in vm["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(data)))
    expected_z = torch.nn.functional.gelu(torch.from_numpy(a).double() @ torch.from_numpy(weight).double())
    conv = torch.nn.functional.conv2d(
        torch.from_numpy(data).permute(0, 3, 1, 2).double(),
        torch.from_numpy(taps).permute(3, 2, 0, 1).double(),
        padding=1,
        groups=32,
    )
    expected_d = torch.sigmoid(conv).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(z, expected_z.numpy(), rtol=0, atol=2e-5 * np.abs(expected_z.numpy()).max())
    np.testing.assert_allclose(d, expected_d, rtol=0, atol=2e-6)
