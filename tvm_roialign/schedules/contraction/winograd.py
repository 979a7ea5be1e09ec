"""Rule: the input and output transforms of a Winograd convolution
(:class:`tvm_roialign.passes.WinogradConv2D`); its batched matrix product goes to
:class:`~tvm_roialign.schedules.contraction.matmul.Matmul`.

Both transforms are written as one select over the position in the tile of explicit sums with
constant coefficients. Unrolling that position (the ``a*a`` transformed points of the input, the
``m x m`` output pixels) turns every select into one of its sums, and lets LLVM load each input
vector of the tile once for all the sums that use it; the channel axis is vectorized and the tiles
run in parallel:

* input ``V[e*a + f, p, c]``: loops ``p`` (parallel), channel vectors, ``e*a + f`` (unrolled),
  lanes (vectorized); at a symbolic size ``V[e*a + f, n, tile row, tile column, c]``, the tile
  rows in parallel;
* output ``Y[n, h, w, k]`` (+ the bias / ReLU epilogue, inlined): ``h`` and ``w`` split by the
  output tile ``m`` (tile rows and columns parallel, the ``m x m`` pixels unrolled; a predicate
  crops the last tile when the output is not a multiple of ``m``), channel vectors, lanes.
"""

from __future__ import annotations

import math

from tvm.s_tir import Schedule

from ..base import CPURule, find_block, inline_epilogue, loop_extent, pick_lanes, static_int
from ..elementwise import schedule_rest
from ..target_info import cpu_info

INPUT_BLOCK = "winograd_input"
OUTPUT_BLOCK = "winograd_output"


def _stage_in_registers(sch: Schedule, block, loop, vec: int) -> None:
    """Compute the separable first stage ``block`` per tile under ``loop``, in a local buffer,
    its tile points unrolled and its channel lanes vectorized."""
    rank = len(sch.get(block).iter_vars)
    sch.compute_at(block, loop, preserve_unit_loops=True)
    sch.set_scope(block, 0, "local")
    # the block's own loops: its two tile-point axes, the (unit) tile axes, the channel lanes
    inner = sch.get_loops(block)[-rank:]
    for lp in inner[:2]:
        sch.unroll(lp)
    if vec > 1:
        sch.vectorize(inner[-1])


def schedule_input_transform(sch: Schedule, block, lanes: int) -> None:
    ef, *tiles, c = sch.get_loops(block)
    vec = pick_lanes(loop_extent(sch, c), lanes) or 1
    c_outer, c_inner = sch.split(c, [None, vec])
    sch.reorder(*tiles, c_outer, ef, c_inner)
    # flat tiles run in parallel; tile rows and columns (a symbolic size) run their rows in
    # parallel, which needs no division by the symbolic number of columns
    sch.parallel(tiles[0] if len(tiles) == 1 else tiles[1])
    sch.unroll(ef)
    if vec > 1:
        sch.vectorize(c_inner)
    rows = find_block(sch, INPUT_BLOCK + "_rows")
    if rows is not None:
        _stage_in_registers(sch, rows, c_outer, vec)


def schedule_output_transform(sch: Schedule, block, lanes: int) -> None:
    stmt = sch.get(block)
    rows = find_block(sch, OUTPUT_BLOCK + "_rows")
    source = sch.get(rows).reads[0].source if rows is not None else stmt.reads[0].source
    alpha = math.isqrt(static_int(source.ty.shape[0]))
    tile = alpha - 2
    inline_epilogue(sch, block)
    n, h, w, k = sch.get_loops(block)
    th, a = sch.split(h, [None, tile])
    tw, b = sch.split(w, [None, tile])
    vec = pick_lanes(loop_extent(sch, k), lanes) or 1
    k_outer, k_inner = sch.split(k, [None, vec])
    sch.reorder(n, th, tw, k_outer, a, b, k_inner)
    sch.parallel(sch.fuse(n, th, tw))
    sch.unroll(a)
    sch.unroll(b)
    if vec > 1:
        sch.vectorize(k_inner)
    if rows is not None:
        _stage_in_registers(sch, rows, k_outer, vec)


class WinogradTransforms(CPURule):
    """Schedules functions holding a Winograd input or output transform block."""

    def schedule(self, sch, func, target):
        lanes = cpu_info(target).lanes()
        found = False
        block = find_block(sch, INPUT_BLOCK)
        if block is not None:
            schedule_input_transform(sch, block, lanes)
            found = True
        block = find_block(sch, OUTPUT_BLOCK)
        if block is not None:
            schedule_output_transform(sch, block, lanes)
            found = True
        if not found:
            return None
        schedule_rest(sch, lanes)
        return sch


__all__ = [
    "WinogradTransforms",
    "schedule_input_transform",
    "schedule_output_transform",
]
