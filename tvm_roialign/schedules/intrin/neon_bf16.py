"""The AArch64 bf16 micro-kernel as a TensorIntrin: the AMX kernel's 32 x 32 block on ``BFDOT``.

The description is the AMX kernel's (:mod:`~tvm_roialign.schedules.intrin.amx`):
``C[i, j] += f32(A[i, k]) * f32(B[0, k // 2, j, k % 2])`` over a 32 x 32 block and ``kc`` reduction elements,
the weights in the pair layout (the x86 kernels' packing serves as it is: ``BFDOT``'s lane is
``acc + a0 b0 + a1 b1`` over one pair, like ``vdpbf16ps``'s). The implementation runs the block as sixteen 4 x
16 sub-blocks, each held in 16 vector accumulators (4 rows x 4 vectors of 4 fp32, half of the 32 NEON
registers); a step over one pair of reduction elements loads the pairs of the 16 columns (four 128-bit
vectors), broadcasts each row's pair of activations and issues 16 ``bfdot``.

``BFDOT`` was chosen over ``BFMMLA`` (2 x 4 by 4 x 2 per instruction): it needs no other weight
layout, and its accumulators are rows of the output as they are. Without FEAT_EBF16 the instruction
rounds the sum of the two products to odd and flushes denormals (Arm ARM, BFDOT), within the bf16
kernels' accumulation bound.

TVM 0.27 hands LLVM a bf16 vector as 16-bit integers, while ``llvm.aarch64.neon.bfdot.v4f32.v8bf16``
takes ``<8 x bfloat>``: the call goes through a small LLVM function imported into the module
(``pragma_import_llvm``) that takes the pairs as ``<4 x i32>`` and reinterprets them.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .amx import BF16
from .register import block_func, register_block_intrin

#: the imported LLVM function: ``acc + dot(a pairs, b pairs)`` with the pairs as 32-bit lanes
_BFDOT = "tvm_roialign_bfdot"
_LLVM_IR = f"""
define internal <4 x float> @{_BFDOT}(<4 x float> %c, <4 x i32> %a, <4 x i32> %b) alwaysinline {{
  %x = bitcast <4 x i32> %a to <8 x bfloat>
  %y = bitcast <4 x i32> %b to <8 x bfloat>
  %r = call <4 x float> @llvm.aarch64.neon.bfdot.v4f32.v8bf16(<4 x float> %c, <8 x bfloat> %x,
                                                             <8 x bfloat> %y)
  ret <4 x float> %r
}}
declare <4 x float> @llvm.aarch64.neon.bfdot.v4f32.v8bf16(<4 x float>, <8 x bfloat>, <8 x bfloat>)
"""

#: rows and columns of a sub-block (accumulators: rows x columns / 4 vectors)
_ROWS, _COLUMNS = 4, 16
_VECTORS = _COLUMNS // 4

def _pair(a, row, p):
    """The activations ``a[row, 2p:2p+2]`` as one 32-bit lane, broadcast to the 4 lanes."""
    return T.broadcast(T.reinterpret("int32", a.vload([row, 2 * p], "uint16x2")), 4)


def _pairs(b, p, column):
    """The weight pairs of the 4 columns from ``column`` as 4 32-bit lanes."""
    return T.reinterpret("int32x4", b.vload([0, p, column, 0], "uint16x8"))


def _dot(acc, a_pair, b_pairs):
    return tirx.call_pure_extern("float32x4", _BFDOT, acc, a_pair, b_pairs)


def _impl(kc: int, zero_init: bool):
    pairs = kc // 2

    @T.macro
    def impl_body(A, B, C, sa, sc):
        acc = T.alloc_buffer((_ROWS, _COLUMNS), "float32", scope="local")
        for g in T.serial(32 // _ROWS, annotations={"pragma_import_llvm": _LLVM_IR}):
            for h in T.serial(32 // _COLUMNS):
                for r, v in T.grid(_ROWS, _VECTORS):
                    if zero_init:
                        acc[r, T.ramp(v * 4, 1, 4)] = T.broadcast(T.float32(0), 4)
                    else:
                        acc[r, T.ramp(v * 4, 1, 4)] = C[g * _ROWS + r, T.ramp(h * _COLUMNS + v * 4, 1, 4)]
                for p in range(pairs):
                    for r in T.unroll(_ROWS):
                        for v in T.unroll(_VECTORS):
                            acc[r, T.ramp(v * 4, 1, 4)] = _dot(
                                acc[r, T.ramp(v * 4, 1, 4)],
                                _pair(A, g * _ROWS + r, p),
                                _pairs(B, p, h * _COLUMNS + v * 4),
                            )
                for r, v in T.grid(_ROWS, _VECTORS):
                    C[g * _ROWS + r, T.ramp(h * _COLUMNS + v * 4, 1, 4)] = acc[r, T.ramp(v * 4, 1, 4)]

    return block_func(kc, "uint16", "uint16", 2, "float32", impl_body)


def neon_bf16_intrin(kc: int, zero_init: bool = False) -> str:
    """The name of the micro-kernel over ``kc`` reduction elements (a multiple of 32), registered
    with ``TensorIntrin`` on first use; ``zero_init`` as
    :func:`~tvm_roialign.schedules.intrin.amx.amx_bf16_intrin`."""
    return register_block_intrin("tvm_roialign_neon_bf16", BF16.step, kc, zero_init, BF16.desc, _impl)


__all__ = ["neon_bf16_intrin"]
