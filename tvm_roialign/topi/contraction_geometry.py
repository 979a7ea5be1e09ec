"""What the bf16 and int8 contraction computes share (:mod:`.bf16_contraction`,
:mod:`.int8_contraction`): a conv2d (NHWC) seen as a GEMM (:class:`ConvGeometry`), its im2col
rows (:func:`gather_conv`), the output indices of a GEMM row, and the packing of a constant
``[K, N]`` weight into the blocks of 32 columns the micro-kernels read, ``group`` consecutive
reduction elements of a column side by side (:func:`pack_columns`: 2 for bf16 pairs, 4 for int8
quads).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

#: columns of one packed block of weights (the micro-kernels' 32 x 32 output block)
BLOCK_N = 32

#: the reduction depth a narrow-tap kernel row is padded to (:attr:`ConvGeometry.row_taps`)
ROW_TAP_DEPTH = 32


def round_up(value, multiple: int):
    """``value`` (an int, or a symbolic row count) rounded up to a multiple of ``multiple``."""
    return (value + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class ConvGeometry:
    """An NHWC conv2d as a GEMM: output ``[n, oh, ow, o]``, kernel ``kh x kw`` over ``c`` channels
    (``n``, ``oh``, ``ow`` ints, or expressions of a symbolic image size)."""

    n: object
    oh: object
    ow: object
    kh: int
    kw: int
    c: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    #: narrow taps (an RGB stem): the reduction runs over kernel rows, each a run of ``kw * c``
    #: elements contiguous in the (padded) input, zero-padded to :data:`ROW_TAP_DEPTH`
    row_taps: bool = False

    @property
    def rows(self):
        return self.n * self.oh * self.ow

    @property
    def reduction(self) -> int:
        if self.row_taps:
            return self.kh * ROW_TAP_DEPTH
        return self.kh * self.kw * self.c


def nhwc_reader(x: te.Tensor, height, width):
    """Index ``x`` (NHWC, or rows ``[Mp, c]`` of an image ``height x width``) as NHWC."""
    if len(x.shape) == 4:
        return lambda b, y, x_, ch: x[b, y, x_, ch]
    return lambda b, y, x_, ch: x[(b * height + y) * width + x_, ch]


def gather_conv(x: te.Tensor, g: ConvGeometry, in_hw, convert=None, zero=None):
    """``(m, k) -> value`` of im2col row ``m`` column ``k``: ``convert`` (default: as it is) of the
    input point, ``zero`` (default: 0 of ``x``'s dtype) outside the image; ``x`` is NHWC or rows
    ``[Mp, c]`` of an ``in_hw`` image."""
    height, width = in_hw
    zero = tirx.const(0, x.dtype) if zero is None else zero
    convert = convert or (lambda value: value)
    read = nhwc_reader(x, height, width)

    def value(m, k):
        b = m // (g.oh * g.ow)
        oy = m // g.ow % g.oh
        ox = m % g.ow
        ky = k // (g.kw * g.c)
        kx = k // g.c % g.kw
        ch = k % g.c
        iy = oy * g.stride[0] - g.padding[0] + ky * g.dilation[0]
        ix = ox * g.stride[1] - g.padding[1] + kx * g.dilation[1]
        inside = tirx.all(iy >= 0, iy < height, ix >= 0, ix < width)
        safe_y = tirx.max(tirx.min(iy, height - 1), 0)
        safe_x = tirx.max(tirx.min(ix, width - 1), 0)
        return tirx.if_then_else(inside, convert(read(b, safe_y, safe_x, ch)), zero)

    return value


def unflatten(m, out_shape, rows) -> tuple:
    """The output indices (all but the channel) of GEMM row ``m`` (clamped to the real rows)."""
    safe = tirx.min(m, rows - 1)
    dims, idx = out_shape[:-1], []
    for j, dim in enumerate(dims):
        inner = 1
        for later in dims[j + 1:]:
            inner = inner * later
        idx.append(safe // inner % dim)
    return tuple(idx)


def gemm_row(idx, out_shape):
    """The GEMM row of the output point ``idx`` (all its indices but the channel, flattened)."""
    row = idx[0]
    for dim, i in zip(out_shape[1:-1], idx[1:-1]):
        row = row * dim + i
    return row


def pack_columns(weight: np.ndarray, depth: int, group: int, dtype) -> np.ndarray:
    """``weight [K, N]`` -> ``[Np / 32, Kp / group, 32, group]`` of ``dtype``: zero-padded to
    ``Kp`` (a multiple of ``depth``) and ``Np`` (of :data:`BLOCK_N`), blocks of 32 columns, each
    with ``group`` consecutive reduction elements of a column side by side."""
    k, n = weight.shape
    kp, np_ = round_up(k, depth), round_up(n, BLOCK_N)
    padded = np.zeros((kp, np_), dtype)
    padded[:k, :n] = weight
    blocks = padded.reshape(kp // group, group, np_ // BLOCK_N, BLOCK_N)
    return np.ascontiguousarray(blocks.transpose(2, 0, 3, 1))


__all__ = [
    "BLOCK_N",
    "ROW_TAP_DEPTH",
    "ConvGeometry",
    "gather_conv",
    "gemm_row",
    "nhwc_reader",
    "pack_columns",
    "round_up",
    "unflatten",
]
