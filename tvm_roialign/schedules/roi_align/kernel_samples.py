"""The per-sample parts of the CPU RoIAlign kernel (:mod:`~tvm_roialign.schedules.roi_align.kernel`): a roi's
geometry from its row of the rois buffer (:class:`RoiReader`), the expressions of one sample and of the
reduction (the TE compute's float operations in the same order), and the statements that add one sample to
a bin's channel accumulator, write a finished bin, and copy an NCHW map to channels-last.

The channel loops are vectorized and hold whole expressions, no statements: TVM's vectorizer does
not widen a Bind inside a vectorized loop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import tvm
from tvm import tirx
from tvm.script import tirx as T

from ...topi._sampling import bilinear_coeffs, exact_product, roi_geometry
from .kernel_constants import FamilyKernel, KernelConstants

__all__ = [
    "BinRow",
    "RoiReader",
    "add_sample",
    "bin_row",
    "chan",
    "copy_channels_last",
    "finish",
    "to_acc",
    "turn",
    "write_bin",
]


@dataclass(frozen=True)
class RoiReader:
    """A roi's geometry from its row of the rois buffer: the TE compute's own helpers (same float
    operations); the family's geometry when there is one."""

    c: KernelConstants
    num_batch: object
    pooled_size: tuple
    spatial_scale: float
    aligned: bool
    half_pixel: bool
    family: FamilyKernel | None
    sampling_ratio: int = 0

    def geometry(self, buf, k):
        roi = lambda j: to_acc(self.c, buf[k, j])
        acc, idx = self.c.acc, self.c.idx
        if self.family is not None:
            return self.family.geometry(roi, self.num_batch, acc, idx)
        return roi_geometry(roi, self.num_batch, self.pooled_size, self.spatial_scale,
                            self.sampling_ratio, self.aligned, acc, idx, self.half_pixel,
                            self.c.target)

    def fields(self, buf, k):
        geo = self.geometry(buf, k)
        return (geo.start_h, geo.start_w, geo.bin_h, geo.bin_w, geo.grid_h, geo.grid_w,
                geo.roi_ok, geo.batch)

    def rotation(self, buf, k):
        rotation = self.geometry(buf, k).rotation
        c = self.c
        return rotation if rotation is not None else (c.one, c.zero, c.zero, c.zero)


def _is_int(value) -> bool:
    return "int" in str(value.ty.dtype)


def _bound(value):
    """``value`` bound once as an immutable Bind; a constant, a variable, a condition, or a
    conversion between integer and float as itself (static loop extents stay static, and TVM's
    integer-set analysis of a Bind of a float comparison or conversion fails). Returns the
    variable or the value."""
    folded = tvm.sym.Analyzer().simplify(value)
    if isinstance(folded, (tirx.IntImm, tirx.FloatImm)):
        return folded
    if isinstance(value, tirx.Var):
        return value
    if isinstance(value, tirx.Cast) and _is_int(value) != _is_int(value.value):
        return value
    if str(value.ty.dtype) == "bool":
        return value
    return T.Bind(value)


@dataclass(frozen=True)
class BinRow:
    """The scalars of one bin row ``(k, ph)``, bound once: its roi's geometry, and the row's
    ``y_base`` (``start_h + ph * bin_h``)."""

    k: object
    ph: object
    start_h: object
    start_w: object
    bin_h: object
    bin_w: object
    grid_h: object
    grid_w: object
    roi_ok: object
    batch: object
    rotation: tuple
    grid_h_f: object
    grid_w_f: object
    nonempty: object
    count: object
    y_base: object


