"""Sampling helpers shared by the RoIAlign computes of this package.

The TE computes of :mod:`tvm_roialign.topi.roi_align` and :mod:`tvm_roialign.topi.multiscale_roi_align`
and the hand-scheduled CPU kernel of :mod:`tvm_roialign.strategies.cpu_kernel` build their geometry,
sampling grid, bilinear weights and final value from these functions, so that every code path
rounds the same float operations in the same order (the contract is in
:mod:`tvm_roialign.topi.roi_align`'s docstring):

* dtypes and sizes: :func:`accumulate_dtype`, :func:`index_dtype_for`, :func:`normalize_pooled_size`;
* shapes by layout: :func:`data_dims`, :func:`output_shape`, :func:`data_form`, :func:`channel_reader`;
* per roi: :func:`roi_is_valid`, :func:`roi_box` (products fenced by :func:`exact_product`),
  :func:`adaptive_grid`, :func:`sampling_grid`, :func:`roi_geometry`, :func:`rotated_roi_geometry`
  (the rotated family: the same grid in the roi's own frame, turned about its centre);
* per sample: :func:`sample_point`, :func:`bilinear_coeffs`, :func:`sample_value`;
* per output: :func:`reduce_samples`, :func:`finalize`, :func:`accumulate_then_finalize`, and
  :func:`pooled_compute`, the whole compute of a RoIAlign-like op from its per-roi geometry and its
  channel mapping (roi_align, roi_align_rotated, ps_roi_align).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import te, tirx

LAYOUTS = ("NCHW", "NHWC")
MODES = ("avg", "max", "onnx_max")
FLOAT_DTYPES = ("float16", "float32", "float64")
INT32_MAX = 2**31 - 1
#: Largest adaptive sampling grid per bin side; a larger (or non-finite) roi/pooled ratio is capped
#: (finite) or gives an empty grid (non-finite), so that the kernel always terminates.
MAX_ADAPTIVE_GRID = 32768  # grid_h * grid_w stays below 2**31
#: A roi size / pooled size ratio at or above this (or NaN, or not positive) gives an empty grid:
#: +inf fails the comparison, and so does any value whose ceil would not fit the index dtype.
GRID_RATIO_BOUND = 1e30


def accumulate_dtype(dtype: str) -> str:
    """Accumulation dtype for ``dtype``: float64 for float64, float32 otherwise."""
    return "float64" if str(dtype) == "float64" else "float32"


def is_static(dim) -> bool:
    """Whether a dimension is a known integer (not symbolic, not unknown)."""
    return isinstance(dim, (int, tirx.IntImm))


def _static_numel(shape) -> int | None:
    total = 1
    for dim in shape:
        if not is_static(dim):
            return None
        total *= int(dim)
    return total


def index_dtype_for(*shapes) -> str:
    """``"int64"`` if any shape has more than ``2**31 - 1`` elements or a symbolic dimension."""
    for shape in shapes:
        numel = _static_numel(shape)
        if numel is None or numel > INT32_MAX:
            return "int64"
    return "int32"


def normalize_pooled_size(pooled_size) -> tuple[int, int]:
    """``int`` or ``(PH, PW)`` -> ``(PH, PW)``; raises ValueError unless both are positive ints."""
    if isinstance(pooled_size, (int, tirx.IntImm)):
        pooled = (int(pooled_size), int(pooled_size))
    else:
        try:
            pooled = tuple(int(p) for p in pooled_size)
        except TypeError as err:
            raise ValueError(
                f"pooled_size must be an int or a pair (PH, PW) of positive ints, got {pooled_size!r}"
            ) from err
    if len(pooled) != 2 or min(pooled) <= 0:
        raise ValueError(
            f"pooled_size must be an int or a pair (PH, PW) of positive ints, got {pooled_size!r}"
        )
    return pooled


def data_dims(shape, layout):
    """``(N, C, H, W)`` of a data shape in ``layout`` (``"NCHW"`` or ``"NHWC"``)."""
    if layout == "NCHW":
        num_batch, channels, height, width = shape
    else:
        num_batch, height, width, channels = shape
    return num_batch, channels, height, width


def output_shape(num_rois, channels, pooled, layout):
    """``(K, C, PH, PW)`` (NCHW) or ``(K, PH, PW, C)`` (NHWC)."""
    pooled_h, pooled_w = pooled
    if layout == "NCHW":
        return (num_rois, channels, pooled_h, pooled_w)
    return (num_rois, pooled_h, pooled_w, channels)


def data_form(layout) -> str:
    """How a 4-D data shape is written for ``layout``, for error messages."""
    return "[N, C, H, W]" if layout == "NCHW" else "[N, H, W, C]"


def check_layout_and_mode(layout, mode) -> None:
    """Raise ValueError unless ``layout`` and ``mode`` are supported."""
    check_layout(layout)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


#: The row form of RoIAlign's ``[K, 5]`` rois, for error messages.
BOX_ROW = "(batch_index, x1, y1, x2, y2)"


def check_rois_shape(rois_shape, columns: int = 5, row_form: str = BOX_ROW) -> None:
    """Raise ValueError unless ``rois_shape`` is ``[K, columns]`` (rows of ``row_form``)."""
    if len(rois_shape) != 2 or (is_static(rois_shape[1]) and int(rois_shape[1]) != columns):
        raise ValueError(
            f"rois must be [K, {columns}] rows of {row_form}, got shape {list(rois_shape)}"
        )


def check_data_and_rois(
    data_shape, data_dtype, rois_shape, rois_dtype, layout, columns: int = 5, row_form: str = BOX_ROW
) -> None:
    """The checks the RoI family's computes share (``layout`` already checked): ``data`` 4-D in
    ``layout``, ``rois`` ``[K, columns]`` rows of ``row_form``, a float data dtype, the rois' dtype
    equal to it. Raises ValueError (shapes) / TypeError (dtypes) naming the argument."""
    if len(data_shape) != 4:
        raise ValueError(
            f"data must be 4-D {data_form(layout)} for layout {layout}, got shape {list(data_shape)}"
        )
    check_rois_shape(rois_shape, columns, row_form)
    if str(data_dtype) not in FLOAT_DTYPES:
        raise TypeError(f"data dtype must be one of {FLOAT_DTYPES}, got {data_dtype}")
    if str(rois_dtype) != str(data_dtype):
        raise TypeError(f"rois dtype ({rois_dtype}) must equal data dtype ({data_dtype})")


def check_layout(layout) -> None:
    """Raise ValueError unless ``layout`` is supported."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


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
    #: rotated rois: ``(cos, sin, centre_h, centre_w)``; the grid (``start``/``bin``) is then in the
    #: roi's own frame, centred on 0, and :func:`sample_point` turns it about the centre
    rotation: tuple | None = None


