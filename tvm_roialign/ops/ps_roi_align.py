"""``relax.vision.ps_roi_align``: position-sensitive RoIAlign (torchvision ``ps_roi_align``).

``call.args = (data, rois)``: ``data [N, C * PH * PW, H, W]`` (NCHW) or ``[N, H, W, C * PH * PW]``
(NHWC), ``rois [K, 5]`` of ``(batch_index, x1, y1, x2, y2)``. ``call.attrs`` is an ``ir.DictAttrs``
with ``pooled_size`` ``[PH, PW]``, ``spatial_scale``, ``sampling_ratio`` and ``layout``. Output
``[K, C, PH, PW]`` / ``[K, PH, PW, C]`` in data's dtype; semantics in
:mod:`tvm_roialign.topi.ps_roi_align`. :func:`register` registers the op (global
``ir.RegisterOp``), its ``FInferType``, ``FPurity`` and ``FLegalize``; its ``FRelaxInferLayout`` is
the layout pass's (:mod:`tvm_roialign.passes.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import tvm
from tvm import relax

from .. import _registry
from ..strategies.base import GATHERED_CHANNELS_ATTR
from ..topi._sampling import normalize_pooled_size, output_shape
from ..topi.ps_roi_align import check_ps_roi_align_args
from ..topi.ps_roi_align import ps_roi_align as topi_ps_roi_align
from ._legalize import DictAttrsFields, checkable_shapes, legalize_with_strategy

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
    attrs = PSRoiAlignAttrs.from_call(call)
    (data_shape, check_data, dtype), (rois_shape, check_rois, rois_dtype) = checkable_shapes(call)
    pooled, channels = check_ps_roi_align_args(
        check_data, dtype, check_rois, rois_dtype, attrs.pooled_size, attrs.layout
    )
    vdevice = call.args[0].ty.vdevice
    if data_shape is None or rois_shape is None or channels is None:
        return relax.TensorType(ndim=4, dtype=dtype, vdevice=vdevice)
    shape = output_shape(rois_shape[0], channels, pooled, attrs.layout)
    return relax.TensorType(list(shape), dtype, vdevice=vdevice)


def legalize(bb: relax.BlockBuilder, call):
    """``call_tir`` of the PrimFunc the call's target's strategy builds and schedules."""
    attrs = PSRoiAlignAttrs.from_call(call)

    def compute(data, rois):
        return topi_ps_roi_align(
            data, rois, attrs.pooled_size, attrs.spatial_scale, attrs.sampling_ratio, attrs.layout
        )

    return legalize_with_strategy(
        bb,
        call,
        name=f"ps_roi_align_{attrs.layout.lower()}",
        inputs=[(call.args[0], "data"), (call.args[1], "rois")],
        compute=compute,
        layout=attrs.layout,
        attrs=attrs,
        func_attrs={GATHERED_CHANNELS_ATTR: True},
    )


def register() -> None:
    """Register the op and its attributes (idempotent, reversible)."""
    _registry.get_or_register_op(OP_NAME)
    _registry.set_op_attr(OP_NAME, "FInferType", infer_struct_info)
    _registry.set_op_attr(OP_NAME, "FPurity", True)
    _registry.set_op_attr(OP_NAME, "FLegalize", legalize)


def make_ps_roi_align(data, rois, output_size, *, spatial_scale=1.0, sampling_ratio=-1, layout="NCHW"):
    """Build a ``relax.vision.ps_roi_align`` call (torchvision ``ps_roi_align``'s arguments; the
    family's argument order and defaults, :func:`~tvm_roialign.ops.roi_align.make_roi_align`).

    Parameters
    ----------
    data : relax.Expr
        ``[N, C * PH * PW, H, W]`` (NCHW) or ``[N, H, W, C * PH * PW]`` (NHWC), float16/32/64.
    rois : relax.Expr
        ``[K, 5]`` rows of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels, data's dtype.
    output_size : int or (int, int)
        ``(PH, PW)``.
    spatial_scale : float
        Feature-map pixels per input-image pixel.
    sampling_ratio : int
        Samples per bin side; ``<= 0`` is adaptive.
    layout : str
        ``"NCHW"`` or ``"NHWC"``.

    Returns
    -------
    relax.Expr
        ``[K, C, PH, PW]`` or ``[K, PH, PW, C]`` (checked when a BlockBuilder normalizes it).
    """
    attrs = PSRoiAlignAttrs(
        normalize_pooled_size(output_size), float(spatial_scale), int(sampling_ratio), str(layout)
    )
    return relax.Call(tvm.ir.Op.get(OP_NAME), [data, rois], attrs.to_attrs())


__all__ = ["OP_NAME", "PSRoiAlignAttrs", "infer_struct_info", "legalize", "make_ps_roi_align",
           "register"]
