"""The TE math the RoI family's computes and the CPU kernel of :mod:`tvm_roialign.strategies.cpu_kernel`
share, so that every code path rounds the same float operations in the same order (the contract is
docs/semantics.md): per roi :func:`roi_geometry` / :func:`rotated_roi_geometry`, per sample
:func:`sample_point`, :func:`bilinear_coeffs` and :func:`sample_value`, per output
:func:`reduce_samples` and :func:`finalize`, and :func:`pooled_compute`, a whole compute. The
products that decide a roi's size are fenced for the target passed down (:func:`exact_product`).
Argument checks and shapes are in :mod:`._args`, re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

from ._args import (  # noqa: F401 - the names the strategies, ops and tests import from here
    FLOAT_DTYPES,
    LAYOUTS,
    MODES,
    accumulate_dtype,
    data_dims,
    index_dtype_for,
    is_static,
    normalize_pooled_size,
    output_shape,
)

#: Largest adaptive sampling grid per bin side (``grid_h * grid_w`` stays below 2**31).
MAX_ADAPTIVE_GRID = 32768
#: A roi size / pooled size ratio at or above this (or NaN, or not positive) gives an empty grid.
GRID_RATIO_BOUND = 1e30


def channel_reader(data, layout, batch, channel, acc):
    """``load(y, x)``: channel ``channel`` of image ``batch`` of ``data`` at ``(y, x)``, in ``acc``."""
    if layout == "NCHW":
        return lambda y, x: data[batch, channel, y, x].astype(acc)
    return lambda y, x: data[batch, y, x, channel].astype(acc)


@dataclass
class RoiGeometry:
    """Per-roi scalars of the sampling grid (TIR expressions in the accumulate dtype)."""

    batch: tirx.PrimExpr  # safe batch index (0 when invalid)
    roi_ok: tirx.PrimExpr  # bool: batch index in [0, N) and finite coordinates
    start_h: tirx.PrimExpr
    start_w: tirx.PrimExpr
    bin_h: tirx.PrimExpr
    bin_w: tirx.PrimExpr
    grid_h: tirx.PrimExpr  # index dtype, >= 0
    grid_w: tirx.PrimExpr
    acc: str  # accumulate dtype
    idx: str  # index dtype
    #: rotated rois: ``(cos, sin, centre_h, centre_w)``; the grid is then in the roi's own frame
    rotation: tuple | None = None
    #: the target the products are fenced for (:func:`exact_product`)
    target: object = None


@dataclass
class BilinearCoeffs:
    """The four corner positions (plain expressions, inside the map) and weights of one sample;
    ``valid`` and the weights are Let-bound: wrap an expression that uses them with :meth:`wrap`."""

    valid: tirx.PrimExpr
    y_low: tirx.PrimExpr
    y_high: tirx.PrimExpr
    x_low: tirx.PrimExpr
    x_high: tirx.PrimExpr
    w1: tirx.PrimExpr
    w2: tirx.PrimExpr
    w3: tirx.PrimExpr
    w4: tirx.PrimExpr
    bindings: list  # [(Var, value)] in binding order

    def wrap(self, expr):
        """``expr`` inside the Let bindings that define the fields."""
        for var, value in reversed(self.bindings):
            expr = tirx.Let(var, value, expr)
        return expr


class _Lets:
    """Collects ``let name = value`` bindings; ``bind`` returns the new variable."""

    def __init__(self):
        self.bindings = []

    def bind(self, name, value, dtype):
        var = tirx.Var(name, dtype)
        self.bindings.append((var, value))
        return var


def adaptive_grid(size_over_pooled, acc, idx):
    """``ceil(size / pooled)`` capped at :data:`MAX_ADAPTIVE_GRID`; 0 unless the ratio is in
    ``(0, GRID_RATIO_BOUND)``."""
    cap = tirx.const(float(MAX_ADAPTIVE_GRID), acc)
    zero = tirx.const(0.0, acc)
    finite = tirx.all(
        size_over_pooled > zero, size_over_pooled < tirx.const(GRID_RATIO_BOUND, acc)
    )
    grid = te.min(tirx.ceil(size_over_pooled), cap)
    return tirx.Select(finite, grid, zero).astype(idx)


def exact_product(a, b, target=None):
    """``a * b`` rounded on its own, never contracted into a multiply-add: fenced with
    ``llvm.arithmetic.fence`` for an llvm ``target``, ``__fmul_rn`` / ``__dmul_rn`` for CUDA; the
    plain product for other targets and for None."""
    product = a * b
    kind = target.kind.name if target is not None else None
    dtype = str(product.ty.dtype)
    if kind == "llvm":
        return tirx.call_llvm_pure_intrin(dtype, "llvm.arithmetic.fence", product)
    if kind == "cuda" and dtype in _CUDA_MUL_RN:
        return tirx.call_pure_extern(dtype, _CUDA_MUL_RN[dtype], a, b)
    return product


_CUDA_MUL_RN = {"float32": "__fmul_rn", "float64": "__dmul_rn"}


def clamp_roi_size(size, acc):
    """``max(size, 1)``; compare-and-select, so a NaN size becomes 1."""
    return te.max(size, tirx.const(1.0, acc))


def roi_box(roi, spatial_scale, aligned, half_pixel, acc, target=None):
    """``(start_h, start_w, roi_h, roi_w)`` of one roi in feature-map pixels."""
    scale = tirx.const(float(spatial_scale), acc)
    half = tirx.const(0.5, acc)

    def coordinate(j):
        value = exact_product(roi(j), scale, target)
        return value - half if half_pixel else value

    start_w, start_h, end_w, end_h = (coordinate(j) for j in (1, 2, 3, 4))
    roi_w = end_w - start_w
    roi_h = end_h - start_h
    if not aligned:
        roi_w = clamp_roi_size(roi_w, acc)
        roi_h = clamp_roi_size(roi_h, acc)
    return start_h, start_w, roi_h, roi_w


def roi_is_valid(roi, num_batch, acc, columns=(1, 2, 3, 4)):
    """Batch index in ``(-1, N)`` and finite ``columns`` (NaN and infinities fail)."""
    b = roi(0)
    return tirx.all(
        b > tirx.const(-1.0, acc),
        b < tirx.Cast(acc, num_batch),
        *(tirx.isfinite(roi(j)) for j in columns),
    )


def sampling_grid(roi_h, roi_w, pooled, sampling_ratio, acc, idx):
    """``(grid_h, grid_w)``: ``sampling_ratio`` per side when positive, else adaptive."""
    if sampling_ratio > 0:
        grid = tirx.const(int(sampling_ratio), idx)
        return grid, grid
    ph, pw = pooled
    return (
        adaptive_grid(roi_h / tirx.const(float(ph), acc), acc, idx),
        adaptive_grid(roi_w / tirx.const(float(pw), acc), acc, idx),
    )


def roi_geometry(
    roi, num_batch, pooled, spatial_scale, sampling_ratio, aligned, acc, idx, half_pixel=False,
    target=None,
):
    """Per-roi geometry from ``roi(j)`` (column ``j`` of the roi row, in the accumulate dtype)."""
    ph, pw = pooled
    start_h, start_w, roi_h, roi_w = roi_box(roi, spatial_scale, aligned, half_pixel, acc, target)
    pooled_h = tirx.const(float(ph), acc)
    pooled_w = tirx.const(float(pw), acc)
    grid_h, grid_w = sampling_grid(roi_h, roi_w, pooled, sampling_ratio, acc, idx)
    roi_ok = roi_is_valid(roi, num_batch, acc)
    batch = tirx.Select(roi_ok, roi(0), tirx.const(0.0, acc)).astype(idx)
    return RoiGeometry(
        batch=batch,
        roi_ok=roi_ok,
        start_h=start_h,
        start_w=start_w,
        bin_h=roi_h / pooled_h,
        bin_w=roi_w / pooled_w,
        grid_h=grid_h,
        grid_w=grid_w,
        acc=acc,
        idx=idx,
        target=target,
    )


def rotated_roi_geometry(
    roi, num_batch, pooled, spatial_scale, sampling_ratio, aligned, angle_scale, clockwise, acc, idx,
    target=None,
):
    """Per-roi geometry of a rotated roi ``(batch, cx, cy, w, h, angle)``: the grid of a box
    centred on 0, which :func:`sample_point` turns about the roi's centre."""
    ph, pw = pooled
    scale = tirx.const(float(spatial_scale), acc)
    offset = tirx.const(0.5, acc)

    def centre(j):
        value = exact_product(roi(j), scale, target)
        return value - offset if aligned else value

    roi_w = exact_product(roi(3), scale, target)
    roi_h = exact_product(roi(4), scale, target)
    if not aligned:
        roi_w = clamp_roi_size(roi_w, acc)
        roi_h = clamp_roi_size(roi_h, acc)
    theta = roi(5) if float(angle_scale) == 1.0 else exact_product(
        roi(5), tirx.const(float(angle_scale), acc), target
    )
    if clockwise:
        theta = -theta
    grid_h, grid_w = sampling_grid(roi_h, roi_w, pooled, sampling_ratio, acc, idx)
    roi_ok = roi_is_valid(roi, num_batch, acc, columns=(1, 2, 3, 4, 5))
    batch = tirx.Select(roi_ok, roi(0), tirx.const(0.0, acc)).astype(idx)
    two = tirx.const(2.0, acc)
    return RoiGeometry(
        batch=batch,
        roi_ok=roi_ok,
        start_h=-roi_h / two,
        start_w=-roi_w / two,
        bin_h=roi_h / tirx.const(float(ph), acc),
        bin_w=roi_w / tirx.const(float(pw), acc),
        grid_h=grid_h,
        grid_w=grid_w,
        acc=acc,
        idx=idx,
        rotation=(tirx.cos(theta), tirx.sin(theta), centre(2), centre(1)),
        target=target,
    )


