"""ONNX ``Clip`` (tvm_roialign/frontend/_onnx_clip.py): constant float bounds become ``relax.clip``,
which moves to NHWC with the convolution before it (TVM's converter left two TE kernels between
transposes); every form against onnxruntime, NaN and absent bounds included."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_roialign.frontend import from_onnx
from tvm_roialign.passes import ConvertLayoutWherePossible, desired_layouts
from tvm_roialign.testing import compile_and_run, op_calls

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
helper, TensorProto = onnx.helper, onnx.TensorProto

NAN = float("nan")


def _model(bounds, opset=13, dtype=TensorProto.FLOAT, computed_min=False):
    """``Conv(x, w) -> Clip`` (float) or ``Clip(x)`` (integer ``dtype``). ``bounds``: ``(min,
    max)`` as initializers (None: the input left out), or the attributes for ``opset`` 6;
    ``computed_min``: the lower bound is ``ReduceMin(x)`` (not a constant)."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    source = "x"
    if dtype == TensorProto.FLOAT:
        weight = rng.standard_normal((8, 4, 3, 3)).astype("float32")
        inits.append(onnx.numpy_helper.from_array(weight, "w"))
        nodes.append(helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]))
        source = "y"
    np_dtype = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    if opset < 11:
        attrs = {k: v for k, v in zip(("min", "max"), bounds) if v is not None}
        nodes.append(helper.make_node("Clip", [source], ["out"], **attrs))
    else:
        names = []
        for name, value in zip(("lo", "hi"), bounds):
            if value is None:
                names.append("")
            else:
                inits.append(onnx.numpy_helper.from_array(np.array(value, np_dtype), name))
                names.append(name)
        if computed_min:
            nodes.append(helper.make_node("ReduceMin", ["x"], ["lo"], keepdims=0))
            names[0] = "lo"
        nodes.append(helper.make_node("Clip", [source, *names], ["out"]))
    channels = 8 if dtype == TensorProto.FLOAT else 4
    graph = helper.make_graph(
        nodes, "clip",
        [helper.make_tensor_value_info("x", dtype, [1, 4, 6, 7])],
        [helper.make_tensor_value_info("out", dtype, [1, channels, 6, 7])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, x):
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = compile_and_run(from_onnx(model), [x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    return expected


@pytest.mark.parametrize(
    "bounds, opset",
    [((0.0, 6.0), 13), ((-0.5, None), 13), ((None, 0.25), 11), ((NAN, 1.0), 13), ((0.0, 6.0), 6)],
    ids=["relu6", "min-only", "max-only", "nan-min", "opset6-attributes"],
)
def test_constant_bounds_become_relax_clip_and_move_to_nhwc(bounds, opset):
    model = _model(bounds, opset)
    x = np.random.default_rng(1).standard_normal((1, 4, 6, 7)).astype("float32") * 4
    expected = _check(model, x)
    conv = _check(_model((None, None), opset), x)  # the same conv unclipped: the bounds do cut
    assert not np.array_equal(expected, conv)
    mod = from_onnx(model)
    assert len(op_calls(mod, "relax.clip")) == 1 and not op_calls(mod, "relax.call_tir")
    nhwc = ConvertLayoutWherePossible(desired_layouts("NHWC"))(mod)
    # only the graph's edges transpose (and the weight, a constant): the clip follows the conv
    moved = [c for c in op_calls(nhwc, "relax.permute_dims")
             if not isinstance(c.args[0], tvm.ir.expr.Constant)]
    assert len(moved) == 2


def test_computed_bound_keeps_tvms_converter():
    model = _model((None, 6.0), computed_min=True)
    x = np.random.default_rng(2).standard_normal((1, 4, 6, 7)).astype("float32")
    _check(model, x)
    assert not op_calls(from_onnx(model), "relax.clip")


def test_integer_clip_keeps_tvms_converter():
    model = _model((-3, 5), dtype=TensorProto.INT32)
    x = np.random.default_rng(3).integers(-10, 10, (1, 4, 6, 7)).astype("int32")
    _check(model, x)
    assert not op_calls(from_onnx(model), "relax.clip")
