"""The bf16 contraction compute: a conv2d (NHWC) or a matmul as one GEMM on bf16 tiles, fp32 result.

``out = A @ B`` with

bf16 values are held as their uint16 bit patterns (TVM's llvm lowering would otherwise widen a bf16
buffer the function allocates to fp32, which the tile loads cannot read):

* ``A [Mp, Kp]``: bf16 rows of the input read as they are (a matmul, or a 1x1 stride-1 conv, over
  bf16 rows and a multiple of 32 channels), else (stage ``bf16_gather_a``) the activations (fp32
  rounded to bf16, or bf16 rows copied) gathered as the rows of the GEMM (a matmul's rows as they
  are; a convolution's im2col rows, one per output pixel, the reduction running over kernel rows,
  kernel columns and input channels, zero outside the image; narrow taps through a padded copy,
  ``bf16_padded_input``) and zero-padded to ``Mp`` rows and ``Kp`` columns (multiples of the
  micro-kernel's tile);
* ``B [Np / 32, Kp / 2, 32, 2]``: the constant weights in bf16, packed at compile time
  (:func:`pack_weight_vnni`): blocks of 32 columns, each in the pair layout the bf16 dot products
  read (two consecutive reduction elements of a column side by side);
* ``bf16_contraction [Mp, Np]``: the products summed in fp32;
* ``bf16_output``: the :class:`Epilogue` (bias, residual, ReLU) on the sums; fp32 in the op's output
  shape, or bf16 rows ``[Mp, N]`` (uint16).

The schedule is :class:`tvm_roialign.schedules.lowp.bf16.BF16Contraction`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from .contraction_geometry import (
    ConvGeometry,
    gather_conv,
    gemm_row,
    nhwc_reader,
    pack_columns,
    round_up,
    unflatten,
)

#: rows, reduction and columns are padded to multiples of these (the AMX micro-kernel's block)
TILE_M, TILE_K, TILE_N = 32, 32, 32

GATHER_A = "bf16_gather_a"
CONTRACTION = "bf16_contraction"
OUTPUT = "bf16_output"


def to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """``array`` (float) rounded to bf16, nearest-even, as the uint16 bit patterns."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def pack_weight_vnni(weight: np.ndarray) -> np.ndarray:
    """``weight [K, N]`` (float) -> bf16 bits ``[Np / 32, Kp / 2, 32, 2]``, zero-padded (see module)."""
    return to_bf16_bits(pack_columns(np.asarray(weight, np.float32), TILE_K, 2, np.float32))


def bf16_bits(value):
    """The fp32 expression ``value`` rounded to bf16 (nearest-even; NaN kept), as uint16 bits."""
    bits = tirx.reinterpret("uint32", value)
    rounded = (bits + tirx.const(0x7FFF, "uint32") + ((bits >> 16) & tirx.const(1, "uint32"))) >> 16
    return tirx.if_then_else(value != value, tirx.const(0x7FC0, "uint16"), rounded.astype("uint16"))


def bf16_value(bits):
    """The fp32 value of the bf16 ``bits`` (uint16): exact."""
    return tirx.reinterpret("float32", bits.astype("uint32") << tirx.const(16, "uint32"))


PADDED_INPUT = "bf16_padded_input"


