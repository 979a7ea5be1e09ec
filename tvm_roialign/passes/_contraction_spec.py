"""What the bf16 and int8 contraction passes read of a conv2d or matmul call: the constant weight,
the shapes, and the conv's geometry, as one :class:`Spec` (:mod:`.bf16_contractions`,
:mod:`.int8_contractions`; each pass decides which convolutions it takes)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from tvm import relax

from ..topi.contraction_geometry import ConvGeometry
from ._mutator import const_value, is_op_call, tensor_shape


class Spec(NamedTuple):
    """A contraction a pass takes: its ``[K, N]`` weight, the conv's geometry (None: a matmul), the
    GEMM's rows (maybe symbolic) and the op's output shape."""

    matrix: np.ndarray
    geometry: ConvGeometry | None
    rows: object
    out_shape: list


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


#: a conv with a kernel larger than 1x1 over a multiple of this many input channels gathers its taps
#: as they are (each fills whole vectors of the gather); over fewer, it has narrow taps (an RGB stem)
TAP_CHANNELS = 16


def narrow_taps(kh: int, kw: int, channels: int) -> bool:
    """Whether a ``kh x kw`` conv over ``channels`` inputs has narrow taps (:data:`TAP_CHANNELS`)."""
    return kh * kw > 1 and channels % TAP_CHANNELS != 0


def conv_spec(call, row_tap_depth: int | None = None) -> Spec | None:
    """The :class:`Spec` of an ungrouped fp32 NHWC conv2d with a constant weight, else None. A
    conv with narrow taps (:data:`TAP_CHANNELS`) is taken only with ``row_tap_depth`` (each kernel
    row's run of ``kw * c`` inputs padded to that depth: the weight's rows padded alike; the run
    must fit it, undilated, symmetrically padded), else None."""
    found = conv_weight(call)
    if found is None:
        return None
    hwio, out_shape = found
    kh, kw, channels, outputs = hwio.shape
    row_taps = narrow_taps(kh, kw, channels)
    if row_taps and not _fits_row_taps(call.attrs, kw * channels, row_tap_depth):
        return None
    geometry = conv_geometry(call, hwio, out_shape, row_taps)
    matrix = hwio.reshape(kh * kw * channels, outputs)
    if row_taps:
        padded = np.zeros((kh, row_tap_depth, outputs), np.float32)
        padded[:, : kw * channels] = hwio.reshape(kh, kw * channels, outputs)
        matrix = padded.reshape(kh * row_tap_depth, outputs)
    return Spec(matrix, geometry, geometry.rows, out_shape)


def unpadded_weight(spec: Spec) -> np.ndarray:
    """A contraction's ``[K, N]`` weight without the zero rows that pad a narrow-tap conv's kernel
    rows (:func:`conv_spec`): the layer's own weight, as a predicate of layers by weight knows it."""
    geometry, matrix = spec.geometry, spec.matrix
    if geometry is None or not geometry.row_taps:
        return matrix
    outputs = matrix.shape[1]
    taps = geometry.kw * geometry.c
    return matrix.reshape(geometry.kh, -1, outputs)[:, :taps].reshape(-1, outputs)


def _fits_row_taps(attrs, run: int, depth: int | None) -> bool:
    if depth is None:
        return False
    pads = [int(p) for p in attrs.padding]
    symmetric = len(pads) != 4 or pads[:2] == pads[2:]
    return run <= depth and tuple(int(d) for d in attrs.dilation) == (1, 1) and symmetric


def matmul_spec(call) -> Spec | None:
    """The :class:`Spec` of an fp32 matmul by a constant 2-D weight, else None."""
    found = matmul_weight(call)
    if found is None:
        return None
    matrix, rows, out_shape = found
    return Spec(matrix, None, rows, out_shape)


def call_contraction(builder, compute, prefix: str, x, *tensors, rows, reduction: int, out_shape, geometry,
                     **options):
    """``builder.call_te`` of the TE contraction ``compute`` (bf16's or int8's) on ``x`` and
    ``tensors``, for ``rows`` GEMM rows over ``reduction`` elements in the op's ``out_shape`` (a
    conv of ``geometry``, or a matmul); named ``{prefix}_conv2d`` or ``{prefix}_matmul``."""
    kernel = functools.partial(compute, rows=rows, reduction=reduction, out_shape=list(out_shape),
                               geometry=geometry, **options)
    name = f"{prefix}_conv2d" if geometry is not None else f"{prefix}_matmul"
    return builder.call_te(kernel, x, *tensors, primfunc_name_hint=name)


def contraction_spec(call, row_tap_depth: int | None = None) -> Spec | None:
    """The :class:`Spec` of ``call``: a conv2d by :func:`conv_spec` (narrow taps with
    ``row_tap_depth``), a matmul by :func:`matmul_spec`; None for anything else."""
    if is_op_call(call, "relax.nn.conv2d"):
        return conv_spec(call, row_tap_depth)
    if is_op_call(call, "relax.matmul"):
        return matmul_spec(call)
    return None
