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
from dataclasses import dataclass

import tvm
from tvm import te, tirx

__all__ = [
    "LAYOUTS",
    "MAX_ADAPTIVE_GRID",
    "MODES",
    "accumulate_dtype",
    "accumulate_then_finalize",
    "check_roi_align_args",
    "index_dtype_for",
    "normalize_pooled_size",
    "roi_align",
    "roi_align_nchw",
    "roi_align_nhwc",
]

LAYOUTS = ("NCHW", "NHWC")
MODES = ("avg", "max", "onnx_max")
FLOAT_DTYPES = ("float16", "float32", "float64")
INT32_MAX = 2**31 - 1
#: Largest adaptive sampling grid per bin side; a larger (or non-finite) roi/pooled ratio is capped
#: (finite) or gives an empty grid (non-finite), so that the kernel always terminates.
MAX_ADAPTIVE_GRID = 32768  # grid_h * grid_w stays below 2**31


def accumulate_dtype(dtype: str) -> str:
    """Accumulation dtype for ``dtype``: float64 for float64, float32 otherwise."""
    return "float64" if str(dtype) == "float64" else "float32"


def _static_numel(shape) -> int | None:
    total = 1
    for dim in shape:
        if not isinstance(dim, (int, tirx.IntImm)):
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


def check_roi_align_args(data_shape, data_dtype, rois_shape, rois_dtype, pooled_size, layout, mode):
    """Validate RoIAlign arguments; raise ValueError / TypeError naming the argument.

    Returns ``(PH, PW)``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if len(data_shape) != 4:
        form = "[N, C, H, W]" if layout == "NCHW" else "[N, H, W, C]"
        raise ValueError(f"data must be 4-D {form} for layout {layout}, got shape {list(data_shape)}")
    if len(rois_shape) != 2 or (
        isinstance(rois_shape[1], (int, tirx.IntImm)) and int(rois_shape[1]) != 5
    ):
        raise ValueError(
            "rois must be [K, 5] rows of (batch_index, x1, y1, x2, y2), "
            f"got shape {list(rois_shape)}"
        )
    if str(data_dtype) not in FLOAT_DTYPES:
        raise TypeError(f"data dtype must be one of {FLOAT_DTYPES}, got {data_dtype}")
    if str(rois_dtype) != str(data_dtype):
        raise TypeError(f"rois dtype ({rois_dtype}) must equal data dtype ({data_dtype})")
    return normalize_pooled_size(pooled_size)


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
    """``ceil(size / pooled)`` capped at :data:`MAX_ADAPTIVE_GRID`; 0 (empty) unless in ``(0, 1e30)``."""
    cap = tirx.const(float(MAX_ADAPTIVE_GRID), acc)
    zero = tirx.const(0.0, acc)
    # NaN and +-inf fail one of the comparisons and give an empty grid.
    finite = tirx.all(size_over_pooled > zero, size_over_pooled < tirx.const(1e30, acc))
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

    ``te.max`` lowers to compare-and-select, so a NaN size becomes 1; a NaN size only comes from a
    non-finite coordinate, and :func:`roi_is_valid` makes such a roi a row of zeros before any of
    its samples is taken.
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


def roi_is_valid(roi, num_batch, acc):
    """Whether a roi is pooled at all: batch index in ``(-1, N)`` (torchvision truncates it toward
    zero) and four finite coordinates. NaN and infinities fail, so the index is safe to use."""
    b = roi(0)
    return tirx.all(
        b > tirx.const(-1.0, acc),
        b < tirx.Cast(acc, num_batch),
        *(tirx.isfinite(roi(j)) for j in (1, 2, 3, 4)),
    )


def roi_geometry(
    roi, num_batch, pooled, spatial_scale, sampling_ratio, aligned, acc, idx, half_pixel=False
):
    """Per-roi geometry from ``roi(j)`` (column ``j`` of the roi row, in the accumulate dtype)."""
    ph, pw = pooled
    start_h, start_w, roi_h, roi_w = roi_box(roi, spatial_scale, aligned, half_pixel, acc)
    pooled_h = tirx.const(float(ph), acc)
    pooled_w = tirx.const(float(pw), acc)
    if sampling_ratio > 0:
        grid_h = grid_w = tirx.const(int(sampling_ratio), idx)
    else:
        grid_h = adaptive_grid(roi_h / pooled_h, acc, idx)
        grid_w = adaptive_grid(roi_w / pooled_w, acc, idx)
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
    return y, x


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


def _roi_align(
    data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned, layout, half_pixel
):
    pooled = check_roi_align_args(
        data.shape, data.dtype, rois.shape, rois.dtype, pooled_size, layout, mode
    )
    spatial_scale = float(spatial_scale)
    if not math.isfinite(spatial_scale) or spatial_scale <= 0:
        raise ValueError(f"spatial_scale must be a positive finite float, got {spatial_scale}")
    sampling_ratio = int(sampling_ratio)
    if layout == "NCHW":
        num_batch, channels, height, width = data.shape
    else:
        num_batch, height, width, channels = data.shape
    num_rois = rois.shape[0]
    pooled_h, pooled_w = pooled
    if layout == "NCHW":
        out_shape = (num_rois, channels, pooled_h, pooled_w)
    else:
        out_shape = (num_rois, pooled_h, pooled_w, channels)
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

    def body(k, c, ph, pw):
        geo = geometry(k)

        def value(iy, ix):
            y, x = sample_point(geo, ph, pw, iy, ix, acc)
            co = bilinear_coeffs(y, x, height, width, geo.roi_ok, acc, idx)
            if layout == "NCHW":
                load = lambda yy, xx: data[geo.batch, c, yy, xx].astype(acc)
            else:
                load = lambda yy, xx: data[geo.batch, yy, xx, c].astype(acc)
            return sample_value(load, co, mode, acc)

        return reduce_samples(value, geo, mode, acc)

    return accumulate_then_finalize(
        out_shape,
        layout,
        body,
        lambda k, accumulated: finalize(accumulated, geometry(k), mode, acc, data.dtype),
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
    return _roi_align(
        data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned, "NCHW", half_pixel
    )


def roi_align_nhwc(data, rois, pooled_size, spatial_scale=1.0, mode="avg", sampling_ratio=-1,
                   aligned=False, half_pixel=False):
    """RoIAlign on NHWC data: ``data [N, H, W, C]`` -> ``[K, PH, PW, C]``.

    Arguments, semantics and errors as :func:`roi_align_nchw`.
    """
    return _roi_align(
        data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned, "NHWC", half_pixel
    )


def roi_align(data, rois, pooled_size, spatial_scale=1.0, mode="avg", sampling_ratio=-1,
              aligned=False, layout="NCHW", half_pixel=False):
    """RoIAlign dispatcher over ``layout`` (``"NCHW"`` or ``"NHWC"``); raises ValueError otherwise."""
    args = (data, rois, pooled_size, spatial_scale, mode, sampling_ratio, aligned, half_pixel)
    if layout == "NCHW":
        return roi_align_nchw(*args)
    if layout == "NHWC":
        return roi_align_nhwc(*args)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
