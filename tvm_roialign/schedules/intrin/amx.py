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

from .register import register_block_intrin

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


def _amx(name: str, *args):
    """A call of the LLVM intrinsic ``llvm.x86.<name>`` (tile numbers are immediates: ``uint8``)."""
    return tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args)


def block_desc(kind: AMXKind, kc: int, zero_init: bool):
    """The description the micro-kernels of ``kind`` share (with the block's init where
    ``zero_init``)."""
    g, groups, value = kind.group, kc // kind.group, kind.value
    a_dtype, b_dtype, c_dtype = kind.a_dtype, kind.b_dtype, kind.c_dtype
    zero = tirx.const(0, c_dtype)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (32, kc), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (1, groups, 32, g), b_dtype, offset_factor=1)
        C = T.match_buffer(c, (32, 32), c_dtype, offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:32, 0:32], A[0:32, 0:kc], B[0, 0:groups, 0:32, 0:g])
            T.writes(C[0:32, 0:32])
            for i, j, k in T.grid(32, 32, kc):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + value(A[vi, vk]) * value(B[0, vk // g, vj, vk % g])

    @T.prim_func(s_tir=True)
    def desc_init(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (32, kc), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (1, groups, 32, g), b_dtype, offset_factor=1)
        C = T.match_buffer(c, (32, 32), c_dtype, offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(A[0:32, 0:kc], B[0, 0:groups, 0:32, 0:g])
            T.writes(C[0:32, 0:32])
            for i, j, k in T.grid(32, 32, kc):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    T.reads(C[vi, vj], A[vi, vk], B[0, vk // g, vj, vk % g])
                    T.writes(C[vi, vj])
                    with T.init():
                        C[vi, vj] = zero
                    C[vi, vj] = C[vi, vj] + value(A[vi, vk]) * value(B[0, vk // g, vj, vk % g])

    return desc_init if zero_init else desc


def _impl(kind: AMXKind, kc: int, zero_init: bool):
    g, groups, step, steps = kind.group, kc // kind.group, kind.step, kc // kind.step
    a_dtype, b_dtype, c_dtype = kind.a_dtype, kind.b_dtype, kind.c_dtype
    a_bytes, dot = kind.element_bytes, kind.instruction
    b_rows = ROW_BYTES // 4  # groups of B per step: one tile of 16 rows

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (32, kc), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (1, groups, 32, g), b_dtype, offset_factor=1)
        C = T.match_buffer(c, (32, 32), c_dtype, offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:32, 0:32], A[0:32, 0:kc], B[0, 0:groups, 0:32, 0:g])
            T.writes(C[0:32, 0:32])
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

    return impl


def amx_intrin(kind: AMXKind, kc: int, zero_init: bool = False) -> str:
    """The name of ``kind``'s micro-kernel over ``kc`` reduction elements (a multiple of
    ``kind.step``), registered on first use (:func:`~tvm_roialign.schedules.intrin.register.register_block_intrin`).
    ``zero_init``: the block's whole reduction (a block with its init; the accumulators start from
    ``tilezero`` instead of a load of ``C``)."""
    return register_block_intrin(
        f"tvm_roialign_amx_{kind.name}",
        kind.step,
        kc,
        zero_init,
        lambda kc, zero_init: block_desc(kind, kc, zero_init),
        lambda kc, zero_init: _impl(kind, kc, zero_init),
    )


__all__ = ["AMX_TILES", "BLOCK", "AMXKind", "amx_intrin", "block_desc"]
