"""Rotated RoIAlign compute definitions (TE) for NCHW and NHWC (detectron2 / mmcv / OpenVINO).

The contract
------------
Inputs
    data : ``[N, C, H, W]`` (NCHW) or ``[N, H, W, C]`` (NHWC), float16/32/64.
    rois : ``[K, 6]`` rows of ``(batch_index, cx, cy, w, h, angle)`` in input-image pixels, data's
        dtype.
Output
    ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC), data's dtype.

Per roi: ``centre = c * spatial_scale - offset`` (offset 0.5 when ``aligned``, else 0; the product
rounded on its own), ``size = w * spatial_scale`` (clamped to >= 1 unless ``aligned``), ``theta =
angle`` (``angle_unit="radians"``) or ``angle * pi / 180`` (``"degrees"``), negated when
``clockwise``. The ``PH x PW`` bins and their ``grid_h x grid_w`` samples (``sampling_ratio``, or
adaptive ``ceil(size / pooled)`` per side) are RoIAlign's, laid out in the roi's own frame with
``start = -size / 2``; a point ``(yy, xx)`` is then turned about the centre:
``y = yy * cos(theta) - xx * sin(theta) + centre_y``, ``x = yy * sin(theta) + xx * cos(theta) +
centre_x`` (each product rounded once), and sampled bilinearly with RoIAlign's out-of-map rule.
The average is the sum over ``max(grid_h * grid_w, 1)``; an empty grid (a zero or negative size
with an adaptive grid) gives 0; a NaN / infinite coordinate or angle, or a batch index outside
``[0, N)``, gives a row of zeros; every index is clamped before use.

============================  ==============  ============  =========  =========================
convention                    ``angle_unit``  ``clockwise``  ``aligned`` rois
============================  ==============  ============  =========  =========================
detectron2 ``ROIAlignRotated``  degrees        False          True       ``[K, 6]``
mmcv ``RoIAlignRotated``        radians        its flag       its flag   ``[K, 6]``
OpenVINO ``ROIAlignRotated``    radians        clockwise_mode True       ``[K, 5]`` + batch indices
============================  ==============  ============  =========  =========================

The float64 NumPy reference is :func:`tvm_roialign.testing.roi_align_rotated_ref`.
"""

from __future__ import annotations

import math

from ._sampling import (
    LAYOUTS,
    accumulate_dtype,
    check_data_and_rois,
    check_layout,
    data_dims,
    index_dtype_for,
    normalize_pooled_size,
    output_shape,
    pooled_compute,
    rotated_roi_geometry,
)
from .roi_align import check_spatial_scale

__all__ = [
    "ANGLE_UNITS",
    "angle_scale",
    "check_roi_align_rotated_args",
    "roi_align_rotated",
    "roi_align_rotated_nchw",
    "roi_align_rotated_nhwc",
]

#: The row form of the rotated rois, for error messages.
ROTATED_ROW = "(batch_index, cx, cy, w, h, angle)"

#: Angle unit -> the factor that turns an angle into radians.
ANGLE_UNITS = {"radians": 1.0, "degrees": math.pi / 180.0}


def angle_scale(angle_unit: str) -> float:
    """Radians per ``angle_unit``; raises ValueError for an unknown unit."""
    if angle_unit not in ANGLE_UNITS:
        raise ValueError(f"angle_unit must be one of {tuple(ANGLE_UNITS)}, got {angle_unit!r}")
    return ANGLE_UNITS[angle_unit]


def check_roi_align_rotated_args(
    data_shape, data_dtype, rois_shape, rois_dtype, pooled_size, layout, angle_unit
):
    """Validate the arguments; raise ValueError / TypeError naming the argument. Returns
    ``(PH, PW)``."""
    check_layout(layout)
    angle_scale(angle_unit)
    check_data_and_rois(data_shape, data_dtype, rois_shape, rois_dtype, layout, 6, ROTATED_ROW)
    return normalize_pooled_size(pooled_size)


def _roi_align_rotated(data, rois, pooled_size, spatial_scale, sampling_ratio, aligned, clockwise,
                       angle_unit, layout):
    pooled = check_roi_align_rotated_args(
        data.shape, data.dtype, rois.shape, rois.dtype, pooled_size, layout, angle_unit
    )
    spatial_scale = check_spatial_scale(spatial_scale)
    num_batch, channels, _, _ = data_dims(data.shape, layout)
    acc = accumulate_dtype(data.dtype)
    idx = index_dtype_for(data.shape, output_shape(rois.shape[0], channels, pooled, layout))

    def geometry(k):
        return rotated_roi_geometry(
            lambda j: rois[k, j].astype(acc),
            num_batch,
            pooled,
            spatial_scale,
            int(sampling_ratio),
            bool(aligned),
            angle_scale(angle_unit),
            bool(clockwise),
            acc,
            idx,
        )

    return pooled_compute(
        data,
        rois.shape[0],
        pooled,
        geometry,
        lambda c, ph, pw: c,
        channels,
        "avg",
        layout,
        f"roi_align_rotated_{layout.lower()}",
    )


def roi_align_rotated_nchw(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1,
                           aligned=True, clockwise=False, angle_unit="degrees"):
    """Rotated RoIAlign on NCHW data (module docstring; detectron2's convention by default).

    Parameters
    ----------
    data : te.Tensor
        ``[N, C, H, W]``, float16/float32/float64.
    rois : te.Tensor
        ``[K, 6]`` of ``(batch_index, cx, cy, w, h, angle)``, dtype of ``data``.
    pooled_size : int or (int, int)
        ``(PH, PW)``, positive.
    spatial_scale : float
        Feature-map pixels per input-image pixel (positive).
    sampling_ratio : int
        Samples per bin side; ``<= 0`` is adaptive.
    aligned : bool
        Shift the centre by -0.5 after scaling and do not clamp the size (``False``: no shift,
        size >= 1, mmcv's ``aligned=False``).
    clockwise : bool
        A positive angle turns clockwise (mmcv's ``clockwise``, OpenVINO's ``clockwise_mode``).
    angle_unit : str
        ``"degrees"`` (detectron2) or ``"radians"`` (mmcv, OpenVINO).

    Returns
    -------
    te.Tensor
        ``[K, C, PH, PW]`` of ``data.dtype``.
    """
    return _roi_align_rotated(data, rois, pooled_size, spatial_scale, sampling_ratio, aligned,
                              clockwise, angle_unit, "NCHW")


def roi_align_rotated_nhwc(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1,
                           aligned=True, clockwise=False, angle_unit="degrees"):
    """Rotated RoIAlign on NHWC data: ``[N, H, W, C]`` -> ``[K, PH, PW, C]``; as
    :func:`roi_align_rotated_nchw`."""
    return _roi_align_rotated(data, rois, pooled_size, spatial_scale, sampling_ratio, aligned,
                              clockwise, angle_unit, "NHWC")


def roi_align_rotated(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1, aligned=True,
                      clockwise=False, angle_unit="degrees", layout="NCHW"):
    """Dispatcher over ``layout`` (``"NCHW"`` or ``"NHWC"``); raises ValueError otherwise."""
    args = (data, rois, pooled_size, spatial_scale, sampling_ratio, aligned, clockwise, angle_unit)
    if layout == "NCHW":
        return roi_align_rotated_nchw(*args)
    if layout == "NHWC":
        return roi_align_rotated_nhwc(*args)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
