"""x86 targets: the bin-major CPU schedule of :mod:`.cpu`, vectorized to the target's vector width
(SSE / AVX2 / AVX-512, from the CPU features of the target's mcpu; see
:func:`tvm_roialign.schedules.target_info.cpu_info`)."""

from __future__ import annotations

import tvm


def is_x86(target: tvm.target.Target) -> bool:
    if target.kind.name != "llvm":
        return False
    triple = str(target.attrs.get("mtriple", "")) or tvm.target.codegen.llvm_get_system_triple()
    return triple.startswith(("x86_64", "i386", "i686"))
