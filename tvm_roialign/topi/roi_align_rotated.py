"""Rotated RoIAlign compute (TE), NCHW and NHWC: rois ``[K, 6]`` of ``(batch_index, cx, cy, w, h,
angle)``; detectron2's convention by default, mmcv's and OpenVINO's by the arguments. Semantics in
docs/semantics.md; float64 reference :func:`tvm_roialign.testing.roi_align_rotated_ref`."""

from __future__ import annotations

import math

from ._args import (
    by_layout,
    check_data_and_rois,
    check_layout,
    check_spatial_scale,
    data_dims,
    normalize_pooled_size,
    resolve_target,
)
from ._sampling import pooled_compute, rotated_roi_geometry

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
    """Radians per ``angle_unit``; ValueError for an unknown unit."""
    if angle_unit not in ANGLE_UNITS:
        raise ValueError(f"angle_unit must be one of {tuple(ANGLE_UNITS)}, got {angle_unit!r}")
    return ANGLE_UNITS[angle_unit]


def check_roi_align_rotated_args(
    data_shape, data_dtype, rois_shape, rois_dtype, pooled_size, layout, angle_unit
):
    """ValueError / TypeError naming the argument; returns ``(PH, PW)``."""
    check_layout(layout)
    angle_scale(angle_unit)
    check_data_and_rois(data_shape, data_dtype, rois_shape, rois_dtype, layout, 6, ROTATED_ROW)
    return normalize_pooled_size(pooled_size)


def _roi_align_rotated(data, rois, pooled_size, spatial_scale, sampling_ratio, aligned, clockwise,
                       angle_unit, layout, target):
    pooled = check_roi_align_rotated_args(
        data.shape, data.dtype, rois.shape, rois.dtype, pooled_size, layout, angle_unit
    )
    spatial_scale = check_spatial_scale(spatial_scale)
    num_batch, channels, _, _ = data_dims(data.shape, layout)
    target = resolve_target(target)

    def geometry(roi, acc, idx):
        return rotated_roi_geometry(roi, num_batch, pooled, spatial_scale, int(sampling_ratio),
                                    bool(aligned), angle_scale(angle_unit), bool(clockwise), acc,
                                    idx, target)

    return pooled_compute(data, rois, pooled, geometry, channels, "avg", layout,
                          f"roi_align_rotated_{layout.lower()}")


def roi_align_rotated_nchw(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1,
                           aligned=True, clockwise=False, angle_unit="degrees", *, target=None):
    """Rotated RoIAlign of ``data [N, C, H, W]`` -> ``[K, C, PH, PW]``.

    ``aligned``: shift the centre by -0.5 after scaling, no >= 1 size clamp; ``clockwise``: a
    positive angle turns clockwise; ``angle_unit``: ``"degrees"`` or ``"radians"``; ``target``:
    what the products are fenced for (default: the current target).
    """
    return _roi_align_rotated(data, rois, pooled_size, spatial_scale, sampling_ratio, aligned,
                              clockwise, angle_unit, "NCHW", target)


def roi_align_rotated_nhwc(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1,
                           aligned=True, clockwise=False, angle_unit="degrees", *, target=None):
    """:func:`roi_align_rotated_nchw` on ``[N, H, W, C]`` -> ``[K, PH, PW, C]``."""
    return _roi_align_rotated(data, rois, pooled_size, spatial_scale, sampling_ratio, aligned,
                              clockwise, angle_unit, "NHWC", target)


def roi_align_rotated(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1, aligned=True,
                      clockwise=False, angle_unit="degrees", layout="NCHW", *, target=None):
    """:func:`roi_align_rotated_nchw` or :func:`roi_align_rotated_nhwc` by ``layout``."""
    compute = by_layout(layout, roi_align_rotated_nchw, roi_align_rotated_nhwc)
    return compute(data, rois, pooled_size, spatial_scale, sampling_ratio, aligned, clockwise,
                   angle_unit, target=target)
