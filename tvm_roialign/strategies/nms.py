"""Strategies for ``relax.vision.batched_nms``: how the greedy pass is built for a target.

The pass (:mod:`tvm_roialign.topi.nms`) is one sequential loop nest written with the IRBuilder, so a
strategy chooses how it is launched rather than a schedule: on llvm targets (x86, ARM) it is plain
CPU code; on CUDA and Metal it runs in one GPU thread (the build is complete and deployable; the
pass is short next to the network, and sorting, the part that scales, is TVM's own per-target
argsort). Metal has no float64, so there the products are plain float32 (see the topi module).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import te

from ..topi.nms import batched_nms
from .base import mark_scheduled
from .targets import is_cuda, is_llvm, is_metal


@dataclass(frozen=True)
class NMSStrategy:
    """``matches(target)`` selects it; ``gpu`` and ``exact_products`` are the pass's parameters."""

    name: str
    matches: Callable[[tvm.target.Target], bool]
    gpu: bool
    exact_products: bool

    def build(self, inputs, iou_threshold, max_output, offset_trick_max_numel):
        """The PrimFunc ``(boxes, idxs, valid, order) -> (keep, count)``, marked scheduled."""
        keep, count = batched_nms(
            *inputs,
            iou_threshold,
            max_output,
            offset_trick_max_numel,
            gpu=self.gpu,
            exact_products=self.exact_products,
        )
        return mark_scheduled(te.create_prim_func([*inputs, keep, count]))


NMS_STRATEGIES: dict[str, NMSStrategy] = {
    "llvm": NMSStrategy("llvm", is_llvm, False, True),
    "cuda": NMSStrategy("cuda", is_cuda, True, True),
    "metal": NMSStrategy("metal", is_metal, True, False),
}


def select_nms_strategy(target: tvm.target.Target) -> NMSStrategy:
    """The strategy for ``target``; ValueError for a target kind none serves."""
    for strategy in NMS_STRATEGIES.values():
        if strategy.matches(target):
            return strategy
    raise ValueError(
        f"unsupported target {target.kind.name!r} for batched_nms: tvm-roialign has strategies "
        f"for {', '.join(NMS_STRATEGIES)}"
    )


__all__ = ["NMS_STRATEGIES", "NMSStrategy", "select_nms_strategy"]
