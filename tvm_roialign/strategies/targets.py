"""Which targets a strategy serves: llvm for x86 and ARM CPUs (and any other llvm), CUDA, Metal.

The x86 and ARM strategies take the vectorized bin-major CPU rule (vector width from the target's
CPU features, NEON's 128 bits on ARM: :func:`tvm_roialign.schedules.target_info.cpu_info`); CUDA
and Metal take the GPU rule (:mod:`tvm_roialign.schedules.roi_align.gpu`).
"""

from __future__ import annotations

import tvm


def is_llvm(target: tvm.target.Target) -> bool:
    return target.kind.name == "llvm"


def is_x86(target: tvm.target.Target) -> bool:
    if not is_llvm(target):
        return False
    triple = str(target.attrs.get("mtriple", "")) or tvm.target.codegen.llvm_get_system_triple()
    return triple.startswith(("x86_64", "i386", "i686"))


def is_arm(target: tvm.target.Target) -> bool:
    """An llvm target for an ARM CPU (TVM gives it the key ``arm_cpu``, e.g. mtriple aarch64-*)."""
    return is_llvm(target) and "arm_cpu" in [str(key) for key in target.keys]


def is_cuda(target: tvm.target.Target) -> bool:
    return target.kind.name == "cuda"


def is_metal(target: tvm.target.Target) -> bool:
    return target.kind.name == "metal"


__all__ = ["is_arm", "is_cuda", "is_llvm", "is_metal", "is_x86"]
