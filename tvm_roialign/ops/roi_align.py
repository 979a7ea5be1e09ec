"""``relax.vision.roi_align``: our struct-info inference and legalization (through the
strategies) registered above stock TVM's, reversibly. The typed attributes keep stock TVM's
meaning; torchvision's ``aligned`` (a shift after scaling) travels as ``half_pixel`` in
``ir.DictAttrs`` (:class:`RoiAlignAttrs`; semantics in docs/semantics.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import tvm
from tvm import relax

from ..topi import roi_align as topi_roi_align
from ..topi.roi_align import check_roi_align_args
from ._legalize import (
    FreshDims,
    data_channels,
    infer_pooled_type,
    legalize_with_strategy,
    register_op,
)

OP_NAME = "relax.vision.roi_align"


@dataclass(frozen=True)
class RoiAlignAttrs:
    """The attributes of a ``relax.vision.roi_align`` call, as plain Python values.

    A call carries either TVM's typed ``relax.attrs.ROIAlignAttrs`` (stock importers, the plain
    op; ``half_pixel`` is then False) or an ``ir.DictAttrs`` with the same keys plus
    ``half_pixel`` (built by :func:`make_roi_align` for torchvision's ``aligned=True`` / ONNX's
    ``half_pixel``: the typed attributes have no field for the shift).
    """

    pooled_size: tuple[int, int]
    spatial_scale: float
    sampling_ratio: int
    aligned: bool
    layout: str
    mode: str
    half_pixel: bool = False

    @classmethod
    def from_call(cls, call) -> RoiAlignAttrs:
        a = call.attrs
        half_pixel = bool(a["half_pixel"]) if isinstance(a, tvm.ir.DictAttrs) and (
            "half_pixel" in a
        ) else False
        return cls(
            pooled_size=tuple(int(p) for p in a.pooled_size),
            spatial_scale=float(a.spatial_scale),
            sampling_ratio=int(a.sample_ratio),
            aligned=bool(a.aligned),
            layout=str(a.layout),
            mode=str(a.mode),
            half_pixel=half_pixel,
        )

    def to_attrs(self) -> tvm.ir.Attrs:
        """An ``ir.DictAttrs`` holding these values (``half_pixel`` included)."""
        return tvm.ir.make_node(
            "ir.DictAttrs",
            pooled_size=[int(p) for p in self.pooled_size],
            spatial_scale=float(self.spatial_scale),
            sample_ratio=int(self.sampling_ratio),
            aligned=bool(self.aligned),
            layout=str(self.layout),
            mode=str(self.mode),
            half_pixel=bool(self.half_pixel),
        )


def infer_struct_info(call, _ctx=None):
    """Output ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC) in the data dtype."""
    a = RoiAlignAttrs.from_call(call)

    def check(data_shape, dtype, rois_shape, rois_dtype):
        pooled = check_roi_align_args(data_shape, dtype, rois_shape, rois_dtype, a.pooled_size,
                                      a.layout, a.mode)
        return pooled, data_channels(data_shape, a.layout)

    return infer_pooled_type(call, a.layout, check)


def legalize(bb: relax.BlockBuilder, call):
    """``call_tir`` of the PrimFunc the call's target's strategy builds and schedules."""
    a = RoiAlignAttrs.from_call(call)

    def compute(data, rois, target):
        return topi_roi_align(data, rois, a.pooled_size, a.spatial_scale, a.mode, a.sampling_ratio,
                              a.aligned, a.layout, a.half_pixel, target=target)

    return legalize_with_strategy(bb, call, compute=compute, layout=a.layout, attrs=a)


def register() -> None:
    """Our FInferType and FLegalize for the stock ``relax.vision.roi_align`` (idempotent)."""
    register_op(OP_NAME, infer_struct_info, legalize, stock=True)


def make_roi_align(
    data,
    rois,
    output_size,
    *,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    layout: str = "NCHW",
    mode: str = "avg",
):
    """A Relax RoIAlign call of ``data`` and ``rois [K, 5]`` with torchvision's meaning of
    ``aligned`` (shift by -0.5 after scaling, no >= 1 size clamp: the call then carries
    ``ir.DictAttrs`` with ``half_pixel=True``; ``False`` builds the stock call).

    The family's builders take the tensors and the output size by position, the rest by keyword in
    one order (``spatial_scale``, ``sampling_ratio``, ``aligned``, ``layout``, ``mode``, then the
    op's own), with ``relax.op.vision.roi_align``'s defaults (the rotated op's ``aligned``:
    detectron2's ``True``).
    """
    call = relax.op.vision.roi_align(
        data,
        rois,
        output_size,
        spatial_scale,
        sample_ratio=sampling_ratio,  # TVM's typed attrs spell it so; the family's own ops do not
        aligned=bool(aligned),
        layout=layout,
        mode=mode,
    )
    if not aligned:
        return call
    attrs = dataclasses.replace(RoiAlignAttrs.from_call(call), half_pixel=True)
    return relax.Call(call.op, list(call.args), attrs.to_attrs())


__all__ = [
    "OP_NAME",
    "FreshDims",
    "RoiAlignAttrs",
    "infer_struct_info",
    "legalize",
    "make_roi_align",
    "register",
]
