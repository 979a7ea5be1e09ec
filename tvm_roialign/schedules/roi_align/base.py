"""What RoIAlign's schedule rules share: the PrimFunc they recognize, and their guard.

The rules (:class:`~tvm_roialign.schedules.roi_align.cpu.RoIAlignCPU`,
:class:`~tvm_roialign.schedules.roi_align.gpu.RoIAlignGPU`) find the blocks ``roi_align_acc`` (the reduction
over the sampling grid) and ``roi_align`` (the output) by name. Every RoIAlign-like compute of this package
(``roi_align``, ``multiscale_roi_align``, the RoI family) names its blocks so, with loops ``(K, C, PH, PW)``
in NCHW or ``(K, PH, PW, C)`` in NHWC, and records its layout in the PrimFunc attribute ``roi_align.layout``;
one rule then serves all of them. Unlike the model's :class:`~tvm_roialign.schedules.base.CPURule`\\ s, a
RoIAlign rule lets a refused step raise.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import Schedule

from ..base import Rule, find_block, new_schedule

ACC_BLOCK = "roi_align_acc"
OUT_BLOCK = "roi_align"
#: TE nests a reduction whose extent depends on the roi (adaptive sampling grid) in a block of its own
NESTED_ACC_BLOCK = ACC_BLOCK + "_l1"
#: multiscale_roi_align computes each roi's FPN level once, in a block of its own
LEVEL_BLOCK = "roi_level"
LAYOUT_ATTR = "roi_align.layout"
#: PrimFunc attribute of an op whose output channel reads another data channel per bin
#: (ps_roi_align): a channels-last copy of the map would not make the channel loop contiguous
GATHERED_CHANNELS_ATTR = "roi_align.gathered_channels"
LAYOUTS = ("NCHW", "NHWC")


def layout_of(func: tirx.PrimFunc) -> str | None:
    """The ``roi_align.layout`` attribute of ``func`` (None when it has none)."""
    if func.attrs is None or LAYOUT_ATTR not in func.attrs:
        return None
    return str(func.attrs[LAYOUT_ATTR])


def find_roi_blocks(sch: Schedule):
    """``(acc, out)`` block RVs of a RoIAlign PrimFunc, or None when it is not one."""
    acc, out = find_block(sch, ACC_BLOCK), find_block(sch, OUT_BLOCK)
    if acc is None or out is None:
        return None
    return acc, out


class RoIAlignRule(Rule):
    """A rule whose :meth:`schedule` sees RoIAlign PrimFuncs of this package only (a layout
    attribute and the two blocks); any other function gets None."""

    def schedule_func(self, func, target):
        if layout_of(func) not in LAYOUTS:
            return None
        sch = new_schedule(func)
        if find_roi_blocks(sch) is None:
            return None
        return self.schedule(sch, func, target)


__all__ = [
    "ACC_BLOCK",
    "GATHERED_CHANNELS_ATTR",
    "LAYOUTS",
    "LAYOUT_ATTR",
    "LEVEL_BLOCK",
    "NESTED_ACC_BLOCK",
    "OUT_BLOCK",
    "RoIAlignRule",
    "find_roi_blocks",
    "layout_of",
]
