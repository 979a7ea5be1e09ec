"""Quantized RoIAlign compute (TE), NCHW and NHWC: torchvision's ``roi_align`` on a per-tensor
affine quantized map (``real = (q - zero_point) * scale``), uint8 or int8, with float32 rois.

The geometry is RoIAlign's with torchvision's ``aligned`` (:func:`._sampling.roi_geometry`); the
bilinear samples and their average are computed in float32 on ``q - zero_point`` (exact in
float32), and the average ``a`` is then

* ``out_dtype`` = the data's dtype: requantized with the input's scale and zero point,
  ``clamp(round_half_even(a) + zero_point)`` (torchvision rounds ``a * scale / scale``: the two
  differ by at most one quantum, only where ``a`` lies within float32 rounding of ``n + 0.5``);
* ``out_dtype`` = ``"float32"``: dequantized, ``a * scale``.

An empty grid or an invalid roi gives the real value 0 (``zero_point`` requantized). Blocks
``roi_align_acc`` and ``roi_align`` are RoIAlign's, so its schedules apply.
"""

from __future__ import annotations

import math

from tvm import te, tirx

from ._args import (
    by_layout,
    check_data_rank,
    check_layout,
    check_rois_dtype,
    check_rois_shape,
    check_spatial_scale,
    data_dims,
    normalize_pooled_size,
    resolve_target,
)
from ._sampling import pooled_compute, roi_geometry

__all__ = [
    "QUANTIZED_DTYPES",
    "check_quantized_roi_align_args",
    "quantized_roi_align",
    "quantized_roi_align_nchw",
    "quantized_roi_align_nhwc",
]

#: The quantized data dtypes and their ranges.
QUANTIZED_DTYPES = {"uint8": (0, 255), "int8": (-128, 127)}


def check_quantization(data_dtype, scale, zero_point, out_dtype) -> tuple[float, int]:
    """``(scale, zero_point)`` as float and int; TypeError / ValueError naming the argument."""
    data_dtype = str(data_dtype)
    if data_dtype not in QUANTIZED_DTYPES:
        raise TypeError(f"data dtype must be one of {tuple(QUANTIZED_DTYPES)}, got {data_dtype}")
    try:
        scale = float(scale)
    except (TypeError, ValueError) as err:
        raise ValueError(f"scale must be a positive finite float, got {scale!r}") from err
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float, got {scale}")
    low, high = QUANTIZED_DTYPES[data_dtype]
    if isinstance(zero_point, bool) or not isinstance(zero_point, (int, tirx.IntImm)) or not (
        low <= int(zero_point) <= high
    ):
        raise ValueError(
            f"zero_point must be an int in [{low}, {high}] for {data_dtype} data, got {zero_point!r}"
        )
    if str(out_dtype) not in (data_dtype, "float32"):
        raise ValueError(f"out_dtype must be {data_dtype!r} or 'float32', got {out_dtype!r}")
    return scale, int(zero_point)


def check_quantized_roi_align_args(data_shape, data_dtype, rois_shape, rois_dtype, pooled_size,
                                   layout, scale, zero_point, out_dtype):
    """ValueError / TypeError naming the argument; returns ``((PH, PW), scale, zero_point)``."""
    check_layout(layout)
    pooled = normalize_pooled_size(pooled_size)
    check_data_rank(data_shape, layout)
    check_rois_shape(rois_shape)
    scale, zero_point = check_quantization(data_dtype, scale, zero_point, out_dtype)
    check_rois_dtype(rois_dtype, data_dtype)
    return pooled, scale, zero_point


def _requantize(average, zero_point, dtype):
    low, high = QUANTIZED_DTYPES[dtype]
    q = tirx.nearbyint(average) + tirx.const(float(zero_point), "float32")
    clamped = te.min(te.max(q, tirx.const(float(low), "float32")), tirx.const(float(high), "float32"))
    return clamped.astype(dtype)


def _quantized_roi_align(data, rois, pooled_size, scale, zero_point, spatial_scale, sampling_ratio,
                         aligned, layout, out_dtype, target):
    pooled, scale, zero_point = check_quantized_roi_align_args(
        data.shape, data.dtype, rois.shape, rois.dtype, pooled_size, layout, scale, zero_point,
        out_dtype,
    )
    spatial_scale = check_spatial_scale(spatial_scale)
    sampling_ratio, aligned, out_dtype = int(sampling_ratio), bool(aligned), str(out_dtype)
    num_batch, channels, _, _ = data_dims(data.shape, layout)
    target = resolve_target(target)

    def geometry(roi, acc, idx):
        return roi_geometry(roi, num_batch, pooled, spatial_scale, sampling_ratio, aligned, acc,
                            idx, aligned, target)

    def output(average):
        if out_dtype == "float32":
            return average * tirx.const(scale, "float32")
        return _requantize(average, zero_point, out_dtype)

    return pooled_compute(data, rois, pooled, geometry, channels, "avg", layout,
                          f"quantized_roi_align_{layout.lower()}", zero_point=zero_point,
                          output=output)


def quantized_roi_align_nchw(data, rois, pooled_size, scale, zero_point, spatial_scale=1.0,
                             sampling_ratio=-1, aligned=False, out_dtype="uint8", *, target=None):
    """Quantized RoIAlign of ``data [N, C, H, W]`` (uint8 / int8, ``real = (q - zero_point) *
    scale``) and float32 ``rois [K, 5]`` -> ``[K, C, PH, PW]`` of ``out_dtype`` (the data's dtype:
    requantized; ``"float32"``: dequantized). ``aligned``: torchvision's (shift by -0.5 after
    scaling). ValueError / TypeError naming a bad argument."""
    return _quantized_roi_align(data, rois, pooled_size, scale, zero_point, spatial_scale,
                                sampling_ratio, aligned, "NCHW", out_dtype, target)


def quantized_roi_align_nhwc(data, rois, pooled_size, scale, zero_point, spatial_scale=1.0,
                             sampling_ratio=-1, aligned=False, out_dtype="uint8", *, target=None):
    """:func:`quantized_roi_align_nchw` on ``data [N, H, W, C]`` -> ``[K, PH, PW, C]``."""
    return _quantized_roi_align(data, rois, pooled_size, scale, zero_point, spatial_scale,
                                sampling_ratio, aligned, "NHWC", out_dtype, target)


def quantized_roi_align(data, rois, pooled_size, scale, zero_point, spatial_scale=1.0,
                        sampling_ratio=-1, aligned=False, layout="NCHW", out_dtype="uint8", *,
                        target=None):
    """:func:`quantized_roi_align_nchw` or :func:`quantized_roi_align_nhwc` by ``layout``."""
    compute = by_layout(layout, quantized_roi_align_nchw, quantized_roi_align_nhwc)
    return compute(data, rois, pooled_size, scale, zero_point, spatial_scale, sampling_ratio,
                   aligned, out_dtype, target=target)
