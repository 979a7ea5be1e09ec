"""The AMX-INT8 micro-kernel (:mod:`~tvm_roialign.schedules.intrin.amx`): a 32 x 32 int32 block += ``A [32, kc]`` x ``B``,
``A`` uint8, ``B`` int8 in the quad layout ``[kc / 4, 32, 4]``, four ``tdpbusd`` per 64 reduction
elements. It computes the block of :func:`tvm_roialign.topi.int8_contraction.int8_contraction`."""

from __future__ import annotations

from ...topi.int8_contraction import widen
from . import amx as amx_block
from .amx import BLOCK, AMXKind

INT8 = AMXKind("int8", "uint8", "int8", 1, 4, "int32", "tdpbusd", widen)

#: reduction elements of one step
STEP = INT8.step


def block_desc(kc: int, zero_init: bool):
    """The description both int8 micro-kernels share (AMX-INT8, and ``vpdpbusd``)."""
    return amx_block.block_desc(INT8, kc, zero_init)


def amx_int8_intrin(kc: int, zero_init: bool = False) -> str:
    """The name of the micro-kernel over ``kc`` reduction elements (a multiple of 64), registered
    on first use (:func:`~tvm_roialign.schedules.intrin.amx.amx_intrin`)."""
    return amx_block.amx_intrin(INT8, kc, zero_init)


__all__ = ["BLOCK", "STEP", "amx_int8_intrin", "block_desc"]