@dataclass
class BilinearCoeffs:
    """The four corner positions and weights of one sample, shared across channels.

    ``valid`` and the weights are Let-bound variables (each is computed once and the TIR stays
    small): an expression that uses them must be wrapped with :meth:`wrap`, as :func:`sample_value`
    does. The positions are plain expressions, always inside the feature map.
    """

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
    """``ceil(size / pooled)`` capped at :data:`MAX_ADAPTIVE_GRID` per side; 0 (an empty grid)
    unless the ratio is in ``(0, GRID_RATIO_BOUND)`` (NaN and infinities fail the comparisons)."""
    cap = tirx.const(float(MAX_ADAPTIVE_GRID), acc)
    zero = tirx.const(0.0, acc)
    finite = tirx.all(
        size_over_pooled > zero, size_over_pooled < tirx.const(GRID_RATIO_BOUND, acc)
    )
    grid = te.min(tirx.ceil(size_over_pooled), cap)
    return tirx.Select(finite, grid, zero).astype(idx)


def exact_product(a, b):
    """``a * b`` rounded once, as a separate multiplication (never fused into a multiply-add).

    With a target whose CPU has fused multiply-add (x86 with FMA, every aarch64), LLVM contracts
    ``x * s - 0.5`` into one ``fma`` rounded once, while torchvision's CPU kernel rounds the product
    first; the roi size and with it an adaptive sampling grid can then differ. The product is fenced
    for the current target (``tvm.target.Target.current()``): ``llvm.arithmetic.fence`` for llvm
    targets, ``__fmul_rn`` / ``__dmul_rn`` for CUDA; other targets (Metal, which compiles with fast
    math) and no current target get the plain product.
    """
    product = a * b
    target = tvm.target.Target.current(allow_none=True)
    kind = target.kind.name if target is not None else None
    dtype = str(product.ty.dtype)
    if kind == "llvm":
        return tirx.call_llvm_pure_intrin(dtype, "llvm.arithmetic.fence", product)
    if kind == "cuda" and dtype in _CUDA_MUL_RN:
        return tirx.call_pure_extern(dtype, _CUDA_MUL_RN[dtype], a, b)
    return product


