"""Give each compound symbolic extent of a kernel a variable of its own.

A model with a symbolic image size reaches the deeper kernels with extents such as
``(h - 1) // 4 + 1`` (after a stride-2 stem and a stride-2 pool), and Relax passes ``h`` and
``w`` to the kernel as scalars. TIR's arithmetic cannot tell the sign of such an extent, so the
bounds that schedule primitives derive from it (the region a tile of a fused parallel loop
writes, the shape of a re-laid-out buffer) come out as ``Select``-guarded over-approximations,
and a register tile's write-back would cover other tiles' outputs.

:func:`name_symbolic_extents` rewrites such a kernel so that every compound extent of its
parameter buffers is a fresh variable (``extent0``, ``extent1``, ...), bound at run time from the
buffer's own shape, as a plain ``h`` is: the expression ``E`` becomes ``extent_i`` wherever it
occurs, and its core (``E`` less a constant addend ``c``) becomes ``extent_i - c``, so that
``(h - 1) // 4 + 3`` (a padded copy) becomes ``extent0 + 2``. Larger expressions are replaced
first, so the output extent ``((h - 1) // 4 - 1) // 2 + 1`` of a strided conv gets a variable of its
own rather than one written in terms of the input's. The kernel computes the same values (each
variable equals its expression for every tensor Relax passes: the shapes were computed from it),
with extents that the schedule's arithmetic handles as it handles a plain ``h``. The scalar
parameters stay in the signature (Relax still passes them), used or not.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

#: expression kinds that a compound extent (or its core) can be
_EXTENT_NODES = (tirx.FloorDiv, tirx.FloorMod, tirx.Add, tirx.Sub, tirx.Mul, tirx.Min, tirx.Max)


def _free_vars(expr) -> list:
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Var, lambda v: found.append(v) and None))
    return found


def _node_count(expr) -> int:
    count = [0]

    def visit(_node):
        count[0] += 1

    tvm_ffi.structural_walk(expr, visit)
    return count[0]


def _split_constant(expr) -> tuple:
    """``(core, c)`` with ``expr == core + c`` and ``c`` an integer (0 when there is none)."""
    if isinstance(expr, tirx.Add) and isinstance(expr.b, tirx.IntImm):
        return expr.a, int(expr.b.value)
    return expr, 0


def compound_extents(func: tirx.PrimFunc) -> list:
    """The distinct compound symbolic extents (neither a constant nor a variable) of ``func``'s
    parameter buffers, largest first."""
    found = []
    for param in func.params:
        if not isinstance(param.ty, tirx.buffer.BufferType):
            continue
        for extent in param.ty.shape:
            if isinstance(extent, (tirx.IntImm, tirx.Var)) or not _free_vars(extent):
                continue
            if not any(tvm_ffi.structural_equal(extent, seen) for seen in found):
                found.append(extent)
    return sorted(found, key=_node_count, reverse=True)


def name_symbolic_extents(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with a variable of its own for each compound extent of its parameter buffers
    (see the module docstring); None when it has none."""
    extents = compound_extents(func)
    if not extents:
        return None
    fresh = [tirx.Var(f"extent{i}", "int64") for i in range(len(extents))]
    # whole expressions before cores, larger before smaller (pre-order: outer nodes first)
    replacements = list(zip(extents, fresh))
    for extent, var in zip(extents, fresh):
        core, constant = _split_constant(extent)
        if constant:
            replacements.append((core, var - constant))

    def replace(expr):
        for pattern, value in replacements:
            if tvm_ffi.structural_equal(expr, pattern):
                return value
        return expr

    named = tvm_ffi.structural_map(func, (_EXTENT_NODES, replace), order="pre")
    analyzer = tvm.sym.Analyzer()

    def simplify(expr):
        # ``extent0 - 1 + 3`` -> ``extent0 + 2``: the padded copies' extents
        if any(any(v.same_as(f) for f in fresh) for v in _free_vars(expr)):
            return analyzer.simplify(expr)
        return expr

    return tvm_ffi.structural_map(named, ((tirx.Add, tirx.Sub), simplify), order="pre")


__all__ = ["compound_extents", "name_symbolic_extents"]
