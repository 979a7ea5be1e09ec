"""RoIAlign compute definitions (TE) for NCHW and NHWC.

The contract
------------
Inputs
    data : ``[N, C, H, W]`` (``layout="NCHW"``) or ``[N, H, W, C]`` (``layout="NHWC"``),
        float16, float32 or float64.
    rois : ``[K, 5]`` rows of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels, same dtype
        as ``data``.
Output
    ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC), dtype of ``data``.

Per roi (``spatial_scale`` maps input-image pixels to feature-map pixels):

* ``roi_start = x1 * spatial_scale - offset``, ``roi_end = x2 * spatial_scale - offset`` (same for
  y), in the accumulate dtype and in this order, the product rounded on its own (never fused into a
  multiply-add, see :func:`exact_product`), so that the roi size and an adaptive grid are exactly
  torchvision's at every scale. ``offset`` is 0.5 with ``half_pixel=True``, else 0.
  ``aligned=False`` clamps the roi width and height to at least 1 (a NaN size stays NaN),
  ``aligned=True`` does not.

  ========================  ===============================  ========================================
  name                      where                            meaning
  ========================  ===============================  ========================================
  ``aligned``               ``relax.vision.roi_align``       stock TVM: no >= 1 clamp of the roi size;
                            attribute, this module           no shift
  ``half_pixel``            this module, the ops' attributes subtract 0.5 after scaling
                            (``DictAttrs``)
  torchvision ``aligned``,  :func:`tvm_roialign.roi_align`,  ``aligned=True, half_pixel=True``
  ONNX ``half_pixel``       the importers
  ========================  ===============================  ========================================

* The roi is cut into ``PH x PW`` bins; each bin is sampled on a regular grid of
  ``grid_h x grid_w`` points, ``grid = sampling_ratio`` when ``sampling_ratio > 0`` and
  ``ceil(roi_size / pooled_size)`` otherwise (adaptive; a non-finite size gives an empty grid and the
  grid is capped at ``MAX_ADAPTIVE_GRID`` per side so that no box can make the kernel run unbounded).
* Bilinear sampling follows torchvision's CPU kernel: a sample with ``y < -1``, ``y > H``, ``x < -1``
  or ``x > W`` contributes 0; otherwise negative coordinates are clamped to 0 and the upper corner is
  clamped to ``H - 1`` / ``W - 1``.
* ``mode="avg"``: sum of the samples divided by ``max(grid_h * grid_w, 1)`` (torchvision, Caffe2).
  ``mode="max"``: the maximum of the interpolated sample values (Caffe2 / mmcv, stock TVM's meaning).
  ``mode="onnx_max"``: the maximum over samples of the largest of the four weighted corner terms
  ``w_i * v_i`` (the ONNX ``RoiAlign`` specification, onnx.reference and onnxruntime).
  An empty grid gives 0 in every mode.
* A NaN or infinite coordinate (x1, y1, x2 or y2) makes every sample of the roi invalid, and a batch
  index outside ``[0, N)`` (after truncation toward zero, as torchvision's ``int`` cast; NaN and
  infinities included) is invalid too: the roi's row is 0. No memory outside ``data`` is ever read,
  because every index is clamped before it is used.
* float16 data are accumulated in float32 (float64 for float64) and returned as float16.
* Index arithmetic is int64 when ``data`` or the output has more than ``2**31 - 1`` elements (or a
  symbolic dimension), int32 otherwise.

The reduction block is named ``roi_align_acc`` and the block that writes the output ``roi_align``, so
that schedules find them by name.
"""

from __future__ import annotations

import math

from ._sampling import (
    LAYOUTS,
    MAX_ADAPTIVE_GRID,
    MODES,
    accumulate_dtype,
    check_data_and_rois,
    check_layout_and_mode,
    data_dims,
    index_dtype_for,
    normalize_pooled_size,
    output_shape,
    pooled_compute,
    roi_geometry,
)

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
    """Validate RoIAlign arguments; raise ValueError / TypeError naming the argument.

    Returns ``(PH, PW)``.
    """
    check_layout_and_mode(layout, mode)
    check_data_and_rois(data_shape, data_dtype, rois_shape, rois_dtype, layout)
    return normalize_pooled_size(pooled_size)