_CUDA_MUL_RN = {"float32": "__fmul_rn", "float64": "__dmul_rn"}


def clamp_roi_size(size, acc):
    """``max(size, 1)`` (torchvision's clamp of a malformed roi to 1 x 1).

    ``te.max`` lowers to compare-and-select, so a NaN size becomes 1. A NaN size comes from a
    non-finite coordinate, which :func:`roi_is_valid` turns into a row of zeros, or from finite
    coordinates whose scaled values overflow to infinity, whose samples are then all infinite or
    NaN and so outside the map.
    """
    return te.max(size, tirx.const(1.0, acc))


def roi_box(roi, spatial_scale, aligned, half_pixel, acc):
    """``(start_h, start_w, roi_h, roi_w)`` of one roi in feature-map pixels, rounded as
    torchvision's kernel: ``start = x1 * spatial_scale - offset`` (offset 0.5 with ``half_pixel``,
    else 0), ``size = end - start``, clamped to >= 1 unless ``aligned``."""
    scale = tirx.const(float(spatial_scale), acc)
    half = tirx.const(0.5, acc)

    def coordinate(j):
        value = exact_product(roi(j), scale)
        return value - half if half_pixel else value

    start_w, start_h, end_w, end_h = (coordinate(j) for j in (1, 2, 3, 4))
    roi_w = end_w - start_w
    roi_h = end_h - start_h
    if not aligned:
        roi_w = clamp_roi_size(roi_w, acc)
        roi_h = clamp_roi_size(roi_h, acc)
    return start_h, start_w, roi_h, roi_w


def roi_is_valid(roi, num_batch, acc, columns=(1, 2, 3, 4)):
    """Whether a roi is pooled at all: batch index in ``(-1, N)`` (torchvision truncates it toward
    zero) and finite coordinates (``columns``: the four box corners; ``(1, ..., 5)`` for a rotated
    roi). NaN and infinities fail, so the index is safe to use."""
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
    roi, num_batch, pooled, spatial_scale, sampling_ratio, aligned, acc, idx, half_pixel=False
):
    """Per-roi geometry from ``roi(j)`` (column ``j`` of the roi row, in the accumulate dtype)."""
    ph, pw = pooled
    start_h, start_w, roi_h, roi_w = roi_box(roi, spatial_scale, aligned, half_pixel, acc)
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
    )


def rotated_roi_geometry(
    roi, num_batch, pooled, spatial_scale, sampling_ratio, aligned, angle_scale, clockwise, acc, idx
):
    """Per-roi geometry of a rotated roi ``(batch, cx, cy, w, h, angle)`` (``roi(j)`` in ``acc``).

    ``centre = c * spatial_scale - offset`` (offset 0.5 when ``aligned``, the product rounded on its
    own), ``size = w * spatial_scale`` (clamped to >= 1 unless ``aligned``), ``theta = angle *
    angle_scale`` (``pi / 180`` for degrees, 1 for radians), negated when ``clockwise``. The grid
    is the axis-aligned one of a box of that size centred on 0 (``start = -size / 2``), sampled by
    :func:`sample_point`, which turns each point by ``theta`` about the centre.
    """
    ph, pw = pooled
    scale = tirx.const(float(spatial_scale), acc)
    offset = tirx.const(0.5, acc)

    def centre(j):
        value = exact_product(roi(j), scale)
        return value - offset if aligned else value

    roi_w = exact_product(roi(3), scale)
    roi_h = exact_product(roi(4), scale)
    if not aligned:
        roi_w = clamp_roi_size(roi_w, acc)
        roi_h = clamp_roi_size(roi_h, acc)
    theta = roi(5) if float(angle_scale) == 1.0 else exact_product(
        roi(5), tirx.const(float(angle_scale), acc)
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
    )


