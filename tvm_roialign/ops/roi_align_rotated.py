"""``relax.vision.roi_align_rotated``: rotated RoIAlign (detectron2, mmcv, OpenVINO conventions).

``call.args = (data, rois [K, 6])``, rows ``(batch_index, cx, cy, w, h, angle)``; ``call.attrs``
is an ``ir.DictAttrs`` of :class:`RoiAlignRotatedAttrs`' fields (meanings as the arguments of
:func:`tvm_roialign.topi.roi_align_rotated.roi_align_rotated_nchw`); :data:`CONVENTIONS` gives each
system's values. :func:`register` registers the op, its ``FInferType``, ``FPurity`` and
``FLegalize``; its ``FRelaxInferLayout`` is the layout pass's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import tvm
from tvm import relax

from ..topi._sampling import normalize_pooled_size
from ..topi.roi_align_rotated import check_roi_align_rotated_args
from ..topi.roi_align_rotated import roi_align_rotated as topi_roi_align_rotated
from ._legalize import (
    DictAttrsFields,
    data_channels,
    infer_pooled_type,
    legalize_with_strategy,
    register_op,
)

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
    a = RoiAlignRotatedAttrs.from_call(call)

    def check(data_shape, dtype, rois_shape, rois_dtype):
        pooled = check_roi_align_rotated_args(data_shape, dtype, rois_shape, rois_dtype,
                                              a.pooled_size, a.layout, a.angle_unit)
        return pooled, data_channels(data_shape, a.layout)

    return infer_pooled_type(call, a.layout, check)


def legalize(bb: relax.BlockBuilder, call):
    """``call_tir`` of the PrimFunc the call's target's strategy builds and schedules."""
    a = RoiAlignRotatedAttrs.from_call(call)

    def compute(data, rois, target):
        return topi_roi_align_rotated(
            data, rois, a.pooled_size, a.spatial_scale, a.sampling_ratio, a.aligned, a.clockwise,
            a.angle_unit, a.layout, target=target,
        )

    return legalize_with_strategy(bb, call, compute=compute, layout=a.layout, attrs=a)


def register() -> None:
    """Register the op and its attributes (idempotent, reversible)."""
    register_op(OP_NAME, infer_struct_info, legalize)


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
    """A ``relax.vision.roi_align_rotated`` call (the family's argument order,
    :func:`~tvm_roialign.ops.roi_align.make_roi_align`). The defaults are detectron2's; mmcv's is
    ``angle_unit="radians"`` with its flags, OpenVINO's ``angle_unit="radians",
    clockwise=clockwise_mode``. Checked when a BlockBuilder normalizes it."""
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
