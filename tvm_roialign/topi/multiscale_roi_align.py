"""Multi-level (FPN) RoIAlign compute definitions (TE) for NCHW and NHWC.

The contract
------------
Inputs
    features : ``L`` feature maps, level ``l`` of shape ``[N, C, H_l, W_l]`` (``layout="NCHW"``) or
        ``[N, H_l, W_l, C]`` (``layout="NHWC"``); all of one dtype (float16, float32 or float64) and
        the same ``N`` and ``C``.
    rois : ``[K, 5]`` rows of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels, dtype of the
        features.
Output
    ``[K, C, PH, PW]`` (NCHW) or ``[K, PH, PW, C]`` (NHWC), dtype of the features.

Each roi is pooled from one level only, chosen inside the kernel as torchvision's ``LevelMapper``
(``torchvision.ops.poolers``) does, in the accumulate dtype (float32 for float16/float32 data,
float64 for float64)::

    k = floor(canonical_level + log2(sqrt((x2 - x1) * (y2 - y1)) / canonical_scale) + 1e-6)
    k = min(max(k, k_min), k_max)            # torch.clamp(min=k_min, max=k_max)
    level = int(k) - k_min                   # index into ``features``

with ``k_min = int(-log2(spatial_scales[0]))`` and ``k_max = int(-log2(spatial_scales[-1]))``
(float32 ``log2``, truncated toward zero, as torchvision's ``_setup_scales``). A roi whose level is
NaN (negative area) or falls outside ``[0, L)`` gives a row of zeros, as in torchvision, where no
level selects it. With a single level, every roi is pooled from it (torchvision calls ``roi_align``
directly then).

The chosen level is then pooled exactly as :func:`tvm_roialign.topi.roi_align` with that level's
``spatial_scale`` (same sampling grid, bilinear rule, averaging and safety guarantees; see that
module's docstring). ``aligned`` and ``half_pixel`` mean what they mean there: ``aligned`` drops the
>= 1 clamp of the roi size, ``half_pixel`` subtracts 0.5 after scaling (``x * spatial_scale_l -
0.5``); torchvision's ``aligned=True`` is both.

Only the chosen level is read and sampled: the level is computed once per sample (a Let; LLVM
hoists it out of the channel loop), and the sample is an ``if_then_else`` chain over the levels
whose branch ``l`` is RoIAlign's own sample code with level ``l``'s constants (scale, height,
width). ``if_then_else`` evaluates only the taken branch, and every branch's indices are clamped to
its own map, so no memory outside a feature map is read. (Selecting the scale, height and width by
the level inside one shared sample would put ``Select``s on the level into every index and weight;
TVM's arithmetic analyzer substitutes Let-bound values, and compiling that took ~100x longer.)
With an adaptive grid the loop extents are the chosen level's grid (a ``Select`` over the levels'
grids on the level expression, since an extent cannot refer to a Let variable).

The reduction block is named ``roi_align_acc`` and the output block ``roi_align``, with the loop
order of RoIAlign (NCHW: K, C, PH, PW; NHWC: K, PH, PW, C), so that the RoIAlign schedule rules of
:mod:`tvm_roialign.strategies` apply unchanged.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from tvm import te, tirx

from ._sampling import (
    FLOAT_DTYPES,
    LAYOUTS,
    accumulate_dtype,
    accumulate_then_finalize,
    bilinear_coeffs,
    channel_reader,
    check_layout_and_mode,
    check_rois_shape,
    data_dims,
    data_form,
    finalize,
    index_dtype_for,
    is_static,
    normalize_pooled_size,
    output_shape,
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
    """``(k_min, k_max)`` from the first and last scale, as torchvision's ``_setup_scales``.

    ``k = int(-log2(float32(scale)))`` (truncation toward zero).
    """
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
    """Validate multi-level RoIAlign arguments; raise ValueError / TypeError naming the argument.

    ``feature_shapes`` may contain ``None`` dimensions (unknown). Returns ``(PH, PW)``.
    """
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
    if str(rois_dtype) != dtype:
        raise TypeError(
            f"rois dtype ({rois_dtype}) must equal the features dtype ({dtype})"
        )
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
    """``(level, level_ok)`` of one roi: torchvision's LevelMapper (see the module docstring).

    ``level`` indexes the features (any value when ``level_ok`` is false: NaN level, or a level
    that no feature map has).
    """
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
                          layout, canonical_scale, canonical_level, mode, half_pixel):
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
    )
    return accumulate_then_finalize(
        levels.out_shape, layout, levels.body, levels.final, f"multiscale_roi_align_{layout.lower()}"
    )


class _Levels:
    """The fused multi-level compute's pieces, for one call: each roi's level, its per-level
    RoIAlign geometry, its sampling grid, and the accumulation and finalization of one output."""

    def __init__(self, features, rois, pooled, scales, sampling_ratio, aligned, layout,
                 canonical_scale, canonical_level, mode, half_pixel):
        self.features, self.rois, self.pooled, self.scales = features, rois, pooled, scales
        self.sampling_ratio, self.aligned, self.half_pixel = sampling_ratio, aligned, half_pixel
        self.layout, self.mode = layout, mode
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
        # The level of each roi is computed once, in a stage of its own (``roi_level``: the level,
        # or -1 when there is none): computed inside the samples it would be evaluated again for
        # every channel vector, and ``log2`` is an opaque library call that LLVM does not hoist.
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
            # The level is bound once (a Let; TIR wants SSA, so fresh variables per binding) and
            # only the chosen level's sample is evaluated (if_then_else is lazy).
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
                              half_pixel=False):
    """Multi-level RoIAlign on NCHW feature maps (torchvision's ``MultiScaleRoIAlign``).

    Parameters
    ----------
    features : list of te.Tensor
        ``L`` maps ``[N, C, H_l, W_l]``, one float dtype, same ``N`` and ``C``.
    rois : te.Tensor
        ``[K, 5]`` of ``(batch_index, x1, y1, x2, y2)`` in input-image pixels, features' dtype.
    pooled_size : int or (int, int)
        Output ``(PH, PW)``, positive.
    spatial_scales : list of float
        Feature-map pixels per input-image pixel, one per level (``2 ** -k`` in an FPN).
    sampling_ratio : int
        Samples per bin side; ``<= 0`` is adaptive.
    aligned : bool
        Stock TVM's meaning, as :func:`tvm_roialign.topi.roi_align`: no >= 1 clamp of the roi size.
    canonical_scale, canonical_level : int
        ``s0`` and ``k0`` of the FPN level formula (224 and 4 in torchvision).
    mode : str
        ``"avg"`` (torchvision); ``"max"`` and ``"onnx_max"`` as in RoIAlign.
    half_pixel : bool
        Subtract 0.5 after scaling, per level. torchvision's ``aligned=True`` is
        ``aligned=True, half_pixel=True``.

    Returns
    -------
    te.Tensor
        ``[K, C, PH, PW]`` of the features' dtype; blocks ``roi_align_acc`` and ``roi_align``.

    Raises
    ------
    ValueError, TypeError
        On an empty list, a wrong rank, levels that disagree on ``N``/``C``/dtype, rois not
        ``[K, 5]``, one scale per level missing or non-positive, a non-positive pooled size.
    """
    return _multiscale_roi_align(features, rois, pooled_size, spatial_scales, sampling_ratio,
                                 aligned, "NCHW", canonical_scale, canonical_level, mode,
                                 half_pixel)


def multiscale_roi_align_nhwc(features, rois, pooled_size, spatial_scales, sampling_ratio=2,
                              aligned=False, canonical_scale=224, canonical_level=4, mode="avg",
                              half_pixel=False):
    """Multi-level RoIAlign on NHWC maps ``[N, H_l, W_l, C]`` -> ``[K, PH, PW, C]``.

    Arguments, semantics and errors as :func:`multiscale_roi_align_nchw`.
    """
    return _multiscale_roi_align(features, rois, pooled_size, spatial_scales, sampling_ratio,
                                 aligned, "NHWC", canonical_scale, canonical_level, mode,
                                 half_pixel)


def multiscale_roi_align(features, rois, pooled_size, spatial_scales, sampling_ratio=2,
                         aligned=False, layout="NCHW", canonical_scale=224, canonical_level=4,
                         mode="avg", half_pixel=False):
    """Dispatcher over ``layout`` (``"NCHW"`` or ``"NHWC"``); raises ValueError otherwise."""
    impls = {"NCHW": multiscale_roi_align_nchw, "NHWC": multiscale_roi_align_nhwc}
    if layout not in impls:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return impls[layout](features, rois, pooled_size, spatial_scales, sampling_ratio, aligned,
                         canonical_scale, canonical_level, mode, half_pixel)
