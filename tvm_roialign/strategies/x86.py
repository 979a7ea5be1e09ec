"""x86 strategy: the bin-major CPU schedule, vectorized to the target's vector width (SSE/AVX2/AVX-512)."""

from __future__ import annotations

import tvm

from .cpu import schedule_cpu


def is_x86(target: tvm.target.Target) -> bool:
    if target.kind.name != "llvm":
        return False
    triple = str(target.attrs.get("mtriple", "")) or tvm.target.codegen.llvm_get_system_triple()
    return triple.startswith(("x86_64", "i386", "i686"))


def vector_bits(target: tvm.target.Target) -> int:
    """The target's vector register width in bits, as LLVM reports it for its mcpu."""
    try:
        return int(tvm.target.codegen.llvm_get_vector_width(target))
    except Exception:  # noqa: BLE001 - an unknown mcpu: assume SSE
        return 128


def schedule_x86(func, target):
    """Schedule rule: ``(PrimFunc, Target) -> Schedule | None``."""
    # float32 accumulation everywhere but float64 data; lanes are counted in accumulator elements
    bits = 64 if any(str(p.dtype) == "float64" for p in func.params) else 32
    return schedule_cpu(func, target, max_lanes=max(vector_bits(target) // bits, 1))
