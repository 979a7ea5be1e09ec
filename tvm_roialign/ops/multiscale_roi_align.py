"""``relax.vision.multiscale_roi_align``: the fused multi-level (FPN) RoIAlign Relax op.

Calling convention
------------------
``call.args = (feature_0, ..., feature_{L-1}, rois)``: ``L`` feature maps of one dtype and layout
(``[N, C, H_l, W_l]`` NCHW or ``[N, H_l, W_l, C]`` NHWC) and ``rois [K, 5]`` of
``(batch_index, x1, y1, x2, y2)`` in input-image pixels, last. ``call.attrs`` is an ``ir.DictAttrs``
with keys ``pooled_size`` ``[PH, PW]``, ``spatial_scales`` (one float per level),
``sampling_ratio``, ``aligned`` (stock TVM's meaning: no >= 1 clamp of the roi size),
``half_pixel`` (subtract 0.5 after scaling, per level; torchvision's ``aligned=True`` is both),
``layout`` (``"NCHW"``/``"NHWC"``), ``canonical_scale`` (224), ``canonical_level`` (4) and ``mode``
(``"avg"``). Output ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC) in the features' dtype.

The FPN level of each roi is chosen inside the kernel exactly as torchvision's ``LevelMapper``
(see :mod:`tvm_roialign.topi.multiscale_roi_align`). :func:`register` registers the op (global
``ir.RegisterOp``) and its ``FInferType``, ``FPurity`` and ``FLegalize``; its ``FRelaxInferLayout``
is the layout pass's (:mod:`tvm_roialign.passes.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from .. import _registry
from ..topi._sampling import data_dims, normalize_pooled_size, output_shape
from ..topi.multiscale_roi_align import check_multiscale_roi_align_args
from ..topi.multiscale_roi_align import (
    multiscale_roi_align as topi_multiscale_roi_align,
)
from ._legalize import legalize_with_strategy, tensor_info

OP_NAME = "relax.vision.multiscale_roi_align"


@dataclass(frozen=True)
class MultiscaleRoiAlignAttrs:
    """The attributes of a ``relax.vision.multiscale_roi_align`` call, as plain Python values."""

    pooled_size: tuple[int, int]
    spatial_scales: tuple[float, ...]
    sampling_ratio: int = -1
    aligned: bool = False
    layout: str = "NCHW"
    canonical_scale: int = 224
    canonical_level: int = 4
    mode: str = "avg"
    half_pixel: bool = False

    @classmethod
    def from_attrs(cls, attrs) -> MultiscaleRoiAlignAttrs:
        if attrs is None:
            raise ValueError(
                f"{OP_NAME} needs attributes (pooled_size, spatial_scales, ...)"
            )
        values = dict(attrs.items())
        if set(values) == {
            "__dict__"
        }:  # built with make_node("ir.DictAttrs", __dict__={...})
            values = dict(values["__dict__"].items())
        missing = {"pooled_size", "spatial_scales"} - set(values)
        if missing:
            raise ValueError(f"{OP_NAME} attributes lack {sorted(missing)}")
        return cls(
            pooled_size=tuple(int(p) for p in values["pooled_size"]),
            spatial_scales=tuple(float(s) for s in values["spatial_scales"]),
            sampling_ratio=int(values.get("sampling_ratio", -1)),
            aligned=bool(values.get("aligned", False)),
            layout=str(values.get("layout", "NCHW")),
            canonical_scale=int(values.get("canonical_scale", 224)),
            canonical_level=int(values.get("canonical_level", 4)),
            mode=str(values.get("mode", "avg")),
            half_pixel=bool(values.get("half_pixel", False)),
        )

    @classmethod
    def from_call(cls, call) -> MultiscaleRoiAlignAttrs:
        return cls.from_attrs(call.attrs)

    def to_attrs(self, **changes) -> tvm.ir.Attrs:
        """An ``ir.DictAttrs`` with these values (``changes`` override fields, e.g. ``layout``)."""
        values = {
            "pooled_size": [int(p) for p in self.pooled_size],
            "spatial_scales": [float(s) for s in self.spatial_scales],
            "sampling_ratio": int(self.sampling_ratio),
            "aligned": bool(self.aligned),
            "layout": str(self.layout),
            "canonical_scale": int(self.canonical_scale),
            "canonical_level": int(self.canonical_level),
            "mode": str(self.mode),
            "half_pixel": bool(self.half_pixel),
        }
        values.update(changes)
        return tvm.ir.make_node("ir.DictAttrs", **values)


def _split_args(call):
    args = list(call.args)
    if len(args) < 2:
        raise ValueError(
            f"{OP_NAME} takes (feature_0, ..., feature_{{L-1}}, rois): at least one feature map and "
            f"the rois, got {len(args)} argument(s)"
        )
    return args[:-1], args[-1]


def _shapes(exprs, names):
    return [tensor_info(e, n) for e, n in zip(exprs, names)]


def infer_struct_info(call, _ctx=None):
    """Output ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC) in the features' dtype."""
    attrs = MultiscaleRoiAlignAttrs.from_call(call)
    features, rois = _split_args(call)
    feature_infos = _shapes(features, [f"features[{i}]" for i in range(len(features))])
    rois_shape, rois_ndim, rois_dtype = tensor_info(rois, "rois")

    def check_shape(shape, ndim, rank):
        if shape is not None:
            return shape
        return [None] * (rank if ndim == -1 else ndim)

    check_multiscale_roi_align_args(
        [check_shape(s, n, 4) for s, n, _ in feature_infos],
        [d for _, _, d in feature_infos],
        check_shape(rois_shape, rois_ndim, 2),
        rois_dtype,
        attrs.pooled_size,
        attrs.spatial_scales,
        attrs.layout,
        attrs.mode,
        attrs.canonical_scale,
        attrs.canonical_level,
    )
    dtype = feature_infos[0][2]
    first = feature_infos[0][0]
    vdevice = features[0].ty.vdevice
    if first is None or rois_shape is None:
        return relax.TensorType(ndim=4, dtype=dtype, vdevice=vdevice)
    channels = data_dims(first, attrs.layout)[1]
    shape = output_shape(rois_shape[0], channels, attrs.pooled_size, attrs.layout)
    return relax.TensorType(list(shape), dtype, vdevice=vdevice)


