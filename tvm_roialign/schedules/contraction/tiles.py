"""The tile cost model of the register-tiled contraction: the register tile and the loop order a
:class:`~tvm_roialign.schedules.contraction.analysis.Contraction` gets on a target (:func:`choose_tiling`).

The tile is one the target's register file holds (``rows * cols`` accumulators, ``cols`` weight
vectors and one broadcast) and whose accumulator TVM puts on the stack (under 1 KiB), scored by
the throughput of one step of the reduction and, among equals, by its loads per multiply-add
(:func:`pick_tile`): with 32 vector registers ``6 x 4`` vectors on AArch64 where the sizes allow,
``7 x 2`` or ``5 x 3`` on AVX-512 (its ``6 x 4`` zmm, 1.5 KiB, would be a heap workspace), with 16
(AVX2) ``6 x 2``, the shapes of the vendor libraries' SGEMM micro-kernels; column blocks go
outermost unless all the weights fit in half of L2.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import pick_lanes
from ..target_info import CPUInfo
from .analysis import Contraction, reduction_size, rows_pos, weight_bytes

#: largest register tile (accumulators) considered; beyond it the gain is nil and spills start
_MAX_ACCUMULATORS = 28
#: independent accumulator chains that keep two multiply-add pipes busy (latency about 4 cycles,
#: doubled to cover the loads feeding them)
_LATENCY_CHAINS = 16
#: vector registers per cycle a core streams from L2 while computing (the packed weights of a
#: tile): one, the width of a core's L1 fill path counted in its own vectors
_L2_VECTORS_PER_CYCLE = 1
#: cycles a parallel launch costs the calling thread (waking the pool's threads and joining them:
#: a few microseconds), counted in vector multiply-adds of one core
_LAUNCH_CYCLES = 4096
#: instructions a thread issues per cycle when its core's sibling thread is busy too (the tile's
#: multiply-adds, loads and the loop's own two share them)
_ISSUE_PER_CYCLE = 3
_LOOP_INSTRUCTIONS = 2
#: TVM's limit for a ``global`` buffer on the stack (``runtime::kMaxStackAlloca``, exclusive: one
#: of 1024 bytes or more is a heap workspace, allocated and freed at every parallel step)
_MAX_STACK_BYTES = 1024
#: the largest accumulator tile (bytes) of a register tile, which TVM puts on the stack
STACK_TILE_BYTES = _MAX_STACK_BYTES - 1
#: loads a row of the register tile costs when its extent is symbolic: the row index is clamped
#: (:func:`~tvm_roialign.schedules.contraction.schedule.unguard_rows`) before the broadcast load (outside the
#: reduction loop, so not in the instructions a step issues)
_SYMBOLIC_ROW_LOADS = 2
#: row extents a symbolic one is assumed to take when a tile is chosen for it: the widths of the
#: feature maps of an image model at 224 to 480 pixels (stride 2 to 32) and of a batch of rows
NOMINAL_ROWS = (7, 10, 14, 15, 28, 30, 56, 60, 112, 120)


def _tile_use(rows_extent: int | None, rows: int) -> float:
    """Share of a row tile's work that is not padding, over ``rows_extent`` (None: symbolic, the
    mean over :data:`NOMINAL_ROWS`)."""
    extents = NOMINAL_ROWS if rows_extent is None else (rows_extent,)
    return sum(e / (-(-e // rows) * rows) for e in extents) / len(extents)


def pick_tile(
    rows_extent: int | None,
    vectors: int,
    registers: int,
    vector_bytes: int = 64,
    max_bytes: int | None = None,
    dividing_rows: bool = False,
) -> tuple[int, int]:
    """``(rows, cols)`` of the register tile.

    ``cols`` divides the number of column vectors; ``rows`` need not divide the innermost row
    extent (the last tile computes padding rows, which count as lost work; for a symbolic
    extent, None, the loss is averaged over :data:`NOMINAL_ROWS`), unless ``dividing_rows`` (a
    tile that accumulates in the output, whose padding rows would stay guarded). The tile
    needs ``rows * cols`` accumulators, ``cols`` weight vectors and a broadcast register. A step of
    the reduction issues ``rows * cols`` multiply-adds (two per cycle) and ``rows + cols`` loads
    (two per cycle), all of them and the loop's own instructions through an issue width shared
    with the core's other thread (:data:`_ISSUE_PER_CYCLE`), streams ``cols`` weight vectors from
    L2 (:data:`_L2_VECTORS_PER_CYCLE`), and cannot be shorter than the latency of one accumulator
    chain (:data:`_LATENCY_CHAINS`). The tile with the best throughput under this model wins, then
    the one with the fewest loads per multiply-add. A row of a symbolic extent costs
    :data:`_SYMBOLIC_ROW_LOADS` loads (its index is clamped, see
    :func:`~tvm_roialign.schedules.contraction.schedule.unguard_rows`).
    """
    best, best_key = (1, 1), None
    for cols in range(1, min(vectors, 8) + 1):
        if vectors % cols:
            continue
        for rows in range(1, min(rows_extent or 32, 32) + 1):
            acc = rows * cols
            if acc + cols + 1 > registers or acc > _MAX_ACCUMULATORS:
                continue
            if max_bytes is not None and acc * vector_bytes > max_bytes:
                continue
            if dividing_rows and rows_extent is not None and rows_extent % rows:
                continue
            key = _tile_key(rows_extent, rows, cols)
            if best_key is None or key > best_key:
                best, best_key = (rows, cols), key
    return best


def _tile_key(rows_extent: int | None, rows: int, cols: int) -> tuple:
    """:func:`pick_tile`'s score of a ``rows x cols`` tile: the share of the multiply-add peak
    one step of the reduction reaches (less the padding rows of a last, partial tile), then
    fewer loads per multiply-add, then fewer rows."""
    acc = rows * cols
    loads = rows * (_SYMBOLIC_ROW_LOADS if rows_extent is None else 1) + cols
    cycles = max(
        acc / 2,
        loads / 2,
        (acc + rows + cols + _LOOP_INSTRUCTIONS) / _ISSUE_PER_CYCLE,
        _LATENCY_CHAINS / 2,
        cols / _L2_VECTORS_PER_CYCLE,
    )
    used = _tile_use(rows_extent, rows)
    return (round(acc / 2 / cycles * used, 3), -loads / acc, -rows)


def tile_throughput(rows_extent: int | None, rows: int, cols: int) -> float:
    """The share of the multiply-add peak a ``rows x cols`` tile reaches under :func:`pick_tile`'s
    model (padding rows of the last tile counted as lost)."""
    return _tile_key(rows_extent, rows, cols)[0]


@dataclass
class Tiling:
    lanes: int
    rows: int
    cols: int
    #: chunk of the innermost reduction loop (None: whole)
    reduce_chunk: int | None = None
    #: row tiles outside column blocks (the weights stay in L2; ``a`` is read once)
    rows_outer: bool = False
    #: row tiles per row block, the block outside the column blocks (its slice of ``a`` stays in
    #: L2 while every column block reads it): with ``reduce_chunk``, per chunk; without, over the
    #: whole reduction (:func:`resident_row_block`); None: all the rows
    block_tiles: int | None = None
    #: the tiles run in parallel (False: too little work to pay for a launch)
    parallel: bool = True


def worth_parallel(c: Contraction, info: CPUInfo) -> bool:
    """Whether ``c``'s multiply-adds pay for a parallel launch on ``info``'s cores: split over
    them, they save more vector multiply-adds than :data:`_LAUNCH_CYCLES`. A squeeze-excitation's
    FCs on a pooled map (a few hundred to a few ten thousand multiply-adds) run serially; a
    symbolic extent is taken as large."""
    if info.num_cores < 2:
        return False
    if None in c.extents:
        return True
    macs = 1
    for extent in c.extents:
        macs *= extent
    saved = macs / info.lanes(c.dtype) * (1 - 1 / info.num_cores)
    return saved > _LAUNCH_CYCLES


def resident_row_block(c: Contraction, rows: int, block_cols: int, info: CPUInfo) -> int | None:
    """Row tiles per row block of the order "row blocks, column blocks, row tiles" over the whole
    reduction, or None where it does not apply.

    Without it, column blocks outermost read all of ``a`` once per column block (from L3 when it
    does not fit in L2: Mask R-CNN's mask predictor, a 1x1 conv 256 -> 1024 over 100 maps of
    14 x 14, streamed its 20 MB input 64 times), and row tiles outermost read every weight panel
    from L2 once per row tile. A block of row tiles whose slice of ``a`` and one column block's
    panel of packed weights fit in half of L2, with the column blocks inside it, reads ``a``
    once, and the weights once per block. It applies when the rows are static, neither a
    batch's ``a`` nor its weights fit in half of L2 (else the order that reads the other once
    keeps it there: :attr:`Tiling.rows_outer` for the weights), the panel over the whole
    reduction takes at most a quarter of L2, and either the panel (and ``rows`` rows of ``a``)
    fits in L1, where it stays for all the block's tiles, or the blocks read fewer bytes from
    beyond L2 than column blocks outermost (``a`` once and the weights once per block, against
    the weights once and ``a`` once per column block: Keypoint R-CNN's Winograd products
    ``[49, 900, 512] x [49, 512, 512]``, whose ``a`` was read 32 times). The tiles per block divide
    the row tiles of the innermost row axis (no guard); the outer row axes (the maps of a conv, a
    matmul's leading rows) stay outside the blocks. Only the order of the output's tiles
    changes: every output sums its products in the same order."""
    row_extents = [e for r, e in zip(c.roles, c.extents) if r == "M"]
    if None in row_extents or None in c.extents:
        return None
    reduction = reduction_size(c)
    a_bytes = reduction * 4
    for extent in row_extents:
        a_bytes *= extent
    panel = reduction * block_cols * 4
    w_bytes = weight_bytes(c)
    if (
        a_bytes <= info.l2_bytes // 2
        or w_bytes <= info.l2_bytes // 2
        or panel > info.l2_bytes // 4
    ):
        return None
    count = -(-row_extents[-1] // rows)
    budget = info.l2_bytes // 2 - panel
    tiles = max(
        (t for t in range(1, count + 1) if count % t == 0 and t * rows * reduction * 4 <= budget),
        default=1,
    )
    if (reduction * (block_cols + rows) * 4) <= info.l1_bytes:
        return tiles
    blocks = a_bytes // (reduction * 4 * rows * tiles)
    column_blocks = c.num_columns // block_cols
    return tiles if a_bytes + w_bytes * blocks < w_bytes + a_bytes * column_blocks else None


def choose_tiling(c: Contraction, info: CPUInfo) -> Tiling | None:
    lanes = pick_lanes(c.num_columns, info.lanes(c.dtype))
    if lanes is None:
        return None
    rows, cols = pick_tile(
        c.extents[rows_pos(c)],
        c.num_columns // lanes,
        info.vector_registers,
        lanes * 4,
        # the accumulator (a ``global`` buffer compacted to the tile, contraction.
        # _tile_accumulator) stays under TVM's stack limit, static or symbolic: a larger one is a
        # heap workspace at every parallel step (AVX-512's 6 x 4 zmm: 1.5 KiB; 5 x 3 or 7 x 2 fit)
        STACK_TILE_BYTES,
    )
    return Tiling(
        lanes,
        rows,
        cols,
        rows_outer=weight_bytes(c) <= info.l2_bytes // 2,
        block_tiles=resident_row_block(c, rows, cols * lanes, info),
        parallel=worth_parallel(c, info),
    )


__all__ = [
    "NOMINAL_ROWS",
    "STACK_TILE_BYTES",
    "Tiling",
    "choose_tiling",
    "pick_tile",
    "resident_row_block",
    "tile_throughput",
    "worth_parallel",
]
