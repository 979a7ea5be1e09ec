"""The VNNI micro-kernels as TensorIntrins: the AMX-INT8 kernel's 32 x 32 block on ``vpdpbusd``.

The description is the AMX kernel's (:mod:`~tvm_roialign.schedules.intrin.amx`): ``C[i, j] += i32(A[i, k]) *
i32(B[0, k // 4, j, k % 4])`` over a 32 x 32 block and ``kc`` reduction elements, ``A`` uint8, ``B``
int8 in the quad layout. ``vpdpbusd`` gives each int32 lane ``acc += a0 b0 + a1 b1 + a2 b2 + a3 b3``,
exact, no saturation.

* AVX512-VNNI (:func:`vnni_intrin`): the block as four groups of 8 rows, each held in 16 zmm
  accumulators (8 rows x 2 vectors of 16 int32); a step over one quad of reduction elements
  broadcasts each row's four activations and issues 16 ``vpdpbusd`` against the quads of the 32
  columns (two vectors of 64 int8).
* AVX-VNNI (:func:`avx_vnni_intrin`; Intel Alder Lake and later client cores, Sierra Forest: no
  AVX-512): the same instruction on ymm registers, VEX-encoded, as the AVX2 kernel's groups of 2 rows
  x 4 vectors of 8 int32 (:mod:`~tvm_roialign.schedules.intrin.avx2`), one ``vpdpbusd`` where AVX2 needs two
  multiply-adds and 8-bit weights where AVX2's must stay within +-64. LLVM selects the VEX form of
  the same intrinsic where the target has ``avxvnni`` and not AVX512-VL.
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T
from tvm.target import codegen

from .amx import INT8
from .register import block_func, register_block_intrin

#: rows of a group (accumulators: rows x 2 vectors)
_GROUP = 8

def _operand(vector, lanes: int = 16):
    """An operand of ``lanes`` 32-bit lanes as the LLVM intrinsic takes it (bytes since LLVM 21,
    32-bit lanes before)."""
    if codegen.llvm_version_major() >= 21:
        return T.reinterpret(vector, dtype=f"int8x{4 * lanes}")
    return T.reinterpret(vector, dtype=f"int32x{lanes}")


def _quad(a, row, q):
    """The four uint8 activations ``a[row, 4q:4q+4]`` as one 32-bit lane."""
    return T.reinterpret(a.vload([row, 4 * q], "uint8x4"), dtype="int32")


def _dot(acc, a_quad, b_quads):
    return tirx.call_llvm_pure_intrin(
        "int32x16", "llvm.x86.avx512.vpdpbusd.512", acc, _operand(a_quad), _operand(b_quads)
    )


def _dot_ymm(acc, a_quad, b_quads):
    """``vpdpbusd`` on 8 int32 lanes (``{vex} vpdpbusd`` with AVX-VNNI)."""
    return tirx.call_llvm_pure_intrin(
        "int32x8", "llvm.x86.avx512.vpdpbusd.256", acc, _operand(a_quad, 8), _operand(b_quads, 8)
    )


def broadcast_quad_impl(kc: int, zero_init: bool, group: int, lanes: int, dot):
    """The 32 x 32 block's implementation shared by the x86 int8 kernels: groups of ``group`` rows
    held in ``32 / lanes`` vectors of ``lanes`` int32 accumulators each; a step over one quad of
    reduction elements broadcasts each row's four activations (one 32-bit lane) and calls
    ``dot(acc, broadcast quads, weight quads of lanes columns)`` per row and vector."""
    quads, vectors, b_type = kc // 4, 32 // lanes, f"int8x{4 * lanes}"

    @T.macro
    def impl_body(A, B, C, sa, sc):
        acc = T.alloc_buffer((group, 32), "int32", scope="local")
        for g in T.serial(32 // group):
            for r, h in T.grid(group, vectors):
                if zero_init:
                    acc[r, T.ramp(h * lanes, 1, lanes)] = T.broadcast(T.int32(0), lanes)
                else:
                    acc[r, T.ramp(h * lanes, 1, lanes)] = C[g * group + r, T.ramp(h * lanes, 1, lanes)]
            for q in range(quads):
                for r in T.unroll(group):
                    for h in T.unroll(vectors):
                        acc[r, T.ramp(h * lanes, 1, lanes)] = dot(
                            acc[r, T.ramp(h * lanes, 1, lanes)],
                            T.broadcast(_quad(A, g * group + r, q), lanes),
                            B.vload([0, q, h * lanes, 0], b_type),
                        )
            for r, h in T.grid(group, vectors):
                C[g * group + r, T.ramp(h * lanes, 1, lanes)] = acc[r, T.ramp(h * lanes, 1, lanes)]

    return block_func(kc, "uint8", "int8", 4, "int32", impl_body)


def _impl(kc: int, zero_init: bool):
    return broadcast_quad_impl(kc, zero_init, _GROUP, 16, _dot)


def vnni_intrin(kc: int, zero_init: bool = False) -> str:
    """The name of the AVX512-VNNI micro-kernel over ``kc`` reduction elements (a multiple of 64),
    registered with ``TensorIntrin`` on first use; ``zero_init`` as
    :func:`~tvm_roialign.schedules.intrin.amx.amx_int8_intrin`."""
    return register_block_intrin("tvm_roialign_vnni", INT8.step, kc, zero_init, INT8.desc, _impl)


#: rows of an AVX-VNNI group (accumulators: rows x 4 ymm vectors: 8 of the 16 ymm registers)
_YMM_GROUP = 2


def _impl_ymm(kc: int, zero_init: bool):
    return broadcast_quad_impl(kc, zero_init, _YMM_GROUP, 8, _dot_ymm)


def avx_vnni_intrin(kc: int, zero_init: bool = False) -> str:
    """The name of the AVX-VNNI (256-bit) micro-kernel over ``kc`` reduction elements, as
    :func:`vnni_intrin`."""
    return register_block_intrin("tvm_roialign_avxvnni", INT8.step, kc, zero_init, INT8.desc, _impl_ymm)


__all__ = ["avx_vnni_intrin", "broadcast_quad_impl", "vnni_intrin"]