def legalize(bb: relax.BlockBuilder, call):
    """Lower a call to ``call_tir`` of a PrimFunc scheduled by the strategy of the call's target
    (:func:`~._legalize.legalize_with_strategy`)."""
    attrs = MultiscaleRoiAlignAttrs.from_call(call)
    features, rois = _split_args(call)

    def compute(*tensors):
        return topi_multiscale_roi_align(
            list(tensors[:-1]),
            tensors[-1],
            attrs.pooled_size,
            attrs.spatial_scales,
            attrs.sampling_ratio,
            attrs.aligned,
            attrs.layout,
            attrs.canonical_scale,
            attrs.canonical_level,
            attrs.mode,
            attrs.half_pixel,
        )

    inputs = [(f, f"features[{i}]") for i, f in enumerate(features)] + [(rois, "rois")]
    return legalize_with_strategy(
        bb,
        call,
        name=f"multiscale_roi_align_{attrs.layout.lower()}",
        inputs=inputs,
        compute=compute,
        layout=attrs.layout,
    )


def register() -> None:
    """Register the op and its attributes (idempotent). Its layout rule (``FRelaxInferLayout``)
    is registered with roi_align's by :func:`tvm_roialign.passes.layout.register`."""
    _registry.get_or_register_op(OP_NAME)
    _registry.set_op_attr(OP_NAME, "FInferType", infer_struct_info)
    _registry.set_op_attr(OP_NAME, "FPurity", True)
    _registry.set_op_attr(OP_NAME, "FLegalize", legalize)


def make_multiscale_roi_align(
    features,
    rois,
    output_size,
    spatial_scales,
    *,
    sampling_ratio: int = -1,
    aligned: bool = False,
    layout: str = "NCHW",
    mode: str = "avg",
    canonical_scale: int = 224,
    canonical_level: int = 4,
):
    """Build a ``relax.vision.multiscale_roi_align`` call (torchvision's ``MultiScaleRoIAlign``;
    the family's argument order and defaults, :func:`~tvm_roialign.ops.roi_align.make_roi_align`).

    Parameters
    ----------
    features : list of relax.Expr
        ``L`` feature maps ``[N, C, H_l, W_l]`` (NCHW) or ``[N, H_l, W_l, C]`` (NHWC), one float
        dtype, finest level first.
    rois : relax.Expr
        ``[K, 5]`` rows of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels, same dtype.
    output_size : int or (int, int)
        ``(PH, PW)``, positive.
    spatial_scales : list of float
        Feature-map pixels per input-image pixel, one per level (``2 ** -k``).
    sampling_ratio : int
        Samples per bin side; ``<= 0`` is adaptive (the default). torchvision's detectors'
        ``MultiScaleRoIAlign`` use 2: pass it.
    aligned : bool
        torchvision's ``aligned`` (MultiScaleRoIAlign always uses False): the call gets
        ``aligned=half_pixel=aligned`` (shift by 0.5 after scaling, no >= 1 clamp).
    layout : str
        ``"NCHW"`` or ``"NHWC"`` (of the features and the output).
    canonical_scale, canonical_level : int
        ``s0`` and ``k0`` of the level formula (224 and 4 in torchvision).
    mode : str
        ``"avg"`` (torchvision).

    Returns
    -------
    relax.Expr
        A call whose output is ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC).

    Raises
    ------
    ValueError, TypeError
        As :func:`tvm_roialign.topi.multiscale_roi_align.check_multiscale_roi_align_args`
        (raised when the call is normalized by a BlockBuilder).
    """
    features = list(features)
    if not features:
        raise ValueError("features must be a non-empty list of feature maps, got none")
    attrs = MultiscaleRoiAlignAttrs(
        pooled_size=normalize_pooled_size(output_size),
        spatial_scales=tuple(float(s) for s in spatial_scales),
        sampling_ratio=int(sampling_ratio),
        aligned=bool(aligned),
        layout=str(layout),
        canonical_scale=int(canonical_scale),
        canonical_level=int(canonical_level),
        mode=str(mode),
        half_pixel=bool(aligned),
    )
    return relax.Call(tvm.ir.Op.get(OP_NAME), [*features, rois], attrs.to_attrs())


__all__ = [
    "OP_NAME",
    "MultiscaleRoiAlignAttrs",
    "infer_struct_info",
    "legalize",
    "make_multiscale_roi_align",
    "register",
]
