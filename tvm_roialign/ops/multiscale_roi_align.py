"""``relax.vision.multiscale_roi_align``: the fused multi-level (FPN) RoIAlign Relax op.

``call.args = (feature_0, ..., feature_{L-1}, rois)``: feature maps of one dtype and layout, finest
first, and ``rois [K, 5]`` last; ``call.attrs`` is an ``ir.DictAttrs`` of
:class:`MultiscaleRoiAlignAttrs`' fields (``aligned``: no >= 1 size clamp, ``half_pixel``: shift by
-0.5 after scaling; torchvision's ``aligned=True`` is both). Semantics in
:mod:`tvm_roialign.topi.multiscale_roi_align`. :func:`register` registers the op with
``FInferType``, ``FPurity`` and ``FLegalize``; its ``FRelaxInferLayout`` is the layout pass's.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from ..topi._sampling import normalize_pooled_size
from ..topi.multiscale_roi_align import check_multiscale_roi_align_args
from ..topi.multiscale_roi_align import (
    multiscale_roi_align as topi_multiscale_roi_align,
)
from ._legalize import (
    checkable,
    data_channels,
    legalize_with_strategy,
    pooled_output_type,
    register_op,
    tensor_info,
)

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
    check_multiscale_roi_align_args(
        [checkable(s, n, 4) for s, n, _ in feature_infos],
        [d for _, _, d in feature_infos],
        checkable(rois_shape, rois_ndim, 2),
        rois_dtype,
        attrs.pooled_size,
        attrs.spatial_scales,
        attrs.layout,
        attrs.mode,
        attrs.canonical_scale,
        attrs.canonical_level,
    )
    first, first_ndim, dtype = feature_infos[0]
    channels = data_channels(checkable(first, first_ndim, 4), attrs.layout)
    return pooled_output_type(call, rois_shape, attrs.pooled_size, channels, attrs.layout, dtype)


def legalize(bb: relax.BlockBuilder, call):
    """``call_tir`` of the PrimFunc the call's target's strategy builds and schedules."""
    a = MultiscaleRoiAlignAttrs.from_call(call)
    features, rois = _split_args(call)

    def compute(*tensors, target):
        return topi_multiscale_roi_align(
            list(tensors[:-1]), tensors[-1], a.pooled_size, a.spatial_scales, a.sampling_ratio,
            a.aligned, a.layout, a.canonical_scale, a.canonical_level, a.mode, a.half_pixel,
            target=target,
        )

    inputs = [(f, f"features[{i}]") for i, f in enumerate(features)] + [(rois, "rois")]
    return legalize_with_strategy(bb, call, compute=compute, layout=a.layout, inputs=inputs)


def register() -> None:
    """Register the op and its attributes (idempotent); its ``FRelaxInferLayout`` is registered
    by :func:`tvm_roialign.passes.layout.register`."""
    register_op(OP_NAME, infer_struct_info, legalize)


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
    """A ``relax.vision.multiscale_roi_align`` call (torchvision's ``MultiScaleRoIAlign``; the
    family's argument order, :func:`~tvm_roialign.ops.roi_align.make_roi_align`): feature maps
    finest first, one ``spatial_scales`` entry per level; torchvision's detectors use
    ``sampling_ratio=2``; ``aligned`` is torchvision's (the call gets ``aligned=half_pixel``).
    Checked when a BlockBuilder normalizes it."""
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
