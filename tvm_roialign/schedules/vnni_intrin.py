"""The AVX512-VNNI micro-kernel as a TensorIntrin: the AMX-INT8 kernel's 32 x 32 block on ``vpdpbusd``.

The description is the AMX kernel's (:mod:`.amx_int8_intrin`): ``C[i, j] += i32(A[i, k]) *
i32(B[0, k // 4, j, k % 4])`` over a 32 x 32 block and ``kc`` reduction elements, ``A`` uint8, ``B``
int8 in the quad layout. The implementation runs the block as four groups of 8 rows, each held in
16 vector accumulators (8 rows x 2 vectors of 16 int32); a step over one quad of reduction elements
loads the quads of the 32 columns (two vectors of 64 int8), broadcasts each row's four activations
and issues 16 ``vpdpbusd`` (each lane: ``acc += a0 b0 + a1 b1 + a2 b2 + a3 b3``, exact, no
saturation).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T
from tvm.target import codegen

from .amx_int8_intrin import STEP, block_desc
from .block_intrin import register_block_intrin

#: rows of a group (accumulators: rows x 2 vectors)
_GROUP = 8

def _operand(vector):
    """A 64-byte operand as the LLVM intrinsic takes it (bytes since LLVM 21, 32-bit lanes before)."""
    if codegen.llvm_version_major() >= 21:
        return T.reinterpret(vector, dtype="int8x64")
    return T.reinterpret(vector, dtype="int32x16")


def _quad(a, row, q):
    """The four uint8 activations ``a[row, 4q:4q+4]`` as one 32-bit lane."""
    return T.reinterpret(a.vload([row, 4 * q], "uint8x4"), dtype="int32")


def _dot(acc, a_quad, b_quads):
    return tirx.call_llvm_pure_intrin(
        "int32x16", "llvm.x86.avx512.vpdpbusd.512", acc, _operand(a_quad), _operand(b_quads)
    )


def broadcast_quad_impl(kc: int, zero_init: bool, group: int, lanes: int, dot):
    """The 32 x 32 block's implementation shared by the x86 int8 kernels: groups of ``group`` rows
    held in ``32 / lanes`` vectors of ``lanes`` int32 accumulators each; a step over one quad of
    reduction elements broadcasts each row's four activations (one 32-bit lane) and calls
    ``dot(acc, broadcast quads, weight quads of lanes columns)`` per row and vector."""
    quads, vectors, b_type = kc // 4, 32 // lanes, f"int8x{4 * lanes}"

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (32, kc), "uint8", offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (1, quads, 32, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (32, 32), "int32", offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:32, 0:32], A[0:32, 0:kc], B[0, 0:quads, 0:32, 0:4])
            T.writes(C[0:32, 0:32])
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

    return impl


def _impl(kc: int, zero_init: bool):
    return broadcast_quad_impl(kc, zero_init, _GROUP, 16, _dot)


def vnni_intrin(kc: int, zero_init: bool = False) -> str:
    """The name of the micro-kernel over ``kc`` reduction elements (a multiple of 64), registered
    with ``TensorIntrin`` on first use; ``zero_init`` as :func:`.amx_int8_intrin.amx_int8_intrin`."""
    return register_block_intrin("tvm_roialign_vnni", STEP, kc, zero_init, block_desc, _impl)


__all__ = ["broadcast_quad_impl", "vnni_intrin"]
