"""What a strategy is: a TE compute plus a schedule rule, chosen from the target.

The schedule rules are dlight ``ScheduleRule`` subclasses (``apply(func, target, tunable) ->
Schedule | None``): :class:`~.cpu.RoIAlignCPU` and :class:`~.gpu.RoIAlignGPU`. A rule finds the
blocks ``roi_align_acc`` (the reduction over the sampling grid) and ``roi_align`` (the output) by
name and returns None when they are not there. Every RoIAlign-like compute of this package
(``roi_align``, ``multiscale_roi_align``) names its blocks so, with loops ``(K, C, PH, PW)`` in NCHW
or ``(K, PH, PW, C)`` in NHWC, and records its layout in the PrimFunc attribute
``roi_align.layout``; one rule then serves all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import te
from tvm.s_tir import Schedule
from tvm.s_tir.dlight import ScheduleRule

from ..topi._sampling import index_dtype_for

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
#: TVM's OpPatternKind kOpaque: FuseOps never fuses a PrimFunc so marked.
OPAQUE = 8

def new_schedule(func: tvm.tirx.PrimFunc) -> Schedule:
    """A schedule whose errors are not rendered (RoIAlign's TIR is large to print)."""
    return Schedule(func, error_render_level="none")


def has_block(sch: Schedule, name: str) -> bool:
    try:
        sch.get_sblock(name)
    except Exception:  # noqa: BLE001 - ScheduleError / ValueError: no such block
        return False
    return True


def find_blocks(sch: Schedule):
    """``(acc, out)`` block RVs of a RoIAlign PrimFunc, or None when it is not one."""
    if not (has_block(sch, ACC_BLOCK) and has_block(sch, OUT_BLOCK)):
        return None
    return sch.get_sblock(ACC_BLOCK), sch.get_sblock(OUT_BLOCK)


def buffer_dtypes(func: tvm.tirx.PrimFunc) -> list[str]:
    """The dtypes of the buffer parameters of ``func``, in order (data first)."""
    return [
        str(param.ty.dtype) for param in func.params if isinstance(param.ty, tvm.tirx.BufferType)
    ]


def layout_of(func: tvm.tirx.PrimFunc) -> str | None:
    if func.attrs is None or LAYOUT_ATTR not in func.attrs:
        return None
    return str(func.attrs[LAYOUT_ATTR])


def static_extent(sch: Schedule, loop) -> int | None:
    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tvm.tirx.IntImm) else None


def largest_divisor_lanes(extent: int | None, max_lanes: int) -> int:
    """The largest power of two <= ``max_lanes`` that divides ``extent`` (1 if none or symbolic)."""
    if extent is None:
        return 1
    lanes = 1
    while lanes * 2 <= max_lanes and extent % (lanes * 2) == 0:
        lanes *= 2
    return lanes


def without_global_symbol(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` without the ``global_symbol`` (``"main"``) that ``te.create_prim_func`` and a
    schedule's module give it, for adding it to a Relax module under a name of its own: a second
    ``"main"`` symbol breaks ``tvm.compile`` after an explicit ``relax.transform.LegalizeOps()``
    (``IRModule contains duplicate global symbol: main``)."""
    if func.attrs is not None and "global_symbol" in func.attrs:
        return func.without_attr("global_symbol")
    return func


def mark_scheduled(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """Mark a PrimFunc so that dlight leaves its schedule alone and FuseOps never fuses it."""
    return func.with_attrs({"tirx.is_scheduled": True, "op_pattern": OPAQUE, "tirx.noalias": True})


@dataclass(frozen=True)
class Strategy:
    """A compute plus a schedule rule for one family of targets.

    ``schedule`` is the dlight rule; ``matches(target)`` says whether the strategy is meant for a
    target.
    ``kernel``, when given, is a strategy-specific compute ``(te_inputs, attrs, target) ->
    te.Tensor | None`` tried before the op's TE compute (None: not applicable); its PrimFunc is
    expected to be scheduled already (the schedule rule returns None for it).
    """

    name: str
    matches: Callable[[tvm.target.Target], bool]
    schedule: ScheduleRule
    kernel: Callable | None = None

    def build(
        self, compute, inputs, target, layout: str, attrs=None, func_attrs=None
    ) -> tvm.tirx.PrimFunc:
        """Create the PrimFunc of ``compute(*inputs)`` and schedule it for ``target``.

        ``compute`` returns the output te.Tensor; the index dtype is chosen from the static sizes
        of the inputs and the output (int64 past 2**31 - 1 elements or for symbolic sizes).
        ``attrs`` (the op's attributes) are passed to the strategy's ``kernel`` if it has one;
        ``func_attrs`` are set on the PrimFunc before it is scheduled.
        """
        with target:  # the compute fences its geometry for the target (topi.exact_product)
            out = None
            if self.kernel is not None and attrs is not None:
                out = self.kernel(inputs, attrs, target)
            if out is None:
                out = compute(*inputs)
        shapes = [t.shape for t in inputs if isinstance(t, te.Tensor)] + [out.shape]
        func = te.create_prim_func(
            [*inputs, out], index_dtype_override=index_dtype_for(*shapes)
        ).with_attrs({LAYOUT_ATTR: layout, **(func_attrs or {})})
        sch = self.schedule.apply(func, target, False)
        if sch is not None:
            func = sch.mod["main"]
        return mark_scheduled(func)
