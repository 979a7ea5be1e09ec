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
  :func:`~.roi_align_cpu.vector_lanes` (the largest power of two up to it that divides ``C``;
  the TE schedule's policy);
* the bin's output is written once, after the grid (divided by ``max(grid_h * grid_w, 1)`` in
  ``avg`` mode; 0 for an empty grid in every mode).

The RoI family takes the same kernel (:class:`~.roi_align_kernel_constants.FamilyKernel`):
``roi_align_rotated`` turns each sample about the roi's centre (its geometry from
:func:`~tvm_roialign.topi._sampling.rotated_roi_geometry`), ``ps_roi_align`` reads data channel
``(c * PH + ph) * PW + pw`` for output channel ``c`` of bin ``(ph, pw)`` (strided vector loads).

NHWC reads the channel vectors of the feature map directly. NCHW first copies the feature map to
channels-last (``[N, H, W, C]``, a workspace the size of ``data``, in parallel over rows) so that
the channel loop reads contiguous vectors, as the TE path's NCHW schedule does.

The semantics are those of the TE compute (module docstring of :mod:`tvm_roialign.topi.roi_align`):
the roi's geometry, validity and grid, and each sample's positions and bilinear weights
(:func:`~tvm_roialign.topi._sampling.bilinear_coeffs`), come from the same helpers
(:mod:`tvm_roialign.topi._sampling`), the samples follow the same float operation order
(torchvision's CPU kernel), every index is clamped before it is used, and the reduction identity is
the same. Index arithmetic is int32 or int64 as :func:`~tvm_roialign.topi._sampling.index_dtype_for`
decides (int64 for a symbolic number of rois). The strategy's glue that builds it from an op's
attributes is :mod:`tvm_roialign.strategies.cpu_kernel`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx
from tvm.script import tirx as T

from ..topi._sampling import bilinear_coeffs, data_dims, exact_product, roi_geometry
from .roi_align_kernel_constants import FamilyKernel, KernelConstants

__all__ = ["roi_align_adaptive_cpu"]


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


# --- expressions of the kernel (the vectorized channel loops hold whole expressions, no
# statements: TVM's vectorizer does not widen a Bind inside a vectorized loop) ---


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


def _coefficients(c: KernelConstants, y, x, roi_ok):
    """``(valid, y_low, y_high, x_low, x_high, w1, w2, w3, w4)`` of the sample at ``(y, x)``: the
    TE compute's :func:`~tvm_roialign.topi._sampling.bilinear_coeffs`, its bindings emitted here
    as Bind statements (scalars, computed once for all the channels)."""
    co = bilinear_coeffs(y, x, c.height, c.width, roi_ok, c.acc, c.idx)
    for var, value in co.bindings:
        T.Bind(value, var=var)
    return co.valid, co.y_low, co.y_high, co.x_low, co.x_high, co.w1, co.w2, co.w3, co.w4


@T.macro
def _add_sample(c, feat, acc_buf, cb, ph, pw, batch, roi_ok, y, x):
    # the sample's positions and weights, once for all the channels (scalars)
    valid, y_low, y_high, x_low, x_high, w1, w2, w3, w4 = _coefficients(c, y, x, roi_ok)
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
    c = KernelConstants.of(
        data, rois, pooled_size, mode, layout, lanes, channel_block, family, target
    )
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
