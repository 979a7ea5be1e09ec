"""The AVX2 micro-kernel as a TensorIntrin: the AMX-INT8 kernel's 32 x 32 block on ``vpmaddubsw``.

The description is the AMX kernel's (:mod:`~tvm_roialign.schedules.intrin.amx`): ``C[i, j] += i32(A[i, k]) *
i32(B[0, k // 4, j, k % 4])`` over a 32 x 32 block and ``kc`` reduction elements, ``A`` uint8, ``B``
int8 in the quad layout. A CPU without VNNI has no instruction that sums u8 x s8 products into int32
directly: ``vpmaddubsw`` multiplies the bytes and adds adjacent pairs into int16 with saturation,
``vpmaddwd`` with ones adds adjacent int16 pairs into int32. Together they give each int32 lane
``a0 b0 + a1 b1 + a2 b2 + a3 b3``, as ``vpdpbusd`` does, exactly where no pair overflows int16:
``2 * 255 * 64 = 32640 <= 32767``, so the weights of these kernels are quantized to ``[-64, 64]``
(:data:`~tvm_roialign.schedules.lowp.int8.WEIGHT_LIMITS`; ONNX Runtime's ``reduce_range``). The block runs as
groups of 2 rows held in 8 vector accumulators (2 rows x 4 vectors of 8 int32): a step over one
quad of reduction elements broadcasts each row's four activations and multiplies them with the
quads of the 32 columns (four vectors of 32 int8, read from memory by the multiply itself).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .amx import INT8
from .register import register_block_intrin
from .vnni import broadcast_quad_impl

#: rows of a group (accumulators: rows x 4 vectors of 8 int32: 8 of the 16 ymm registers)
_GROUP = 2


def _dot(acc, a_quads, b_quads):
    """``acc + (a . b per quad)``: ``vpmaddubsw`` (u8 x s8 pairs -> int16), ``vpmaddwd`` with ones
    (int16 pairs -> int32), ``vpaddd``."""
    pairs = tirx.call_llvm_pure_intrin(
        "int16x16", "llvm.x86.avx2.pmadd.ub.sw",
        T.reinterpret(a_quads, dtype="int8x32"), b_quads,
    )
    quads = tirx.call_llvm_pure_intrin(
        "int32x8", "llvm.x86.avx2.pmadd.wd", pairs, T.broadcast(T.int16(1), 16)
    )
    return acc + quads


def _impl(kc: int, zero_init: bool):
    return broadcast_quad_impl(kc, zero_init, _GROUP, 8, _dot)


def avx2_int8_intrin(kc: int, zero_init: bool = False) -> str:
    """The name of the micro-kernel over ``kc`` reduction elements (a multiple of 64), registered
    with ``TensorIntrin`` on first use; ``zero_init`` as
    :func:`~tvm_roialign.schedules.intrin.amx.amx_int8_intrin`."""
    return register_block_intrin("tvm_roialign_avx2_int8", INT8.step, kc, zero_init, INT8.desc, _impl)


__all__ = ["avx2_int8_intrin"]
