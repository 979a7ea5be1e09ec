"""The matmul whose ``b`` is computed at run time and whose columns are not a multiple of the
vector width: attention's scores ``q @ k^T`` (``[heads, tokens, d] x [heads, d, tokens]``, 197
columns for ViT-B/16 at 224, 49 for a Swin window).

A constant weight gets padded output channels from the graph (:class:`~tvm_roialign.passes.PadChannels`);
a run-time ``b`` cannot, and without it the register tile of
:mod:`~tvm_roialign.schedules.contraction.schedule` has no vector that divides the columns (the matmul ran as
scalar multiply-adds). Here:

* the block's column domain is padded to a multiple of the register tile's width
  (``sch.pad_einsum``), which gives ``b`` a zero-padded copy made at each call, laid out as the
  tile's panels ``[<batch>, columns / (cols * lanes), <reduction>, cols * lanes]`` (the packing of
  a constant weight, done at run time: one pass over ``b``, which is ``rows`` times smaller than
  the work that reads it);
* the register tile runs on the padded columns (its padding columns multiply zeros), and its
  write-back copies the real columns only, with the epilogue inlined into it;
* the tile (``rows x cols`` vectors) is the one :func:`~tvm_roialign.schedules.contraction.tiles.pick_tile`
  gives the padded column count that costs the fewest vector multiply-adds, padding rows and columns
  counted, weighted by the loads a step issues beyond one per multiply-add
  (:func:`padded_tiling`).
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..base import inline_epilogue
from ..elementwise import schedule_producers, schedule_rest
from ..target_info import CPUInfo
from .analysis import Contraction, analyze_contraction, rows_pos, weight_bytes
from .schedule import schedule_contraction, unguard_rows
from .tiles import STACK_TILE_BYTES, Tiling, pick_tile


def constant_weight(sch: Schedule, c: Contraction) -> bool:
    """Whether ``w`` of ``c`` is a layout-free constant (packed at compile time)."""
    func = sch.mod["main"]
    free = func.attrs.get("layout_free_buffers") if func.attrs is not None else None
    if not free:
        return False
    source = sch.get(c.block).reads[c.weight_read].source
    return any(func.params[int(i)].same_as(source) for i in free)


def wants_padding(sch: Schedule, c: Contraction, info: CPUInfo) -> bool:
    """Whether ``c`` is scheduled here: a run-time ``w``, static extents, and columns the
    target's full vector does not divide (a narrower vector would halve the throughput or more)."""
    if None in c.extents or constant_weight(sch, c):
        return False
    return c.num_columns % info.lanes(c.dtype) != 0


def padded_tiling(c: Contraction, info: CPUInfo) -> Tiling:
    """The register tile and its padded column count (``cols * lanes`` divides it).

    For each padded count of column vectors (from the real count up to one more tile of the
    widest ``cols``), :func:`~tvm_roialign.schedules.contraction.tiles.pick_tile` gives its tile; the cost is
    the vector multiply-adds of the padded rows and columns, times ``(rows + cols) / (rows * cols)``
    where a step issues more loads than multiply-adds (both issue two per cycle)."""
    lanes = info.lanes(c.dtype)
    vectors = -(-c.num_columns // lanes)
    rows_extent = c.extents[rows_pos(c)]
    best, best_cost = None, None
    for padded in range(vectors, vectors + 8):
        # the accumulator (:func:`~.contraction.schedule_contraction`'s) under TVM's stack bound
        rows, cols = pick_tile(
            rows_extent, padded, info.vector_registers, lanes * 4, STACK_TILE_BYTES
        )
        padded_rows = -(-rows_extent // rows) * rows
        cost = padded * padded_rows * max(1.0, (rows + cols) / (rows * cols))
        if best_cost is None or cost < best_cost:
            best, best_cost = Tiling(lanes, rows, cols), cost
    return best


def _pack_panels(sch: Schedule, block, c: Contraction, block_cols: int) -> None:
    """Lay the padded ``b`` (its producer: the zero-padding copy) out as panels
    ``[<batch dims>, columns / block_cols, <other dims>, block_cols]`` and schedule the copy
    (batch and column blocks in parallel, the panel's row contiguous and vectorized)."""
    stmt = sch.get(block)
    region = stmt.reads[c.weight_read].region
    batch_vars = {
        it.var for it, role in zip(stmt.iter_vars, c.roles) if role == "B"
    }
    dim, ndim = c.weight_column_dim, c.weight_ndim
    batch_dims = [d for d in range(ndim) if d != dim and region[d].min in batch_vars]
    other_dims = [d for d in range(ndim) if d != dim and d not in batch_dims]

    def index_map(*idx):
        return (
            *(idx[d] for d in batch_dims),
            idx[dim] // block_cols,
            *(idx[d] for d in other_dims),
            idx[dim] % block_cols,
        )

    source = stmt.reads[c.weight_read].source
    packer = next(
        p for p in sch.get_producers(block) if sch.get(p).writes[0].source.same_as(source)
    )
    sch.transform_layout(block, ("read", c.weight_read), index_map)
    loops = sch.get_loops(packer)
    if len(loops) != ndim:
        return
    col_outer, col_inner = sch.split(loops[dim], [None, block_cols])
    outer = [loops[d] for d in batch_dims]
    sch.reorder(*outer, col_outer, *(loops[d] for d in other_dims), col_inner)
    fused = sch.fuse(*outer, col_outer) if outer else col_outer
    sch.parallel(fused)


def schedule_padded(sch: Schedule, c: Contraction, info: CPUInfo) -> Schedule | None:
    """Schedule the function of ``c`` (see the module); None when TIR cannot pad it."""
    tiling = padded_tiling(c, info)
    block_cols = tiling.cols * tiling.lanes
    padding = [1] * len(c.roles)
    padding[c.column] = block_cols
    sch.pad_einsum(c.block, padding)
    padded = analyze_contraction(sch, c.block)
    if padded is None or padded.num_columns % block_cols:
        return None
    # all of ``b``'s panels in half of L2: row tiles outermost (``a`` read once), as
    # :func:`~tvm_roialign.schedules.contraction.tiles.choose_tiling` decides
    tiling.rows_outer = weight_bytes(padded) <= info.l2_bytes // 2
    writeback = sch.get_consumers(c.block)
    if len(writeback) != 1:
        return None
    writeback = writeback[0]
    _pack_panels(sch, c.block, padded, block_cols)
    outer, local = schedule_contraction(sch, padded, tiling, pack=False)
    # the tile's copy to the padded output is inlined into the copy of its real columns, which
    # takes the epilogue and goes under the tile's parallel loop
    sch.compute_inline(local)
    inline_epilogue(sch, writeback)
    sch.reverse_compute_at(writeback, outer, preserve_unit_loops=True)
    schedule_producers(sch, c.block, tiling.lanes)
    schedule_rest(sch, tiling.lanes)
    return unguard_rows(sch, padded, tiling.rows)


__all__ = ["constant_weight", "padded_tiling", "schedule_padded", "wants_padding"]
