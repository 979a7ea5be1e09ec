"""Rule: dense / matmul / batched matmul (``[..., M, K] x [..., K, N]`` or ``x [N, K]^T``) + epilogue.

The matmul block is a :class:`~tvm_roialign.schedules.contraction.schedule.Contraction` (``N`` the columns,
``M`` the rows, ``K`` the reduction), register-tiled by
:func:`~tvm_roialign.schedules.contraction.schedule.schedule_contraction` with a constant weight packed at
compile time into ``[N / (cols * lanes), K, cols * lanes]``.

When ``a`` does not fit in half of L2 and several column blocks read it (the ``[1000, 12544] x
[12544, 1024]`` fc6 of a box head), the reduction is cut into chunks (GEMM blocking, the order of
Goto's GEMM): per chunk, row blocks outside column blocks, so that a block's slice of ``a`` stays
in L2 while every column block reads it, and the chunk's panel of packed weights stays in L1 while
every row tile of the block reads it (:func:`_row_blocks` sizes both from the target's caches).
The tile then accumulates in the output across chunks, and the epilogue is a separate parallel
pass. (Chunks sized for all rows' slice of ``a``, with column blocks outside row tiles, read and
write the output once per chunk: slower than no chunks at all; docs/benchmarks.md.)

A ``b`` computed at run time whose columns the target's vector does not divide (attention's
``q @ k^T``) is padded and packed into the tile's panels at each call
(:mod:`~tvm_roialign.schedules.contraction.runtime_matmul`).
"""

from __future__ import annotations

from ..base import CPURule, find_main_reduction
from ..target_info import CPUInfo, cpu_info
from ..vector_math import ALL_OPS
from .runtime_matmul import schedule_padded, wants_padding
from .schedule import analyze_contraction, choose_tiling, schedule_with_epilogue
from .tiles import pick_tile, tile_throughput

#: the least share of the free register tile's throughput that a tile dividing the rows (which
#: reduction chunks need) must keep: chunks save re-reading ``a`` from L3 per column block, which
#: the hardware prefetchers mostly hide behind the multiply-adds
_CHUNKED_TILE_SHARE = 0.9


def _reduce_chunk(
    extent: int, rows_total: int, column_blocks: int, l2_bytes: int
) -> int | None:
    """A divisor of the reduction ``extent`` whose slice of ``a`` (``rows_total`` rows) fills
    about half of L2, or None when ``a`` fits whole or only one column block reuses it."""
    if column_blocks < 2 or rows_total * extent * 4 <= l2_bytes // 2:
        return None
    budget = max(l2_bytes // 2 // (rows_total * 4), 1)
    best = None
    for chunk in range(1, min(budget, extent) + 1):
        if extent % chunk == 0:
            best = chunk
    return best if best is not None and best >= 32 else None


def _row_blocks(
    extent: int, rows_extent: int, rows: int, block_cols: int, info: CPUInfo
) -> tuple[int, int] | None:
    """``(chunk, tiles)`` of the blocked order: the largest divisor ``chunk`` of the reduction
    ``extent`` whose panel of the weights (``block_cols`` columns) and ``rows`` rows of ``a`` fit
    in L1, and the most row tiles per block (a divisor of ``rows_extent / rows``) whose slice of
    ``a`` over a chunk fits in half of L2; None when no chunk of at least 32 fits in L1."""
    per_step = (block_cols + rows) * 4
    chunk = max(
        (d for d in range(32, extent + 1) if extent % d == 0 and d * per_step <= info.l1_bytes),
        default=None,
    )
    if chunk is None:
        return None
    count = rows_extent // rows
    slice_budget = info.l2_bytes // 2
    tiles = max(
        (t for t in range(1, count + 1) if count % t == 0 and t * rows * chunk * 4 <= slice_budget),
        default=1,
    )
    return chunk, tiles


class Matmul(CPURule):
    """Register-tiled matmul with packed constant weights and a fused epilogue."""

    vector_ops = ALL_OPS

    def __init__(self, reduce_chunks: bool = True):
        self.reduce_chunks = reduce_chunks

    def schedule(self, sch, func, target):
        block = find_main_reduction(sch)
        if block is None:
            return None
        name = sch.get(block).name_hint
        if not any(key in name for key in ("matmul", "dense")):
            return None
        contraction = analyze_contraction(sch, block)
        if contraction is None or contraction.roles.count("R") != 1:
            return None
        info = cpu_info(target)
        if wants_padding(sch, contraction, info):
            return schedule_padded(sch, contraction, info)
        tiling = choose_tiling(contraction, info)
        if tiling is None:
            return None
        rows = [e for r, e in zip(contraction.roles, contraction.extents) if r == "M"]
        # GEMM blocking needs the rows' count (a symbolic one: the tile accumulates in registers)
        if self.reduce_chunks and not tiling.rows_outer and None not in rows:
            rows_total = 1
            for extent in rows:
                rows_total *= extent
            tiling.reduce_chunk = _reduce_chunk(
                contraction.extents[contraction.roles.index("R")],
                rows_total,
                contraction.num_columns // (tiling.cols * tiling.lanes),
                info.l2_bytes,
            )
            if tiling.reduce_chunk is not None:
                # the tile accumulates in the output: a row tile that divides the rows, unless
                # the best such tile is much slower than the free one (197 rows, a prime: 1 x 6
                # vectors, a load per multiply-add): re-reading ``a`` per column block costs less
                chunk_rows, chunk_cols = pick_tile(
                    rows[-1],
                    contraction.num_columns // tiling.lanes,
                    info.vector_registers,
                    tiling.lanes * 4,
                    dividing_rows=True,
                )
                free = tile_throughput(rows[-1], tiling.rows, tiling.cols)
                if tile_throughput(rows[-1], chunk_rows, chunk_cols) < _CHUNKED_TILE_SHARE * free:
                    tiling.reduce_chunk = None
                else:
                    reduction = contraction.extents[contraction.roles.index("R")]
                    blocked = _row_blocks(
                        reduction, rows[-1], chunk_rows, chunk_cols * tiling.lanes, info
                    )
                    if blocked is not None and blocked[0] == reduction:
                        # one chunk is no chunk: the free tile in registers, the epilogue fused
                        # (ConvNeXt's 784 x 192 and 196 x 384 MLP inputs)
                        tiling.reduce_chunk = None
                    else:
                        tiling.rows, tiling.cols = chunk_rows, chunk_cols
                        tiling.block_tiles = None  # the free tile's blocks: a chunk's are its own
                        if blocked is not None:
                            tiling.reduce_chunk, tiling.block_tiles = blocked
        return schedule_with_epilogue(sch, contraction, tiling)


__all__ = ["Matmul"]
