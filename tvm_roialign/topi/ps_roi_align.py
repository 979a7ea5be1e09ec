"""Position-sensitive RoIAlign compute (TE), NCHW and NHWC (torchvision ``ps_roi_align``): output
channel ``c`` of bin ``(ph, pw)`` pools input channel ``(c * PH + ph) * PW + pw`` with RoIAlign's
geometry for torchvision's ``aligned=True``. Semantics in docs/semantics.md."""

from __future__ import annotations

from ._args import (
    by_layout,
    check_data_and_rois,
    check_layout,
    check_spatial_scale,
    data_dims,
    is_static,
    normalize_pooled_size,
    resolve_target,
)
from ._sampling import pooled_compute, roi_geometry

__all__ = ["check_ps_roi_align_args", "ps_roi_align", "ps_roi_align_nchw", "ps_roi_align_nhwc"]


def check_ps_roi_align_args(data_shape, data_dtype, rois_shape, rois_dtype, pooled_size, layout):
    """ValueError / TypeError naming the argument; returns ``((PH, PW), C)``, ``C`` None when the
    input channel count is not static."""
    check_layout(layout)
    pooled = normalize_pooled_size(pooled_size)
    check_data_and_rois(data_shape, data_dtype, rois_shape, rois_dtype, layout)
    channels = data_dims(data_shape, layout)[1]
    if not is_static(channels):
        return pooled, None
    bins = pooled[0] * pooled[1]
    if int(channels) % bins:
        raise ValueError(
            f"data channels ({int(channels)}) must be a multiple of PH * PW = {bins} "
            f"(pooled_size {pooled}) for ps_roi_align"
        )
    return pooled, int(channels) // bins


def _ps_roi_align(data, rois, pooled_size, spatial_scale, sampling_ratio, layout, target):
    pooled, channels = check_ps_roi_align_args(
        data.shape, data.dtype, rois.shape, rois.dtype, pooled_size, layout
    )
    if channels is None:
        raise ValueError("ps_roi_align needs a static data channel count")
    spatial_scale = check_spatial_scale(spatial_scale)
    sampling_ratio = int(sampling_ratio)
    num_batch = data_dims(data.shape, layout)[0]
    ph_count, pw_count = pooled
    target = resolve_target(target)

    def geometry(roi, acc, idx):
        return roi_geometry(roi, num_batch, pooled, spatial_scale, sampling_ratio, True, acc, idx,
                            True, target)

    def channel_of(c, ph, pw):
        return (c * ph_count + ph) * pw_count + pw

    return pooled_compute(data, rois, pooled, geometry, channels, "avg", layout,
                          f"ps_roi_align_{layout.lower()}", channel_of)


def ps_roi_align_nchw(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1, *,
                      target=None):
    """Position-sensitive RoIAlign of ``data [N, C * PH * PW, H, W]`` -> ``[K, C, PH, PW]``;
    ``target``: what the products are fenced for (default: the current target)."""
    return _ps_roi_align(data, rois, pooled_size, spatial_scale, sampling_ratio, "NCHW", target)


def ps_roi_align_nhwc(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1, *,
                      target=None):
    """:func:`ps_roi_align_nchw` on ``[N, H, W, C * PH * PW]`` -> ``[K, PH, PW, C]``."""
    return _ps_roi_align(data, rois, pooled_size, spatial_scale, sampling_ratio, "NHWC", target)


def ps_roi_align(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1, layout="NCHW", *,
                 target=None):
    """:func:`ps_roi_align_nchw` or :func:`ps_roi_align_nhwc` by ``layout``."""
    compute = by_layout(layout, ps_roi_align_nchw, ps_roi_align_nhwc)
    return compute(data, rois, pooled_size, spatial_scale, sampling_ratio, target=target)
