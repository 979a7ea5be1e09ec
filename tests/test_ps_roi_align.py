"""``relax.vision.ps_roi_align``'s types, argument errors and registration. Its numerics (against
torchvision's ``ps_roi_align`` and the float64 reference, every layout, grid, dtype and CPU path,
degenerate boxes, a fuzz) are tests/test_roi_family.py's ``TestPSRoIAlign``.
"""

from __future__ import annotations

import pytest
from tvm import relax

import tvm_roialign
from tvm_roialign import _registry
from tvm_roialign.ops.ps_roi_align import OP_NAME

POOLED = (3, 2)


def _normalize(data_shape, rois_shape, pooled=POOLED, layout="NCHW", dtype="float32",
               rois_dtype="float32"):
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(list(data_shape), dtype))
    rois = relax.Var("rois", relax.TensorType(list(rois_shape), rois_dtype))
    with bb.function("main", [data, rois]):
        out = bb.emit(tvm_roialign.ps_roi_align(
            data, rois, pooled, spatial_scale=1.0, sampling_ratio=2, layout=layout))
        bb.emit_func_output(out)
    return bb.get()["main"].ret_ty


def test_struct_info():
    assert [int(d) for d in _normalize((1, 24, 8, 8), (7, 5)).shape] == [7, 4, 3, 2]
    assert [int(d) for d in _normalize((1, 8, 8, 24), (7, 5), layout="NHWC").shape] == [7, 3, 2, 4]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data_shape": (1, 25, 8, 8), "rois_shape": (7, 5)}, "multiple of PH \\* PW = 6"),
        ({"data_shape": (1, 24, 8, 8), "rois_shape": (7, 4)}, "rois must be \\[K, 5\\]"),
        ({"data_shape": (24, 8, 8), "rois_shape": (7, 5)}, "data must be 4-D"),
        ({"data_shape": (1, 24, 8, 8), "rois_shape": (7, 5), "layout": "NCWH"}, "layout must be"),
        ({"data_shape": (1, 24, 8, 8), "rois_shape": (7, 5), "rois_dtype": "float16"},
         "rois dtype"),
    ],
)
def test_bad_arguments_raise_one_line(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _normalize(**kwargs)


def test_bad_pooled_size():
    with pytest.raises(ValueError, match="pooled_size must be"):
        tvm_roialign.ps_roi_align(relax.Var("d"), relax.Var("r"), (0, 2))


def test_registration_is_reversible():
    assert _registry.get_op_attr(OP_NAME, "FLegalize") is not None
    tvm_roialign.unregister()
    try:
        for attr in ("FLegalize", "FInferType", "FRelaxInferLayout"):
            assert _registry.get_op_attr(OP_NAME, attr) is None, attr
    finally:
        tvm_roialign.register()
    assert _registry.get_op_attr(OP_NAME, "FRelaxInferLayout") is not None
