"""``relax.vision.roi_align_rotated``'s types, argument errors and registration. Its numerics (against
OpenVINO's ``ROIAlignRotated`` and the float64 reference in detectron2's and mmcv's conventions, every
layout, grid, dtype and CPU path, degenerate boxes, a fuzz) are tests/test_roi_family.py's
``TestRoIAlignRotated``.
"""

from __future__ import annotations

import pytest
from tvm import relax

import tvm_roialign
from tvm_roialign import _registry
from tvm_roialign.ops.roi_align_rotated import OP_NAME

POOLED = (3, 4)


def _normalize(data_shape, rois_shape, layout="NCHW", angle_unit="degrees", dtype="float32"):
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(list(data_shape), dtype))
    rois = relax.Var("rois", relax.TensorType(list(rois_shape), dtype))
    with bb.function("main", [data, rois]):
        out = bb.emit(tvm_roialign.roi_align_rotated(data, rois, POOLED, spatial_scale=1.0,
                                                     sampling_ratio=2, angle_unit=angle_unit,
                                                     layout=layout))
        bb.emit_func_output(out)
    return bb.get()["main"].ret_ty


def test_struct_info():
    assert [int(d) for d in _normalize((1, 8, 9, 9), (7, 6)).shape] == [7, 8, 3, 4]
    assert [int(d) for d in _normalize((1, 9, 9, 8), (7, 6), layout="NHWC").shape] == [7, 3, 4, 8]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data_shape": (1, 8, 9, 9), "rois_shape": (7, 5)}, "rois must be \\[K, 6\\]"),
        ({"data_shape": (8, 9, 9), "rois_shape": (7, 6)}, "data must be 4-D"),
        ({"data_shape": (1, 8, 9, 9), "rois_shape": (7, 6), "angle_unit": "turns"},
         "angle_unit must be one of"),
        ({"data_shape": (1, 8, 9, 9), "rois_shape": (7, 6), "layout": "HWCN"}, "layout must be"),
        ({"data_shape": (1, 8, 9, 9), "rois_shape": (7, 6), "dtype": "int32"}, "data dtype"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _normalize(**kwargs)


def test_registration_is_reversible():
    assert _registry.get_op_attr(OP_NAME, "FLegalize") is not None
    tvm_roialign.unregister()
    try:
        for attr in ("FLegalize", "FInferType", "FRelaxInferLayout"):
            assert _registry.get_op_attr(OP_NAME, attr) is None, attr
    finally:
        tvm_roialign.register()
    assert _registry.get_op_attr(OP_NAME, "FRelaxInferLayout") is not None
