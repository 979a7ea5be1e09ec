"""``relax.vision.roi_align`` as an op: registration (reversible, ``stock_tvm()``), struct info,
attributes, argument errors, index width. Numerics on every code path and a fuzz: ``test_roi_family.py``;
exactness: ``test_exactness.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te

import tvm_roialign
from tvm_roialign.testing import (
    build_roi_align_module,
    compile_and_run,
    roi_align_ref,
    single_op_module,
    smooth_data,
)
from tvm_roialign.topi._sampling import index_dtype_for


def test_shift_after_scaling_smallest_case():
    """The issue's smallest case: torchvision gives 7.5 (stock importers: 8.75)."""
    data = np.arange(16, dtype="float32").reshape(1, 1, 4, 4)
    rois = np.array([[0, 0, 0, 8, 8]], dtype="float32")
    mod = build_roi_align_module((1, 1, 4, 4), 1, (1, 1), 0.5, 1, True, torchvision_aligned=True)
    assert compile_and_run(mod, [data, rois]).item() == pytest.approx(7.5)


def test_fp16_feeds_fp16_add(tol):
    """fp16 in, fp16 out: roi_align(fp16) -> add(fp16) compiles (stock TVM infers float32)."""

    def build(data, rois):
        pooled = relax.op.vision.roi_align(data, rois, (2, 2), 1.0, 2)
        return relax.op.add(pooled, relax.const(1.0, "float16"))

    mod = single_op_module(build, data=([1, 4, 8, 8], "float16"), rois=([3, 5], "float16"))
    (binding,) = [b for b in mod["main"].body.blocks[0].bindings
                  if isinstance(b.value, relax.Call) and b.value.op.name == "relax.add"]
    assert str(binding.value.args[0].ty.dtype) == "float16"
    x = np.resize(smooth_data((1, 4, 8, 8)), (1, 4, 8, 8)).astype("float16")
    r = np.array([[0, 0, 0, 4, 4], [0, 1, 2, 7, 6], [0, 3, 3, 5, 5]], dtype="float16")
    out = compile_and_run(mod, [x, r])
    assert out.dtype == np.float16
    expected = roi_align_ref(x, r, (2, 2), 1.0, 2) + 1.0
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=tol["float16"],
                               atol=tol["float16"])


def test_stock_tvm_restores_stock_and_register_is_idempotent():
    op = tvm.ir.Op.get("relax.vision.roi_align")
    ours = {key: op.get_attr(key) for key in ("FLegalize", "FInferType")}
    tvm_roialign.register()  # idempotent: nothing re-registered
    assert all(op.get_attr(key).same_as(value) for key, value in ours.items())
    with tvm_roialign.stock_tvm():
        assert not tvm_roialign.is_registered()
        stock = {key: op.get_attr(key) for key in ours}
        for key, value in ours.items():
            assert stock[key] is not None and not stock[key].same_as(value)
    assert tvm_roialign.is_registered()
    for key in ours:
        assert not op.get_attr(key).same_as(stock[key])


def test_stock_tvm_registers_again_after_an_error():
    with pytest.raises(RuntimeError, match="inside"), tvm_roialign.stock_tvm():
        raise RuntimeError("inside")
    assert tvm_roialign.is_registered()
    tvm_roialign.unregister()
    try:  # a block entered while unregistered leaves it unregistered
        with tvm_roialign.stock_tvm():
            pass
        assert not tvm_roialign.is_registered()
    finally:
        tvm_roialign.register()


def _call(data_shape, rois_shape, dtype="float32", rois_dtype=None, **kwargs):
    args = {"pooled_size": (2, 2), "spatial_scale": 1.0, "sample_ratio": -1, "layout": "NCHW",
            "mode": "avg", **kwargs}
    single_op_module(lambda data, rois: relax.op.vision.roi_align(data, rois, **args),
                     data=(data_shape, dtype), rois=(rois_shape, rois_dtype or dtype))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"data_shape": (1, 4, 8), "rois_shape": (3, 5)}, r"data must be 4-D \[N, C, H, W\]"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 4)}, r"rois must be \[K, 5\]"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5, 1)}, r"rois must be \[K, 5\]"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "layout": "HWCN"},
         "layout must be one of"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "mode": "min"},
         "mode must be one of"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "pooled_size": (0, 2)},
         "pooled_size"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "rois_dtype": "float16"},
         r"rois dtype \(float16\) must equal data dtype \(float32\)"),
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "dtype": "int32"},
         "data dtype must be"),
        # bfloat16 data takes float32 rois only (bfloat16 rois would lose whole pixels)
        ({"data_shape": (1, 4, 8, 8), "rois_shape": (3, 5), "dtype": "bfloat16",
          "rois_dtype": "bfloat16"},
         r"rois dtype \(bfloat16\) must be float32 for data dtype bfloat16"),
    ],
)
def test_bad_input_raises_clear_error(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _call(**kwargs)


def test_bf16_struct_info_and_layout_keep_the_dtype():
    """bfloat16 data with float32 rois: the output is bfloat16, also after ConvertLayout."""
    mod = single_op_module(lambda d, r: relax.op.vision.roi_align(d, r, (2, 2), 1.0, 2),
                           data=([1, 8, 6, 6], "bfloat16"), rois=([3, 5], "float32"))
    assert str(mod["main"].ret_ty.dtype) == "bfloat16"
    converted = relax.transform.ConvertLayout({"relax.vision.roi_align": ["NHWC", "default"]})(mod)
    calls = [b.value for b in converted["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.vision.roi_align"]
    assert calls and str(calls[0].attrs.layout) == "NHWC"
    assert str(calls[0].ty.dtype) == "bfloat16"


def test_topi_dispatcher_rejects_unknown_layout():
    data = te.placeholder((1, 4, 8, 8), "float32", "data")
    rois = te.placeholder((3, 5), "float32", "rois")
    with pytest.raises(ValueError, match="layout must be one of"):
        tvm_roialign.topi.roi_align(data, rois, (2, 2), layout="CHWN")
    with pytest.raises(ValueError, match="spatial_scale must be a positive"):
        tvm_roialign.topi.roi_align(data, rois, (2, 2), spatial_scale=0.0)


def test_index_dtype_int64_only_past_int32():
    assert index_dtype_for((1, 256, 200, 272), (1000, 256, 7, 7)) == "int32"
    assert index_dtype_for((172, 256, 200, 272)) == "int64"
    assert index_dtype_for((172000, 256, 7, 7)) == "int64"
    assert index_dtype_for((tvm.tirx.Var("k", "int64"), 5)) == "int64"
