"""x86 targets: the bin-major CPU schedule of :mod:`.cpu`, vectorized to the target's vector width
(SSE / AVX2 / AVX-512, as LLVM reports it for the target's mcpu)."""

from __future__ import annotations

import tvm


def is_x86(target: tvm.target.Target) -> bool:
    if target.kind.name != "llvm":
        return False
    triple = str(target.attrs.get("mtriple", "")) or tvm.target.codegen.llvm_get_system_triple()
    return triple.startswith(("x86_64", "i386", "i686"))


def x86_vector_bits(target: tvm.target.Target) -> int:
    """The target's vector register width in bits, as LLVM reports it for its mcpu."""
    try:
        return int(tvm.target.codegen.llvm_get_vector_width(target))
    except Exception:  # noqa: BLE001 - an unknown mcpu: assume SSE
        return 128
