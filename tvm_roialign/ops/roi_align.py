"""``relax.vision.roi_align``: struct-info inference and legalization through the strategies.

Stock TVM 0.27 infers float32 for float16 data and legalizes to an unscheduled TE compute with
known faults (see the README). :func:`register` replaces both, above TVM's own level, reversibly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import tvm
from tvm import relax, te, tirx

from .. import _registry
from ..strategies import select_strategy
from ..strategies.base import without_global_symbol
from ..topi import roi_align as topi_roi_align
from ..topi.roi_align import check_roi_align_args

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


def tensor_info(expr, name: str):
    """``(shape values or None, ndim, dtype)`` of a tensor-typed Relax expression."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType):
        raise TypeError(f"{name} must be a tensor, got {ty}")
    shape = None if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr) else list(
        ty.shape.values
    )
    return shape, int(ty.ndim), str(ty.dtype)


class FreshDims:
    """Replace composite symbolic dimensions (``K0 + K1``) by fresh variables.

    A PrimFunc can only take its symbolic sizes from buffer shapes; a dimension such as
    ``K0 + K1`` (rois concatenated from two inputs) defines neither variable. A fresh variable
    per distinct composite dimension is bound from the buffer's shape at run time instead.
    """

    def __init__(self):
        self._seen: list[tuple[tirx.PrimExpr, tirx.Var]] = []

    def __call__(self, shape):
        return [self._dim(d) for d in shape]

    def _dim(self, dim):
        if isinstance(dim, (int, tirx.IntImm, tirx.Var)):
            return dim
        for expr, var in self._seen:
            if tvm.ir.structural_equal(expr, dim):
                return var
        var = tirx.Var(f"dim{len(self._seen)}", "int64")
        self._seen.append((dim, var))
        return var


def _output_shape(data_shape, rois_shape, pooled, layout):
    ph, pw = pooled
    if layout == "NCHW":
        return [rois_shape[0], data_shape[1], ph, pw]
    return [rois_shape[0], ph, pw, data_shape[3]]


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
    if data_shape is None or rois_shape is None:
        return relax.TensorType(ndim=4, dtype=data_dtype)
    return relax.TensorType(
        _output_shape(data_shape, rois_shape, attrs.pooled_size, attrs.layout), data_dtype
    )


def legalize(bb: relax.BlockBuilder, call):
    """Lower a call to ``call_tir`` of a PrimFunc scheduled by the current target's strategy."""
    attrs = RoiAlignAttrs.from_call(call)
    data_shape, _, dtype = tensor_info(call.args[0], "data")
    rois_shape, _, _ = tensor_info(call.args[1], "rois")
    if data_shape is None or rois_shape is None:
        raise ValueError("roi_align needs data and rois of known rank and shape to legalize")
    strategy, target = select_strategy(None)
    fresh = FreshDims()
    inputs = [
        te.placeholder(fresh(data_shape), dtype, "data"),
        te.placeholder(fresh(rois_shape), dtype, "rois"),
    ]

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

    func = strategy.build(compute, inputs, target, attrs.layout, attrs)
    gvar = bb.add_func(without_global_symbol(func), f"roi_align_{attrs.layout.lower()}")
    return relax.call_tir(gvar, list(call.args), call.ty)


def register() -> None:
    """Register our FInferType and FLegalize for ``relax.vision.roi_align`` (idempotent)."""
    _registry.set_op_attr(OP_NAME, "FInferType", infer_struct_info)
    _registry.set_op_attr(OP_NAME, "FLegalize", legalize)


def make_roi_align(
    data,
    rois,
    output_size,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    layout: str = "NCHW",
    mode: str = "avg",
):
    """Build a Relax RoIAlign call with torchvision's meaning of ``aligned``.

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
        data, rois, output_size, spatial_scale, sampling_ratio, bool(aligned), layout, mode
    )
    if not aligned:
        return call
    attrs = dataclasses.replace(RoiAlignAttrs.from_call(call), half_pixel=True)
    return relax.Call(call.op, list(call.args), attrs.to_attrs())


__all__ = ["OP_NAME", "FreshDims", "RoiAlignAttrs", "infer_struct_info", "legalize", "make_roi_align", "register"]
