"""The row rules (softmax, layer norm: tvm_roialign.schedules.RowReduction; a global mean's write-back):
results equal a float64 reference, one parallel step per row."""

from __future__ import annotations

import numpy as np
import pytest
from _schedules import (
    build_and_run,
    close_to,
    conv_module,
    fused_primfuncs,
    matmul_module,
    parallel_loops,
    row_module,
)
from _targets import NATIVE as HOST
from tvm import relax

from tvm_roialign.schedules import CPUDefault


@pytest.mark.parametrize("shape", [(2, 3, 197, 197), (4, 49, 49), (3, 5, 64)])
def test_softmax_row_by_row_matches_float64(shape, rng):
    """schedules.row_reduction: softmax (a ragged row: partial sums whose padding steps re-read
    the last element, which must count once; a vector multiple: vector partial sums) with a
    scale epilogue, against float64. Half the rows peak at their last element."""
    x = (rng.standard_normal(shape) * 4).astype("float32")
    x[..., ::2, -1] = 30.0

    def body(bb, v):
        y = bb.emit(relax.op.nn.softmax(v, axis=-1))
        return relax.op.multiply(y, relax.const(2.0, "float32"))

    x64 = x.astype("float64")
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    close_to(build_and_run(row_module(shape, body), x), 2.0 * e / e.sum(-1, keepdims=True))


@pytest.mark.parametrize("shape", [(1, 197, 768), (2, 7, 7, 96), (3, 50)])
def test_layer_norm_row_by_row_matches_float64(shape, rng):
    x = (rng.standard_normal(shape) * 3 + 1).astype("float32")
    gamma = rng.standard_normal(shape[-1]).astype("float32")
    beta = rng.standard_normal(shape[-1]).astype("float32")

    def body(bb, v):
        return relax.op.nn.layer_norm(
            v, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-6
        )

    x64 = x.astype("float64")
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    expected = (x64 - mean) / np.sqrt(var + 1e-6) * gamma + beta
    close_to(build_and_run(row_module(shape, body), x), expected)


def test_row_reduction_rule_takes_softmax_and_layer_norm_only(rng):
    from tvm_roialign.schedules import RowReduction

    rule = RowReduction()
    softmax = fused_primfuncs(row_module((4, 49, 49), lambda bb, v: relax.op.nn.softmax(v)))
    assert all(rule.apply(f, HOST, False) is not None for f in softmax.values())
    dense = fused_primfuncs(
        matmul_module((8, 16), rng.standard_normal((16, 32)).astype("float32"), np.zeros(32, "float32"))
    )
    assert all(rule.apply(f, HOST, False) is None for f in dense.values())
    weight = rng.standard_normal((3, 3, 16, 32)).astype("float32")
    conv = fused_primfuncs(
        conv_module((1, 8, 8, 16), weight, np.zeros(32, "float32"), 1, 1, 1, 1, "NHWC")
    )
    assert all(rule.apply(f, HOST, False) is None for f in conv.values())


@pytest.mark.parametrize("shape", [(1, 7, 7, 1280), (2, 5, 3, 12)])
def test_global_mean_divides_in_its_write_back(shape, rng):
    """A global average pool (the squeeze-excitation's, the classifier head's): the division by
    the count is inlined into the fallback's tile write-back, one parallel loop in all."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(x, axis=[1, 2], keepdims=True))
        bb.emit_func_output(out)
    mod = bb.get()
    (func,) = fused_primfuncs(mod).values()
    with HOST:
        scheduled = CPUDefault().apply(func, HOST, False).mod["main"]
    assert len(parallel_loops(scheduled)) == 1
    data = rng.standard_normal(shape).astype("float32")
    close_to(build_and_run(mod, data), data.astype("float64").mean(axis=(1, 2), keepdims=True))
