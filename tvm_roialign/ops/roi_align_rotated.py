"""``relax.vision.roi_align_rotated``: rotated RoIAlign (detectron2, mmcv, OpenVINO conventions).

``call.args = (data, rois)``: ``data [N, C, H, W]`` (NCHW) or ``[N, H, W, C]`` (NHWC), ``rois [K,
6]`` of ``(batch_index, cx, cy, w, h, angle)``. ``call.attrs`` is an ``ir.DictAttrs``:

=================  ==========  ===============================================================
attribute          default     meaning
=================  ==========  ===============================================================
``pooled_size``    (required)  ``[PH, PW]``
``spatial_scale``  1.0         feature-map pixels per input-image pixel
``sampling_ratio`` -1          samples per bin side; ``<= 0`` adaptive ``ceil(size / pooled)``
``aligned``        True        centre shifted by -0.5 after scaling, no size clamp (``False``:
                               no shift, sizes clamped to >= 1, mmcv ``aligned=False``)
``clockwise``      False       a positive angle turns clockwise (mmcv ``clockwise``, OpenVINO
                               ``clockwise_mode``)
``angle_unit``     "degrees"   ``"degrees"`` (detectron2) or ``"radians"`` (mmcv, OpenVINO)
``layout``         "NCHW"      of ``data`` and the output
=================  ==========  ===============================================================

:data:`CONVENTIONS` gives each system's attribute values; the compute's contract is in
:mod:`tvm_roialign.topi.roi_align_rotated`, the float64 reference is
:func:`tvm_roialign.testing.roi_align_rotated_ref`. :func:`register` registers the op, its
``FInferType``, ``FPurity`` and ``FLegalize``; its ``FRelaxInferLayout`` is the layout pass's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import tvm
from tvm import relax

from .. import _registry
from ..topi._sampling import data_dims, normalize_pooled_size, output_shape
from ..topi.roi_align_rotated import check_roi_align_rotated_args
from ..topi.roi_align_rotated import roi_align_rotated as topi_roi_align_rotated
from ._legalize import DictAttrsFields, checkable_shapes, legalize_with_strategy

OP_NAME = "relax.vision.roi_align_rotated"

#: ``(angle_unit, clockwise, aligned)`` of each system (mmcv's ``clockwise`` / ``aligned`` are its
#: op's own arguments: the values given are its defaults).
CONVENTIONS = {
    "detectron2": {"angle_unit": "degrees", "clockwise": False, "aligned": True},
    "mmcv": {"angle_unit": "radians", "clockwise": False, "aligned": True},
    "openvino": {"angle_unit": "radians", "clockwise": False, "aligned": True},
}


@dataclass(frozen=True)
class RoiAlignRotatedAttrs(DictAttrsFields):
    """The attributes of a ``relax.vision.roi_align_rotated`` call (module table)."""

    OP_NAME: ClassVar[str] = OP_NAME

    pooled_size: tuple[int, int]
    spatial_scale: float = 1.0
    sampling_ratio: int = -1
    aligned: bool = True
    clockwise: bool = False
    angle_unit: str = "degrees"
    layout: str = "NCHW"


def infer_struct_info(call, _ctx=None):
    """Output ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC) in the data dtype."""
    attrs = RoiAlignRotatedAttrs.from_call(call)
    (data_shape, check_data, dtype), (rois_shape, check_rois, rois_dtype) = checkable_shapes(call)
    pooled = check_roi_align_rotated_args(
        check_data, dtype, check_rois, rois_dtype, attrs.pooled_size, attrs.layout, attrs.angle_unit
    )
    vdevice = call.args[0].ty.vdevice
    if data_shape is None or rois_shape is None:
        return relax.TensorType(ndim=4, dtype=dtype, vdevice=vdevice)
    channels = data_dims(data_shape, attrs.layout)[1]
    shape = output_shape(rois_shape[0], channels, pooled, attrs.layout)
    return relax.TensorType(list(shape), dtype, vdevice=vdevice)


def legalize(bb: relax.BlockBuilder, call):
    """``call_tir`` of the PrimFunc the call's target's strategy builds and schedules."""
    a = RoiAlignRotatedAttrs.from_call(call)

    def compute(data, rois):
        return topi_roi_align_rotated(
            data, rois, a.pooled_size, a.spatial_scale, a.sampling_ratio, a.aligned, a.clockwise,
            a.angle_unit, a.layout,
        )

    return legalize_with_strategy(
        bb,
        call,
        name=f"roi_align_rotated_{a.layout.lower()}",
        inputs=[(call.args[0], "data"), (call.args[1], "rois")],
        compute=compute,
        layout=a.layout,
        attrs=a,
    )


def register() -> None:
    """Register the op and its attributes (idempotent, reversible)."""
    _registry.get_or_register_op(OP_NAME)
    _registry.set_op_attr(OP_NAME, "FInferType", infer_struct_info)
    _registry.set_op_attr(OP_NAME, "FPurity", True)
    _registry.set_op_attr(OP_NAME, "FLegalize", legalize)


def make_roi_align_rotated(
    data,
    rois,
    output_size,
    *,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = True,
    layout: str = "NCHW",
    clockwise: bool = False,
    angle_unit: str = "degrees",
):
    """Build a ``relax.vision.roi_align_rotated`` call (attributes: module table; the family's
    argument order, :func:`~tvm_roialign.ops.roi_align.make_roi_align`).

    The defaults are detectron2's ``ROIAlignRotated``; mmcv's ``RoIAlignRotated(aligned, clockwise)``
    is ``angle_unit="radians"`` with its flags; OpenVINO's ``ROIAlignRotated`` is
    ``angle_unit="radians", clockwise=clockwise_mode`` (rois with the batch index in column 0).

    Returns
    -------
    relax.Expr
        ``[K, C, PH, PW]`` or ``[K, PH, PW, C]`` in data's dtype (checked when normalized).
    """
    attrs = RoiAlignRotatedAttrs(
        normalize_pooled_size(output_size),
        float(spatial_scale),
        int(sampling_ratio),
        bool(aligned),
        bool(clockwise),
        str(angle_unit),
        str(layout),
    )
    return relax.Call(tvm.ir.Op.get(OP_NAME), [data, rois], attrs.to_attrs())


__all__ = [
    "CONVENTIONS",
    "OP_NAME",
    "RoiAlignRotatedAttrs",
    "infer_struct_info",
    "legalize",
    "make_roi_align_rotated",
    "register",
]
