"""What every CPU rule shares: :class:`CPURule` and two small schedule queries.

:class:`CPURule` is a dlight CPU ``ScheduleRule`` whose ``apply(func, target, tunable)`` does the
part common to all rules of this package: it accepts llvm targets and TIR PrimFuncs only, opens a
:class:`~tvm.s_tir.Schedule` of the function, and hands it to the rule's own :meth:`CPURule.schedule`.
A rule returns the schedule, or None when the function is not of its kind; a schedule step that
TIR refuses (any exception) also means None, so that the next rule gets the untouched function.
A function whose buffers have compound symbolic extents (``(h - 1) // 4 + 1``) is handed to the
rule with a variable of its own for each (:mod:`.symbolic_extents`): the rules' arithmetic on
such extents is exact only in that form.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule

from .symbolic_extents import name_symbolic_extents


def static_int(value) -> int | None:
    """``value`` as a Python int when it is a constant (an int or ``IntImm``), else None."""
    return int(value) if isinstance(value, (int, tirx.IntImm)) else None


def find_block(sch: Schedule, name: str):
    """The block named ``name`` of the function, or None when it has none."""
    try:
        return sch.get_sblock(name)
    except Exception:  # noqa: BLE001 - TIR raises when the name is not in the function
        return None


class CPURule(CPUScheduleRule):
    """A schedule rule for llvm PrimFuncs (dlight's CPU rule: llvm targets only); subclasses
    implement :meth:`schedule`."""

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        func = name_symbolic_extents(func) or func
        sch = Schedule(func, error_render_level="none")
        try:
            return self.schedule(sch, func, target)
        except Exception:  # noqa: BLE001 - any failed step: let the next rule try
            return None

    def schedule(self, sch: Schedule, func: tirx.PrimFunc, target) -> Schedule | None:
        """Schedule ``sch`` (a fresh schedule of ``func``) for ``target``; None when ``func`` is
        not of this rule's kind."""
        raise NotImplementedError


__all__ = ["CPURule", "find_block", "static_int"]
