"""The scaffolding of the contraction's 32 x 32 block micro-kernels (AMX tiles, AVX-512 BF16 /
VNNI, AVX2, AArch64 BFDOT / dot products): the PrimFunc over the block's operands that every
description and implementation shares (:func:`block_func`), and their registration: each kernel
over ``kc`` reduction elements, with or without its init, has one name and is registered with
``TensorIntrin`` on first use (:func:`register_block_intrin`)."""

from __future__ import annotations

from collections.abc import Callable

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

_REGISTERED: set[str] = set()


def register_block_intrin(
    prefix: str, step: int, kc: int, zero_init: bool, desc: Callable, impl: Callable
) -> str:
    """The name ``{prefix}_32x32x{kc}[_init]`` of the kernel ``impl(kc, zero_init)`` tensorizing
    ``desc(kc, zero_init)``, registered on first use; ``kc`` must be a positive multiple of
    ``step``. ``zero_init``: the block's whole reduction (the accumulators start at zero instead
    of a load of the output)."""
    if kc <= 0 or kc % step:
        raise ValueError(f"kc must be a positive multiple of {step}, got {kc}")
    name = f"{prefix}_32x32x{kc}" + ("_init" if zero_init else "")
    if name not in _REGISTERED:
        TensorIntrin.register(name, desc(kc, zero_init), impl(kc, zero_init), override=True)
        _REGISTERED.add(name)
    return name


def block_func(kc: int, a_dtype: str, b_dtype: str, group: int, c_dtype: str, body, reads_c: bool = True):
    """The PrimFunc of a block micro-kernel over ``kc`` reduction elements: ``A [32, kc]``
    (``a_dtype``, rows ``sa`` apart), ``B [1, kc / group, 32, group]`` (``b_dtype``: one block of
    32 columns, ``group`` reduction elements of a column side by side), ``C [32, 32]`` (``c_dtype``,
    rows ``sc`` apart); its root block reads ``C`` too unless ``reads_c`` is False (a block with its
    init) and runs ``body(A, B, C, sa, sc)``, a ``T.macro``."""
    groups = kc // group

    @T.prim_func(s_tir=True)
    def func(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (32, kc), a_dtype, offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (1, groups, 32, group), b_dtype, offset_factor=1)
        C = T.match_buffer(c, (32, 32), c_dtype, offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            if reads_c:
                T.reads(C[0:32, 0:32], A[0:32, 0:kc], B[0, 0:groups, 0:32, 0:group])
            else:
                T.reads(A[0:32, 0:kc], B[0, 0:groups, 0:32, 0:group])
            T.writes(C[0:32, 0:32])
            body(A, B, C, sa, sc)

    return func


__all__ = ["block_func", "register_block_intrin"]
