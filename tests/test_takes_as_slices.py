"""TakesAsSlices: a gather of one in-bounds constant index along a static axis becomes a slice
(no ``take`` left, so it fuses with its consumer); other gathers stay; values equal NumPy's
indexing, and the built pipeline runs no kernel of its own for an attention layer's split."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from _targets import NATIVE as HOST
from tvm import relax

from tvm_roialign.passes import TakesAsSlices
from tvm_roialign.pipeline import build
from tvm_roialign.profiling import profile_vm
from tvm_roialign.testing import op_calls, run_first


def _module(shape, index, axis):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            taken = bb.emit(relax.op.take(x, relax.const(index), axis=axis))
            out = bb.emit_output(relax.op.multiply(taken, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    return run_first(tvm.compile(mod, "llvm"), x)


@pytest.mark.parametrize(
    ("index", "axis", "sliced"),
    [
        (np.int64(1), 0, True),
        (np.int32(4), 1, True),
        (np.int64(7), -1, True),
        (np.int64(-1), 0, False),
        (np.int64(3), 0, False),
        (np.array([0, 2]), 0, False),
    ],
)
def test_one_constant_index_becomes_a_slice(rng, index, axis, sliced):
    mod = _module((3, 5, 8), index, axis)
    rewritten = TakesAsSlices()(mod)
    assert (len(op_calls(rewritten, "relax.take")) == 0) == sliced
    assert rewritten.same_as(mod) != sliced
    x = rng.standard_normal((3, 5, 8)).astype("float32")
    if index.ndim == 0 and not 0 <= int(index) < x.shape[axis]:
        return  # out of bounds: left to take's own mode, not compared
    np.testing.assert_array_equal(_run(rewritten, x), np.take(x, index, axis=axis) * 2)


def test_attention_split_runs_no_gather_kernel(rng):
    """``qkv[0] + qkv[1] * qkv[2]`` of a ``[3, tokens, features]`` tensor: one fused kernel."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 10, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            q, k, v = (bb.emit(relax.op.take(x, relax.const(np.int64(i)), axis=0)) for i in range(3))
            out = bb.emit_output(relax.op.add(q, relax.op.multiply(k, v)))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(build(bb.get(), HOST).executable, tvm.cpu())
    data = rng.standard_normal((3, 10, 16)).astype("float32")
    np.testing.assert_allclose(
        vm["main"](tvm.runtime.tensor(data)).numpy(), data[0] + data[1] * data[2], rtol=1e-6, atol=1e-6
    )
    kernels, _ = profile_vm(vm, tvm.cpu(), [tvm.runtime.tensor(data)], runs=1)
    assert not any("take" in k.name for k in kernels), [k.name for k in kernels]
