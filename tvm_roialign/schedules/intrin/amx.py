"""The AMX micro-kernel as a TensorIntrin, for each element kind: a 32 x 32 block of ``C`` +=
``A [32, kc]`` x ``B``, with ``B`` one block of weights in the VNNI layout ``[kc / g, 32, g]`` (``g``
elements of a 4-byte group: 2 bf16, 4 int8).

Its description: ``C[i, j] += value(A[i, k]) * value(B[0, k // g, j, k % g])``. Its implementation
holds the block in four accumulator tiles (``tmm0``-``tmm3``, 16 rows x 16 four-byte values each) and
runs the reduction one step of 64 bytes a row at a time: two tiles of ``A`` (16 rows: ``tmm4``,
``tmm5``), two of ``B`` (16 groups x 16 columns: ``tmm6``, ``tmm7``), four dot-product instructions
(``tdpbf16ps``, ``tdpbusd``). Each call configures the tiles (``ldtilecfg``: palette 1, eight tiles
of 16 rows x 64 bytes), loads the block from ``C`` (or, for a block's whole reduction, the variant
with the block's init, zeroes the tiles: ``tilezero``), stores it back and releases the tiles, so
that it needs no state of its caller's thread.

Running it needs the process's permission for the AMX tile state on Linux
(:func:`tvm_roialign.host.request_amx`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from ...topi.bf16_contraction import bf16_value
from ...topi.int8_contraction import widen
from .register import block_func, register_block_intrin

#: rows and columns of the output block; bytes of one reduction step of a tile row
BLOCK, ROW_BYTES = 32, 64

#: The annotation of a scheduled function's root block whose kernels configure AMX tiles (set by
#: the bf16 and int8 contraction rules), by which
#: :class:`~tvm_roialign.passes.RequestAMXState` finds the functions that need the tile state.
AMX_TILES = "tvm_roialign.amx_tiles"


@dataclass(frozen=True)
class AMXKind:
    """What differs between the AMX dot products: ``A``'s and ``B``'s storage dtypes and bytes per
    element, the elements of a 4-byte group, the accumulator dtype, the instruction, and the value
    of a stored element in the accumulator's dtype."""

    name: str
    a_dtype: str
    b_dtype: str
    element_bytes: int
    group: int
    c_dtype: str
    instruction: str
    value: Callable

    @property
    def step(self) -> int:
        """Reduction elements of one step (a 64-byte tile row)."""
        return ROW_BYTES // self.element_bytes

    def desc(self, kc: int, zero_init: bool):
        """The description every micro-kernel of these operands shares (AMX, and the vector
        kernels that compute the same block): :func:`block_desc`."""
        return block_desc(self, kc, zero_init)


def _amx(name: str, *args):
    """A call of the LLVM intrinsic ``llvm.x86.<name>`` (tile numbers are immediates: ``uint8``)."""
    return tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args)