def check_spatial_scale(spatial_scale) -> float:
    """``float(spatial_scale)``; raises ValueError unless positive and finite."""
    spatial_scale = float(spatial_scale)
    if not math.isfinite(spatial_scale) or spatial_scale <= 0:
        raise ValueError(f"spatial_scale must be a positive finite float, got {spatial_scale}")
    return spatial_scale


def _roi_align(data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned, layout,
               half_pixel):
    pooled = check_roi_align_args(
        data.shape, data.dtype, rois.shape, rois.dtype, pooled_size, layout, mode
    )
    spatial_scale = check_spatial_scale(spatial_scale)
    sampling_ratio = int(sampling_ratio)
    num_batch, channels, _, _ = data_dims(data.shape, layout)
    out_shape = output_shape(rois.shape[0], channels, pooled, layout)
    acc = accumulate_dtype(data.dtype)
    idx = index_dtype_for(data.shape, out_shape)

    def geometry(k):
        return roi_geometry(
            lambda j: rois[k, j].astype(acc),
            num_batch,
            pooled,
            spatial_scale,
            sampling_ratio,
            aligned,
            acc,
            idx,
            half_pixel,
        )

    return pooled_compute(
        data,
        rois.shape[0],
        pooled,
        geometry,
        lambda c, ph, pw: c,
        channels,
        mode,
        layout,
        f"roi_align_{layout.lower()}",
    )


def roi_align_nchw(data, rois, pooled_size, spatial_scale=1.0, mode="avg", sampling_ratio=-1,
                   aligned=False, half_pixel=False):
    """RoIAlign on NCHW data.

    Parameters
    ----------
    data : te.Tensor
        ``[N, C, H, W]``, float16/float32/float64.
    rois : te.Tensor
        ``[K, 5]`` of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels, dtype of ``data``.
    pooled_size : int or (int, int)
        Output ``(PH, PW)``, positive.
    spatial_scale : float
        Feature-map pixels per input-image pixel (positive).
    mode : str
        ``"avg"``, ``"max"`` (max of interpolated samples, Caffe2/mmcv) or ``"onnx_max"``.
    sampling_ratio : int
        Samples per bin side; ``<= 0`` is adaptive ``ceil(roi_size / pooled_size)``.
    aligned : bool
        Stock TVM's meaning: ``False`` clamps the roi size to at least 1; no shift (module doc).
    half_pixel : bool
        Subtract 0.5 from the scaled coordinates (``x * spatial_scale - 0.5``). torchvision's
        ``aligned=True`` and ONNX's ``half_pixel`` are ``aligned=True, half_pixel=True``.

    Returns
    -------
    te.Tensor
        ``[K, C, PH, PW]`` of ``data.dtype``; the output block is named ``roi_align``.

    Raises
    ------
    ValueError, TypeError
        On a wrong rank, rois not ``[K, 5]``, unknown mode, non-positive pooled size or
        spatial_scale, non-float or mismatched dtypes.
    """
    return _roi_align(data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned,
                      "NCHW", half_pixel)


def roi_align_nhwc(data, rois, pooled_size, spatial_scale=1.0, mode="avg", sampling_ratio=-1,
                   aligned=False, half_pixel=False):
    """RoIAlign on NHWC data: ``data [N, H, W, C]`` -> ``[K, PH, PW, C]``.

    Arguments, semantics and errors as :func:`roi_align_nchw`.
    """
    return _roi_align(data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned,
                      "NHWC", half_pixel)


def roi_align(data, rois, pooled_size, spatial_scale=1.0, mode="avg", sampling_ratio=-1,
              aligned=False, layout="NCHW", half_pixel=False):
    """RoIAlign dispatcher over ``layout`` (``"NCHW"`` or ``"NHWC"``); raises ValueError otherwise."""
    args = (data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned, half_pixel)
    if layout == "NCHW":
        return roi_align_nchw(*args)
    if layout == "NHWC":
        return roi_align_nhwc(*args)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