def _axis_coeffs(lets, coord, size, acc, idx, axis):
    """Clamp one sample coordinate as torchvision does; returns (low, high, frac).

    ``low`` and ``high`` are plain expressions (they index the data, whose read region TE derives
    from them) and are in ``[0, size - 1]`` for every input, NaN and infinities included; ``frac`` is
    a Let-bound variable. torchvision: ``y <= 0 -> 0``; ``y_low >= size - 1 -> y_low = y_high =
    size - 1, frac 0``. Clamping the coordinate to ``[0, size - 1]`` first gives the same result.
    """
    zero = tirx.const(0.0, acc)
    last_f = tirx.Cast(acc, size) - tirx.const(1.0, acc)
    # te.max / te.min lower to compare-and-select (not IEEE maxnum): max(NaN, 0) is 0
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
    """Feature-map coordinates of sample ``(iy, ix)`` of bin ``(ph, pw)`` (torchvision's order)."""
    half = tirx.const(0.5, acc)
    y = (
        geo.start_h
        + exact_product(ph.astype(acc), geo.bin_h)
        + (iy.astype(acc) + half) * geo.bin_h / geo.grid_h.astype(acc)
    )
    x = (
        geo.start_w
        + exact_product(pw.astype(acc), geo.bin_w)
        + (ix.astype(acc) + half) * geo.bin_w / geo.grid_w.astype(acc)
    )
    if geo.rotation is None:
        return y, x
    # rotated: (y, x) is the point in the roi's frame; turn it by theta about the centre
    # (counter-clockwise in image coordinates for a positive angle), each product rounded once
    cos, sin, centre_h, centre_w = geo.rotation
    return (
        exact_product(y, cos) - exact_product(x, sin) + centre_h,
        exact_product(y, sin) + exact_product(x, cos) + centre_w,
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
    """avg: divide by ``max(grid_h * grid_w, 1)``; every mode: 0 for an empty grid.

    An empty grid never runs the reduction, and with an adaptive grid TE nests the reduction's
    initialization inside the sampling loops, so the accumulator is not read for an empty grid.
    """
    nonempty = tirx.all(geo.grid_h > 0, geo.grid_w > 0)
    if mode == "avg":
        count = te.max(geo.grid_h * geo.grid_w, tirx.const(1, geo.idx))
        acc_value = acc_value / count.astype(acc)
    return tirx.Select(nonempty, acc_value, tirx.const(0.0, acc)).astype(out_dtype)


def accumulate_then_finalize(out_shape, layout, body, final, tag):
    """The two blocks every RoIAlign-like compute of this package has, the names the schedules
    find: ``roi_align_acc = body(k, c, ph, pw)`` (the reduction over the sampling grid) and
    ``roi_align = final(k, roi_align_acc)``, over ``(K, C, PH, PW)`` in NCHW or ``(K, PH, PW, C)``
    in NHWC."""
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


def pooled_compute(data, num_rois, pooled, geometry, channel_of, out_channels, mode, layout, tag):
    """The TE compute of a RoIAlign-like op on one feature map (:func:`accumulate_then_finalize`).

    ``geometry(k)`` is roi ``k``'s :class:`RoiGeometry`; ``channel_of(c, ph, pw)`` the data channel
    that output channel ``c`` of bin ``(ph, pw)`` reads (``c`` for RoIAlign, ``(c * PH + ph) * PW +
    pw`` for the position-sensitive op). Output ``[K, out_channels, PH, PW]`` (NCHW) or ``[K, PH,
    PW, out_channels]`` (NHWC) in data's dtype.
    """
    _, _, height, width = data_dims(data.shape, layout)
    out_shape = output_shape(num_rois, out_channels, pooled, layout)
    acc = accumulate_dtype(data.dtype)

    def body(k, c, ph, pw):
        geo = geometry(k)

        def value(iy, ix):
            y, x = sample_point(geo, ph, pw, iy, ix, acc)
            co = bilinear_coeffs(y, x, height, width, geo.roi_ok, acc, geo.idx)
            load = channel_reader(data, layout, geo.batch, channel_of(c, ph, pw), acc)
            return sample_value(load, co, mode, acc)

        return reduce_samples(value, geo, mode, acc)

    return accumulate_then_finalize(
        out_shape,
        layout,
        body,
        lambda k, accumulated: finalize(accumulated, geometry(k), mode, acc, data.dtype),
        tag,
    )
