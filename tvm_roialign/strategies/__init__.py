"""Per-target strategies for RoIAlign: a compute plus a schedule rule, chosen from the target.

``STRATEGIES`` is the table, keyed by strategy name and searched in order; the first whose
``matches(target)`` holds is used. :func:`select_strategy` raises ValueError for a target that no
strategy serves. The schedule rules themselves live in :mod:`tvm_roialign.schedules`
(``roi_align_cpu``, ``roi_align_gpu``, and the adaptive-grid kernel ``roi_align_kernel``).
"""

from __future__ import annotations

import tvm

from ..schedules.roi_align.cpu import RoIAlignCPU
from ..schedules.roi_align.gpu import RoIAlignCUDA, RoIAlignMetal
from .base import Strategy
from .cpu_kernel import cpu_adaptive_kernel
from .targets import is_arm, is_cuda, is_llvm, is_metal, is_x86

STRATEGIES: dict[str, Strategy] = {
    "x86": Strategy("x86", is_x86, RoIAlignCPU(), kernel=cpu_adaptive_kernel),
    "arm": Strategy("arm", is_arm, RoIAlignCPU(), kernel=cpu_adaptive_kernel),
    "llvm": Strategy("llvm", is_llvm, RoIAlignCPU(vectorize=False)),
    "cuda": Strategy("cuda", is_cuda, RoIAlignCUDA()),
    "metal": Strategy("metal", is_metal, RoIAlignMetal()),
}


def host_target() -> tvm.target.Target:
    """The llvm target of this machine (generic CPU), for a call that has no target of its own."""
    return tvm.target.Target({"kind": "llvm"})


def select_strategy(target: tvm.target.Target) -> tuple[Strategy, tvm.target.Target]:
    """``(strategy, target)`` for ``target`` (the caller's: legalization passes the call's)."""
    for strategy in STRATEGIES.values():
        if strategy.matches(target):
            return strategy, target
    names = ", ".join(STRATEGIES)
    raise ValueError(
        f"unsupported target {target.kind.name!r} for roi_align: tvm-roialign has strategies "
        f"for {names}"
    )


__all__ = ["STRATEGIES", "Strategy", "host_target", "select_strategy"]
