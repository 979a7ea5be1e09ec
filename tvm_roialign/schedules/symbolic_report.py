"""Which kernels of symbolic shape the rules served, and which fell back (the build's summary line).

A kernel (PrimFunc) has a symbolic shape when one of its buffers has a symbolic dimension (an ONNX
model's dynamic height, width or batch). After the schedule rules, it counts as *served* when it
runs in parallel and vectorized and, if it holds a conv2d or matmul reduction, register-tiled (an
unrolled tile accumulated in a cache block, as the conv and matmul rules do); otherwise the reason
is the first of those it lacks. :func:`symbolic_report_pass`
hands the :class:`SymbolicCoverage` of a module to a callback (``tvm-roialign compile`` prints it,
as it prints the coverage of ``--tuning-records``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import tirx

from .base import static_int, walk


@dataclass
class SymbolicCoverage:
    """Kernels with a symbolic shape: the ``served`` names and ``(name, reason)`` that fell back."""

    served: list[str] = field(default_factory=list)
    fell_back: list[tuple[str, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.served) + len(self.fell_back)

    def __str__(self) -> str:
        text = f"symbolic shapes: {len(self.served)} of {self.total} kernels tiled, vectorized, parallel"
        if self.fell_back:
            shown = ", ".join(f"{name} ({why})" for name, why in self.fell_back[:4])
            more = ", ..." if len(self.fell_back) > 4 else ""
            text += f"; {len(self.fell_back)} fell back: {shown}{more}"
        return text


def _is_symbolic(func: tirx.PrimFunc) -> bool:
    return any(
        static_int(dim) is None
        for param in func.params
        for dim in getattr(param.ty, "shape", None) or ()
    )


def _reason(func: tirx.PrimFunc) -> str | None:
    kinds, contraction = set(), []
    walk(func.body, tirx.For, lambda loop: kinds.add(loop.kind))
    walk(
        func.body,
        tvm.s_tir.SBlock,
        lambda b: contraction.append(b.name_hint)
        if b.name_hint.startswith(("conv2d", "matmul", "dense"))
        else None,
    )
    if tirx.ForKind.PARALLEL not in kinds:
        return "serial"
    if tirx.ForKind.VECTORIZED not in kinds:
        return "scalar: no static innermost axis of 4 or more lanes"
    # the conv / matmul rules accumulate their tile in a cache block (``<name>_local`` or
    # ``_global``); the fallback accumulates in the output
    tiled = [name for name in contraction if name.endswith(("_local", "_global"))]
    if contraction and (not tiled or tirx.ForKind.UNROLLED not in kinds):
        return "no register tile: the fallback rule"
    return None


def symbolic_coverage(mod: tvm.IRModule) -> SymbolicCoverage:
    """The :class:`SymbolicCoverage` of the scheduled PrimFuncs of ``mod``."""
    coverage = SymbolicCoverage()
    for gv, func in sorted(mod.functions_items(), key=lambda item: item[0].name_hint):
        if not isinstance(func, tirx.PrimFunc) or not _is_symbolic(func):
            continue
        why = _reason(func)
        if why is None:
            coverage.served.append(gv.name_hint)
        else:
            coverage.fell_back.append((gv.name_hint, why))
    return coverage


def symbolic_report_pass(report) -> tvm.transform.Pass:
    """A pass that leaves the module as it is and calls ``report(SymbolicCoverage)`` when the
    module has kernels of symbolic shape."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_roialign.SymbolicReport")
    def analyze(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        coverage = symbolic_coverage(mod)
        if coverage.total:
            report(coverage)
        return mod

    return analyze


__all__ = ["SymbolicCoverage", "symbolic_coverage", "symbolic_report_pass"]
