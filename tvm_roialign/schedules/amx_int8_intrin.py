"""The AMX-INT8 micro-kernel as a TensorIntrin: a 32 x 32 int32 block += ``A [32, kc]`` x ``B``.

Its description is the block of :func:`tvm_roialign.topi.int8_contraction.int8_contraction` over one
32 x 32 output block and ``kc`` reduction elements: ``C[i, j] += i32(A[i, k]) * i32(B[0, k // 4, j,
k % 4])`` (``A`` uint8, ``B`` int8 in the quad layout ``[kc / 4, 32, 4]``). Its implementation holds
the block in four accumulator tiles (``tmm0``-``tmm3``, 16 rows x 16 int32 each) and runs the
reduction 64 elements a step: two tiles of ``A`` (16 rows x 64 uint8: ``tmm4``, ``tmm5``), two of
``B`` (16 quads x 16 columns: ``tmm6``, ``tmm7``), four ``tdpbusd``. Each call configures the tiles
(``ldtilecfg``: palette 1, eight tiles of 16 rows x 64 bytes), loads the block from ``C`` (or, for a
block's whole reduction, zeroes the tiles: ``tilezero``), stores it back and releases the tiles.

Running it needs the process's permission for the AMX tile state on Linux
(:func:`tvm_roialign.host.request_amx`).
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..topi.int8_contraction import widen

#: rows and columns of the output block, reduction elements of one step
BLOCK, STEP = 32, 64

_REGISTERED: set[str] = set()


def _amx(name: str, *args):
    """A call of the LLVM intrinsic ``llvm.x86.<name>`` (tile numbers are immediates: ``uint8``)."""
    return tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args)


def block_desc(kc: int, zero_init: bool):
    """The description both int8 micro-kernels share (with the block's init where ``zero_init``)."""
    quads = kc // 4

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (32, kc), "uint8", offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (1, quads, 32, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (32, 32), "int32", offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:32, 0:32], A[0:32, 0:kc], B[0, 0:quads, 0:32, 0:4])
            T.writes(C[0:32, 0:32])
            for i, j, k in T.grid(32, 32, kc):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + widen(A[vi, vk]) * widen(B[0, vk // 4, vj, vk % 4])

    @T.prim_func(s_tir=True)
    def desc_init(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (32, kc), "uint8", offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (1, quads, 32, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (32, 32), "int32", offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(A[0:32, 0:kc], B[0, 0:quads, 0:32, 0:4])
            T.writes(C[0:32, 0:32])
            for i, j, k in T.grid(32, 32, kc):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    T.reads(C[vi, vj], A[vi, vk], B[0, vk // 4, vj, vk % 4])
                    T.writes(C[vi, vj])
                    with T.init():
                        C[vi, vj] = T.int32(0)
                    C[vi, vj] = C[vi, vj] + widen(A[vi, vk]) * widen(B[0, vk // 4, vj, vk % 4])

    return desc_init if zero_init else desc


def _impl(kc: int, zero_init: bool):
    quads = kc // 4
    steps = kc // STEP

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
            ra = T.int64(sa)
            for s in T.serial(steps, annotations={"pragma_unroll_explicit": 0}):
                T.evaluate(_amx("tileloadd64", T.uint8(4), T.address_of(A[0, s * 64]), ra))
                T.evaluate(_amx("tileloadd64", T.uint8(5), T.address_of(A[16, s * 64]), ra))
                T.evaluate(_amx("tileloadd64", T.uint8(6), T.address_of(B[0, s * 16, 0, 0]), T.int64(128)))
                T.evaluate(_amx("tileloadd64", T.uint8(7), T.address_of(B[0, s * 16, 16, 0]), T.int64(128)))
                T.evaluate(_amx("tdpbusd", T.uint8(0), T.uint8(4), T.uint8(6)))
                T.evaluate(_amx("tdpbusd", T.uint8(1), T.uint8(4), T.uint8(7)))
                T.evaluate(_amx("tdpbusd", T.uint8(2), T.uint8(5), T.uint8(6)))
                T.evaluate(_amx("tdpbusd", T.uint8(3), T.uint8(5), T.uint8(7)))
            T.evaluate(_amx("tilestored64", T.uint8(0), T.address_of(C[0, 0]), rc))
            T.evaluate(_amx("tilestored64", T.uint8(1), T.address_of(C[0, 16]), rc))
            T.evaluate(_amx("tilestored64", T.uint8(2), T.address_of(C[16, 0]), rc))
            T.evaluate(_amx("tilestored64", T.uint8(3), T.address_of(C[16, 16]), rc))
            T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilerelease"))

    return impl


def amx_int8_intrin(kc: int, zero_init: bool = False) -> str:
    """The name of the micro-kernel over ``kc`` reduction elements (a multiple of 64), registered
    with ``TensorIntrin`` on first use. ``zero_init``: the block's whole reduction (the
    accumulators start from ``tilezero`` instead of a load of ``C``)."""
    if kc <= 0 or kc % STEP:
        raise ValueError(f"kc must be a positive multiple of {STEP}, got {kc}")
    name = f"tvm_roialign_amx_int8_32x32x{kc}" + ("_init" if zero_init else "")
    if name not in _REGISTERED:
        TensorIntrin.register(name, block_desc(kc, zero_init), _impl(kc, zero_init), override=True)
        _REGISTERED.add(name)
    return name


__all__ = ["BLOCK", "STEP", "amx_int8_intrin", "block_desc"]
