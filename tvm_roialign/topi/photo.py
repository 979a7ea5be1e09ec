"""TE kernels of torchvision's GeneralizedRCNNTransform and its postprocess (eval), for the
photo-in, detections-out function of a detector artifact (:mod:`tvm_roialign.models.detector_photo`).

The arithmetic is the runner's (:mod:`tvm_roialign.runtime.transform`, :mod:`~tvm_roialign.runtime.masks`,
:mod:`~tvm_roialign.runtime.bilinear`), rounding for rounding: torchvision's resized size in float64
(Python floats), the bilinear source coordinates and interpolation in float32 as PyTorch's CPU kernel
(a fused multiply-add where its build fuses, ``fused``), boxes scaled by ``float32(original) /
float32(resized)``. TVM's LLVM code generator contracts a product followed by a sum into one fused
multiply-add; each product whose rounding matters is therefore an explicit ``llvm.fma`` (a product alone
is ``fma(a, b, +0)``, rounded once and left unfused), which ties these kernels to LLVM targets.
"""

from __future__ import annotations

from tvm import te, tirx

__all__ = [
    "expanded_mask_boxes",
    "first_rows",
    "leading_rows",
    "mask_columns",
    "mask_rows",
    "paste_masks",
    "photo_boxes",
    "photo_size",
    "preprocess_photo",
    "resized_size",
    "size_is_served",
]

F32, F64, I64 = "float32", "float64", "int64"


def _f32(value) -> tirx.PrimExpr:
    return tirx.const(value, F32)


def fma(a, b, c) -> tirx.PrimExpr:
    """``a * b + c`` in float32, rounded once."""
    return tirx.call_llvm_pure_intrin(F32, "llvm.fma.f32", a, b, c)


def mul(a, b) -> tirx.PrimExpr:
    """``a * b`` in float32, rounded on its own (never fused with a sum that uses it)."""
    return fma(a, b, _f32(0.0))


def _source(in_size, out_size, dst, fused: bool):
    """``(index0, index1, lambda0, lambda1)`` of output index ``dst`` of PyTorch's bilinear resize
    ``in_size -> out_size`` (``align_corners=False``; :func:`~tvm_roialign.runtime.bilinear_weights`)."""
    scale = in_size.astype(F32) / out_size.astype(F32)
    half = dst.astype(F32) + _f32(0.5)
    src = fma(scale, half, _f32(-0.5)) if fused else mul(scale, half) - _f32(0.5)
    src = tirx.max(src, _f32(0.0))
    index0 = tirx.min(tirx.floor(src).astype(I64), in_size - 1)
    lambda1 = tirx.min(tirx.max(src - index0.astype(F32), _f32(0.0)), _f32(1.0))
    index1 = index0 + tirx.Select(index0 < in_size - 1, tirx.const(1, I64), tirx.const(0, I64))
    return index0, index1, _f32(1.0) - lambda1, lambda1


def _lerp(a, wa, b, wb, fused: bool):
    return fma(a, wa, mul(b, wb)) if fused else mul(a, wa) + mul(b, wb)


def _bilinear(read, rows, columns, in_h, in_w, y, x, fused: bool):
    """The value at ``(y, x)`` of ``read(row, column)`` (``in_h x in_w``) resized to ``rows x
    columns``: along the width, then the height, as PyTorch's separable CPU kernel."""
    x0, x1, wx0, wx1 = _source(in_w, columns, x, fused)
    y0, y1, wy0, wy1 = _source(in_h, rows, y, fused)
    top = _lerp(read(y0, x0), wx0, read(y0, x1), wx1, fused)
    bottom = _lerp(read(y1, x0), wx0, read(y1, x1), wx1, fused)
    return _lerp(top, wy0, bottom, wy1, fused)


def resized_size(photo: te.Tensor, min_size: int, max_size: int) -> te.Tensor:
    """``[2]`` int64: torchvision's resized ``(h, w)`` of a ``[H, W, 3]`` photo, ``floor(side *
    min(min_size / short side, max_size / long side))`` in float64 as its Python floats."""
    height, width = (photo.shape[i].astype(F64) for i in (0, 1))
    scale = tirx.min(
        tirx.const(float(min_size), F64) / tirx.min(height, width),
        tirx.const(float(max_size), F64) / tirx.max(height, width),
    )
    sizes = [tirx.floor(side * scale).astype(I64) for side in (height, width)]
    return te.compute((2,), lambda i: tirx.Select(i == 0, sizes[0], sizes[1]), name="resized_size")


