"""The AMX bf16 micro-kernel (:mod:`~tvm_roialign.schedules.intrin.amx`): a 32 x 32 fp32 block += ``A [32, kc]`` x ``B``,
``A`` and ``B`` bf16 held as uint16 bits, ``B`` in the pair layout ``[kc / 2, 32, 2]``, four
``tdpbf16ps`` per 32 reduction elements. It computes the block of
:func:`tvm_roialign.topi.bf16_contraction.bf16_contraction`."""

from __future__ import annotations

from ...topi.bf16_contraction import bf16_value
from . import amx as amx_block
from .amx import BLOCK, AMXKind

BF16 = AMXKind("bf16", "uint16", "uint16", 2, 2, "float32", "tdpbf16ps", bf16_value)

#: reduction elements of one step
STEP = BF16.step


def block_desc(kc: int, zero_init: bool):
    """The description both bf16 micro-kernels share (AMX, and ``vdpbf16ps``)."""
    return amx_block.block_desc(BF16, kc, zero_init)


def amx_bf16_intrin(kc: int, zero_init: bool = False) -> str:
    """The name of the micro-kernel over ``kc`` reduction elements (a multiple of 32), registered
    on first use (:func:`~tvm_roialign.schedules.intrin.amx.amx_intrin`)."""
    return amx_block.amx_intrin(BF16, kc, zero_init)


__all__ = ["BLOCK", "STEP", "amx_bf16_intrin", "block_desc"]
