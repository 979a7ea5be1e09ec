"""What a strategy is: a TE compute plus a schedule rule, chosen from the target.

The schedule rules are dlight ``ScheduleRule`` subclasses (``apply(func, target, tunable) ->
Schedule | None``) of :mod:`tvm_roialign.schedules`: ``RoIAlignCPU`` and ``RoIAlignGPU``. They
recognize a RoIAlign PrimFunc by its blocks and its ``roi_align.layout`` attribute
(:data:`LAYOUT_ATTR`, set by :meth:`Strategy.build`); an op may set more attributes for them
(:data:`GATHERED_CHANNELS_ATTR`) through ``func_attrs``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import te
from tvm.s_tir.dlight import ScheduleRule

from ..schedules.roi_align.base import GATHERED_CHANNELS_ATTR, LAYOUT_ATTR
from ..topi._sampling import index_dtype_for

__all__ = [
    "GATHERED_CHANNELS_ATTR",
    "LAYOUT_ATTR",
    "OPAQUE",
    "Strategy",
    "mark_scheduled",
    "without_global_symbol",
]

#: TVM's OpPatternKind kOpaque: FuseOps never fuses a PrimFunc so marked.
OPAQUE = 8


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