def size_is_served(sizes: te.Tensor, lowest: te.Tensor, divisor: int, bounds) -> te.Tensor:
    """``[1]`` int64: 1 if the padded size of the resized ``sizes`` lies within ``bounds`` (the
    function's sides) and the resized height is at least ``lowest[padded height // divisor]`` (the
    smallest height at which torchvision's poolers infer the function's scales; a negative entry
    when they never do)."""

    def padded(side):
        return (side + divisor - 1) // divisor * divisor

    def served():
        height, width = padded(sizes[0]), padded(sizes[1])
        inside = tirx.all(height >= bounds[0], height <= bounds[1], width >= bounds[0], width <= bounds[1])
        index = tirx.min(height // divisor, lowest.shape[0] - 1)
        ok = tirx.all(inside, lowest[index] >= 0, sizes[0] >= lowest[index])
        return tirx.Select(ok, tirx.const(1, I64), tirx.const(0, I64))

    return te.compute((1,), lambda _i: served(), name="size_is_served")


def preprocess_photo(photo: te.Tensor, rows, columns, settings, fused: bool) -> te.Tensor:
    """``[1, 3, Hp, Wp]`` float32: the ``[H, W, 3]`` uint8 photo to [0, 1], normalized with
    ``settings``' mean and std, resized to ``rows x columns`` and zero-padded to a multiple of
    its ``size_divisible``."""
    divisor = int(settings.size_divisible)
    padded = [(side + divisor - 1) // divisor * divisor for side in (rows, columns)]
    mean, std = settings.image_mean, settings.image_std

    def channel_value(values, c):
        return tirx.Select(c == 0, _f32(values[0]), tirx.Select(c == 1, _f32(values[1]), _f32(values[2])))

    def pixel(_n, c, y, x):
        def read(r, q):
            value = photo[r, q, c].astype(F32) / _f32(255.0)
            return (value - channel_value(mean, c)) / channel_value(std, c)

        value = _bilinear(read, rows, columns, photo.shape[0], photo.shape[1], y, x, fused)
        return tirx.if_then_else(tirx.all(y < rows, x < columns), value, _f32(0.0))

    return te.compute((1, 3, *padded), pixel, name="preprocess_photo")


def photo_boxes(boxes: te.Tensor, count, sizes: te.Tensor, photo_size) -> te.Tensor:
    """``[count, 4]``: the first ``count`` of ``boxes [1, D, 4]`` (resized image's pixels) in the
    photo's, torchvision's ``resize_boxes`` (``box * float32(original) / float32(resized)``)."""

    def ratio(axis):
        return photo_size[axis].astype(F32) / sizes[axis].astype(F32)

    def scaled(i, k):
        return mul(boxes[0, i, k], tirx.Select(k % 2 == 0, ratio(1), ratio(0)))

    return te.compute((count, 4), scaled, name="photo_boxes")


def first_rows(values: te.Tensor, count) -> te.Tensor:
    """``[count]``: the first ``count`` entries of ``values [1, D]``."""
    return te.compute((count,), lambda i: values[0, i], name="first_rows")


def leading_rows(values: te.Tensor, count) -> te.Tensor:
    """``[count, ...]``: the first ``count`` rows of ``values [D, ...]``."""
    return te.compute((count, *values.shape[1:]), lambda *i: values[i], name="leading_rows")


def photo_size(photo: te.Tensor) -> te.Tensor:
    """``[2]`` int64: the ``(H, W)`` of a ``[H, W, 3]`` photo."""
    return te.compute((2,), lambda i: tirx.Select(i == 0, photo.shape[0], photo.shape[1]), name="photo_size")


def expanded_mask_boxes(boxes: te.Tensor, mask_size: int, padding: int = 1) -> te.Tensor:
    """``[n, 4]`` int64: ``boxes`` widened about their centres by ``(M + 2 padding) / M`` and
    truncated (torchvision's ``expand_boxes``; :func:`~tvm_roialign.runtime.masks.expand_boxes`)."""
    scale = _f32(float(mask_size + 2 * padding) / mask_size)
    half = _f32(0.5)

    def corner(i, k):
        low, high = boxes[i, k % 2], boxes[i, k % 2 + 2]
        half_side = mul(mul(high - low, half), scale)
        centre = mul(high + low, half)
        value = tirx.Select(k < 2, centre - half_side, centre + half_side)
        return tirx.trunc(value).astype(I64)

    return te.compute((boxes.shape[0], 4), corner, name="expanded_mask_boxes")


def _box_extent(expanded, i, axis):
    """``(low, high, length)`` of detection ``i``'s expanded box along ``axis`` (0: x, 1: y)."""
    low, high = expanded[i, axis], expanded[i, axis + 2]
    return low, high, tirx.max(high - low + 1, 1)


def mask_columns(masks: te.Tensor, expanded: te.Tensor, width) -> te.Tensor:
    """``[n, M + 2, W]``: the rows of each zero-padded ``masks [1, D, M, M]`` map resized along the
    width to its ``expanded`` box, at the photo's columns (zero outside the box): the first pass of
    :func:`paste_masks`' separable resize."""
    size = masks.shape[-1]

    def value(i, r, x):
        x0, x1, length = _box_extent(expanded, i, 0)

        def read(q):
            # the padding's zeros; the indices clamped too, for a vectorized select reads both sides
            inside = tirx.all(r >= 1, r <= size, q >= 1, q <= size)
            row, column = (tirx.min(tirx.max(v - 1, 0), size - 1) for v in (r, q))
            return tirx.Select(inside, masks[0, i, row, column], _f32(0.0))

        q0, q1, w0, w1 = _source(size + 2, length, x - x0, True)
        resized = _lerp(read(q0), w0, read(q1), w1, True)
        return tirx.if_then_else(tirx.all(x >= x0, x <= x1), resized, _f32(0.0))

    return te.compute((expanded.shape[0], size + 2, width), value, name="mask_columns")


def mask_rows(expanded: te.Tensor, height, size: int):
    """``(rows [n, H, 2] int64, weights [n, H, 2])``: per photo row, the two rows of
    :func:`mask_columns` and their weights of the resize along the height (``size``: M)."""

    def source(i, y):
        y0, _, length = _box_extent(expanded, i, 1)
        return _source(tirx.const(size + 2, I64), length, y - y0, True)

    def row(i, y, j):
        r0, r1, _, _ = source(i, y)
        return tirx.Select(j == 0, r0, r1)

    def weight(i, y, j):
        _, _, w0, w1 = source(i, y)
        return tirx.Select(j == 0, w0, w1)

    shape = (expanded.shape[0], height, 2)
    return te.compute(shape, row, name="mask_rows"), te.compute(shape, weight, name="mask_row_weights")


def paste_masks(
    columns: te.Tensor, rows: te.Tensor, weights: te.Tensor, expanded: te.Tensor,
    threshold: float = 0.5,
) -> te.Tensor:
    """``[n, H, W]`` uint8: each mask map (padded by one pixel of zeros) resized bilinearly to its
    ``expanded`` box and pasted into the photo, thresholded (``> threshold``): torchvision's
    ``paste_masks_in_image`` (:func:`~tvm_roialign.runtime.paste_masks`), from the width pass
    ``columns`` (:func:`mask_columns`) and the rows and weights of the height pass
    (:func:`mask_rows`)."""

    def pixel(i, y, x):
        x0, x1, _ = _box_extent(expanded, i, 0)
        y0, y1, _ = _box_extent(expanded, i, 1)
        top, bottom = columns[i, rows[i, y, 0], x], columns[i, rows[i, y, 1], x]
        value = _lerp(top, weights[i, y, 0], bottom, weights[i, y, 1], True)
        inside = tirx.all(x >= x0, x <= x1, y >= y0, y <= y1)
        hit = tirx.all(inside, value > _f32(threshold))
        return tirx.Select(hit, tirx.const(1, "uint8"), tirx.const(0, "uint8"))

    shape = (expanded.shape[0], rows.shape[1], columns.shape[2])
    return te.compute(shape, pixel, name="paste_masks")
