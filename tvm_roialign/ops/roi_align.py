"""``relax.vision.roi_align``: struct-info inference and legalization through the strategies.

Stock TVM 0.27 infers float32 for float16 data and legalizes to an unscheduled TE compute with
known faults (see the README). :func:`register` replaces both, above TVM's own level, reversibly.
The op's typed attributes keep stock TVM's meaning; torchvision's ``aligned`` (a shift after
scaling) travels as ``half_pixel`` in ``ir.DictAttrs`` (:class:`RoiAlignAttrs`; the names are
tabled in :mod:`tvm_roialign.topi.roi_align`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import tvm
from tvm import relax

from .. import _registry
from ..topi import roi_align as topi_roi_align
from ..topi._sampling import data_dims, output_shape
from ..topi.roi_align import check_roi_align_args
from ._legalize import FreshDims, legalize_with_strategy, tensor_info

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
    attrs = RoiAlignAttrs.from_call(call)
    data_shape, data_ndim, data_dtype = tensor_info(call.args[0], "data")
    rois_shape, rois_ndim, rois_dtype = tensor_info(call.args[1], "rois")
    check_shape = data_shape if data_shape is not None else [None] * max(data_ndim, 0)
    check_rois = rois_shape if rois_shape is not None else [None] * max(rois_ndim, 0)
    if data_ndim == -1:
        check_shape = [None] * 4
    if rois_ndim == -1:
        check_rois = [None, None]
    check_roi_align_args(
        check_shape, data_dtype, check_rois, rois_dtype, attrs.pooled_size, attrs.layout, attrs.mode
    )
    vdevice = call.args[0].ty.vdevice
    if data_shape is None or rois_shape is None:
        return relax.TensorType(ndim=4, dtype=data_dtype, vdevice=vdevice)
    channels = data_dims(data_shape, attrs.layout)[1]
    shape = output_shape(rois_shape[0], channels, attrs.pooled_size, attrs.layout)
    return relax.TensorType(list(shape), data_dtype, vdevice=vdevice)


def legalize(bb: relax.BlockBuilder, call):
    """Lower a call to ``call_tir`` of a PrimFunc scheduled by the strategy of the call's target
    (:func:`~._legalize.legalize_with_strategy`)."""
    attrs = RoiAlignAttrs.from_call(call)

    def compute(data, rois):
        return topi_roi_align(
            data,
            rois,
            attrs.pooled_size,
            attrs.spatial_scale,
            attrs.mode,
            attrs.sampling_ratio,
            attrs.aligned,
            attrs.layout,
            attrs.half_pixel,
        )

    return legalize_with_strategy(
        bb,
        call,
        name=f"roi_align_{attrs.layout.lower()}",
        inputs=[(call.args[0], "data"), (call.args[1], "rois")],
        compute=compute,
        layout=attrs.layout,
        attrs=attrs,
    )


def register() -> None:
    """Register our FInferType and FLegalize for ``relax.vision.roi_align`` (idempotent)."""
    _registry.set_op_attr(OP_NAME, "FInferType", infer_struct_info)
    _registry.set_op_attr(OP_NAME, "FLegalize", legalize)


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
    """Build a Relax RoIAlign call with torchvision's meaning of ``aligned``.

    The RoI family's builders (this, :func:`~tvm_roialign.ops.multiscale_roi_align.make_multiscale_roi_align`,
    :func:`~tvm_roialign.ops.ps_roi_align.make_ps_roi_align`,
    :func:`~tvm_roialign.ops.roi_align_rotated.make_roi_align_rotated`) take the tensors and the
    output size by position, the rest by keyword, in one order: ``spatial_scale``,
    ``sampling_ratio``, ``aligned``, ``layout``, ``mode``, then the op's own; the shared ones default
    as ``tvm.relax.op.vision.roi_align`` (``sampling_ratio=-1``, ``aligned=False``, ``"NCHW"``,
    ``"avg"``; ``spatial_scale=1.0``), except the rotated op's ``aligned`` (detectron2's ``True``).

    Parameters
    ----------
    data : relax.Expr
        ``[N, C, H, W]`` (NCHW) or ``[N, H, W, C]`` (NHWC) feature map, float16/32/64.
    rois : relax.Expr
        ``[K, 5]`` rows of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels, data's dtype.
    output_size : int or (int, int)
        ``(PH, PW)``, positive.
    spatial_scale : float
        Feature-map pixels per input-image pixel.
    sampling_ratio : int
        Samples per bin side; ``<= 0`` is adaptive.
    aligned : bool
        torchvision's ``aligned``: subtract 0.5 after scaling (``x * spatial_scale - 0.5``, in this
        float order) and drop the >= 1 size clamp. ``False`` builds the stock call (typed
        attributes); ``True`` builds the call with ``ir.DictAttrs`` ``aligned=True,
        half_pixel=True`` (see :class:`RoiAlignAttrs`), the shift done in the kernel.
    layout, mode : str
        ``"NCHW"``/``"NHWC"``; ``"avg"``/``"max"`` (max of interpolated samples).

    Returns
    -------
    relax.Expr
        ``[K, C, PH, PW]`` or ``[K, PH, PW, C]`` in data's dtype.
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