def bin_row(c: KernelConstants, reader, rois_buf, row) -> BinRow:
    """:class:`BinRow` of ``row`` (``k * PH + ph``), its values emitted as Bind statements. (In
    TVMScript a plain assignment makes a mutable local, which a parallel loop allocates from the
    workspace on every iteration.)"""
    k = _bound(row // c.pooled_h)
    ph = _bound(row % c.pooled_h)
    # (the roi's fields stay expressions: TVM's integer-set analysis of Binds of them fails)
    fields = list(reader.fields(rois_buf, k))
    start_h, _, bin_h, _, grid_h, grid_w = fields[:6]
    rotation = tuple(_bound(v) for v in reader.rotation(rois_buf, k))
    return BinRow(
        k, ph, *fields, rotation,
        grid_h_f=to_acc(c, grid_h),
        grid_w_f=to_acc(c, grid_w),
        nonempty=_bound(T.And(grid_h > c.i_zero, grid_w > c.i_zero)),
        count=to_acc(c, T.max(grid_h * grid_w, c.i_one)),
        y_base=_bound(start_h + exact_product(to_acc(c, ph), bin_h, c.target)),
    )


def to_acc(c: KernelConstants, value):
    return tirx.Cast(c.acc, value)


def chan(c: KernelConstants, cb, co, ci):
    """The channel of lane ``ci`` of vector ``co`` of block ``cb``."""
    return cb * c.block_i + co * c.lanes + ci


def _in_chan(c: KernelConstants, cb, co, ci, ph, pw):
    """The data channel read for output channel ``chan(cb, co, ci)`` of bin ``(ph, pw)``."""
    if c.position_sensitive:
        return chan(c, cb, co, ci) * c.bins + ph * c.pooled_w + pw
    return chan(c, cb, co, ci)


def turn(c: KernelConstants, yy, xx, rotation):
    """A sample ``(yy, xx)`` of the roi's grid -> feature-map ``(y, x)``: turned about the centre
    for a rotated roi (each product rounded once, as topi's sample_point), else itself."""
    if not c.rotated:
        return yy, xx
    cos_t, sin_t, centre_h, centre_w = rotation
    y = exact_product(yy, cos_t, c.target) - exact_product(xx, sin_t, c.target) + centre_h
    x = exact_product(yy, sin_t, c.target) + exact_product(xx, cos_t, c.target) + centre_w
    return y, x


def _sample(c: KernelConstants, w1, w2, w3, w4, v1, v2, v3, v4):
    """torchvision: ``w1 * v1 + w2 * v2 + w3 * v3 + w4 * v4``, left to right (``onnx_max``: the
    max of the four products)."""
    if c.mode == "onnx_max":
        return tirx.max(
            tirx.max(w1 * to_acc(c, v1), w2 * to_acc(c, v2)),
            tirx.max(w3 * to_acc(c, v3), w4 * to_acc(c, v4)),
        )
    return w1 * to_acc(c, v1) + w2 * to_acc(c, v2) + w3 * to_acc(c, v3) + w4 * to_acc(c, v4)


def _update(c: KernelConstants, acc_value, value):
    """The reduction's combiner, accumulator first (as TE's sum / max)."""
    return acc_value + value if c.mode == "avg" else tirx.max(acc_value, value)


def finish(c: KernelConstants, acc_value, nonempty, count):
    """avg: divide by ``max(grid_h * grid_w, 1)``; every mode: 0 for an empty grid."""
    value = acc_value / count if c.mode == "avg" else acc_value
    return tirx.Cast(c.dtype, tirx.Select(nonempty, value, c.zero))


@T.macro
def copy_channels_last(c, data_buf, feat):
    # channels-last copy of the feature map: the channel loop reads contiguous vectors
    for nh in T.parallel(c.num_batch * c.height):
        for w in range(c.width):
            for co in range(c.copy_vectors):
                for ci in T.vectorized(c.lanes):
                    feat[nh // c.height, nh % c.height, w, co * c.lanes + ci] = data_buf[
                        nh // c.height, co * c.lanes + ci, nh % c.height, w
                    ]


def _coefficients(c: KernelConstants, y, x, roi_ok):
    """The :class:`~tvm_roialign.topi._sampling.BilinearCoeffs` of the sample at ``(y, x)`` (the
    TE compute's :func:`~tvm_roialign.topi._sampling.bilinear_coeffs`), its bindings and its
    corner positions emitted here as Bind statements (scalars, computed once for all the
    channels)."""
    co = bilinear_coeffs(y, x, c.height, c.width, roi_ok, c.acc, c.idx)
    for var, value in co.bindings:
        T.Bind(value, var=var)
    return replace(co, y_low=_bound(co.y_low), y_high=_bound(co.y_high),
                   x_low=_bound(co.x_low), x_high=_bound(co.x_high))


@T.macro
def _add_weighted(c, feat, acc_buf, cb, ph, pw, batch, s):
    if s.valid:
        for co in c.vector_loop(c.block_vectors):
            for ci in T.vectorized(c.lanes):
                # one expression (no Bind inside a vectorized loop)
                acc_buf[co * c.lanes + ci] = _update(
                    c,
                    acc_buf[co * c.lanes + ci],
                    _sample(
                        c, s.w1, s.w2, s.w3, s.w4,
                        feat[batch, s.y_low, s.x_low, _in_chan(c, cb, co, ci, ph, pw)],
                        feat[batch, s.y_low, s.x_high, _in_chan(c, cb, co, ci, ph, pw)],
                        feat[batch, s.y_high, s.x_low, _in_chan(c, cb, co, ci, ph, pw)],
                        feat[batch, s.y_high, s.x_high, _in_chan(c, cb, co, ci, ph, pw)],
                    ),
                )
    else:
        # an outside sample contributes 0 (adding 0 changes no sum)
        if c.mode != "avg":
            for co in c.vector_loop(c.block_vectors):
                for ci in T.vectorized(c.lanes):
                    acc_buf[co * c.lanes + ci] = T.max(acc_buf[co * c.lanes + ci], c.zero)


@T.macro
def add_sample(c, feat, acc_buf, cb, ph, pw, batch, roi_ok, point):
    # the sample at point (y, x): its positions and weights once for all the channels (scalars)
    _add_weighted(c, feat, acc_buf, cb, ph, pw, batch, _coefficients(c, point[0], point[1], roi_ok))


@T.macro
def write_bin(c, out, acc_buf, cb, k, ph, pw, nonempty, count):
    # the bin's output, written once
    for co in c.vector_loop(c.block_vectors):
        for ci in T.vectorized(c.lanes):
            if c.nchw:
                out[k, chan(c, cb, co, ci), ph, pw] = finish(
                    c, acc_buf[co * c.lanes + ci], nonempty, count
                )
            else:
                out[k, ph, pw, chan(c, cb, co, ci)] = finish(
                    c, acc_buf[co * c.lanes + ci], nonempty, count
                )
