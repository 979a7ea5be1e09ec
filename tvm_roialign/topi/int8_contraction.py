"""The int8 contraction compute: a conv2d (NHWC) or a matmul as one u8 x s8 -> s32 GEMM, fp32 result.

``out = dequantize(A @ B)`` with

* ``A [Mp, Kp]`` (stage ``int8_gather_a``): the fp32 activations quantized to uint8 with the
  per-tensor scale and zero point calibration chose (``q = clamp(round(x / s) + z, 0, 255)``),
  gathered as the rows of the GEMM (a matmul's rows as they are; a convolution's im2col rows, the
  reduction over kernel rows, kernel columns and input channels; for narrow taps, an RGB stem,
  kernel rows each a run of ``ROW_TAP_DEPTH`` bytes of a quantized, padded copy of the input:
  stage ``int8_padded_input``), the points outside the image (a convolution's zero padding) and
  the padding rows and columns the zero point ``z``;
* ``B [Np / 32, Kp / 4, 32, 4]``: the weights quantized to int8 per output channel (symmetric),
  packed at compile time (:func:`pack_weight_quads`): blocks of 32 columns, each in the quad
  layout the u8 x s8 dot products read (four consecutive reduction elements of a column side by
  side), zero in the padding;
* ``int8_contraction [Mp, Np]``: the products summed exactly in int32;
* ``int8_output``: the real rows and columns in the op's output shape, dequantized in fp32:
  ``(acc - z * sum_k B[k, n]) * s * w_scale[n]`` (the zero point's share removed with the
  weights' column sums, computed at compile time).

The schedule is :class:`tvm_roialign.schedules.lowp.int8.Int8Contraction`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from .contraction_geometry import (
    ROW_TAP_DEPTH,
    ConvGeometry,
    gather_conv,
    gemm_row,
    nhwc_reader,
    pack_columns,
    round_up,
)

#: rows, reduction and columns are padded to multiples of these (the AMX micro-kernel's block)
TILE_M, TILE_K, TILE_N = 32, 64, 32

GATHER_A = "int8_gather_a"
CONTRACTION = "int8_contraction"
OUTPUT = "int8_output"
QUANTIZE = "int8_quantize"
PADDED_INPUT = "int8_padded_input"


@dataclass(frozen=True)
class ActivationQuant:
    """Per-tensor asymmetric uint8 quantization: ``q = clamp(round(x / scale) + zero, 0, 255)``,
    rounded half to even. ``divide`` False (calibrated ranges): ``x`` times the scale's inverse in
    fp32, one multiplication; True (an ONNX QDQ model's own quantization): ``x / scale`` in fp32, as
    ONNX's ``QuantizeLinear`` says, the same integers as the model's fake-quant float."""

    scale: float
    zero: int
    divide: bool = False

    @classmethod
    def from_range(cls, low: float, high: float) -> ActivationQuant:
        """The quantization of the range ``[low, high]`` widened to contain 0 (so that 0, a
        convolution's padding, is exact)."""
        low, high = min(float(low), 0.0), max(float(high), 0.0)
        if not np.isfinite(low) or not np.isfinite(high):
            raise ValueError(f"calibration range [{low}, {high}] is not finite")
        scale = float(np.float32((high - low) / 255.0)) or 1.0
        zero = int(np.clip(np.rint(-low / scale), 0, 255))
        return cls(scale, zero)

    def quantize(self, array: np.ndarray) -> np.ndarray:
        """``array`` quantized as the kernel does (in fp32, half to even)."""
        array = np.asarray(array, np.float32)
        if self.divide:
            q = np.rint(array / np.float32(self.scale)) + self.zero
        else:
            q = np.rint(array * np.float32(1.0 / self.scale)) + self.zero
        return np.clip(q, 0, 255).astype(np.uint8)


def quantize_weight(weight: np.ndarray, limit: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """``weight [K, N]`` (float) -> ``(int8 [K, N], fp32 scale [N])``: symmetric per column,
    ``w ~ q * scale``, ``q`` in ``[-limit, limit]`` (127; 64 for AVX2's kernels, exact in int16 pairs)."""
    weight = np.asarray(weight, np.float64)
    peak = np.abs(weight).max(axis=0)
    scale = np.where(peak > 0, peak / float(limit), 1.0).astype(np.float32)
    q = np.clip(np.rint(weight / scale.astype(np.float64)), -limit, limit).astype(np.int8)
    return q, scale


def pack_weight_quads(q: np.ndarray) -> np.ndarray:
    """``q [K, N]`` int8 -> ``[Np / 32, Kp / 4, 32, 4]``, zero-padded (see module)."""
    return pack_columns(q, TILE_K, 4, np.int8)


def dequant_constants(q: np.ndarray, w_scale: np.ndarray, act: ActivationQuant):
    """``(correction int32 [Np], scale fp32 [Np])`` of the output stage: ``zero * sum_k q[k, n]``
    and ``act.scale * w_scale[n]`` (zero in the padding columns)."""
    n = q.shape[1]
    np_ = round_up(n, TILE_N)
    correction = np.zeros(np_, np.int32)
    correction[:n] = act.zero * q.astype(np.int64).sum(axis=0)
    scale = np.zeros(np_, np.float32)
    scale[:n] = np.float32(act.scale) * w_scale
    return correction, scale


def widen(value):
    """A uint8 or int8 operand as the int32 the products are summed in."""
    return value.astype("int32")


def _quantizer(act: ActivationQuant):
    """``value -> uint8``: ``act``'s quantization of an fp32 value, as :meth:`ActivationQuant.quantize`."""
    inv = tirx.const(1.0 / act.scale, "float32")

    def quantize(value):
        scaled = value / tirx.const(act.scale, "float32") if act.divide else value * inv
        q = tirx.round(scaled) + tirx.const(float(act.zero), "float32")
        return tirx.max(tirx.min(q, tirx.const(255.0, "float32")), tirx.const(0.0, "float32")).astype("uint8")

    return quantize


def quantize_activation(x: te.Tensor, act: ActivationQuant) -> te.Tensor:
    """``x`` (fp32) quantized to uint8 by ``act``, elementwise (stage ``int8_quantize``): the input
    of an int8 contraction quantized before it, where it then fuses into its producer's write-back
    (the producer writes one byte an element instead of four, and a 3x3 conv's gather copies
    bytes instead of quantizing each element once per tap)."""
    quantize = _quantizer(act)
    return te.compute(x.shape, lambda *i: quantize(x(*i)), name=QUANTIZE)


def _gather_row_taps(x: te.Tensor, g: ConvGeometry, in_hw, quantize, zero):
    """``(m, k) -> uint8`` for narrow taps (:attr:`ConvGeometry.row_taps`, an RGB stem): the input
    quantized once into a copy padded with the zero point (stage ``int8_padded_input``), its rows
    ``[n, y, x * c + ch]`` wide enough that a kernel row's run of :data:`ROW_TAP_DEPTH` bytes lies
    inside, so that each kernel row of an im2col row is one contiguous run of bytes (the weights'
    rows beyond the ``kw * c`` real ones are zero, so the bytes they meet do not count)."""
    height, width = in_hw
    (ph, pw), c = g.padding, g.c
    extra = -(-(ROW_TAP_DEPTH - g.kw * c) // c)
    row = (width + 2 * pw + extra) * c
    read = nhwc_reader(x, height, width)

    def padded(b, y, xc):
        iy, ix = y - ph, xc // c - pw
        inside = tirx.all(iy >= 0, iy < height, ix >= 0, ix < width)
        safe_y = tirx.max(tirx.min(iy, height - 1), 0)
        safe_x = tirx.max(tirx.min(ix, width - 1), 0)
        return tirx.if_then_else(inside, quantize(read(b, safe_y, safe_x, xc % c)), zero)

    xp = te.compute((g.n, height + 2 * ph, row), padded, name=PADDED_INPUT)

    def value(m, k):
        b = m // (g.oh * g.ow)
        oy = m // g.ow % g.oh
        ox = m % g.ow
        # the run's bytes beyond ``kw * c`` meet zero weights (and no zero-point correction): read
        # as they are, inside the copy's extra columns, the vector unmasked
        ky, j = k // ROW_TAP_DEPTH, k % ROW_TAP_DEPTH
        return xp[b, oy * g.stride[0] + ky, ox * (g.stride[1] * c) + j]

    return value


def int8_contraction(x: te.Tensor, packed: te.Tensor, correction: te.Tensor, scale: te.Tensor,
                     rows, reduction: int, out_shape, act: ActivationQuant,
                     geometry: ConvGeometry | None = None) -> te.Tensor:
    """The stages of the module docstring; ``x`` is ``[rows, reduction]`` (a matmul) or the NHWC
    input of a conv of ``geometry``, in fp32, or in uint8 already quantized by ``act``
    (:func:`quantize_activation`); ``packed`` the :func:`pack_weight_quads` weights,
    ``correction`` and ``scale`` the :func:`dequant_constants` of the output stage. ``rows`` may
    be symbolic (padded to ``ceil(rows / 32) * 32`` gathered rows)."""
    mp, kp = round_up(rows, TILE_M), round_up(reduction, TILE_K)
    np_ = int(packed.shape[0]) * TILE_N
    zero = tirx.const(act.zero, "uint8")
    quantize = (lambda value: value) if str(x.dtype) == "uint8" else _quantizer(act)

    if geometry is None:
        source = lambda m, k: quantize(x[m, k])
    else:
        read = _gather_row_taps if geometry.row_taps else gather_conv
        source = read(x, geometry, (x.shape[1], x.shape[2]), quantize, zero)

    def gather(m, k):
        inside = tirx.all(m < rows, k < reduction)
        safe_m, safe_k = tirx.min(m, rows - 1), tirx.min(k, reduction - 1)
        return tirx.if_then_else(inside, source(safe_m, safe_k), zero)

    a = te.compute((mp, kp), gather, name=GATHER_A)
    r = te.reduce_axis((0, kp), "k")
    acc = te.compute(
        (mp, np_),
        lambda m, n: te.sum(widen(a[m, r]) * widen(packed[n // TILE_N, r // 4, n % TILE_N, r % 4]), axis=r),
        name=CONTRACTION,
    )
    out_shape = list(out_shape)

    def output(*idx):
        n = idx[-1]
        return (acc[gemm_row(idx, out_shape), n] - correction[n]).astype("float32") * scale[n]

    return te.compute(out_shape, output, name=OUTPUT)


__all__ = ["CONTRACTION", "GATHER_A", "OUTPUT", "PADDED_INPUT", "QUANTIZE", "TILE_K", "TILE_M", "TILE_N",
           "ActivationQuant", "dequant_constants", "int8_contraction", "pack_weight_quads",
           "quantize_activation", "quantize_weight", "widen"]
