"""Multi-level (FPN) RoIAlign compute (TE), NCHW and NHWC (torchvision's ``MultiScaleRoIAlign``).

Each roi is pooled from the one level torchvision's ``LevelMapper`` picks, computed in the kernel
in the accumulate dtype; that level is then pooled as :mod:`.roi_align` with its own
``spatial_scale``. Semantics in docs/semantics.md.

Only the chosen level is read: each level's sample is RoIAlign's own code with that level's
constants, chained with the lazy ``if_then_else`` on the level (a Let), and every branch's indices
are clamped to its own map. With an adaptive grid the loop extents are the chosen level's grid (a
``Select`` on the level, since an extent cannot refer to a Let variable). The blocks and loop order
are RoIAlign's, so that its schedule rules apply.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from tvm import te, tirx

from ._args import (
    FLOAT_DTYPES,
    accumulate_dtype,
    by_layout,
    check_layout_and_mode,
    check_rois_dtype,
    check_rois_shape,
    data_dims,
    data_form,
    index_dtype_for,
    is_static,
    normalize_pooled_size,
    output_shape,
    resolve_target,
)
from ._sampling import (
    accumulate_then_finalize,
    bilinear_coeffs,
    channel_reader,
    finalize,
    reduce_samples,
    roi_geometry,
    sample_point,
    sample_value,
)

__all__ = [
    "LEVEL_EPS",
    "check_multiscale_roi_align_args",
    "level_range",
    "multiscale_roi_align",
    "multiscale_roi_align_nchw",
    "multiscale_roi_align_nhwc",
]

#: The ``eps`` of torchvision's LevelMapper.
LEVEL_EPS = 1e-6


def level_range(spatial_scales) -> tuple[int, int]:
    """``(k_min, k_max)``: ``int(-log2(float32(scale)))`` of the first and last scale."""
    with np.errstate(all="ignore"):
        k_min = -float(np.log2(np.float32(spatial_scales[0])))
        k_max = -float(np.log2(np.float32(spatial_scales[-1])))
    return int(k_min), int(k_max)


def check_multiscale_roi_align_args(
    feature_shapes,
    feature_dtypes,
    rois_shape,
    rois_dtype,
    pooled_size,
    spatial_scales,
    layout,
    mode="avg",
    canonical_scale=224,
    canonical_level=4,
):
    """ValueError / TypeError naming the argument (``None`` dimensions: unknown); returns
    ``(PH, PW)``."""
    check_layout_and_mode(layout, mode)
    num_levels = len(feature_shapes)
    if num_levels == 0:
        raise ValueError("features must be a non-empty list of feature maps, got none")
    form = data_form(layout)
    for level, shape in enumerate(feature_shapes):
        if len(shape) != 4:
            raise ValueError(
                f"features[{level}] must be 4-D {form} for layout {layout}, got shape {list(shape)}"
            )
    dtypes = {str(d) for d in feature_dtypes}
    if len(dtypes) != 1:
        raise TypeError(
            f"features must all have one dtype, got {[str(d) for d in feature_dtypes]}"
        )
    dtype = dtypes.pop()
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"features dtype must be one of {FLOAT_DTYPES}, got {dtype}")
    for letter, name in (("N", "batch size N"), ("C", "channel count C")):
        dims = [shape[layout.index(letter)] for shape in feature_shapes]
        static = [int(d) for d in dims if d is not None and is_static(d)]
        if len(set(static)) > 1:
            raise ValueError(
                f"features must share the {name}, got {static} ({layout}) across levels"
            )
    check_rois_shape(rois_shape)
    check_rois_dtype(rois_dtype, dtype, "the features")
    scales = [float(s) for s in spatial_scales]
    if len(scales) != num_levels:
        raise ValueError(
            f"spatial_scales must have one scale per feature map ({num_levels}), got {scales}"
        )
    if any(not math.isfinite(s) or s <= 0 for s in scales):
        raise ValueError(f"spatial_scales must be positive finite floats, got {scales}")
    if float(canonical_scale) <= 0 or not math.isfinite(float(canonical_scale)):
        raise ValueError(f"canonical_scale must be positive, got {canonical_scale!r}")
    if int(canonical_level) != canonical_level:
        raise ValueError(f"canonical_level must be an int, got {canonical_level!r}")
    return normalize_pooled_size(pooled_size)


def _level_of(
    roi, num_levels, k_min, k_max, canonical_scale, canonical_level, acc, idx
):
    """``(level, level_ok)`` of one roi (``level`` is any value when not ``level_ok``)."""
    if num_levels == 1:
        return tirx.const(0, idx), tirx.const(True, "bool")
    width = roi(3) - roi(1)
    height = roi(4) - roi(2)
    size = tirx.sqrt(width * height)
    k = tirx.floor(
        tirx.const(float(canonical_level), acc)
        + tirx.log2(size / tirx.const(float(canonical_scale), acc))
        + tirx.const(LEVEL_EPS, acc)
    )
    # te.max / te.min are compare-and-select and would turn NaN into a bound: test NaN first
    is_nan = tirx.isnan(k)
    k = te.min(te.max(k, tirx.const(float(k_min), acc)), tirx.const(float(k_max), acc))
    # NaN never reaches the cast
    safe = tirx.Select(is_nan, tirx.const(float(k_min), acc), k)
    level = safe.astype(idx) - tirx.const(k_min, idx)
    level_ok = tirx.all(
        tirx.Not(is_nan),
        level >= tirx.const(0, idx),
        level < tirx.const(num_levels, idx),
    )
    return level, level_ok


def _multiscale_roi_align(features, rois, pooled_size, spatial_scales, sampling_ratio, aligned,
                          layout, canonical_scale, canonical_level, mode, half_pixel, target):
    features = list(features)
    pooled = check_multiscale_roi_align_args(
        [f.shape for f in features],
        [f.dtype for f in features],
        rois.shape,
        rois.dtype,
        pooled_size,
        spatial_scales,
        layout,
        mode,
        canonical_scale,
        canonical_level,
    )
    levels = _Levels(
        features, rois, pooled, [float(s) for s in spatial_scales], int(sampling_ratio),
        bool(aligned), layout, canonical_scale, canonical_level, mode, bool(half_pixel),
        resolve_target(target),
    )
    return accumulate_then_finalize(
        levels.out_shape, layout, levels.body, levels.final, f"multiscale_roi_align_{layout.lower()}"
    )


class _Levels:
    """The fused multi-level compute's pieces, for one call: each roi's level, its per-level
    RoIAlign geometry, its sampling grid, and the accumulation and finalization of one output."""

    def __init__(self, features, rois, pooled, scales, sampling_ratio, aligned, layout,
                 canonical_scale, canonical_level, mode, half_pixel, target):
        self.features, self.rois, self.pooled, self.scales = features, rois, pooled, scales
        self.sampling_ratio, self.aligned, self.half_pixel = sampling_ratio, aligned, half_pixel
        self.layout, self.mode, self.target = layout, mode, target
        self.canonical_scale, self.canonical_level = canonical_scale, canonical_level
        self.num_levels = len(features)
        self.k_min, self.k_max = level_range(scales)
        self.dtype = features[0].dtype
        self.dims = [data_dims(f.shape, layout) for f in features]  # (N, C, H, W) per level
        self.num_batch, channels = self.dims[0][:2]
        num_rois = rois.shape[0]
        self.out_shape = output_shape(num_rois, channels, pooled, layout)
        self.acc = accumulate_dtype(self.dtype)
        self.idx = index_dtype_for(*[f.shape for f in features], self.out_shape)
        # each roi's level (-1: none) in a stage of its own, computed once rather than per channel
        if self.num_levels > 1:
            self.level_table = te.compute(
                (num_rois,),
                lambda k: tirx.Select(
                    self._compute_level(k)[1], self._compute_level(k)[0], tirx.const(-1, self.idx)
                ),
                name="roi_level",
            )

    def _coordinate(self, k):
        return lambda j: self.rois[k, j].astype(self.acc)

    def _compute_level(self, k):
        return _level_of(
            self._coordinate(k),
            self.num_levels,
            self.k_min,
            self.k_max,
            self.canonical_scale,
            self.canonical_level,
            self.acc,
            self.idx,
        )

    def level_of(self, k):
        if self.num_levels == 1:
            return self._compute_level(k)
        level = self.level_table[k]
        return level, level >= tirx.const(0, self.idx)

    def geometry(self, k, index):
        """RoIAlign geometry of roi ``k`` on level ``index`` (its own constant scale)."""
        return roi_geometry(
            self._coordinate(k),
            self.num_batch,
            self.pooled,
            self.scales[index],
            self.sampling_ratio,
            self.aligned,
            self.acc,
            self.idx,
            self.half_pixel,
            self.target,
        )

    def select_level(self, level, values):
        """``values[level]`` (``values[0]`` for a level that is not ok: masked by the caller)."""
        expr = values[0]
        for index in range(1, self.num_levels):
            expr = tirx.Select(level == index, values[index], expr)
        return expr

    def grid(self, k):
        """The sampling grid of roi ``k`` (with an adaptive grid, that of its level)."""
        if self.sampling_ratio > 0:
            ratio = tirx.const(self.sampling_ratio, self.idx)
            return ratio, ratio
        level, _ = self.level_of(k)
        geos = [self.geometry(k, index) for index in range(self.num_levels)]
        return self.select_level(level, [g.grid_h for g in geos]), self.select_level(
            level, [g.grid_w for g in geos]
        )

    def _extent(self, k):
        grid_h, grid_w = self.grid(k)
        return dataclasses.replace(self.geometry(k, 0), grid_h=grid_h, grid_w=grid_w)

    def sample(self, k, c, ph, pw, index, iy, ix, level_ok):
        """One sample on level ``index``: RoIAlign's own code with that level's constants, so that
        no index or weight depends on a level chosen at run time."""
        geo = self.geometry(k, index)
        y, x = sample_point(geo, ph, pw, iy, ix, self.acc)
        ok = tirx.all(geo.roi_ok, level_ok)
        _, _, height, width = self.dims[index]
        co = bilinear_coeffs(y, x, height, width, ok, self.acc, self.idx)
        load = channel_reader(self.features[index], self.layout, geo.batch, c, self.acc)
        return sample_value(load, co, self.mode, self.acc)

    def body(self, k, c, ph, pw):
        def value(iy, ix):
            # the level bound once (fresh Let variables), only the chosen level's sample evaluated
            level_expr, ok_expr = self.level_of(k)
            if self.num_levels == 1:
                return self.sample(k, c, ph, pw, 0, iy, ix, ok_expr)
            level = tirx.Var("level", self.idx)
            level_ok = tirx.Var("level_ok", "bool")
            expr = self.sample(k, c, ph, pw, self.num_levels - 1, iy, ix, level_ok)
            for index in range(self.num_levels - 2, -1, -1):
                expr = tirx.if_then_else(
                    level == index, self.sample(k, c, ph, pw, index, iy, ix, level_ok), expr
                )
            return tirx.Let(level, level_expr, tirx.Let(level_ok, ok_expr, expr))

        return reduce_samples(value, self._extent(k), self.mode, self.acc)

    def final(self, k, accumulated):
        return finalize(accumulated, self._extent(k), self.mode, self.acc, self.dtype)


def multiscale_roi_align_nchw(features, rois, pooled_size, spatial_scales, sampling_ratio=2,
                              aligned=False, canonical_scale=224, canonical_level=4, mode="avg",
                              half_pixel=False, *, target=None):
    """Multi-level RoIAlign of ``L`` maps ``[N, C, H_l, W_l]`` (one float dtype, same ``N``, ``C``)
    and ``rois [K, 5]`` -> ``[K, C, PH, PW]``.

    ``spatial_scales``: one per level; ``canonical_scale``, ``canonical_level``: the level
    formula's ``s0`` and ``k0``; ``aligned``, ``half_pixel``, ``mode`` as RoIAlign's; ``target``:
    what the products are fenced for (default: the current target). ValueError / TypeError naming
    a bad argument.
    """
    return _multiscale_roi_align(features, rois, pooled_size, spatial_scales, sampling_ratio,
                                 aligned, "NCHW", canonical_scale, canonical_level, mode,
                                 half_pixel, target)


def multiscale_roi_align_nhwc(features, rois, pooled_size, spatial_scales, sampling_ratio=2,
                              aligned=False, canonical_scale=224, canonical_level=4, mode="avg",
                              half_pixel=False, *, target=None):
    """:func:`multiscale_roi_align_nchw` on maps ``[N, H_l, W_l, C]`` -> ``[K, PH, PW, C]``."""
    return _multiscale_roi_align(features, rois, pooled_size, spatial_scales, sampling_ratio,
                                 aligned, "NHWC", canonical_scale, canonical_level, mode,
                                 half_pixel, target)


def multiscale_roi_align(features, rois, pooled_size, spatial_scales, sampling_ratio=2,
                         aligned=False, layout="NCHW", canonical_scale=224, canonical_level=4,
                         mode="avg", half_pixel=False, *, target=None):
    """:func:`multiscale_roi_align_nchw` or :func:`multiscale_roi_align_nhwc` by ``layout``."""
    compute = by_layout(layout, multiscale_roi_align_nchw, multiscale_roi_align_nhwc)
    return compute(features, rois, pooled_size, spatial_scales, sampling_ratio, aligned,
                   canonical_scale, canonical_level, mode, half_pixel, target=target)