def _axis_coeffs(lets, coord, size, acc, idx, axis):
    """``(low, high, frac)`` of one sample coordinate clamped to ``[0, size - 1]``: ``low`` and
    ``high`` plain expressions (TE derives the read region from them), ``frac`` Let-bound."""
    zero = tirx.const(0.0, acc)
    last_f = tirx.Cast(acc, size) - tirx.const(1.0, acc)
    # compare-and-select: max(NaN, 0) is 0
    clamped = te.min(te.max(coord, zero), last_f)
    low = clamped.astype(idx)
    last = tirx.Cast(idx, size) - tirx.const(1, idx)
    high = te.min(low + tirx.const(1, idx), last)
    coord_v = lets.bind(axis, clamped, acc)
    low_v = lets.bind(axis + "_low", low, idx)
    frac = lets.bind(
        "l" + axis, tirx.Select(low_v >= last, zero, coord_v - low_v.astype(acc)), acc
    )
    return low, high, frac


def bilinear_coeffs(y, x, height, width, roi_ok, acc, idx):
    """Positions and weights of the sample at feature-map coordinates ``(y, x)``."""
    lets = _Lets()
    valid = lets.bind(
        "valid",
        tirx.all(
            roi_ok,
            y >= tirx.const(-1.0, acc),
            y <= tirx.Cast(acc, height),
            x >= tirx.const(-1.0, acc),
            x <= tirx.Cast(acc, width),
        ),
        "bool",
    )
    y_low, y_high, ly = _axis_coeffs(lets, y, height, acc, idx, "y")
    x_low, x_high, lx = _axis_coeffs(lets, x, width, acc, idx, "x")
    one = tirx.const(1.0, acc)
    hy = lets.bind("hy", one - ly, acc)
    hx = lets.bind("hx", one - lx, acc)
    return BilinearCoeffs(
        valid,
        y_low,
        y_high,
        x_low,
        x_high,
        lets.bind("w1", hy * hx, acc),
        lets.bind("w2", hy * lx, acc),
        lets.bind("w3", ly * hx, acc),
        lets.bind("w4", ly * lx, acc),
        lets.bindings,
    )


