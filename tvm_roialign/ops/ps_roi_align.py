"""``relax.vision.ps_roi_align``: position-sensitive RoIAlign (torchvision ``ps_roi_align``).

``call.args = (data [N, C * PH * PW, H, W] or [N, H, W, C * PH * PW], rois [K, 5])``;
``call.attrs``: an ``ir.DictAttrs`` of :class:`PSRoiAlignAttrs`' fields. Semantics in
:mod:`tvm_roialign.topi.ps_roi_align`. :func:`register` registers the op, its ``FInferType``,
``FPurity`` and ``FLegalize``; its ``FRelaxInferLayout`` is the layout pass's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import tvm
from tvm import relax

from ..strategies.base import GATHERED_CHANNELS_ATTR
from ..topi._sampling import normalize_pooled_size
from ..topi.ps_roi_align import check_ps_roi_align_args
from ..topi.ps_roi_align import ps_roi_align as topi_ps_roi_align
from ._legalize import (
    DictAttrsFields,
    infer_pooled_type,
    legalize_with_strategy,
    register_op,
)

OP_NAME = "relax.vision.ps_roi_align"


@dataclass(frozen=True)
class PSRoiAlignAttrs(DictAttrsFields):
    """The attributes of a ``relax.vision.ps_roi_align`` call, as plain Python values."""

    OP_NAME: ClassVar[str] = OP_NAME

    pooled_size: tuple[int, int]
    spatial_scale: float = 1.0
    sampling_ratio: int = -1
    layout: str = "NCHW"
    #: tells the strategies' adaptive-grid kernel which op it builds
    position_sensitive: ClassVar[bool] = True


def infer_struct_info(call, _ctx=None):
    """Output ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC) in the data dtype."""
    a = PSRoiAlignAttrs.from_call(call)

    def check(data_shape, dtype, rois_shape, rois_dtype):
        return check_ps_roi_align_args(data_shape, dtype, rois_shape, rois_dtype, a.pooled_size,
                                       a.layout)

    return infer_pooled_type(call, a.layout, check)


def legalize(bb: relax.BlockBuilder, call):
    """``call_tir`` of the PrimFunc the call's target's strategy builds and schedules."""
    a = PSRoiAlignAttrs.from_call(call)

    def compute(data, rois, target):
        return topi_ps_roi_align(data, rois, a.pooled_size, a.spatial_scale, a.sampling_ratio,
                                 a.layout, target=target)

    return legalize_with_strategy(bb, call, compute=compute, layout=a.layout, attrs=a,
                                  func_attrs={GATHERED_CHANNELS_ATTR: True})


def register() -> None:
    """Register the op and its attributes (idempotent, reversible)."""
    register_op(OP_NAME, infer_struct_info, legalize)


def make_ps_roi_align(data, rois, output_size, *, spatial_scale=1.0, sampling_ratio=-1, layout="NCHW"):
    """A ``relax.vision.ps_roi_align`` call (torchvision ``ps_roi_align``'s arguments in the
    family's order, :func:`~tvm_roialign.ops.roi_align.make_roi_align`); checked when a
    BlockBuilder normalizes it."""
    attrs = PSRoiAlignAttrs(
        normalize_pooled_size(output_size), float(spatial_scale), int(sampling_ratio), str(layout)
    )
    return relax.Call(tvm.ir.Op.get(OP_NAME), [data, rois], attrs.to_attrs())


__all__ = ["OP_NAME", "PSRoiAlignAttrs", "infer_struct_info", "legalize", "make_ps_roi_align",
           "register"]
