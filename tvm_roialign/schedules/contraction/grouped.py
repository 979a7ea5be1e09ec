"""Rule: a fused grouped NHWC conv2d (ResNeXt's 3x3 convs: several input channels per group) with its
epilogue.

The conv block reads ``pad[n, y, x, f // cg * cg + rc] * w[ry, rx, rc, f]``: output channel ``f`` is
``group * cg + channel-in-group``, ``rc`` runs over the group's ``cg_in`` input channels and the
weight (HWIO, ``I = cg_in``) is indexed by ``f`` itself. It is scheduled as one contraction per
group, the group an outer parallel axis:

* the output channels split into ``[groups, blocks, cols, lanes]``, ``lanes`` the widest vector of
  the target that divides the channels of a group (a full register when ``cg >= lanes``, narrower
  vectors when a group has fewer channels, as ResNeXt 32x4d's first stages), so that a tile never
  spans two groups and its input channels are one broadcast per row;
* a register tile of ``rows`` consecutive output pixels by ``cols`` vectors, the largest the
  target's register file holds (:func:`~tvm_roialign.schedules.contraction.tiles.pick_tile`), ``rows``
  dividing the width (a symbolic width: one pixel per tile, so no loop of the image is cut);
* constant weights packed at compile time into ``[O / (cols * lanes), KH, KW, cg_in, cols * lanes]``
  (:func:`~tvm_roialign.schedules.contraction.schedule.pack_weight`), so that a tile's weight vectors are
  contiguous along the reduction;
* row tiles outside the groups when all the weights fit in half of L2 (the image rows are read
  once), else groups outermost; image, rows and groups fused into one parallel loop (with
  symbolic sizes the two outer ones);
* the epilogue inlined into the tile's write-back, the padding stage its own vectorized pass.

Depthwise convs (one input channel per group) are
:class:`~tvm_roialign.schedules.contraction.depthwise.DepthwiseConv2DNHWC`'s.
"""

from __future__ import annotations

from ..base import (
    CPURule,
    find_main_reduction,
    inline_epilogue,
    largest_divisor_lanes,
    loop_extent,
    static_int,
    vectorize_writeback,
)
from ..elementwise import schedule_producers, schedule_rest
from ..target_info import cpu_info
from ..vector_math import ALL_OPS
from .analysis import Contraction, weight_bytes
from .schedule import pack_weight
from .tiles import STACK_TILE_BYTES, pick_tile

#: narrowest vector worth a tile (below it the fallback's scalar code does as well)
_MIN_LANES = 4


def _grouped_conv(sch) -> tuple[Contraction, int] | None:
    """``(contraction view, output channels per group)`` of a grouped NHWC conv (loops ``n, y, x,
    f, ry, rx, rc``, static channels and taps, ``cg_in > 1``), or None."""
    block = find_main_reduction(sch)
    if block is None:
        return None
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    if not stmt.name_hint.startswith("group_conv2d_nhwc") or len(stmt.reads) != 2:
        return None
    if len(loops) != 7 or len(stmt.iter_vars) != 7:
        return None
    extents = [loop_extent(sch, lp) for lp in loops]
    if None in extents[3:]:
        return None
    f_var = stmt.iter_vars[3].var
    weight = [
        i
        for i, read in enumerate(stmt.reads)
        if len(read.region) == 4 and read.region[3].min.same_as(f_var)
    ]
    if len(weight) != 1:
        return None
    weight = weight[0]
    wshape = [static_int(d) for d in stmt.reads[weight].source.ty.shape]
    data_channels = static_int(stmt.reads[1 - weight].source.ty.shape[-1])
    channels, cg_in = extents[3], wshape[2]
    if None in wshape or data_channels is None or cg_in != extents[6] or cg_in <= 1:
        return None
    groups = data_channels // cg_in
    if groups <= 1 or channels % groups:
        return None
    dtype = str(stmt.writes[0].source.ty.dtype)
    view = Contraction(block, "MMMNRRR", extents, 3, 1 - weight, weight, 3, 4, dtype)
    return view, channels // groups


def _schedule_grouped(sch, c: Contraction, per_group: int, lanes: int, info) -> None:
    """Tile, pack and order the grouped conv ``c`` (see the module docstring)."""
    width = c.extents[2]
    # a static tile's accumulator stays under TVM's stack limit (a larger one: a heap workspace)
    rows, cols = pick_tile(
        width,
        per_group // lanes,
        info.vector_registers,
        lanes * 4,
        STACK_TILE_BYTES,
        dividing_rows=True,
    )
    if width is None:
        rows = 1
    pack_weight(sch, c, cols * lanes)
    n, y, x, f, ry, rx, rc = sch.get_loops(c.block)
    group, block, tile, lane = sch.split(f, [None, per_group // (cols * lanes), cols, lanes])
    x_outer, x_inner = sch.split(x, [None, rows])
    if weight_bytes(c) <= info.l2_bytes // 2:
        spatial = [n, y, x_outer, group, block]
    else:
        spatial = [group, block, n, y, x_outer]
    sch.reorder(*spatial, ry, rx, rc, x_inner, tile, lane)
    if None in c.extents:
        # symbolic sizes: only the two outer loops run in parallel, and the accumulator sits
        # under the innermost spatial loop, so that TIR bounds it by the tile
        sch.parallel(sch.fuse(*spatial[:2]))
        at = spatial[-1]
    else:
        at = sch.fuse(*spatial)
        sch.parallel(at)
    # static sizes: the tile a ``global`` buffer, which TVM 0.27 puts on the stack under 1 KiB
    # (a ``local`` one is a heap workspace allocated at every step of the parallel loop)
    local = sch.cache_write(c.block, 0, "local" if None in c.extents else "global")
    sch.reverse_compute_at(local, at, preserve_unit_loops=True)
    sch.vectorize(lane)
    sch.unroll(tile)
    sch.unroll(x_inner)
    sch.decompose_reduction(c.block, ry)
    inline_epilogue(sch, local)
    vectorize_writeback(sch, local, lanes)


class GroupedConv2DNHWC(CPURule):
    """Grouped NHWC conv2d: a register tile per group, packed weights (see the module)."""

    vector_ops = ALL_OPS

    def schedule(self, sch, func, target):
        found = _grouped_conv(sch)
        if found is None:
            return None
        c, per_group = found
        info = cpu_info(target)
        lanes = largest_divisor_lanes(per_group, info.lanes(c.dtype))
        if lanes < _MIN_LANES:
            return None
        _schedule_grouped(sch, c, per_group, lanes, info)
        schedule_producers(sch, c.block, lanes)
        schedule_rest(sch, lanes)
        return sch


__all__ = ["GroupedConv2DNHWC"]
