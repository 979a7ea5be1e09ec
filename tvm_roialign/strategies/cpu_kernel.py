"""Hand-scheduled CPU kernel for RoIAlign with an adaptive sampling grid (``sampling_ratio <= 0``).

With an adaptive grid the sampling loops' extents depend on the roi, so the TE compute of
:mod:`tvm_roialign.topi.roi_align` nests them in a block per output element and no schedule can
move them outside the channel loop. This kernel is written in TVMScript already scheduled:

* rois x bin rows run in parallel on TVM's thread pool; the roi's geometry (start, bin size, grid,
  batch index) is computed once per parallel iteration;
* each bin has a channel accumulator (``C`` elements of the accumulate dtype, on the worker's
  stack; past :data:`MAX_ACC_BYTES` the channels are processed in blocks);
* for each sample the four corner positions and weights are computed once, as scalars (the row
  terms are loop-invariant in the sample loop unless the roi is rotated), and then applied to all
  channels in an inner loop, vectorized by
  :func:`~tvm_roialign.strategies.cpu.vector_lanes` (the largest power of two up to it that
  divides ``C``; the TE schedule's policy);
* the bin's output is written once, after the grid (divided by ``max(grid_h * grid_w, 1)`` in
  ``avg`` mode; 0 for an empty grid in every mode).

The RoI family takes the same kernel (:class:`FamilyKernel`): ``roi_align_rotated`` turns each
sample about the roi's centre (its geometry from :func:`~tvm_roialign.topi._sampling.rotated_roi_geometry`),
``ps_roi_align`` reads data channel ``(c * PH + ph) * PW + pw`` for output channel ``c`` of bin
``(ph, pw)`` (strided vector loads).

NHWC reads the channel vectors of the feature map directly. NCHW first copies the feature map to
channels-last (``[N, H, W, C]``, a workspace the size of ``data``, in parallel over rows) so that
the channel loop reads contiguous vectors, as the TE path's NCHW schedule does.

The semantics are those of the TE compute (module docstring of :mod:`tvm_roialign.topi.roi_align`):
the roi's geometry, validity and grid come from the same helpers (:mod:`tvm_roialign.topi._sampling`),
the samples follow the same float operation order (torchvision's CPU kernel), every index is
clamped before it is used, and the reduction identity is the same. :func:`cpu_adaptive_kernel`
returns None (the TE path is used) for a static grid (``sampling_ratio > 0``), a symbolic channel
count, or arguments the TE compute would reject (so that it raises its own error). Index arithmetic
is int32 or int64 as
:func:`~tvm_roialign.topi._sampling.index_dtype_for` decides (int64 for a symbolic number of rois).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tvm import te, tirx
from tvm.script import tirx as T

from ..topi._sampling import (
    accumulate_dtype,
    data_dims,
    exact_product,
    index_dtype_for,
    is_static,
    output_shape,
    roi_geometry,
    rotated_roi_geometry,
)
from ..topi.ps_roi_align import check_ps_roi_align_args
from ..topi.roi_align import check_roi_align_args, check_spatial_scale
from ..topi.roi_align_rotated import angle_scale, check_roi_align_rotated_args
from .base import largest_divisor_lanes
from .cpu import vector_lanes

__all__ = [
    "MAX_ACC_BYTES",
    "FamilyKernel",
    "channel_block_for",
    "cpu_adaptive_kernel",
    "roi_align_adaptive_cpu",
]

#: Largest per-bin channel accumulator (bytes, on the stack of each worker); with more channels the
#: channels are processed in blocks that fit (the sampling positions are then computed per block).
MAX_ACC_BYTES = 64 * 1024


@dataclass(frozen=True)
class FamilyKernel:
    """What the kernel needs of a RoI-family op: ``geometry(roi, num_batch, acc, idx)`` (a
    :class:`~tvm_roialign.topi._sampling.RoiGeometry` with an adaptive grid; its ``rotation`` turns
    the samples), the output channel count, and whether output channel ``c`` of bin ``(ph, pw)``
    reads data channel ``(c * PH + ph) * PW + pw`` (position-sensitive)."""

    geometry: Callable
    out_channels: int
    rotated: bool = False
    position_sensitive: bool = False


def channel_block_for(channels: int, lanes: int, acc: str) -> int:
    """Channels per accumulator: all of them if they fit in :data:`MAX_ACC_BYTES`, else the largest
    multiple of ``lanes`` dividing ``channels`` that fits."""
    limit = MAX_ACC_BYTES // (8 if acc == "float64" else 4)
    if channels <= limit:
        return channels
    return max(b for b in range(lanes, limit + 1, lanes) if channels % b == 0)


def roi_align_adaptive_cpu(
    data: te.Tensor,
    rois: te.Tensor,
    pooled_size,
    spatial_scale: float,
    mode: str,
    aligned: bool,
    layout: str,
    lanes: int,
    channel_block: int | None = None,
    half_pixel: bool = False,
    family: FamilyKernel | None = None,
) -> tirx.PrimFunc:
    """The scheduled PrimFunc ``(data, rois, out)`` of RoIAlign with an adaptive grid.

    Parameters
    ----------
    data, rois : te.Tensor
        The placeholders ``[N, C, H, W]`` / ``[N, H, W, C]`` and ``[K, 5]`` (their shapes, symbolic
        ``K`` included, become the buffers' shapes). ``C`` must be static.
    pooled_size : (int, int)
    spatial_scale : float
        Positive and finite.
    mode, aligned, layout, half_pixel
        As :func:`tvm_roialign.topi.roi_align.roi_align`.
    lanes : int
        Vector lanes of the channel loop; must divide ``C``.
    channel_block : int, optional
        Channels per accumulator (a multiple of ``lanes`` dividing ``C``; default ``C``). The
        channel blocks are the outermost loop.
    family : FamilyKernel, optional
        The RoI family's geometry and channel mapping (rotated or position-sensitive RoIAlign);
        None for RoIAlign (``spatial_scale``, ``aligned`` and ``half_pixel`` then give the
        geometry). ``C`` is then the *output* channel count.

    Returns
    -------
    tirx.PrimFunc
        Parameters ``data``, ``rois``, ``out`` (``[K, C, PH, PW]`` or ``[K, PH, PW, C]``).
    """
    dtype = str(data.dtype)
    acc = accumulate_dtype(dtype)
    num_batch, in_channels, height, width = data_dims(data.shape, layout)
    channels = in_channels if family is None else family.out_channels
    num_rois = rois.shape[0]
    pooled_h, pooled_w = pooled_size
    out_shape = list(output_shape(num_rois, channels, pooled_size, layout))
    idx = index_dtype_for(data.shape, out_shape)
    C = int(channels)
    channel_block = channel_block or C
    assert C % channel_block == 0 and channel_block % lanes == 0, (C, channel_block, lanes)
    L = lanes

    def ival(dim):
        return tirx.const(int(dim), idx) if is_static(dim) else tirx.Cast(idx, dim)

    def fval(dim):
        return tirx.const(float(int(dim)), acc) if is_static(dim) else tirx.Cast(acc, dim)

    # --- closure constants (PrimExprs of the right dtypes) ---
    N_I, H_I, W_I = ival(num_batch), ival(height), ival(width)
    H_F, W_F = fval(height), fval(width)
    H_LAST, W_LAST = H_I - tirx.const(1, idx), W_I - tirx.const(1, idx)
    H_LAST_F = H_F - tirx.const(1.0, acc)
    W_LAST_F = W_F - tirx.const(1.0, acc)
    PH_I = tirx.const(pooled_h, idx)
    ROWS = ival(num_rois) * PH_I  # parallel (roi, bin row) iterations
    ZERO = tirx.const(0.0, acc)
    ONE = tirx.const(1.0, acc)
    HALF = tirx.const(0.5, acc)
    MINUS_ONE = tirx.const(-1.0, acc)
    I_ZERO = tirx.const(0, idx)
    I_ONE = tirx.const(1, idx)
    INIT = ZERO if mode == "avg" else tirx.min_value(acc)
    IS_AVG = mode == "avg"
    IS_ONNX_MAX = mode == "onnx_max"
    NCHW = layout == "NCHW"
    FEAT_SHAPE = [num_batch, height, width, in_channels]
    CIO_I = tirx.const(int(in_channels) // L, idx)  # channel vectors of the copy
    ROTATED = family is not None and family.rotated
    POSITION_SENSITIVE = family is not None and family.position_sensitive
    PHPW_I = tirx.const(pooled_h * pooled_w, idx)
    PW_I = tirx.const(pooled_w, idx)
    DATA_SHAPE = data.shape
    ROIS_SHAPE = rois.shape
    OUT_SHAPE = out_shape
    PW_EXT = tirx.const(pooled_w, idx)
    CB = channel_block
    CB_I = tirx.const(CB, idx)
    CBO_I = tirx.const(CB // L, idx)
    NCB_I = tirx.const(C // CB, idx)
    L_I = tirx.const(L, idx)

    def chan(cb, co, ci):
        # the channel of lane ci of vector co of block cb (an expression, not a binding: a Bind
        # inside a vectorized loop is not vectorized correctly by this TVM)
        return cb * CB_I + co * L_I + ci

    def to_acc(value):
        return tirx.Cast(acc, value)

    # the roi's geometry and validity: the TE compute's own helpers (same float operations)
    def geometry_of(buf, k):
        roi = lambda j: to_acc(buf[k, j])
        if family is not None:
            return family.geometry(roi, num_batch, acc, idx)
        return roi_geometry(roi, num_batch, pooled_size, spatial_scale, 0, aligned, acc, idx,
                            half_pixel)

    def fields_of(buf, k):
        geo = geometry_of(buf, k)
        return (geo.start_h, geo.start_w, geo.bin_h, geo.bin_w, geo.grid_h, geo.grid_w,
                geo.roi_ok, geo.batch)

    def rotation_of(buf, k):
        rotation = geometry_of(buf, k).rotation
        return rotation if rotation is not None else (ONE, ZERO, ZERO, ZERO)

    # a sample (yy, xx) of the roi's grid -> feature-map (y, x): turned about the centre for a
    # rotated roi (each product rounded once, as topi's sample_point), else itself
    def turn_y(yy, xx, cos_t, sin_t, centre_h):
        if not ROTATED:
            return yy
        return exact_product(yy, cos_t) - exact_product(xx, sin_t) + centre_h

    def turn_x(yy, xx, cos_t, sin_t, centre_w):
        if not ROTATED:
            return xx
        return exact_product(yy, sin_t) + exact_product(xx, cos_t) + centre_w

    def in_chan(cb, co, ci, ph, pw):
        # the data channel read for output channel chan(cb, co, ci) of bin (ph, pw)
        if POSITION_SENSITIVE:
            return chan(cb, co, ci) * PHPW_I + ph * PW_I + pw
        return chan(cb, co, ci)

    # torchvision: value = w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4, left to right
    def sample_avg(w1, w2, w3, w4, v1, v2, v3, v4):
        return w1 * to_acc(v1) + w2 * to_acc(v2) + w3 * to_acc(v3) + w4 * to_acc(v4)

    def sample_onnx_max(w1, w2, w3, w4, v1, v2, v3, v4):
        return tirx.max(
            tirx.max(w1 * to_acc(v1), w2 * to_acc(v2)), tirx.max(w3 * to_acc(v3), w4 * to_acc(v4))
        )

    sample = sample_onnx_max if IS_ONNX_MAX else sample_avg

    # the reduction's combiner, accumulator first (as TE's sum / max)
    def update(acc_value, value):
        return acc_value + value if IS_AVG else tirx.max(acc_value, value)

    # avg: divide by max(grid_h * grid_w, 1); every mode: 0 for an empty grid
    def finish(acc_value, nonempty, count):
        value = acc_value / count if IS_AVG else acc_value
        return tirx.Cast(dtype, tirx.Select(nonempty, value, ZERO))

    @T.prim_func(s_tir=True)
    def kernel(d: T.handle, r: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        data_buf = T.match_buffer(d, DATA_SHAPE, dtype)
        rois_buf = T.match_buffer(r, ROIS_SHAPE, dtype)
        out = T.match_buffer(o, OUT_SHAPE, dtype)
        if NCHW:
            # channels-last copy of the feature map: the channel loop below reads contiguous vectors
            feat = T.alloc_buffer(FEAT_SHAPE, dtype)
            for nh in T.parallel(N_I * H_I):
                for w in range(W_I):
                    for co in range(CIO_I):
                        for ci in T.vectorized(L_I):
                            feat[nh // H_I, nh % H_I, w, co * L_I + ci] = data_buf[
                                nh // H_I, co * L_I + ci, nh % H_I, w
                            ]
        else:
            feat = data_buf
        # channel blocks outermost: all rois read one block of the feature map at a time, which
        # stays in the last-level cache for the next rois
        for cb in range(NCB_I):
            for row in T.parallel(ROWS):
                k = row // PH_I
                ph = row % PH_I
                # --- the roi's geometry ---
                start_h, start_w, bin_h, bin_w, grid_h, grid_w, roi_ok, batch = fields_of(
                    rois_buf, k
                )
                cos_t, sin_t, centre_h, centre_w = rotation_of(rois_buf, k)
                grid_h_f = to_acc(grid_h)
                grid_w_f = to_acc(grid_w)
                nonempty = T.And(grid_h > I_ZERO, grid_w > I_ZERO)
                count = to_acc(T.max(grid_h * grid_w, I_ONE))
                y_base = start_h + exact_product(to_acc(ph), bin_h)
                for pw in range(PW_EXT):
                    x_base = start_w + exact_product(to_acc(pw), bin_w)
                    acc_buf = T.alloc_buffer((CB,), acc, scope="local")
                    for co in range(CBO_I):
                        for ci in T.vectorized(L_I):
                            acc_buf[co * L_I + ci] = INIT
                    for iy in range(grid_h):
                        yy = y_base + (to_acc(iy) + HALF) * bin_h / grid_h_f
                        for ix in range(grid_w):
                            # --- the sample's positions and weights, shared by the channels (the
                            # row's terms are loop-invariant here unless the roi is rotated) ---
                            xx = x_base + (to_acc(ix) + HALF) * bin_w / grid_w_f
                            y = turn_y(yy, xx, cos_t, sin_t, centre_h)
                            x = turn_x(yy, xx, cos_t, sin_t, centre_w)
                            y_ok = T.And(roi_ok, T.And(y >= MINUS_ONE, y <= H_F))
                            y_c = T.min(T.max(y, ZERO), H_LAST_F)  # compare-and-select: NaN -> 0
                            y_low = T.Cast(idx, y_c)
                            y_high = T.min(y_low + I_ONE, H_LAST)
                            ly = T.Select(y_low >= H_LAST, ZERO, y_c - to_acc(y_low))
                            hy = ONE - ly
                            valid = T.And(y_ok, T.And(x >= MINUS_ONE, x <= W_F))
                            x_c = T.min(T.max(x, ZERO), W_LAST_F)
                            x_low = T.Cast(idx, x_c)
                            x_high = T.min(x_low + I_ONE, W_LAST)
                            lx = T.Select(x_low >= W_LAST, ZERO, x_c - to_acc(x_low))
                            hx = ONE - lx
                            w1 = hy * hx
                            w2 = hy * lx
                            w3 = ly * hx
                            w4 = ly * lx
                            if valid:
                                for co in range(CBO_I):
                                    for ci in T.vectorized(L_I):
                                        # one expression (no Bind inside a vectorized loop)
                                        acc_buf[co * L_I + ci] = update(
                                            acc_buf[co * L_I + ci],
                                            sample(
                                                w1,
                                                w2,
                                                w3,
                                                w4,
                                                feat[batch, y_low, x_low, in_chan(cb, co, ci, ph, pw)],
                                                feat[batch, y_low, x_high, in_chan(cb, co, ci, ph, pw)],
                                                feat[batch, y_high, x_low, in_chan(cb, co, ci, ph, pw)],
                                                feat[batch, y_high, x_high, in_chan(cb, co, ci, ph, pw)],
                                            ),
                                        )
                            else:
                                # an outside sample contributes 0 (adding 0 changes no sum)
                                if not IS_AVG:
                                    for co in range(CBO_I):
                                        for ci in T.vectorized(L_I):
                                            acc_buf[co * L_I + ci] = T.max(
                                                acc_buf[co * L_I + ci], ZERO
                                            )
                    # --- the bin's output, written once ---
                    for co in range(CBO_I):
                        for ci in T.vectorized(L_I):
                            if NCHW:
                                out[k, chan(cb, co, ci), ph, pw] = finish(
                                    acc_buf[co * L_I + ci], nonempty, count
                                )
                            else:
                                out[k, ph, pw, chan(cb, co, ci)] = finish(
                                    acc_buf[co * L_I + ci], nonempty, count
                                )

    return kernel


def _family_of(data, rois, attrs):
    """``(pooled, spatial_scale, mode, FamilyKernel or None)`` of the op ``attrs`` belong to
    (RoIAlign, rotated or position-sensitive RoIAlign, told apart by their fields); ValueError /
    TypeError as the op's TE compute raises them."""
    layout = str(attrs.layout)
    spatial_scale = check_spatial_scale(attrs.spatial_scale)
    num_batch = data_dims(data.shape, layout)[0]
    if hasattr(attrs, "angle_unit"):  # relax.vision.roi_align_rotated
        pooled = check_roi_align_rotated_args(data.shape, data.dtype, rois.shape, rois.dtype,
                                              attrs.pooled_size, layout, attrs.angle_unit)

        def geometry(roi, _num_batch, acc, idx):
            return rotated_roi_geometry(roi, num_batch, pooled, spatial_scale, 0, attrs.aligned,
                                        angle_scale(attrs.angle_unit), attrs.clockwise, acc, idx)

        channels = data_dims(data.shape, layout)[1]
        if not is_static(channels):
            raise ValueError("symbolic channels")
        return pooled, spatial_scale, "avg", FamilyKernel(geometry, int(channels), rotated=True)
    if getattr(attrs, "position_sensitive", False):  # relax.vision.ps_roi_align
        pooled, channels = check_ps_roi_align_args(data.shape, data.dtype, rois.shape, rois.dtype,
                                                   attrs.pooled_size, layout)
        if channels is None:
            raise ValueError("symbolic channels")

        def geometry(roi, _num_batch, acc, idx):
            return roi_geometry(roi, num_batch, pooled, spatial_scale, 0, True, acc, idx, True)

        return pooled, spatial_scale, "avg", FamilyKernel(geometry, channels,
                                                          position_sensitive=True)
    mode = str(attrs.mode)
    pooled = check_roi_align_args(data.shape, data.dtype, rois.shape, rois.dtype,
                                  attrs.pooled_size, layout, mode)
    return pooled, spatial_scale, mode, None


def cpu_adaptive_kernel(te_inputs, attrs, target):
    """Strategy kernel ``(te_inputs, attrs, target) -> te.Tensor | None`` (x86 and ARM strategies).

    ``te_inputs`` are the ``data`` and ``rois`` placeholders, ``attrs`` the op's attributes
    (:class:`~tvm_roialign.ops.roi_align.RoiAlignAttrs`, ``RoiAlignRotatedAttrs`` or
    ``PSRoiAlignAttrs``). Returns the output tensor of the scheduled adaptive-grid kernel
    (:func:`roi_align_adaptive_cpu`) wrapped as a TE extern op, or None (the op's TE compute is
    used) for ``sampling_ratio > 0``, a symbolic channel count, or arguments the TE compute rejects
    (it raises the error).
    """
    if len(te_inputs) != 2 or int(attrs.sampling_ratio) > 0:
        return None
    data, rois = te_inputs
    layout = str(attrs.layout)
    try:
        pooled, spatial_scale, mode, family = _family_of(data, rois, attrs)
    except (ValueError, TypeError):
        return None
    channels = data_dims(data.shape, layout)[1] if family is None else family.out_channels
    if not is_static(channels) or int(channels) <= 0:
        return None
    acc = accumulate_dtype(data.dtype)
    lanes = largest_divisor_lanes(int(channels), vector_lanes(target, data.dtype))
    func = roi_align_adaptive_cpu(
        data,
        rois,
        pooled,
        spatial_scale,
        mode,
        bool(getattr(attrs, "aligned", True)),
        layout,
        lanes,
        channel_block_for(int(channels), lanes, acc),
        bool(getattr(attrs, "half_pixel", False)),
        family,
    )
    return te.extern_primfunc(
        [data, rois], func, name="roi_align_adaptive", tag=f"roi_align_{layout.lower()}"
    )
