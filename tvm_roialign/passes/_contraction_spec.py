"""What the bf16 and int8 contraction passes read of a conv2d or matmul call: the constant weight,
the shapes, and the conv's geometry (:mod:`.bf16_contractions`, :mod:`.int8_contractions`)."""

from __future__ import annotations

import functools

import numpy as np
from tvm import relax

from ..topi.bf16_contraction import ConvGeometry
from ._mutator import const_value, tensor_shape


def is_f32(expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32"


def dims(expr) -> list | None:
    """The shape of the tensor ``expr`` as ints and (symbolic) PrimExprs, or None when its rank is
    unknown or its last dimension (the channels) is not static."""
    shape = tensor_shape(expr)
    if shape is None or shape[-1] is None:
        return None
    return [s if s is not None else d for s, d in zip(shape, expr.ty.shape.values)]


def conv_weight(call, value=None):
    """``(hwio weight, output shape)`` of an ungrouped fp32 NHWC conv2d over static channels with a
    constant weight, or with the weight ``value`` (in the call's kernel layout) when given, else
    None."""
    attrs = call.attrs
    x, weight = call.args
    value = const_value(weight) if value is None else value
    in_shape, out_shape = dims(x), dims(call)
    layout = str(attrs.kernel_layout)
    if (
        value is None
        or int(attrs.groups) != 1
        or str(attrs.data_layout) != "NHWC"
        or str(attrs.out_layout or attrs.data_layout) != "NHWC"
        or not (is_f32(x) and is_f32(call))
        or in_shape is None
        or out_shape is None
        or sorted(layout) != sorted("OIHW")
    ):
        return None
    hwio = np.transpose(value, [layout.index(c) for c in "HWIO"])
    if hwio.shape[2] != in_shape[3]:
        return None
    return hwio, out_shape


def conv_geometry(call, hwio: np.ndarray, out_shape, row_taps: bool = False) -> ConvGeometry:
    """The :class:`ConvGeometry` of the conv2d ``call`` (its weight ``hwio``)."""
    attrs = call.attrs
    kh, kw, channels, _ = hwio.shape
    return ConvGeometry(
        *out_shape[:3],
        kh,
        kw,
        channels,
        tuple(int(s) for s in attrs.strides),
        (int(attrs.padding[0]), int(attrs.padding[1])),
        tuple(int(d) for d in attrs.dilation),
        row_taps,
    )


def matmul_weight(call, value=None):
    """``(weight [K, N], rows, output shape)`` of an fp32 matmul by a constant 2-D weight (as
    fp32), or by the weight ``value`` (as it is) when given, else None."""
    x, weight = call.args
    if value is None:
        value = const_value(weight)
        value = None if value is None else value.astype(np.float32)
    in_shape, out_shape = dims(x), dims(call)
    if (
        value is None
        or value.ndim != 2
        or not (is_f32(x) and is_f32(call))
        or in_shape is None
        or out_shape is None
        or len(in_shape) < 2
    ):
        return None
    rows = functools.reduce(lambda a, b: a * b, in_shape[:-1])
    return value, rows, out_shape