def _gather_row_taps(x: te.Tensor, g: ConvGeometry, in_hw):
    """``(m, k) -> x`` for narrow taps (:attr:`ConvGeometry.row_taps`): the input rounded to bf16
    once in a zero-padded copy (wide enough that a kernel row's whole run of ``TILE_K`` elements
    lies inside it), so that each kernel row of an im2col row is one contiguous run."""
    height, width = in_hw
    (ph, pw), c = g.padding, g.c
    extra = -(-(TILE_K - g.kw * c) // c)
    shape = (x.shape[0], height + 2 * ph, width + 2 * pw + extra, c)
    read = nhwc_reader(x, height, width)

    def padded(b, y, x_, ch):
        iy, ix = y - ph, x_ - pw
        inside = tirx.all(iy >= 0, iy < height, ix >= 0, ix < width)
        safe_y = tirx.max(tirx.min(iy, height - 1), 0)
        safe_x = tirx.max(tirx.min(ix, width - 1), 0)
        value = read(b, safe_y, safe_x, ch)
        value = value if str(x.dtype) == "uint16" else bf16_bits(value)
        return tirx.if_then_else(inside, value, tirx.const(0, "uint16"))

    xp = te.compute(shape, padded, name=PADDED_INPUT)

    def value(m, k):
        b = m // (g.oh * g.ow)
        oy = m // g.ow % g.oh
        ox = m % g.ow
        ky, j = k // TILE_K, k % TILE_K
        tap = xp[b, oy * g.stride[0] + ky, ox * g.stride[1] + j // c, j % c]
        return tirx.if_then_else(j < g.kw * c, tap, tirx.const(0, "uint16"))

    return value


@dataclass(frozen=True)
class Epilogue:
    """What the contraction's output stage applies to each fp32 sum, in this order: ``+ bias[n]``,
    ``+ residual`` (an fp32 tensor of the output's shape, or bf16 rows ``[Mp, N]`` as uint16),
    ``max(., 0)``; ``bits_out``: the result rounded to bf16 and stored as rows ``[Mp, N]`` (uint16,
    the padding rows included) instead of fp32 in the op's output shape."""

    bias: bool = False
    residual: bool = False
    relu: bool = False
    bits_out: bool = False


def bf16_rows(rows):
    """The row count of a bf16 activation of ``rows`` GEMM rows: padded to whole 32-row blocks."""
    return round_up(rows, TILE_M)


def direct_operand(geometry: ConvGeometry | None, reduction: int, bits_in: bool) -> bool:
    """Whether the GEMM reads its ``A`` operand straight from bf16 rows (no gather): a matmul or a
    1x1 stride-1 unpadded conv over a multiple of 32 channels (each row is then an A-tile row)."""
    if not bits_in or reduction % TILE_K:
        return False
    if geometry is None:
        return True
    return (geometry.kh, geometry.kw, geometry.stride, geometry.padding) == (1, 1, (1, 1), (0, 0))


def bf16_contraction(x: te.Tensor, packed: te.Tensor, *extra: te.Tensor, rows, reduction: int,
                     out_shape, geometry: ConvGeometry | None = None, epilogue: Epilogue = Epilogue(),
                     in_hw=None) -> te.Tensor:
    """The stages of the module docstring; ``x`` is ``[rows, reduction]`` (a matmul) or the NHWC
    input of a conv of ``geometry``, or (``in_hw`` given for a conv, or uint16 ``x`` for a matmul)
    bf16 rows ``[Mp, c]`` of an ``in_hw`` image; ``packed`` the :func:`pack_weight_vnni`
    weights; ``extra`` the bias ``[N]`` and the residual of ``epilogue``, in this order. ``rows``
    and the output's leading dimensions may be symbolic (an any-size image): the GEMM's rows are
    then padded to ``Mp = ceil(rows / 32) * 32``, so every 32-row block the micro-kernel loads
    and stores lies inside the buffers, its padding rows never read back as real rows."""
    bits_in = str(x.dtype) == "uint16"
    mp, kp = round_up(rows, TILE_M), round_up(reduction, TILE_K)
    np_ = int(packed.shape[0]) * TILE_N
    if direct_operand(geometry, reduction, bits_in):
        a = x
    else:
        if geometry is None:
            source = lambda m, k: x[m, k]
        else:
            hw = in_hw if in_hw is not None else (x.shape[1], x.shape[2])
            source = (_gather_row_taps if geometry.row_taps else gather_conv)(x, geometry, hw)
        zero = tirx.const(0, "uint16")

        def gather(m, k):
            inside = tirx.all(m < rows, k < reduction)
            safe_m, safe_k = tirx.min(m, rows - 1), tirx.min(k, reduction - 1)
            value = source(safe_m, safe_k)
            bits = bits_in or (geometry is not None and geometry.row_taps)
            return tirx.if_then_else(inside, value if bits else bf16_bits(value), zero)

        a = te.compute((mp, kp), gather, name=GATHER_A)
    r = te.reduce_axis((0, kp), "k")
    acc = te.compute(
        (mp, np_),
        lambda m, n: te.sum(
            bf16_value(a[m, r]) * bf16_value(packed[n // TILE_N, r // 2, n % TILE_N, r % 2]),
            axis=r,
        ),
        name=CONTRACTION,
    )
    return _output(acc, list(extra), epilogue, rows, mp, list(out_shape))


def _output(acc, extra, epilogue: Epilogue, rows, mp, out_shape):
    bias = extra.pop(0) if epilogue.bias else None
    residual = extra.pop(0) if epilogue.residual else None
    columns = out_shape[-1]

    def residual_value(m, n, idx):
        if str(residual.dtype) == "uint16":
            return bf16_value(residual[m, n])
        return residual[idx] if idx is not None else residual[(*unflatten(m, out_shape, rows), n)]

    def value(m, n, idx=None):
        v = acc[m, n]
        if bias is not None:
            v = v + bias[n]
        if residual is not None:
            v = v + residual_value(m, n, idx)
        if epilogue.relu:
            v = tirx.max(v, tirx.const(0, "float32"))
        return v

    if epilogue.bits_out:
        return te.compute((mp, columns), lambda m, n: bf16_bits(value(m, n)), name=OUTPUT)

    def output(*idx):
        return value(gemm_row(idx, out_shape), idx[-1], tuple(idx))

    return te.compute(out_shape, output, name=OUTPUT)


__all__ = [
    "CONTRACTION",
    "GATHER_A",
    "OUTPUT",
    "PADDED_INPUT",
    "TILE_K",
    "TILE_M",
    "TILE_N",
    "ConvGeometry",
    "Epilogue",
    "bf16_bits",
    "bf16_contraction",
    "bf16_rows",
    "bf16_value",
    "direct_operand",
    "pack_weight_vnni",
    "to_bf16_bits",
]