def block_desc(kind: AMXKind, kc: int, zero_init: bool):
    """The description the micro-kernels of ``kind`` share (with the block's init where
    ``zero_init``)."""
    g, value = kind.group, kind.value
    a_dtype, b_dtype, c_dtype = kind.a_dtype, kind.b_dtype, kind.c_dtype
    zero = tirx.const(0, c_dtype)

    @T.macro
    def desc_body(A, B, C, sa, sc):
        for i, j, k in T.grid(32, 32, kc):
            with T.sblock("update"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                C[vi, vj] = C[vi, vj] + value(A[vi, vk]) * value(B[0, vk // g, vj, vk % g])

    desc = block_func(kc, a_dtype, b_dtype, g, c_dtype, desc_body)

    @T.macro
    def desc_init_body(A, B, C, sa, sc):
        for i, j, k in T.grid(32, 32, kc):
            with T.sblock("update"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                T.reads(C[vi, vj], A[vi, vk], B[0, vk // g, vj, vk % g])
                T.writes(C[vi, vj])
                with T.init():
                    C[vi, vj] = zero
                C[vi, vj] = C[vi, vj] + value(A[vi, vk]) * value(B[0, vk // g, vj, vk % g])

    desc_init = block_func(kc, a_dtype, b_dtype, g, c_dtype, desc_init_body, reads_c=False)

    return desc_init if zero_init else desc


def _impl(kind: AMXKind, kc: int, zero_init: bool):
    g, step, steps = kind.group, kind.step, kc // kind.step
    a_dtype, b_dtype, c_dtype = kind.a_dtype, kind.b_dtype, kind.c_dtype
    a_bytes, dot = kind.element_bytes, kind.instruction
    b_rows = ROW_BYTES // 4  # groups of B per step: one tile of 16 rows

    @T.macro
    def impl_body(A, B, C, sa, sc):
        cfg = T.alloc_buffer((64,), "uint8", scope="local")
        for t in range(64):
            cfg[t] = T.uint8(0)
        cfg[0] = T.uint8(1)
        for t in range(8):
            cfg[16 + 2 * t] = T.uint8(64)
            cfg[48 + t] = T.uint8(16)
        T.evaluate(_amx("ldtilecfg", T.address_of(cfg[0])))
        rc = T.int64(sc * 4)
        if zero_init:
            for t in T.unroll(4):
                T.evaluate(_amx("tilezero", T.uint8(t)))
        else:
            T.evaluate(_amx("tileloadd64", T.uint8(0), T.address_of(C[0, 0]), rc))
            T.evaluate(_amx("tileloadd64", T.uint8(1), T.address_of(C[0, 16]), rc))
            T.evaluate(_amx("tileloadd64", T.uint8(2), T.address_of(C[16, 0]), rc))
            T.evaluate(_amx("tileloadd64", T.uint8(3), T.address_of(C[16, 16]), rc))
        ra = T.int64(sa * a_bytes)
        rb = T.int64(128)  # a row of B's tile: 32 columns x one 4-byte group
        for s in T.serial(steps, annotations={"pragma_unroll_explicit": 0}):
            T.evaluate(_amx("tileloadd64", T.uint8(4), T.address_of(A[0, s * step]), ra))
            T.evaluate(_amx("tileloadd64", T.uint8(5), T.address_of(A[16, s * step]), ra))
            T.evaluate(_amx("tileloadd64", T.uint8(6), T.address_of(B[0, s * b_rows, 0, 0]), rb))
            T.evaluate(_amx("tileloadd64", T.uint8(7), T.address_of(B[0, s * b_rows, 16, 0]), rb))
            T.evaluate(_amx(dot, T.uint8(0), T.uint8(4), T.uint8(6)))
            T.evaluate(_amx(dot, T.uint8(1), T.uint8(4), T.uint8(7)))
            T.evaluate(_amx(dot, T.uint8(2), T.uint8(5), T.uint8(6)))
            T.evaluate(_amx(dot, T.uint8(3), T.uint8(5), T.uint8(7)))
        T.evaluate(_amx("tilestored64", T.uint8(0), T.address_of(C[0, 0]), rc))
        T.evaluate(_amx("tilestored64", T.uint8(1), T.address_of(C[0, 16]), rc))
        T.evaluate(_amx("tilestored64", T.uint8(2), T.address_of(C[16, 0]), rc))
        T.evaluate(_amx("tilestored64", T.uint8(3), T.address_of(C[16, 16]), rc))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilerelease"))

    return block_func(kc, a_dtype, b_dtype, g, c_dtype, impl_body)


def amx_intrin(kind: AMXKind, kc: int, zero_init: bool = False) -> str:
    """The name of ``kind``'s micro-kernel over ``kc`` reduction elements (a multiple of
    ``kind.step``), registered on first use
    (:func:`~tvm_roialign.schedules.intrin.register.register_block_intrin`). ``zero_init``: the block's whole
    reduction (a block with its init; the accumulators start from ``tilezero`` instead of a load of ``C``)."""
    return register_block_intrin(
        f"tvm_roialign_amx_{kind.name}",
        kind.step,
        kc,
        zero_init,
        lambda kc, zero_init: block_desc(kind, kc, zero_init),
        lambda kc, zero_init: _impl(kind, kc, zero_init),
    )


#: bf16: ``A`` and ``B`` bf16 held as uint16 bits, ``B`` in the pair layout ``[kc / 2, 32, 2]``, four
#: ``tdpbf16ps`` per 32 reduction elements (the block of
#: :func:`tvm_roialign.topi.bf16_contraction.bf16_contraction`)
BF16 = AMXKind("bf16", "uint16", "uint16", 2, 2, "float32", "tdpbf16ps", bf16_value)

#: int8: ``A`` uint8, ``B`` int8 in the quad layout ``[kc / 4, 32, 4]``, four ``tdpbusd`` per 64
#: reduction elements (the block of :func:`tvm_roialign.topi.int8_contraction.int8_contraction`)
INT8 = AMXKind("int8", "uint8", "int8", 1, 4, "int32", "tdpbusd", widen)


def amx_bf16_intrin(kc: int, zero_init: bool = False) -> str:
    """The AMX bf16 micro-kernel over ``kc`` reduction elements (a multiple of 32): :func:`amx_intrin`."""
    return amx_intrin(BF16, kc, zero_init)


def amx_int8_intrin(kc: int, zero_init: bool = False) -> str:
    """The AMX-INT8 micro-kernel over ``kc`` reduction elements (a multiple of 64): :func:`amx_intrin`."""
    return amx_intrin(INT8, kc, zero_init)


__all__ = ["AMX_TILES", "BF16", "BLOCK", "INT8", "AMXKind", "amx_bf16_intrin", "amx_int8_intrin",
           "amx_intrin", "block_desc"]
