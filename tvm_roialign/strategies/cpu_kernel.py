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
    "KernelConstants",
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


@dataclass(frozen=True, eq=False)
class KernelConstants:
    """What the kernel's TVMScript reads, computed once per kernel (:meth:`of`): dtypes, buffer
    shapes, loop extents and the scalar constants, as PrimExprs of the right dtypes (index
    arithmetic in ``idx``, float arithmetic in ``acc``)."""

    dtype: str
    acc: str
    idx: str
    mode: str
    nchw: bool
    rotated: bool
    position_sensitive: bool
    block: int  # channels per accumulator
    data_shape: list
    rois_shape: list
    out_shape: list
    feat_shape: list  # the channels-last copy of an NCHW feature map
    rows: tirx.PrimExpr  # parallel (roi, bin row) iterations
    pooled_h: tirx.PrimExpr
    pooled_w: tirx.PrimExpr
    bins: tirx.PrimExpr  # PH * PW
    num_batch: tirx.PrimExpr
    height: tirx.PrimExpr
    width: tirx.PrimExpr
    h_last: tirx.PrimExpr
    w_last: tirx.PrimExpr
    height_f: tirx.PrimExpr
    width_f: tirx.PrimExpr
    h_last_f: tirx.PrimExpr
    w_last_f: tirx.PrimExpr
    lanes: tirx.PrimExpr
    copy_vectors: tirx.PrimExpr  # channel vectors of the NCHW copy
    block_i: tirx.PrimExpr
    block_vectors: tirx.PrimExpr  # channel vectors of one block
    num_blocks: tirx.PrimExpr
    zero: tirx.PrimExpr
    one: tirx.PrimExpr
    half: tirx.PrimExpr
    minus_one: tirx.PrimExpr
    i_zero: tirx.PrimExpr
    i_one: tirx.PrimExpr
    init: tirx.PrimExpr  # the reduction's identity
    target: object = None  # what the geometry's products are fenced for (topi's exact_product)

    @classmethod
    def of(cls, data, rois, pooled_size, mode, layout, lanes, channel_block, family, target=None):
        dtype = str(data.dtype)
        acc = accumulate_dtype(dtype)
        num_batch, in_channels, height, width = data_dims(data.shape, layout)
        channels = int(in_channels if family is None else family.out_channels)
        pooled_h, pooled_w = pooled_size
        out_shape = list(output_shape(rois.shape[0], channels, pooled_size, layout))
        idx = index_dtype_for(data.shape, out_shape)
        block = channel_block or channels
        assert channels % block == 0 and block % lanes == 0, (channels, block, lanes)

        def ival(dim):
            return tirx.const(int(dim), idx) if is_static(dim) else tirx.Cast(idx, dim)

        def fval(dim):
            return tirx.const(float(int(dim)), acc) if is_static(dim) else tirx.Cast(acc, dim)

        def const(value):
            return tirx.const(value, idx)

        height_i, width_i = ival(height), ival(width)
        zero = tirx.const(0.0, acc)
        return cls(
            dtype, acc, idx, mode, layout == "NCHW",
            family is not None and family.rotated,
            family is not None and family.position_sensitive,
            block, data.shape, rois.shape, out_shape, [num_batch, height, width, in_channels],
            rows=ival(rois.shape[0]) * const(pooled_h),
            pooled_h=const(pooled_h), pooled_w=const(pooled_w), bins=const(pooled_h * pooled_w),
            num_batch=ival(num_batch), height=height_i, width=width_i,
            h_last=height_i - const(1), w_last=width_i - const(1),
            height_f=fval(height), width_f=fval(width),
            h_last_f=fval(height) - tirx.const(1.0, acc), w_last_f=fval(width) - tirx.const(1.0, acc),
            lanes=const(lanes), copy_vectors=const(int(in_channels) // lanes),
            block_i=const(block), block_vectors=const(block // lanes),
            num_blocks=const(channels // block),
            zero=zero, one=tirx.const(1.0, acc), half=tirx.const(0.5, acc),
            minus_one=tirx.const(-1.0, acc), i_zero=const(0), i_one=const(1),
            init=zero if mode == "avg" else tirx.min_value(acc),
            target=target,
        )


@dataclass(frozen=True)
class _RoiReader:
    """A roi's geometry from its row of the rois buffer: the TE compute's own helpers (same float
    operations); the family's geometry when there is one."""

    c: KernelConstants
    num_batch: object
    pooled_size: tuple
    spatial_scale: float
    aligned: bool
    half_pixel: bool
    family: FamilyKernel | None

    def geometry(self, buf, k):
        roi = lambda j: _to_acc(self.c, buf[k, j])
        acc, idx = self.c.acc, self.c.idx
        if self.family is not None:
            return self.family.geometry(roi, self.num_batch, acc, idx)
        return roi_geometry(roi, self.num_batch, self.pooled_size, self.spatial_scale, 0,
                            self.aligned, acc, idx, self.half_pixel, self.c.target)

    def fields(self, buf, k):
        geo = self.geometry(buf, k)
        return (geo.start_h, geo.start_w, geo.bin_h, geo.bin_w, geo.grid_h, geo.grid_w,
                geo.roi_ok, geo.batch)

    def rotation(self, buf, k):
        rotation = self.geometry(buf, k).rotation
        c = self.c
        return rotation if rotation is not None else (c.one, c.zero, c.zero, c.zero)


# --- expressions of the kernel (no statements: a Bind inside a vectorized loop is not vectorized
# correctly by this TVM, so the channel loops get whole expressions) ---


def _to_acc(c: KernelConstants, value):
    return tirx.Cast(c.acc, value)


def _chan(c: KernelConstants, cb, co, ci):
    """The channel of lane ``ci`` of vector ``co`` of block ``cb``."""
    return cb * c.block_i + co * c.lanes + ci


def _in_chan(c: KernelConstants, cb, co, ci, ph, pw):
    """The data channel read for output channel ``_chan(cb, co, ci)`` of bin ``(ph, pw)``."""
    if c.position_sensitive:
        return _chan(c, cb, co, ci) * c.bins + ph * c.pooled_w + pw
    return _chan(c, cb, co, ci)


def _turn(c: KernelConstants, yy, xx, cos_t, sin_t, centre_h, centre_w):
    """A sample ``(yy, xx)`` of the roi's grid -> feature-map ``(y, x)``: turned about the centre
    for a rotated roi (each product rounded once, as topi's sample_point), else itself."""
    if not c.rotated:
        return yy, xx
    y = exact_product(yy, cos_t, c.target) - exact_product(xx, sin_t, c.target) + centre_h
    x = exact_product(yy, sin_t, c.target) + exact_product(xx, cos_t, c.target) + centre_w
    return y, x


def _sample(c: KernelConstants, w1, w2, w3, w4, v1, v2, v3, v4):
    """torchvision: ``w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4``, left to right (``onnx_max``: the
    max of the four products)."""
    if c.mode == "onnx_max":
        return tirx.max(
            tirx.max(w1 * _to_acc(c, v1), w2 * _to_acc(c, v2)),
            tirx.max(w3 * _to_acc(c, v3), w4 * _to_acc(c, v4)),
        )
    return w1 * _to_acc(c, v1) + w2 * _to_acc(c, v2) + w3 * _to_acc(c, v3) + w4 * _to_acc(c, v4)


def _update(c: KernelConstants, acc_value, value):
    """The reduction's combiner, accumulator first (as TE's sum / max)."""
    return acc_value + value if c.mode == "avg" else tirx.max(acc_value, value)


def _finish(c: KernelConstants, acc_value, nonempty, count):
    """avg: divide by ``max(grid_h * grid_w, 1)``; every mode: 0 for an empty grid."""
    value = acc_value / count if c.mode == "avg" else acc_value
    return tirx.Cast(c.dtype, tirx.Select(nonempty, value, c.zero))


# --- statements of the kernel (TVMScript macros, inlined where they are called) ---


@T.macro
def _copy_channels_last(c, data_buf, feat):
    # channels-last copy of the feature map: the channel loop reads contiguous vectors
    for nh in T.parallel(c.num_batch * c.height):
        for w in range(c.width):
            for co in range(c.copy_vectors):
                for ci in T.vectorized(c.lanes):
                    feat[nh // c.height, nh % c.height, w, co * c.lanes + ci] = data_buf[
                        nh // c.height, co * c.lanes + ci, nh % c.height, w
                    ]


@T.macro
def _add_sample(c, feat, acc_buf, cb, ph, pw, batch, roi_ok, y, x):
    # the sample's positions and weights, once for all the channels (scalars)
    y_ok = T.And(roi_ok, T.And(y >= c.minus_one, y <= c.height_f))
    y_c = T.min(T.max(y, c.zero), c.h_last_f)  # compare-and-select: NaN -> 0
    y_low = T.Cast(c.idx, y_c)
    y_high = T.min(y_low + c.i_one, c.h_last)
    ly = T.Select(y_low >= c.h_last, c.zero, y_c - _to_acc(c, y_low))
    hy = c.one - ly
    valid = T.And(y_ok, T.And(x >= c.minus_one, x <= c.width_f))
    x_c = T.min(T.max(x, c.zero), c.w_last_f)
    x_low = T.Cast(c.idx, x_c)
    x_high = T.min(x_low + c.i_one, c.w_last)
    lx = T.Select(x_low >= c.w_last, c.zero, x_c - _to_acc(c, x_low))
    hx = c.one - lx
    w1 = hy * hx
    w2 = hy * lx
    w3 = ly * hx
    w4 = ly * lx
    if valid:
        for co in range(c.block_vectors):
            for ci in T.vectorized(c.lanes):
                # one expression (no Bind inside a vectorized loop)
                acc_buf[co * c.lanes + ci] = _update(
                    c,
                    acc_buf[co * c.lanes + ci],
                    _sample(
                        c, w1, w2, w3, w4,
                        feat[batch, y_low, x_low, _in_chan(c, cb, co, ci, ph, pw)],
                        feat[batch, y_low, x_high, _in_chan(c, cb, co, ci, ph, pw)],
                        feat[batch, y_high, x_low, _in_chan(c, cb, co, ci, ph, pw)],
                        feat[batch, y_high, x_high, _in_chan(c, cb, co, ci, ph, pw)],
                    ),
                )
    else:
        # an outside sample contributes 0 (adding 0 changes no sum)
        if c.mode != "avg":
            for co in range(c.block_vectors):
                for ci in T.vectorized(c.lanes):
                    acc_buf[co * c.lanes + ci] = T.max(acc_buf[co * c.lanes + ci], c.zero)


@T.macro
def _write_bin(c, out, acc_buf, cb, k, ph, pw, nonempty, count):
    # the bin's output, written once
    for co in range(c.block_vectors):
        for ci in T.vectorized(c.lanes):
            if c.nchw:
                out[k, _chan(c, cb, co, ci), ph, pw] = _finish(
                    c, acc_buf[co * c.lanes + ci], nonempty, count
                )
            else:
                out[k, ph, pw, _chan(c, cb, co, ci)] = _finish(
                    c, acc_buf[co * c.lanes + ci], nonempty, count
                )


@T.macro
def _pool_row(c, reader, feat, rois_buf, out, cb, row):
    # one bin row of one roi: its geometry once, then each bin over the roi's grid
    k = row // c.pooled_h
    ph = row % c.pooled_h
    start_h, start_w, bin_h, bin_w, grid_h, grid_w, roi_ok, batch = reader.fields(rois_buf, k)
    cos_t, sin_t, centre_h, centre_w = reader.rotation(rois_buf, k)
    grid_h_f = _to_acc(c, grid_h)
    grid_w_f = _to_acc(c, grid_w)
    nonempty = T.And(grid_h > c.i_zero, grid_w > c.i_zero)
    count = _to_acc(c, T.max(grid_h * grid_w, c.i_one))
    y_base = start_h + exact_product(_to_acc(c, ph), bin_h, c.target)
    for pw in range(c.pooled_w):
        x_base = start_w + exact_product(_to_acc(c, pw), bin_w, c.target)
        acc_buf = T.alloc_buffer((c.block,), c.acc, scope="local")
        for co in range(c.block_vectors):
            for ci in T.vectorized(c.lanes):
                acc_buf[co * c.lanes + ci] = c.init
        for iy in range(grid_h):
            yy = y_base + (_to_acc(c, iy) + c.half) * bin_h / grid_h_f
            for ix in range(grid_w):
                # (the row's terms are loop-invariant here unless the roi is rotated)
                xx = x_base + (_to_acc(c, ix) + c.half) * bin_w / grid_w_f
                y, x = _turn(c, yy, xx, cos_t, sin_t, centre_h, centre_w)
                _add_sample(c, feat, acc_buf, cb, ph, pw, batch, roi_ok, y, x)
        _write_bin(c, out, acc_buf, cb, k, ph, pw, nonempty, count)


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
    target=None,
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
    target : tvm.target.Target, optional
        What the geometry's products are fenced for (None: plain products).

    Returns
    -------
    tirx.PrimFunc
        Parameters ``data``, ``rois``, ``out`` (``[K, C, PH, PW]`` or ``[K, PH, PW, C]``).
    """
    c = KernelConstants.of(data, rois, pooled_size, mode, layout, lanes, channel_block, family,
                           target)
    num_batch = data_dims(data.shape, layout)[0]
    reader = _RoiReader(c, num_batch, pooled_size, spatial_scale, aligned, half_pixel, family)

    @T.prim_func(s_tir=True)
    def kernel(d: T.handle, r: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        data_buf = T.match_buffer(d, c.data_shape, c.dtype)
        rois_buf = T.match_buffer(r, c.rois_shape, c.dtype)
        out = T.match_buffer(o, c.out_shape, c.dtype)
        if c.nchw:
            feat = T.alloc_buffer(c.feat_shape, c.dtype)
            _copy_channels_last(c, data_buf, feat)
        else:
            feat = data_buf
        # channel blocks outermost: all rois read one block of the feature map at a time, which
        # stays in the last-level cache for the next rois
        for cb in range(c.num_blocks):
            for row in T.parallel(c.rows):
                _pool_row(c, reader, feat, rois_buf, out, cb, row)

    return kernel


def _family_of(data, rois, attrs, target=None):
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
                                        angle_scale(attrs.angle_unit), attrs.clockwise, acc, idx,
                                        target)

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
            return roi_geometry(roi, num_batch, pooled, spatial_scale, 0, True, acc, idx, True,
                                target)

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
        pooled, spatial_scale, mode, family = _family_of(data, rois, attrs, target)
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
        target,
    )
    return te.extern_primfunc(
        [data, rois], func, name="roi_align_adaptive", tag=f"roi_align_{layout.lower()}"
    )
