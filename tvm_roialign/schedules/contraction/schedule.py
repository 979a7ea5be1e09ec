"""The schedule of the register-tiled contraction that the conv2d and matmul rules share.

What a contraction is, and the role of each loop (``B`` batch, ``M`` rows, ``N`` columns, ``R``
reduction), is :mod:`~tvm_roialign.schedules.contraction.analysis`; the tile a target gets is
:mod:`~tvm_roialign.schedules.contraction.tiles`. The schedule (:func:`schedule_contraction`) is the classic
CPU micro-kernel:

* a register tile of ``rows`` consecutive points of the innermost ``M`` axis by ``cols`` vectors
  of the column axis, accumulated in a ``local`` buffer that LLVM keeps in vector registers; the
  tile is the largest one the target's register file holds (``rows * cols`` accumulators, ``cols``
  weight vectors and one broadcast), and each step of the reduction loads ``cols`` weight vectors
  and ``rows`` scalars of ``a`` for ``rows * cols`` fused multiply-adds;
* when ``w`` is a layout-free constant (``AttachAttrLayoutFreeBuffers``), it is packed at compile
  time into ``[columns / (cols * lanes), <reduction axes>, cols * lanes]`` so that the tile's weight
  vectors are contiguous along the reduction (MetaSchedule's layout-rewrite mechanism: a block
  marked ``meta_schedule.layout_rewrite_preproc`` that ``SplitLayoutRewritePreproc`` moves out and
  ``FoldConstant`` evaluates);
* column blocks outermost, so one block of packed weights stays in cache while every row tile
  uses it, unless all the weights fit in half of L2: then row tiles outermost, so that ``a`` is
  read once; batch, column blocks and row tiles fused into one parallel loop;
* for long reductions (a large matmul), the reduction is cut into chunks that keep the tile's slice
  of ``w`` in L1 (see :mod:`~tvm_roialign.schedules.contraction.matmul`);
* the epilogue (bias, residual add, ReLU, ...) inlined into the write-back of the tile.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import Schedule

from ..base import PREPROC_ATTR, block_with_body, inline_epilogue, new_schedule, vectorize_writeback, walk
from ..elementwise import schedule_producers, schedule_rest
from .analysis import Contraction, analyze_contraction, rows_pos
from .tiles import Tiling, choose_tiling


def pack_weight(sch: Schedule, c: Contraction, block_cols: int) -> bool:
    """Pack the layout-free weight of ``c`` as ``[cols / block, <other dims>, block]`` (see module)."""
    func = sch.mod["main"]
    free = func.attrs.get("layout_free_buffers") if func.attrs is not None else None
    if not free:
        return False
    wsource = sch.get(c.block).reads[c.weight_read].source
    if not any(func.params[int(i)].same_as(wsource) for i in free):
        return False
    if c.num_columns % block_cols:
        return False
    cache = sch.cache_read(c.block, c.weight_read, "global")
    sch.annotate(cache, PREPROC_ATTR, True)
    dim, ndim = c.weight_column_dim, c.weight_ndim

    def index_map(*idx):
        others = [idx[d] for d in range(ndim) if d != dim]
        return (idx[dim] // block_cols, *others, idx[dim] % block_cols)

    sch.transform_layout(c.block, ("read", c.weight_read), index_map)
    return True


def schedule_contraction(
    sch: Schedule, c: Contraction, tiling: Tiling, pack: bool = True
):
    """Register-tile ``c`` (see module docstring); returns the parallel loop (for the epilogue)."""
    lanes, rows, cols = tiling.lanes, tiling.rows, tiling.cols
    if pack:
        pack_weight(sch, c, cols * lanes)
    loops = sch.get_loops(c.block)
    batch = [loops[i] for i, r in enumerate(c.roles) if r == "B"]
    m_loops = [loops[i] for i, r in enumerate(c.roles) if r == "M"]
    n_other = [loops[i] for i, r in enumerate(c.roles) if r == "N" and i != c.column]
    red = [loops[i] for i, r in enumerate(c.roles) if r == "R"]
    m_outer, m_inner = sch.split(m_loops[-1], [None, rows])
    n_outer, n_tile, n_lane = sch.split(loops[c.column], [None, cols, lanes])
    if tiling.reduce_chunk is not None:
        by_role = (batch, m_loops, n_other, red)
        return _schedule_chunked(sch, c, tiling, by_role, (m_outer, m_inner, n_outer, n_tile, n_lane))
    # column blocks outermost keep a block of weights in cache while every row tile uses it; when
    # all the weights fit in L2, row tiles outermost read ``a`` once instead of once per block
    spatial = [*n_other, n_outer, *m_loops[:-1], m_outer]
    if tiling.block_tiles is not None:
        # row blocks outside the column blocks over the whole reduction: the block's slice of
        # ``a`` stays in L2 while every column block reads it, a column block's panel of ``w``
        # in L1 (or L2) while the block's tiles do (contraction_tiles.resident_row_block)
        m_block, m_tile = sch.split(m_outer, [None, tiling.block_tiles])
        spatial = [*m_loops[:-1], m_block, *n_other, n_outer, m_tile]
    elif tiling.rows_outer:
        spatial = [*m_loops[:-1], m_outer, *n_other, n_outer]
    sch.reorder(*batch, *spatial, *red, m_inner, n_tile, n_lane)
    outer = sch.fuse(*batch, *spatial)
    sch.parallel(outer)
    # the accumulator tile a ``global`` buffer: TVM 0.27 puts one under 1 KiB (runtime::
    # kMaxStackAlloca) on the stack, where LLVM keeps it in registers, while a ``local`` one
    # became a heap workspace (TVMBackendAllocWorkspace and Free) at every step of the parallel
    # loop, also with static sizes: a 1x1 conv 16 -> 96 at 112x112 spent a third of its time there
    local = sch.cache_write(c.block, 0, "global")
    sch.reverse_compute_at(local, outer, preserve_unit_loops=True)
    if None in c.extents or ragged_rows(c, rows):
        _tile_accumulator(sch, c, rows, cols * lanes)
    sch.vectorize(n_lane)
    sch.unroll(n_tile)
    sch.unroll(m_inner)
    sch.decompose_reduction(c.block, red[0])
    return outer, local


def _schedule_chunked(sch: Schedule, c: Contraction, tiling: Tiling, by_role, split):
    """:func:`schedule_contraction` with the reduction in chunks (``tiling.reduce_chunk``), given
    the block's loops ``by_role`` (batch, rows, other columns, reduction) and the ``split`` ones
    (row tiles, rows of a tile, column blocks, vectors of a tile, lanes): returns ``(parallel
    loop, None)``, the tile accumulating in the output."""
    batch, m_loops, n_other, red = by_role
    m_outer, m_inner, n_outer, n_tile, n_lane = split
    # GEMM blocking: a chunk of the reduction outermost (its rows of ``a`` stay in L2 while
    # every column block uses them), the tile accumulating in the output across chunks (LLVM
    # keeps it in registers within a chunk)
    r_out, r_in = sch.split(red[-1], [None, tiling.reduce_chunk])
    red = [*red[:-1], r_in]
    if tiling.block_tiles is not None:
        # row blocks outside the column blocks: a block's slice of ``a`` stays in L2 while
        # every column block reads it, the chunk's panel of ``w`` in L1 while every row tile
        # of the block does; blocks and column blocks share the parallel loop
        m_block, m_tile = sch.split(m_outer, [None, tiling.block_tiles])
        sch.reorder(
            *batch,
            r_out,
            *m_loops[:-1],
            m_block,
            *n_other,
            n_outer,
            m_tile,
            *red,
            m_inner,
            n_tile,
            n_lane,
        )
        outer = sch.fuse(*m_loops[:-1], m_block, *n_other, n_outer)
    else:
        sch.reorder(
            *batch,
            r_out,
            *n_other,
            n_outer,
            *m_loops[:-1],
            m_outer,
            *red,
            m_inner,
            n_tile,
            n_lane,
        )
        outer = sch.fuse(*n_other, n_outer, *m_loops[:-1], m_outer)
    sch.parallel(outer)
    sch.vectorize(n_lane)
    sch.unroll(n_tile)
    sch.unroll(m_inner)
    sch.decompose_reduction(c.block, r_out)
    return outer, None


def ragged_rows(c: Contraction, rows: int) -> bool:
    """Whether the last register tile of ``c``'s rows is partial (``rows`` does not divide the
    innermost row extent, or that extent is symbolic)."""
    extent = c.extents[rows_pos(c)]
    return extent is None or extent % rows != 0


def _tile_accumulator(sch: Schedule, c: Contraction, rows: int, block_cols: int) -> None:
    """Give the accumulator of a contraction of symbolic extent, or of a partial last row tile,
    tile axes of its own.

    TIR compacts the accumulator to the region one step of the parallel loop touches, but with a
    symbolic extent it cannot bound that region by the tile: the guarded last tile of a symbolic
    row extent spans rows ``[t * rows, min(t * rows + rows, W))``, and it sized the buffer by the
    whole output (one stack array per parallel task: a segfault). Laid out as ``[..., W / rows,
    rows, ..., C / block_cols, block_cols]``, the tile is one point of the outer axes and all of the
    inner ones, so it compacts to exactly ``rows x block_cols`` (the padding rows of the last tile
    are never written back), which :func:`unguard_rows` needs. The accumulator is a ``global``
    buffer (:func:`schedule_contraction`), so that TVM puts the tile on the stack (see there).
    """
    dim = c.row_dim

    def index_map(*idx):
        *lead, col = idx
        lead = [*lead[:dim], lead[dim] // rows, lead[dim] % rows, *lead[dim + 1 :]]
        return (*lead, col // block_cols, col % block_cols)

    sch.transform_layout(
        c.block, ("write", 0), index_map, assume_injective_transform=True
    )


def unguard_rows(sch: Schedule, c: Contraction, rows: int) -> Schedule:
    """``sch`` with the register tile of a partial last row tile (:func:`ragged_rows`) computed
    without guards.

    Splitting a row extent by a tile that does not divide it guards every row of every step of
    the reduction (a branch per multiply-add row, and the guarded rows' accumulators kept in
    memory). The tile's padding rows of
    the last tile may as well be computed: they accumulate in their own slots of the tiled
    accumulator (:func:`_tile_accumulator`), which the guarded write-back never copies out, and
    they read the last real row (the row index clamped in the loads of ``a``), so they never read
    past the data. The init and update blocks of ``c`` lose their predicate; everything else is
    kept. Returns a fresh schedule of the result (the rule's last step)."""
    if ragged_rows(c, rows):
        names = {f"{c.name}_init", f"{c.name}_update"}
        func = sch.mod["main"]
        body = tvm_ffi.structural_map(
            func.body,
            (
                s_tir.SBlockRealize,
                lambda r: _unguarded(r, c.row_var) if r.block.name_hint in names else r,
            ),
        )
        sch = new_schedule(func.with_body(body))
    return sch


def _unguarded(realize, row_var: str):
    block = realize.block
    row = next((it for it in block.iter_vars if it.var.name == row_var), None)
    if row is None:
        return realize
    clamped = tirx.Min(row.var, row.dom.min + row.dom.extent - 1)
    accumulator = block.writes[0].source

    def clamp(load):
        if load.source.same_as(accumulator):
            return load
        indices = [
            tvm_ffi.structural_map(i, (tirx.Var, lambda v: clamped if v.same_as(row.var) else v))
            for i in load.indices
        ]
        return tirx.BufferLoad(load.source, indices)

    body = tvm_ffi.structural_map(block.body, (tvm.ir.expr.TensorLoad, clamp))
    return s_tir.SBlockRealize(realize.iter_values, True, block_with_body(block, body))


def schedule_with_epilogue(sch: Schedule, c: Contraction, tiling: Tiling) -> Schedule:
    """The function around contraction ``c`` scheduled: the tile (:func:`schedule_contraction`),
    the epilogue inlined into its write-back (with reduction chunks the tile accumulates in the
    output and the epilogue is a pass of its own), the producers and the remaining blocks, the
    rows unguarded (:func:`unguard_rows`). Returns the schedule to hand back."""
    _, local = schedule_contraction(sch, c, tiling)
    if local is not None:
        inline_epilogue(sch, local)
        vectorize_writeback(sch, local, tiling.lanes)
    schedule_producers(sch, c.block, tiling.lanes)
    schedule_rest(sch, tiling.lanes)
    if tiling.reduce_chunk is None:
        sch = unguard_rows(sch, c, tiling.rows)
    # (with reduction chunks the tile accumulates in the output: its padding rows stay guarded)
    if not tiling.parallel:
        sch = serial_tiles(sch, c.name or "")
    return sch


def serial_tiles(sch: Schedule, name: str) -> Schedule:
    """A fresh schedule of ``sch``'s function with the parallel loop around the contraction's
    blocks (those named ``name...``) made serial; other parallel loops (an epilogue's own pass
    over a larger output) stay as they are."""

    def holds_contraction(loop) -> bool:
        found = []
        walk(loop.body, s_tir.SBlock, lambda b: found.append(str(b.name_hint)))
        return any(n.startswith(name) for n in found)

    def rewrite(loop):
        if loop.kind != tirx.ForKind.PARALLEL or not name or not holds_contraction(loop):
            return loop
        return tirx.For(
            loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body,
            loop.thread_binding, loop.annotations,
        )

    func = sch.mod["main"]
    return new_schedule(func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, rewrite))))


__all__ = [
    "Contraction",
    "Tiling",
    "analyze_contraction",
    "choose_tiling",
    "pack_weight",
    "ragged_rows",
    "schedule_contraction",
    "schedule_with_epilogue",
    "serial_tiles",
    "unguard_rows",
]
