"""Schedule of a transpose (``permute_dims``) block: tiles over the two axes that are contiguous.

A transpose whose innermost output axis is not the input's innermost axis reads and writes
contiguous runs along two different output axes: the output's last axis (the store) and the axis
that indexes the input's last axis (the load). Fusing all loops into one, as the elementwise
schedule does, leaves a scalar loop that recomputes every index with divisions. Here the loops keep
their static extents: both axes are cut into vectors of the target's width, the other axes (and,
when they are fewer than the cores, the outer part of the load axis) are fused into one parallel
loop, and the inner tile is unrolled on one axis and vectorized on the other: on the load axis (a
contiguous vector load, its lanes stored apart) when it is at least 4 wide, else on the store axis
(vector loads beat vector stores on every shape measured; docs/benchmarks.md).

Only static extents are tiled; a transpose with symbolic extents is left to the elementwise schedule.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir import Schedule

from .base import loop_extent, pick_lanes
from .target_info import CPUInfo

#: below this many elements the loops run serially (a parallel launch costs more than the work)
_MIN_PARALLEL = 4096


def _load_axis(stmt) -> int | None:
    """The block axis that indexes the input's last axis, when ``stmt`` is a pure permutation
    (``out[v0, ..., vn] = inp[v_p0, ..., v_pn]``, where either side may also hold constant indices:
    a batch of one); None for anything else, or when the output's last index is not the last axis."""
    body = stmt.body
    if not isinstance(body, tirx.BufferStore) or not isinstance(body.value, tvm.ir.expr.TensorLoad):
        return None
    names = [iv.var for iv in stmt.iter_vars]

    def positions(indices):
        found = []
        for idx in indices:
            if isinstance(idx, tirx.IntImm):
                continue
            pos = next((i for i, var in enumerate(names) if var.same_as(idx)), None)
            if pos is None:
                return None
            found.append(pos)
        return found if sorted(found) == list(range(len(names))) else None

    store, load = positions(body.indices), positions(body.value.indices)
    if store is None or load is None or store != list(range(len(names))):
        return None
    if not isinstance(body.value.indices[-1], tvm.ir.expr.Var) or not isinstance(
        body.indices[-1], tvm.ir.expr.Var
    ):
        return None
    return load[-1]


def _tile(sch: Schedule, loop, extent: int, lanes: int):
    """``loop`` cut into (outer, vector) when a vector divides it, else (None, loop)."""
    vec = pick_lanes(extent, lanes) if extent > lanes else None
    if vec is None:
        return None, loop
    return sch.split(loop, [None, vec])


def schedule_transpose_block(sch: Schedule, block, info: CPUInfo) -> bool:
    """Schedule ``block`` when it is a static transpose that moves the innermost axis; returns
    whether it did (nothing is changed otherwise)."""
    stmt = sch.get(block)
    if any(it.iter_type != tirx.IterVar.DataPar for it in stmt.iter_vars):
        return False
    k = _load_axis(stmt)
    loops = sch.get_loops(block)
    n = len(loops)
    if k is None or n != len(stmt.iter_vars) or k == n - 1:
        return False
    extents = [loop_extent(sch, lp) for lp in loops]
    if None in extents:
        return False
    body = stmt.body
    lanes = info.lanes(str(body.buffer.dtype))
    last = n - 1
    others = [loops[i] for i in range(n) if i not in (k, last)]
    k_outer, k_inner = _tile(sch, loops[k], extents[k], lanes)
    l_outer, l_inner = _tile(sch, loops[last], extents[last], lanes)
    load_vector = k_outer is not None or extents[k] >= min(4, lanes)
    store_vector = not load_vector
    inner = [k_inner, l_inner] if store_vector else [l_inner, k_inner]
    middle = [lp for lp in (k_outer, l_outer) if lp is not None]
    sch.reorder(*others, *middle, *inner)
    total = 1
    for extent in extents:
        total *= extent
    outer_extent = 1
    for i in range(n):
        if i not in (k, last):
            outer_extent *= extents[i]
    par = list(others)
    if outer_extent < info.num_cores and k_outer is not None:
        par.append(k_outer)
    if total >= _MIN_PARALLEL and par:
        sch.parallel(sch.fuse(*par) if len(par) > 1 else par[0])
    k_ext = extents[k] if k_outer is None else sch.get(k_inner).extent
    l_ext = extents[last] if l_outer is None else sch.get(l_inner).extent
    inner_ext = [int(k_ext), int(l_ext)] if store_vector else [int(l_ext), int(k_ext)]
    if inner_ext[0] <= lanes:
        sch.unroll(inner[0])
    if inner_ext[1] <= lanes:
        sch.vectorize(inner[1])
    return True


__all__ = ["schedule_transpose_block"]
