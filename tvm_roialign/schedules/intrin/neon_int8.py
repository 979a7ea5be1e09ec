"""The AArch64 int8 micro-kernels as TensorIntrins: the AMX-INT8 kernel's 32 x 32 block on ``USDOT``
(FEAT_I8MM) or ``SDOT`` (FEAT_DotProd).

The description is the AMX kernel's (:mod:`~tvm_roialign.schedules.intrin.amx`): ``C[i, j] += i32(A[i, k]) *
i32(B[0, k // 4, j, k % 4])`` over a 32 x 32 block and ``kc`` reduction elements, ``A`` uint8, ``B``
int8 in the quad layout (the x86 kernels' packing serves as it is: a lane of these instructions is
``acc + a0 b0 + a1 b1 + a2 b2 + a3 b3`` over one quad, like ``vpdpbusd``'s). The block runs as
sixteen 4 x 16 sub-blocks, each held in 16 vector accumulators (4 rows x 4 vectors of 4 int32); a
step over one quad of reduction elements loads the quads of the 16 columns (four 128-bit vectors),
broadcasts each row's four activations and issues 16 dot products:

* ``usdot`` (unsigned activations x signed weights): the x86 kernels' u8 x s8 product as it is;
* ``sdot`` (signed x signed), where the target has the dot product but not I8MM: the activations
  shifted to int8 (``a - 128``, the top bit flipped) and the shift given back per column,
  ``sum_k a_k w_k = sdot(a - 128, w) - sdot(-128, w)`` (one more ``sdot`` per weight vector and step,
  with a vector of -128, shared by the sub-block's 4 rows).

Both are exact (int32 lanes, no saturation): the same integers as ``vpdpbusd`` for the same operands.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from .amx import INT8
from .register import block_func, register_block_intrin

#: rows and columns of a sub-block (accumulators: rows x columns / 4 vectors)
_ROWS, _COLUMNS = 4, 16
_VECTORS = _COLUMNS // 4
#: four bytes of 0x80: flips the top bit of each uint8 (``a - 128`` as int8), or -128 as int8
_TOP_BITS = -0x7F7F7F80


def _quad(a, row, q):
    """The four uint8 activations ``a[row, 4q:4q+4]`` as one 32-bit lane."""
    return T.reinterpret(a.vload([row, 4 * q], "uint8x4"), dtype="int32")


def _dot(instruction: str, acc, a_quads, b_quads):
    return tirx.call_llvm_pure_intrin(
        "int32x4", f"llvm.aarch64.neon.{instruction}.v4i32.v16i8", acc,
        T.reinterpret(a_quads, dtype="int8x16"), b_quads,
    )


def _impl(kc: int, zero_init: bool, signed: bool):
    quads = kc // 4
    instruction = "sdot" if signed else "usdot"

    def activations(a, row, q):
        quad = _quad(a, row, q)
        return T.broadcast(T.bitwise_xor(quad, T.int32(_TOP_BITS)) if signed else quad, 4)

    @T.macro
    def impl_body(A, B, C, sa, sc):
        acc = T.alloc_buffer((_ROWS, _COLUMNS), "int32", scope="local")
        shift = T.alloc_buffer((_COLUMNS,), "int32", scope="local")
        for g, h in T.grid(32 // _ROWS, 32 // _COLUMNS):
            for r, v in T.grid(_ROWS, _VECTORS):
                if zero_init:
                    acc[r, T.ramp(v * 4, 1, 4)] = T.broadcast(T.int32(0), 4)
                else:
                    acc[r, T.ramp(v * 4, 1, 4)] = C[g * _ROWS + r, T.ramp(h * _COLUMNS + v * 4, 1, 4)]
            if signed:
                for v in T.serial(_VECTORS):
                    shift[T.ramp(v * 4, 1, 4)] = T.broadcast(T.int32(0), 4)
            for q in range(quads):
                for v in T.unroll(_VECTORS):
                    weights = B.vload([0, q, h * _COLUMNS + v * 4, 0], "int8x16")
                    if signed:
                        shift[T.ramp(v * 4, 1, 4)] = _dot(
                            instruction, shift[T.ramp(v * 4, 1, 4)],
                            T.broadcast(T.int32(_TOP_BITS), 4), weights,
                        )
                    for r in T.unroll(_ROWS):
                        acc[r, T.ramp(v * 4, 1, 4)] = _dot(
                            instruction, acc[r, T.ramp(v * 4, 1, 4)], activations(A, g * _ROWS + r, q),
                            weights,
                        )
            for r, v in T.grid(_ROWS, _VECTORS):
                if signed:
                    C[g * _ROWS + r, T.ramp(h * _COLUMNS + v * 4, 1, 4)] = (
                        acc[r, T.ramp(v * 4, 1, 4)] - shift[T.ramp(v * 4, 1, 4)]
                    )
                else:
                    C[g * _ROWS + r, T.ramp(h * _COLUMNS + v * 4, 1, 4)] = acc[r, T.ramp(v * 4, 1, 4)]

    return block_func(kc, "uint8", "int8", 4, "int32", impl_body)


def neon_int8_intrin(kc: int, zero_init: bool = False, signed: bool = False) -> str:
    """The name of the micro-kernel over ``kc`` reduction elements (a multiple of 64) on ``usdot``,
    or with ``signed`` on ``sdot`` (see module docstring), registered with ``TensorIntrin`` on first
    use; ``zero_init`` as :func:`~tvm_roialign.schedules.intrin.amx.amx_int8_intrin`."""
    return register_block_intrin(
        f"tvm_roialign_{'sdot' if signed else 'usdot'}",
        INT8.step,
        kc,
        zero_init,
        INT8.desc,
        lambda kc, zero_init: _impl(kc, zero_init, signed),
    )


__all__ = ["neon_int8_intrin"]
