"""Rule: a fused NHWC conv2d (HWIO weights) with its epilogue (bias, batch-norm, residual add, ReLU).

The conv block is a :class:`~tvm_roialign.schedules.contraction.schedule.Contraction` (output channels are the
columns; image, height and width the rows; kernel height, width and input channels the reduction), scheduled
with :func:`~tvm_roialign.schedules.contraction.schedule.schedule_contraction`: a register tile of ``rows``
consecutive output pixels by ``cols`` vectors of output channels (the pixels of an image are one row axis
of ``H * W``, static or symbolic (:mod:`~tvm_roialign.schedules.contraction.conv_rows`), so a tile runs on
into the next image row), constant weights packed at compile time into
``[O / (cols * lanes), KH, KW, I, cols * lanes]``, the epilogue inlined into the tile's write-back.

The zero-padding stage legalization puts in front of the conv (``pad_temp``) is computed as its own
parallel, vectorized pass over the input: inlined into the conv it would put a bounds test in front
of every broadcast load of the inner loop. A producer that is a plain copy (``pad_temp`` of a 1x1
conv without padding) is inlined. Grouped and depthwise convs (whose weight shares the channel
axis with the data) and NCHW convs are not contractions of this form: depthwise NHWC ones go to
:class:`~tvm_roialign.schedules.contraction.depthwise.DepthwiseConv2DNHWC`, grouped NHWC ones to
:class:`~tvm_roialign.schedules.contraction.grouped.GroupedConv2DNHWC`, the others to
:class:`~tvm_roialign.schedules.fallback.CPUDefault`.
"""

from __future__ import annotations

from ..base import CPURule, find_main_reduction
from ..target_info import cpu_info
from ..vector_math import ALL_OPS
from .conv_rows import flatten_rows
from .schedule import analyze_contraction, choose_tiling, schedule_with_epilogue


class Conv2DNHWC(CPURule):
    """Register-tiled NHWC conv2d with packed constant weights and a fused epilogue.

    ``symbolic``: also tile convs whose image size or batch is symbolic (any stride; the default).
    False leaves those to the fallback rule."""

    vector_ops = ALL_OPS

    def __init__(self, symbolic: bool = True):
        self.symbolic = symbolic

    def schedule(self, sch, func, target):
        block = find_main_reduction(sch)
        if block is None or not sch.get(block).name_hint.startswith("conv2d_nhwc"):
            return None
        contraction = analyze_contraction(sch, block)
        if contraction is None or contraction.roles.count("M") != 3:
            return None
        if flatten_rows(sch, block):
            contraction = analyze_contraction(sch, block)
            if contraction is None:
                return None
        if None in contraction.extents and not self.symbolic:
            return None
        tiling = choose_tiling(contraction, cpu_info(target))
        if tiling is None:
            return None
        return schedule_with_epilogue(sch, contraction, tiling)


__all__ = ["Conv2DNHWC"]
