"""RoIAlign compute (TE), NCHW and NHWC; the semantics (rounding, sampling grid, modes, invalid
rois) are in docs/semantics.md. Blocks ``roi_align_acc`` and ``roi_align`` are what the schedules
find by name."""

from __future__ import annotations

from ._args import (
    LAYOUTS,
    MODES,
    by_layout,
    check_data_and_rois,
    check_layout_and_mode,
    check_spatial_scale,
    data_dims,
    normalize_pooled_size,
    resolve_target,
)
from ._sampling import MAX_ADAPTIVE_GRID, pooled_compute, roi_geometry

__all__ = [
    "LAYOUTS",
    "MAX_ADAPTIVE_GRID",
    "MODES",
    "check_roi_align_args",
    "check_spatial_scale",
    "roi_align",
    "roi_align_nchw",
    "roi_align_nhwc",
]


def check_roi_align_args(data_shape, data_dtype, rois_shape, rois_dtype, pooled_size, layout, mode):
    """ValueError / TypeError naming the argument; returns ``(PH, PW)``."""
    check_layout_and_mode(layout, mode)
    check_data_and_rois(data_shape, data_dtype, rois_shape, rois_dtype, layout)
    return normalize_pooled_size(pooled_size)


def _roi_align(data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned, layout,
               half_pixel, target):
    pooled = check_roi_align_args(
        data.shape, data.dtype, rois.shape, rois.dtype, pooled_size, layout, mode
    )
    spatial_scale = check_spatial_scale(spatial_scale)
    sampling_ratio = int(sampling_ratio)
    num_batch, channels, _, _ = data_dims(data.shape, layout)
    target = resolve_target(target)

    def geometry(roi, acc, idx):
        return roi_geometry(roi, num_batch, pooled, spatial_scale, sampling_ratio, aligned, acc,
                            idx, half_pixel, target)

    return pooled_compute(data, rois, pooled, geometry, channels, mode, layout,
                          f"roi_align_{layout.lower()}")


def roi_align_nchw(data, rois, pooled_size, spatial_scale=1.0, mode="avg", sampling_ratio=-1,
                   aligned=False, half_pixel=False, *, target=None):
    """RoIAlign of ``data [N, C, H, W]`` and ``rois [K, 5]`` -> ``[K, C, PH, PW]``.

    ``mode``: ``"avg"``, ``"max"`` or ``"onnx_max"``; ``sampling_ratio <= 0``: adaptive grid;
    ``aligned`` (stock TVM): no >= 1 clamp of the roi size; ``half_pixel``: subtract 0.5 after
    scaling; ``target``: what the products are fenced for (default: the current target).
    ValueError / TypeError naming a bad argument.
    """
    return _roi_align(data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned,
                      "NCHW", half_pixel, target)


def roi_align_nhwc(data, rois, pooled_size, spatial_scale=1.0, mode="avg", sampling_ratio=-1,
                   aligned=False, half_pixel=False, *, target=None):
    """:func:`roi_align_nchw` on ``data [N, H, W, C]`` -> ``[K, PH, PW, C]``."""
    return _roi_align(data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned,
                      "NHWC", half_pixel, target)


def roi_align(data, rois, pooled_size, spatial_scale=1.0, mode="avg", sampling_ratio=-1,
              aligned=False, layout="NCHW", half_pixel=False, *, target=None):
    """:func:`roi_align_nchw` or :func:`roi_align_nhwc` by ``layout``."""
    compute = by_layout(layout, roi_align_nchw, roi_align_nhwc)
    return compute(data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned,
                   half_pixel, target=target)
