"""``relax.vision.quantized_roi_align``: RoIAlign of a per-tensor affine quantized map (torchvision's
``roi_align`` on a ``quint8`` tensor), an op of this package.

``call.args = (data [N, C, H, W] or [N, H, W, C] of uint8 / int8, rois [K, 5] float32)``;
``call.attrs``: an ``ir.DictAttrs`` of :class:`QuantizedRoiAlignAttrs`' fields. Semantics in
:mod:`tvm_roialign.topi.quantized_roi_align`. :func:`register` registers the op, its
``FInferType``, ``FPurity`` and ``FLegalize``; its ``FRelaxInferLayout`` is the layout pass's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import tvm
from tvm import relax

from ..topi._args import check_spatial_scale
from ..topi._sampling import normalize_pooled_size
from ..topi.quantized_roi_align import check_quantized_roi_align_args
from ..topi.quantized_roi_align import quantized_roi_align as topi_quantized_roi_align
from ._legalize import (
    DictAttrsFields,
    checkable_shapes,
    data_channels,
    legalize_with_strategy,
    pooled_output_type,
    register_op,
)

OP_NAME = "relax.vision.quantized_roi_align"


@dataclass(frozen=True)
class QuantizedRoiAlignAttrs(DictAttrsFields):
    """The attributes of a ``relax.vision.quantized_roi_align`` call, as plain Python values."""

    OP_NAME: ClassVar[str] = OP_NAME

    pooled_size: tuple[int, int]
    spatial_scale: float = 1.0
    sampling_ratio: int = -1
    aligned: bool = False
    layout: str = "NCHW"
    scale: float = 1.0
    zero_point: int = 0
    out_dtype: str = "uint8"


def infer_struct_info(call, _ctx=None):
    """Output ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC) of ``out_dtype``."""
    a = QuantizedRoiAlignAttrs.from_call(call)
    (_, data_shape, dtype), (rois_shape, check_rois, rois_dtype) = checkable_shapes(call)
    pooled, _, _ = check_quantized_roi_align_args(
        data_shape, dtype, check_rois, rois_dtype, a.pooled_size, a.layout, a.scale, a.zero_point,
        a.out_dtype,
    )
    check_spatial_scale(a.spatial_scale)
    channels = data_channels(data_shape, a.layout)
    return pooled_output_type(call, rois_shape, pooled, channels, a.layout, a.out_dtype)


def legalize(bb: relax.BlockBuilder, call):
    """``call_tir`` of the PrimFunc the call's target's strategy builds and schedules (RoIAlign's
    schedule rules; the CPU strategies' adaptive-grid kernel is float-only and not used)."""
    a = QuantizedRoiAlignAttrs.from_call(call)

    def compute(data, rois, target):
        return topi_quantized_roi_align(data, rois, a.pooled_size, a.scale, a.zero_point,
                                        a.spatial_scale, a.sampling_ratio, a.aligned, a.layout,
                                        a.out_dtype, target=target)

    return legalize_with_strategy(bb, call, compute=compute, layout=a.layout)


def register() -> None:
    """Register the op and its attributes (idempotent, reversible)."""
    register_op(OP_NAME, infer_struct_info, legalize)


def make_quantized_roi_align(data, rois, output_size, *, spatial_scale=1.0, sampling_ratio=-1,
                             aligned=False, layout="NCHW", scale, zero_point, out_dtype="uint8"):
    """A ``relax.vision.quantized_roi_align`` call: ``data`` quantized per tensor (``real = (q -
    zero_point) * scale``), float32 ``rois``, ``aligned`` torchvision's; ``out_dtype`` the data's
    dtype (requantized with ``scale`` / ``zero_point``) or ``"float32"`` (dequantized). Checked
    when a BlockBuilder normalizes it."""
    if isinstance(zero_point, bool) or int(zero_point) != zero_point:
        raise ValueError(f"zero_point must be an int, got {zero_point!r}")
    attrs = QuantizedRoiAlignAttrs(
        normalize_pooled_size(output_size), float(spatial_scale), int(sampling_ratio),
        bool(aligned), str(layout), float(scale), int(zero_point), str(out_dtype),
    )
    return relax.Call(tvm.ir.Op.get(OP_NAME), [data, rois], attrs.to_attrs())


__all__ = ["OP_NAME", "QuantizedRoiAlignAttrs", "infer_struct_info", "legalize",
           "make_quantized_roi_align", "register"]
