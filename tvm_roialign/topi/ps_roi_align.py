"""Position-sensitive RoIAlign compute definitions (TE) for NCHW and NHWC (torchvision ``ps_roi_align``).

The contract
------------
Inputs
    data : ``[N, C_in, H, W]`` (NCHW) or ``[N, H, W, C_in]`` (NHWC), float16/32/64, with
        ``C_in = C * PH * PW``.
    rois : ``[K, 5]`` rows of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels, data's dtype.
Output
    ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC), data's dtype.

Output channel ``c`` of bin ``(ph, pw)`` is the average of the bilinear samples of input channel
``(c * PH + ph) * PW + pw`` over the bin's sampling grid. The geometry is RoIAlign's with
torchvision's ``aligned=True`` (:mod:`tvm_roialign.topi.roi_align`): ``start = x1 * spatial_scale
- 0.5`` (the product rounded on its own), no size clamp, ``grid = sampling_ratio`` or adaptive
``ceil(roi_size / pooled_size)``, the sum divided by ``max(grid_h * grid_w, 1)`` (an empty grid
gives 0), the same out-of-map rule. A NaN / infinite coordinate or a batch index outside ``[0, N)``
gives a row of zeros; every index is clamped before use. The blocks are named ``roi_align_acc`` /
``roi_align`` as RoIAlign's, so that its schedules apply.
"""

from __future__ import annotations

from ._sampling import (
    LAYOUTS,
    accumulate_dtype,
    check_data_and_rois,
    check_layout,
    data_dims,
    index_dtype_for,
    is_static,
    normalize_pooled_size,
    output_shape,
    pooled_compute,
    roi_geometry,
)
from .roi_align import check_spatial_scale

__all__ = ["check_ps_roi_align_args", "ps_roi_align", "ps_roi_align_nchw", "ps_roi_align_nhwc"]


def check_ps_roi_align_args(data_shape, data_dtype, rois_shape, rois_dtype, pooled_size, layout):
    """Validate the arguments; raise ValueError / TypeError naming the argument.

    Returns ``((PH, PW), C)``: the pooled size and the output channel count (None when the input
    channel count is symbolic or unknown).
    """
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


def _ps_roi_align(data, rois, pooled_size, spatial_scale, sampling_ratio, layout):
    pooled, channels = check_ps_roi_align_args(
        data.shape, data.dtype, rois.shape, rois.dtype, pooled_size, layout
    )
    if channels is None:
        raise ValueError("ps_roi_align needs a static data channel count")
    spatial_scale = check_spatial_scale(spatial_scale)
    sampling_ratio = int(sampling_ratio)
    num_batch = data_dims(data.shape, layout)[0]
    acc = accumulate_dtype(data.dtype)
    idx = index_dtype_for(data.shape, output_shape(rois.shape[0], channels, pooled, layout))
    ph_count, pw_count = pooled

    def geometry(k):
        return roi_geometry(
            lambda j: rois[k, j].astype(acc),
            num_batch,
            pooled,
            spatial_scale,
            sampling_ratio,
            True,
            acc,
            idx,
            half_pixel=True,
        )

    def channel_of(c, ph, pw):
        return (c * ph_count + ph) * pw_count + pw

    return pooled_compute(
        data,
        rois.shape[0],
        pooled,
        geometry,
        channel_of,
        channels,
        "avg",
        layout,
        f"ps_roi_align_{layout.lower()}",
    )


def ps_roi_align_nchw(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1):
    """Position-sensitive RoIAlign on NCHW data (torchvision ``ps_roi_align``).

    Parameters
    ----------
    data : te.Tensor
        ``[N, C * PH * PW, H, W]``, float16/float32/float64.
    rois : te.Tensor
        ``[K, 5]`` of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels, dtype of ``data``.
    pooled_size : int or (int, int)
        ``(PH, PW)``, positive.
    spatial_scale : float
        Feature-map pixels per input-image pixel (positive).
    sampling_ratio : int
        Samples per bin side; ``<= 0`` is adaptive.

    Returns
    -------
    te.Tensor
        ``[K, C, PH, PW]`` of ``data.dtype``.

    Raises
    ------
    ValueError, TypeError
        A wrong rank, rois not ``[K, 5]``, channels not a multiple of ``PH * PW``, non-positive
        sizes or scale, non-float or mismatched dtypes.
    """
    return _ps_roi_align(data, rois, pooled_size, spatial_scale, sampling_ratio, "NCHW")


def ps_roi_align_nhwc(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1):
    """Position-sensitive RoIAlign on NHWC data: ``[N, H, W, C * PH * PW]`` -> ``[K, PH, PW, C]``.

    Arguments, semantics and errors as :func:`ps_roi_align_nchw`.
    """
    return _ps_roi_align(data, rois, pooled_size, spatial_scale, sampling_ratio, "NHWC")


def ps_roi_align(data, rois, pooled_size, spatial_scale=1.0, sampling_ratio=-1, layout="NCHW"):
    """Dispatcher over ``layout`` (``"NCHW"`` or ``"NHWC"``); raises ValueError otherwise."""
    args = (data, rois, pooled_size, spatial_scale, sampling_ratio)
    if layout == "NCHW":
        return ps_roi_align_nchw(*args)
    if layout == "NHWC":
        return ps_roi_align_nhwc(*args)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
