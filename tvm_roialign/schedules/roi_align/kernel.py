"""Hand-scheduled CPU kernel for RoIAlign: adaptive sampling grids (``sampling_ratio <= 0``) in
both layouts, and static grids in NHWC (the strategy's choice, :mod:`tvm_roialign.strategies.cpu_kernel`).

The work runs in the order of the feature rows it reads
(:mod:`~tvm_roialign.schedules.roi_align.kernel_order`): bin rows for adaptive grids (each bin accumulated
over its whole grid at once), sample rows for static grids (accumulating in the output), so that each worker
sweeps a band of the map that stays in its cache. The per-sample parts are
:mod:`~tvm_roialign.schedules.roi_align.kernel_samples`.

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
  :func:`~tvm_roialign.schedules.roi_align.cpu.vector_lanes` (the largest power of two up to it that divides
  ``C``; the TE schedule's policy);
* the bin's output is written once, after the grid (divided by ``max(grid_h * grid_w, 1)`` in
  ``avg`` mode; 0 for an empty grid in every mode).

The RoI family takes the same kernel
(:class:`~tvm_roialign.schedules.roi_align.kernel_constants.FamilyKernel`): ``roi_align_rotated`` turns each
sample about the roi's centre (its geometry from :func:`~tvm_roialign.topi._sampling.rotated_roi_geometry`),
``ps_roi_align`` reads data channel ``(c * PH + ph) * PW + pw`` for output channel ``c`` of bin ``(ph, pw)``
(strided vector loads).

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

from tvm import te, tirx
from tvm.script import tirx as T

from ...topi._sampling import data_dims, exact_product
from .kernel_constants import FamilyKernel, KernelConstants
from .kernel_order import assign_chunks, order_items
from .kernel_samples import (
    RoiReader,
    add_sample,
    bin_row,
    chan,
    copy_channels_last,
    finish,
    to_acc,
    turn,
    write_bin,
)

__all__ = ["roi_align_adaptive_cpu"]


@T.macro
def _pool_row(c, feat, out, cb, g):
    # one bin row g of one roi (its geometry bound once): each bin over the roi's grid
    for pw in range(c.pooled_w):
        x_base = T.Bind(g.start_w + exact_product(to_acc(c, pw), g.bin_w, c.target))
        acc_buf = T.alloc_buffer((c.block,), c.acc, scope="local")
        for co in c.vector_loop(c.block_vectors):
            for ci in T.vectorized(c.lanes):
                acc_buf[co * c.lanes + ci] = c.init
        for iy in range(g.grid_h):
            yy = T.Bind(g.y_base + (to_acc(c, iy) + c.half) * g.bin_h / g.grid_h_f)
            for ix in range(g.grid_w):
                # (the row's terms are loop-invariant here unless the roi is rotated)
                xx = T.Bind(x_base + (to_acc(c, ix) + c.half) * g.bin_w / g.grid_w_f)
                add_sample(c, feat, acc_buf, cb, g.ph, pw, g.batch, g.roi_ok,
                           turn(c, yy, xx, g.rotation))
        write_bin(c, out, acc_buf, cb, g.k, g.ph, pw, g.nonempty, g.count)


@T.macro
def _pool_sample_row(c, feat, acc_out, cb, g, iy):
    # sample row iy of bin row g: its samples added to the bins' accumulators in acc_out
    # (channels-last), which the bin row's first sample row starts and its last one finishes
    yy = T.Bind(g.y_base + (to_acc(c, iy) + c.half) * g.bin_h / g.grid_h_f)
    for pw in range(c.pooled_w):
        x_base = T.Bind(g.start_w + exact_product(to_acc(c, pw), g.bin_w, c.target))
        acc_buf = T.alloc_buffer((c.block,), c.acc, scope="local")
        if iy == c.i_zero:
            for co in c.vector_loop(c.block_vectors):
                for ci in T.vectorized(c.lanes):
                    acc_buf[co * c.lanes + ci] = c.init
        else:
            for co in c.vector_loop(c.block_vectors):
                for ci in T.vectorized(c.lanes):
                    acc_buf[co * c.lanes + ci] = acc_out[g.k, g.ph, pw, chan(c, cb, co, ci)]
        for ix in range(g.grid_w):
            xx = T.Bind(x_base + (to_acc(c, ix) + c.half) * g.bin_w / g.grid_w_f)
            add_sample(c, feat, acc_buf, cb, g.ph, pw, g.batch, g.roi_ok, (yy, xx))
        if iy == g.grid_h - c.i_one:
            for co in c.vector_loop(c.block_vectors):
                for ci in T.vectorized(c.lanes):
                    acc_out[g.k, g.ph, pw, chan(c, cb, co, ci)] = finish(
                        c, acc_buf[co * c.lanes + ci], g.nonempty, g.count
                    )
        else:
            for co in c.vector_loop(c.block_vectors):
                for ci in T.vectorized(c.lanes):
                    acc_out[g.k, g.ph, pw, chan(c, cb, co, ci)] = acc_buf[co * c.lanes + ci]


@T.macro
def _to_channels_first(c, acc_out, out):
    # NCHW output from the channels-last bins, one roi per iteration
    for k in T.parallel(c.num_rois):
        for ch in range(c.channels):
            for ph in range(c.pooled_h):
                for pw in range(c.pooled_w):
                    out[k, ch, ph, pw] = acc_out[k, ph, pw, ch]


def _bin_row_kernel(c: KernelConstants, reader: RoiReader):
    """Bin rows in parallel, each bin's accumulator in registers; in the order of the feature
    rows they read unless the rois are rotated."""

    @T.prim_func(s_tir=True)
    def kernel(d: T.handle, r: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        data_buf = T.match_buffer(d, c.data_shape, c.dtype)
        rois_buf = T.match_buffer(r, c.rois_shape, c.rois_dtype)
        out = T.match_buffer(o, c.out_shape, c.dtype)
        if c.nchw:
            feat = T.alloc_buffer(c.feat_shape, c.dtype)
            copy_channels_last(c, data_buf, feat)
        else:
            feat = data_buf
        if c.ordered:
            keys = T.alloc_buffer((c.items,), c.idx)
            counts = T.alloc_buffer((c.num_keys + c.i_one,), c.idx)
            order = T.alloc_buffer((c.items,), c.idx)
            order_items(c, reader, rois_buf, keys, counts, order)
            # channel blocks outermost: the map is swept once per block
            for cb in range(c.num_blocks):
                # each worker takes a contiguous run of the ordered rows: one band of the map
                for t in T.parallel(c.rows):
                    _pool_row(c, feat, out, cb, bin_row(c, reader, rois_buf, order[t]))
        else:
            for cb in range(c.num_blocks):
                for row in T.parallel(c.rows):
                    _pool_row(c, feat, out, cb, bin_row(c, reader, rois_buf, row))

    return kernel


def _sample_row_kernel(c: KernelConstants, reader: RoiReader):
    """Static grids: sample rows in the order of the feature rows they read, each chunk of bin
    rows on one worker (:mod:`~tvm_roialign.schedules.roi_align.kernel_order`); NCHW accumulates channels-last
    first."""

    @T.prim_func(s_tir=True)
    def kernel(d: T.handle, r: T.handle, o: T.handle):
        T.func_attr({"tirx.noalias": True})
        data_buf = T.match_buffer(d, c.data_shape, c.dtype)
        rois_buf = T.match_buffer(r, c.rois_shape, c.rois_dtype)
        out = T.match_buffer(o, c.out_shape, c.dtype)
        if c.nchw:
            feat = T.alloc_buffer(c.feat_shape, c.dtype)
            copy_channels_last(c, data_buf, feat)
            acc_out = T.alloc_buffer(c.bins_shape, c.acc)
        else:
            feat = data_buf
            acc_out = out
        keys = T.alloc_buffer((c.items,), c.idx)
        counts = T.alloc_buffer((c.num_keys + c.i_one,), c.idx)
        order = T.alloc_buffer((c.items,), c.idx)
        owner = T.alloc_buffer((c.rows,), c.idx)
        chunk_start = T.alloc_buffer((c.chunks,), c.idx)
        order_items(c, reader, rois_buf, keys, counts, order)
        assign_chunks(c, order, owner, chunk_start)
        for cb in range(c.num_blocks):
            for chunk in T.parallel(c.chunks):
                for i in range(chunk_start[chunk], c.items):
                    item = T.Bind(order[i])
                    if owner[item // c.row_samples] == chunk:
                        _pool_sample_row(
                            c, feat, acc_out, cb,
                            bin_row(c, reader, rois_buf, item // c.row_samples),
                            item % c.row_samples,
                        )
        if c.nchw:
            _to_channels_first(c, acc_out, out)

    return kernel


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
    sampling_ratio: int = 0,
) -> tirx.PrimFunc:
    """The scheduled PrimFunc ``(data, rois, out)`` of RoIAlign on the CPU.

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
        What the geometry's products are fenced for (None: plain products), and whose cores the
        sample rows of a static grid are divided among (None: one).
    sampling_ratio : int
        Samples per bin side when positive (RoIAlign only; the family's grids are adaptive), else
        the adaptive grid.

    Returns
    -------
    tirx.PrimFunc
        Parameters ``data``, ``rois``, ``out`` (``[K, C, PH, PW]`` or ``[K, PH, PW, C]``).
    """
    sampling_ratio = max(int(sampling_ratio), 0) if family is None else 0
    c = KernelConstants.of(
        data, rois, pooled_size, mode, layout, lanes, channel_block, family, target,
        sampling_ratio,
    )
    num_batch = data_dims(data.shape, layout)[0]
    reader = RoiReader(c, num_batch, pooled_size, spatial_scale, aligned, half_pixel, family,
                       sampling_ratio)
    if c.by_sample_row:
        return _sample_row_kernel(c, reader)
    return _bin_row_kernel(c, reader)
