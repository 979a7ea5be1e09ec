"""Rule: a fused NHWC conv2d (HWIO weights) with its epilogue (bias, batch-norm, residual add, ReLU).

The conv block is a :class:`~.contraction.Contraction` (output channels are the columns; image,
height and width the rows; kernel height, width and input channels the reduction), scheduled with
:func:`~.contraction.schedule_contraction`: a register tile of ``rows`` output pixels of one image
row by ``cols`` vectors of output channels, constant weights packed at compile time into
``[O / (cols * lanes), KH, KW, I, cols * lanes]``, the epilogue inlined into the tile's write-back.

The zero-padding stage legalization puts in front of the conv (``pad_temp``) is computed as its own
parallel, vectorized pass over the input: inlined into the conv it would put a bounds test in front
of every broadcast load of the inner loop. A producer that is a plain copy (``pad_temp`` of a 1x1
conv without padding) is inlined. Grouped and depthwise convs (whose weight shares the channel
axis with the data) and NCHW convs are not contractions of this form: depthwise NHWC ones go to
:class:`~.depthwise.DepthwiseConv2DNHWC`, the others to :class:`~.fallback.CPUDefault`.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir import Schedule

from .base import CPURule, find_block
from .contraction import (
    analyze_contraction,
    choose_tiling,
    inline_epilogue,
    is_layout_preproc,
    schedule_contraction,
    try_step,
    unguard_rows,
    vectorize_writeback,
    walk,
)
from .elementwise import schedule_injective_block, schedule_rest
from .target_info import cpu_info


def _has_condition(stmt) -> bool:
    found = []
    walk(
        stmt.body,
        tvm.ir.expr.Call,
        lambda node: found.append(str(getattr(node.op, "name", ""))),
    )
    return any(name.endswith("if_then_else") for name in found)


def find_main_reduction(sch: Schedule):
    """The single reduction block of the function (all others spatial), or None."""
    root = find_block(sch, "root")
    blocks = sch.get_child_blocks(root) if root is not None else []
    reductions = [
        b
        for b in blocks
        if any(it.iter_type == tirx.IterVar.CommReduce for it in sch.get(b).iter_vars)
    ]
    return reductions[0] if len(reductions) == 1 else None


def schedule_producers(sch: Schedule, block, lanes: int) -> None:
    """Inline plain-copy producers of ``block``; give conditional ones (padding) their own pass."""
    for producer in sch.get_producers(block):
        if is_layout_preproc(sch, producer):
            continue
        if not _has_condition(sch.get(producer)) and try_step(
            sch.compute_inline, producer
        ):
            continue
        schedule_injective_block(sch, producer, lanes)


class Conv2DNHWC(CPURule):
    """Register-tiled NHWC conv2d with packed constant weights and a fused epilogue.

    ``symbolic``: also tile convs whose image size or batch is symbolic (any stride; the default).
    False leaves those to the fallback rule."""

    def __init__(self, symbolic: bool = True):
        self.symbolic = symbolic

    def schedule(self, sch, func, target):
        block = find_main_reduction(sch)
        if block is None or not sch.get(block).name_hint.startswith("conv2d_nhwc"):
            return None
        contraction = analyze_contraction(sch, block)
        if contraction is None or contraction.roles.count("M") != 3:
            return None
        if None in contraction.extents and not self.symbolic:
            return None
        tiling = choose_tiling(contraction, cpu_info(target))
        if tiling is None:
            return None
        _, local = schedule_contraction(sch, contraction, tiling)
        inline_epilogue(sch, local)
        vectorize_writeback(sch, local, tiling.lanes)
        schedule_producers(sch, contraction.block, tiling.lanes)
        schedule_rest(sch, tiling.lanes)
        return unguard_rows(sch, contraction)


__all__ = ["Conv2DNHWC", "find_main_reduction", "schedule_producers"]
