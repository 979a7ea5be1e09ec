"""Per-target strategies for RoIAlign: a compute plus a schedule, chosen from the target.

``STRATEGIES`` is the table, keyed by strategy name and searched in order; the first whose
``matches(target)`` holds is used. :func:`select_strategy` raises ValueError for a target that no
strategy serves.
"""

from __future__ import annotations

import tvm

from .arm import is_arm
from .base import Strategy
from .cpu import RoIAlignCPU
from .cpu_kernel import cpu_adaptive_kernel
from .cuda import RoIAlignCUDA, is_cuda
from .metal import RoIAlignMetal, is_metal
from .x86 import is_x86

STRATEGIES: dict[str, Strategy] = {
    "x86": Strategy("x86", is_x86, RoIAlignCPU(), kernel=cpu_adaptive_kernel),
    "arm": Strategy("arm", is_arm, RoIAlignCPU(), kernel=cpu_adaptive_kernel),
    "llvm": Strategy("llvm", lambda t: t.kind.name == "llvm", RoIAlignCPU(vectorize=False)),
    "cuda": Strategy("cuda", is_cuda, RoIAlignCUDA()),
    "metal": Strategy("metal", is_metal, RoIAlignMetal()),
}


def host_target() -> tvm.target.Target:
    """The llvm target of this machine (generic CPU), used when no target is current."""
    return tvm.target.Target({"kind": "llvm"})


def select_strategy(target: tvm.target.Target | None) -> tuple[Strategy, tvm.target.Target]:
    """``(strategy, target)`` for ``target`` (the current target when None, else the host)."""
    if target is None:
        target = tvm.target.Target.current(allow_none=True) or host_target()
    for strategy in STRATEGIES.values():
        if strategy.matches(target):
            return strategy, target
    names = ", ".join(STRATEGIES)
    raise ValueError(
        f"unsupported target {target.kind.name!r} for roi_align: tvm-roialign has strategies "
        f"for {names}"
    )


__all__ = ["STRATEGIES", "Strategy", "host_target", "select_strategy"]