def sample_point(geo: RoiGeometry, ph, pw, iy, ix, acc):
    """Feature-map coordinates of sample ``(iy, ix)`` of bin ``(ph, pw)``."""
    half = tirx.const(0.5, acc)
    target = geo.target
    y = (
        geo.start_h
        + exact_product(ph.astype(acc), geo.bin_h, target)
        + (iy.astype(acc) + half) * geo.bin_h / geo.grid_h.astype(acc)
    )
    x = (
        geo.start_w
        + exact_product(pw.astype(acc), geo.bin_w, target)
        + (ix.astype(acc) + half) * geo.bin_w / geo.grid_w.astype(acc)
    )
    if geo.rotation is None:
        return y, x
    # turn the point of the roi's frame by theta about the centre
    cos, sin, centre_h, centre_w = geo.rotation
    return (
        exact_product(y, cos, target) - exact_product(x, sin, target) + centre_h,
        exact_product(y, sin, target) + exact_product(x, cos, target) + centre_w,
    )


def sample_value(load, co: BilinearCoeffs, mode, acc):
    """Contribution of one sample; ``load(y, x)`` reads one channel's value in ``acc``."""
    v1 = load(co.y_low, co.x_low)
    v2 = load(co.y_low, co.x_high)
    v3 = load(co.y_high, co.x_low)
    v4 = load(co.y_high, co.x_high)
    zero = tirx.const(0.0, acc)
    if mode == "onnx_max":
        value = te.max(te.max(co.w1 * v1, co.w2 * v2), te.max(co.w3 * v3, co.w4 * v4))
    else:
        value = co.w1 * v1 + co.w2 * v2 + co.w3 * v3 + co.w4 * v4
    return co.wrap(tirx.Select(co.valid, value, zero))


