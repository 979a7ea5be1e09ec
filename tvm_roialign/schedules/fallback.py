"""Rule: the fallback for every llvm PrimFunc the specific rules leave (pooling, reductions,
NCHW convolutions, RoIAlign-like gathers that are not yet scheduled).

* inline every injective producer (padding) and consumer (bias, ReLU, residual add) it can;
* for the remaining reduction block with loops ``S... R...``: tile the two innermost spatial axes
  (rows x vector lanes: 4 x 16 for convolutions, 8 x 32 for a matmul, lanes scaled to the target's
  vector width), run the fused outer spatial loops in parallel, put the reduction loops above the
  tile, accumulate the tile in a ``local`` buffer (kept in registers by LLVM), vectorize the lanes
  and unroll the rows;
* for a remaining injective block: fuse its loops, parallelize the outer part and vectorize the inner.

Functions already marked ``tirx.is_scheduled`` (the RoIAlign strategies) are never touched (the
``ApplyDefaultSchedule`` pass skips them), and any schedule step that fails leaves the function as it
was.
"""

from __future__ import annotations

import contextlib

from tvm.s_tir import Schedule

from .base import CPURule, block_infos, pick_lanes, same_output_shape, static_int, try_step
from .target_info import cpu_info


def _pick_lanes(extent, target, matmul: bool) -> int | None:
    """The widest vector (the target's float32 width, doubled for a matmul; or half, or a quarter,
    not below 4) that divides the static ``extent``, else None."""
    value = static_int(extent)
    if value is None:
        return None
    lanes = cpu_info(target).lanes() if target is not None else 16
    return pick_lanes(value, max(lanes * 2 if matmul else lanes, 4))


def _schedule_reduction(
    sch: Schedule, info, target=None, row_tile: int | None = None
) -> bool:
    kinds = info.dom_kind()
    num_s = len(kinds) - len(kinds.lstrip("S"))
    if num_s == 0 or set(kinds[num_s:]) != {"R"}:
        return False
    loops = sch.get_loops(info.block_rv)
    s_loops, r_loops = loops[:num_s], loops[num_s:]
    # a matmul (rows x columns, one reduction) reuses each weight vector over more rows: a taller,
    # wider tile
    matmul = kinds == "SSR"
    lanes = _pick_lanes(info.iters[num_s - 1].dom, target, matmul)
    if row_tile is None:
        row_tile = 8 if matmul else 4
    if lanes is None:
        fused = sch.fuse(*s_loops) if len(s_loops) > 1 else s_loops[0]
        sch.parallel(fused)
        sch.decompose_reduction(info.block_rv, r_loops[0])
        return True
    col_outer, col_inner = sch.split(s_loops[-1], [None, lanes])
    # register tile: a few rows of the second-to-last spatial axis share each weight vector
    row_inner = None
    if num_s >= 2:
        rows = static_int(info.iters[num_s - 2].dom)
        if rows is None or rows >= row_tile:
            row_outer, row_inner = sch.split(s_loops[-2], [None, row_tile])
            outer = [*s_loops[:-2], row_outer, col_outer]
        else:
            outer = [*s_loops[:-1], col_outer]
    else:
        outer = [col_outer]
    tail = [row_inner, col_inner] if row_inner is not None else [col_inner]
    sch.reorder(*outer, *r_loops, *tail)
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(fused)
    # accumulate the (rows x lanes) tile in a local buffer that LLVM keeps in registers; not with
    # symbolic extents, where TIR sizes the local buffer by the whole output (a stack array of
    # unknown size per parallel task: a segfault on a dynamic-size image)
    if all(static_int(it.dom) is not None for it in info.iters):
        with contextlib.suppress(Exception):  # else: accumulate in place
            local = sch.cache_write(info.block_rv, 0, "local")
            sch.reverse_compute_at(local, fused, preserve_unit_loops=True)
            _fold_consumer(sch, local)
            sch.vectorize(sch.get_loops(local)[-1])
    sch.vectorize(col_inner)
    if row_inner is not None:
        sch.unroll(row_inner)
    sch.decompose_reduction(info.block_rv, r_loops[0])
    return True


def _fold_consumer(sch: Schedule, local) -> None:
    """Inline the sole elementwise consumer of a reduction's write-back into it when it writes
    a buffer of the same shape (a mean's division by the pooled count): computed per tile, it
    costs no pass and no parallel launch of its own."""
    consumers = sch.get_consumers(local)
    if len(consumers) == 1 and same_output_shape(sch, local, consumers[0]):
        try_step(sch.reverse_compute_inline, consumers[0])


def _schedule_injective(sch: Schedule, info, target=None) -> bool:
    loops = sch.get_loops(info.block_rv)
    if not loops:
        return True
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    lanes = _pick_lanes(info.iters[-1].dom, target, False)
    if lanes is not None:
        outer, inner = sch.split(fused, [None, lanes])
        sch.parallel(outer)
        sch.vectorize(inner)
    else:
        sch.parallel(fused)
    return True


class CPUDefault(CPURule):
    """Parallel + vectorized default schedule for unscheduled llvm PrimFuncs (see module docstring)."""

    def schedule(self, sch, func, target):
        infos = block_infos(sch)
        if infos is None:
            return None
        for info in infos:
            if not try_step(sch.get, info.block_rv):
                continue  # inlined into a reduction's write-back (_fold_consumer)
            ok = (
                _schedule_reduction(sch, info, target)
                if info.is_reduction()
                else _schedule_injective(sch, info, target)
                if info.is_injective()
                else False
            )
            if not ok and len(infos) == 1:
                return None
        return sch


__all__ = ["CPUDefault"]
