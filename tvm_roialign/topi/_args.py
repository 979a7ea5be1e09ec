"""Argument checks, dtypes and output shapes of the RoI family's computes (the semantics are in
docs/semantics.md; the TE math is in :mod:`._sampling`)."""

from __future__ import annotations

import math

import tvm
from tvm import tirx

LAYOUTS = ("NCHW", "NHWC")
MODES = ("avg", "max", "onnx_max")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: The rois dtypes each data dtype takes: the data's own, but float32 for bfloat16 data: bfloat16
#: has 8 significant bits (a box edge near 700 px moves in 4 px steps), and on llvm TVM 0.27 gives a
#: Let-bound ``a > x and b < y`` of widened bfloat16 loads as false (the sample validity: all zeros).
ROIS_DTYPES = {"bfloat16": ("float32",), "uint8": ("float32",), "int8": ("float32",)}
INT32_MAX = 2**31 - 1
#: The row form of RoIAlign's ``[K, 5]`` rois, for error messages.
BOX_ROW = "(batch_index, x1, y1, x2, y2)"


def resolve_target(target):
    """``target``, else the current target (None outside any ``with target:``): the computes'
    entry points resolve it once and pass it down to the geometry."""
    if target is not None:
        return target
    return tvm.target.Target.current(allow_none=True)


def accumulate_dtype(dtype: str) -> str:
    """float64 for float64, float32 otherwise (float16 and bfloat16 accumulate in float32)."""
    return "float64" if str(dtype) == "float64" else "float32"


def is_static(dim) -> bool:
    """Whether a dimension is a known integer."""
    return isinstance(dim, (int, tirx.IntImm))


def _static_numel(shape) -> int | None:
    total = 1
    for dim in shape:
        if not is_static(dim):
            return None
        total *= int(dim)
    return total


def index_dtype_for(*shapes) -> str:
    """``"int64"`` if any shape has more than ``2**31 - 1`` elements or a symbolic dimension."""
    for shape in shapes:
        numel = _static_numel(shape)
        if numel is None or numel > INT32_MAX:
            return "int64"
    return "int32"


def normalize_pooled_size(pooled_size) -> tuple[int, int]:
    """``int`` or ``(PH, PW)`` -> ``(PH, PW)``; ValueError unless both are positive ints."""
    message = f"pooled_size must be an int or a pair (PH, PW) of positive ints, got {pooled_size!r}"
    if isinstance(pooled_size, (int, tirx.IntImm)):
        pooled = (int(pooled_size), int(pooled_size))
    else:
        try:
            pooled = tuple(int(p) for p in pooled_size)
        except TypeError as err:
            raise ValueError(message) from err
    if len(pooled) != 2 or min(pooled) <= 0:
        raise ValueError(message)
    return pooled


def data_dims(shape, layout):
    """``(N, C, H, W)`` of a data shape in ``layout``."""
    if layout == "NCHW":
        num_batch, channels, height, width = shape
    else:
        num_batch, height, width, channels = shape
    return num_batch, channels, height, width


def output_shape(num_rois, channels, pooled, layout):
    """``(K, C, PH, PW)`` (NCHW) or ``(K, PH, PW, C)`` (NHWC)."""
    pooled_h, pooled_w = pooled
    if layout == "NCHW":
        return (num_rois, channels, pooled_h, pooled_w)
    return (num_rois, pooled_h, pooled_w, channels)


def data_form(layout) -> str:
    """How a 4-D data shape is written for ``layout``, for error messages."""
    return "[N, C, H, W]" if layout == "NCHW" else "[N, H, W, C]"


def check_layout(layout) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def check_layout_and_mode(layout, mode) -> None:
    check_layout(layout)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def check_spatial_scale(spatial_scale) -> float:
    """``float(spatial_scale)``; ValueError unless positive and finite."""
    spatial_scale = float(spatial_scale)
    if not math.isfinite(spatial_scale) or spatial_scale <= 0:
        raise ValueError(f"spatial_scale must be a positive finite float, got {spatial_scale}")
    return spatial_scale


def check_rois_shape(rois_shape, columns: int = 5, row_form: str = BOX_ROW) -> None:
    """ValueError unless ``rois_shape`` is ``[K, columns]``."""
    if len(rois_shape) != 2 or (is_static(rois_shape[1]) and int(rois_shape[1]) != columns):
        raise ValueError(
            f"rois must be [K, {columns}] rows of {row_form}, got shape {list(rois_shape)}"
        )


def check_data_and_rois(
    data_shape, data_dtype, rois_shape, rois_dtype, layout, columns: int = 5, row_form: str = BOX_ROW
) -> None:
    """``data`` 4-D in ``layout`` (already checked), ``rois`` ``[K, columns]``, a float data dtype
    and a rois dtype it takes (:func:`check_rois_dtype`); ValueError (shapes) / TypeError (dtypes)."""
    check_data_rank(data_shape, layout)
    check_rois_shape(rois_shape, columns, row_form)
    if str(data_dtype) not in FLOAT_DTYPES:
        raise TypeError(f"data dtype must be one of {FLOAT_DTYPES}, got {data_dtype}")
    check_rois_dtype(rois_dtype, data_dtype)


def check_data_rank(data_shape, layout) -> None:
    """ValueError unless ``data`` is 4-D (its form in ``layout`` named)."""
    if len(data_shape) != 4:
        raise ValueError(
            f"data must be 4-D {data_form(layout)} for layout {layout}, got shape {list(data_shape)}"
        )


def rois_dtypes_for(data_dtype) -> tuple[str, ...]:
    """The rois dtypes data of ``data_dtype`` takes (:data:`ROIS_DTYPES`)."""
    return ROIS_DTYPES.get(str(data_dtype), (str(data_dtype),))


def check_rois_dtype(rois_dtype, data_dtype, data_name: str = "data") -> None:
    """TypeError unless ``rois_dtype`` is one ``data_dtype`` takes (:func:`rois_dtypes_for`)."""
    accepted = rois_dtypes_for(data_dtype)
    if str(rois_dtype) in accepted:
        return
    if accepted == (str(data_dtype),):
        raise TypeError(f"rois dtype ({rois_dtype}) must equal {data_name} dtype ({data_dtype})")
    raise TypeError(
        f"rois dtype ({rois_dtype}) must be {' or '.join(accepted)} for {data_name} dtype "
        f"{data_dtype}"
    )


def by_layout(layout, nchw, nhwc):
    """``nchw`` or ``nhwc`` for ``layout``; ValueError for another layout."""
    if layout == "NCHW":
        return nchw
    if layout == "NHWC":
        return nhwc
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