def reduce_samples(value, geo: RoiGeometry, mode, acc, name_prefix=""):
    """Reduce ``value(iy, ix)`` over the sampling grid of ``geo``."""
    iy = te.reduce_axis((0, geo.grid_h), name=name_prefix + "iy")
    ix = te.reduce_axis((0, geo.grid_w), name=name_prefix + "ix")
    if mode == "avg":
        return te.sum(value(iy, ix), axis=[iy, ix])
    return te.max(value(iy, ix), axis=[iy, ix])


def finalize(acc_value, geo: RoiGeometry, mode, acc, out_dtype):
    """avg: divide by ``max(grid_h * grid_w, 1)``; every mode: 0 for an empty grid (whose
    accumulator is never read)."""
    nonempty = tirx.all(geo.grid_h > 0, geo.grid_w > 0)
    if mode == "avg":
        count = te.max(geo.grid_h * geo.grid_w, tirx.const(1, geo.idx))
        acc_value = acc_value / count.astype(acc)
    return tirx.Select(nonempty, acc_value, tirx.const(0.0, acc)).astype(out_dtype)


def accumulate_then_finalize(out_shape, layout, body, final, tag):
    """The blocks the schedules find by name: ``roi_align_acc = body(k, c, ph, pw)`` and
    ``roi_align = final(k, roi_align_acc)``, in ``layout``'s loop order."""
    if layout == "NCHW":
        acc_t = te.compute(out_shape, body, name="roi_align_acc", tag=tag)
        return te.compute(
            out_shape,
            lambda k, c, ph, pw: final(k, acc_t[k, c, ph, pw]),
            name="roi_align",
            tag=tag,
        )
    acc_t = te.compute(
        out_shape, lambda k, ph, pw, c: body(k, c, ph, pw), name="roi_align_acc", tag=tag
    )
    return te.compute(
        out_shape,
        lambda k, ph, pw, c: final(k, acc_t[k, ph, pw, c]),
        name="roi_align",
        tag=tag,
    )


def pooled_compute(data, rois, pooled, geometry, out_channels, mode, layout, tag, channel_of=None,
                   zero_point=None, output=None):
    """The TE compute of a RoIAlign-like op on one feature map: ``geometry(roi, acc, idx)`` is a
    roi's :class:`RoiGeometry` (``roi(j)``: column ``j`` of its row in ``acc``),
    ``channel_of(c, ph, pw)`` the data channel output channel ``c`` of bin ``(ph, pw)`` reads
    (None: ``c``). Output in ``layout`` with ``out_channels`` channels, in data's dtype; for a
    quantized map, ``zero_point`` is taken off every value read (in ``acc``) and ``output(value)``
    makes the output element of the pooled value (in ``acc``)."""
    _, _, height, width = data_dims(data.shape, layout)
    out_shape = output_shape(rois.shape[0], out_channels, pooled, layout)
    acc = accumulate_dtype(data.dtype)
    idx = index_dtype_for(data.shape, out_shape)

    def roi_geometry_of(k):
        return geometry(lambda j: rois[k, j].astype(acc), acc, idx)

    def body(k, c, ph, pw):
        geo = roi_geometry_of(k)
        channel = c if channel_of is None else channel_of(c, ph, pw)
        load = channel_reader(data, layout, geo.batch, channel, acc)

        def read(y, x):
            value = load(y, x)
            return value if zero_point is None else value - tirx.const(float(zero_point), acc)

        def value(iy, ix):
            y, x = sample_point(geo, ph, pw, iy, ix, acc)
            co = bilinear_coeffs(y, x, height, width, geo.roi_ok, acc, geo.idx)
            return sample_value(read, co, mode, acc)

        return reduce_samples(value, geo, mode, acc)

    def final(k, accumulated):
        if output is None:
            return finalize(accumulated, roi_geometry_of(k), mode, acc, data.dtype)
        return output(finalize(accumulated, roi_geometry_of(k), mode, acc, acc))

    return accumulate_then_finalize(out_shape, layout, body, final, tag)
