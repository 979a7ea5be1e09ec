"""The register-tiled contraction that the conv2d and matmul rules share.

A *contraction* here is a reduction block ``out[S...] += a[...] * w[...]`` whose last output axis
(the *column*: output channels of an NHWC conv, ``N`` of a matmul) indexes ``w`` alone. Its spatial
axes are classified by the operand they index:

* ``B`` (batch): both ``a`` and ``w`` (batched matmul);
* ``M`` (rows): ``a`` only (image, height, width of a conv; ``M`` of a matmul);
* ``N`` (columns): ``w`` only; the last one is vectorized, others stay outer loops.

The schedule (:func:`schedule_contraction`) is the classic CPU micro-kernel:

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
  of ``w`` in L1 (see :mod:`.matmul`);
* the epilogue (bias, residual add, ReLU, ...) inlined into the write-back of the tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import Schedule

from .base import static_int
from .target_info import CPUInfo

#: largest register tile (accumulators) considered; beyond it the gain is nil and spills start
_MAX_ACCUMULATORS = 28
#: independent accumulator chains that keep two multiply-add pipes busy (latency about 4 cycles,
#: doubled to cover the loads feeding them); measured on AVX-512: 16 accumulators run a
#: [1000, 1024] x [1024, 1024] matmul 1.3x faster than 20 or 24, and 2x faster than 8
_LATENCY_CHAINS = 16
#: bytes per cycle a core streams from L2 while computing (the packed weights of a tile); measured
#: on AVX-512: a 4x4 tile (256 weight bytes per 16 multiply-adds) runs a [1024, 256] x [256, 256]
#: matmul at 0.67x the speed of an 8x2 tile (128 bytes)
_L2_BYTES_PER_CYCLE = 16
#: TVM's limit for a buffer on the stack (``runtime::kMaxStackAlloca``; larger ones are heap
#: workspaces)
_MAX_STACK_BYTES = 1024
#: loads a row of the register tile costs when its extent is symbolic: the row index is clamped
#: (:func:`unguard_rows`) before the broadcast load
_SYMBOLIC_ROW_LOADS = 2
#: row extents a symbolic one is assumed to take when a tile is chosen for it: the widths of the
#: feature maps of an image model at 224 to 480 pixels (stride 2 to 32) and of a batch of rows
NOMINAL_ROWS = (7, 10, 14, 15, 28, 30, 56, 60, 112, 120)


@dataclass
class Contraction:
    """A contraction block and the role of each of its loops (see module docstring)."""

    block: object  # SBlockRV
    roles: str  # one of B/M/N/R per loop, in loop order
    #: per loop; None for a symbolic extent (batch and row loops only)
    extents: list[int | None]
    column: int  # loop position of the vectorized column axis
    data_read: int  # read-region index of ``a``
    weight_read: int  # read-region index of ``w``
    weight_column_dim: int  # dimension of ``w`` indexed by the column axis
    weight_ndim: int
    dtype: str
    #: dimension of the output indexed by the innermost row (``M``) loop, and its block var
    row_dim: int = -1
    row_var: str = ""
    name: str = ""

    @property
    def num_columns(self) -> int:
        return self.extents[self.column]


def walk(root, node_type, callback) -> None:
    """Call ``callback`` on every node of type ``node_type`` under ``root``."""
    tvm_ffi.structural_walk(root, (node_type, callback), order="post")


def _vars_of(expr) -> set:
    found = set()
    walk(expr, tirx.Var, found.add)
    return found


def _loop_extents(sch: Schedule, loops, iters) -> list | None:
    """Each loop's static extent (None: symbolic), or None when a loop's extent is not its iter's."""
    extents = []
    for loop, it in zip(loops, iters):
        extent = static_int(sch.get(loop).extent)
        if extent is not None and static_int(it.dom.extent) != extent:
            return None
        extents.append(extent)
    return extents


def _weight_operand(stmt, column_var):
    """``(weight, data, column dim of the weight, weight rank, variables each read uses)``: the
    weight is the read indexed by the output column and the other one not (point accesses only);
    None when there is no such read."""
    uses = [set().union(*(_vars_of(r.min) for r in read.region)) for read in stmt.reads]
    weight = [i for i in (0, 1) if column_var in uses[i] and column_var not in uses[1 - i]]
    if len(weight) != 1:
        return None
    weight = weight[0]
    wregion = stmt.reads[weight].region
    dims = [
        d
        for d, r in enumerate(wregion)
        if isinstance(r.min, tirx.Var) and r.min.same_as(column_var)
    ]
    if len(dims) != 1 or not all(static_int(r.extent) == 1 for r in wregion):
        return None
    return weight, 1 - weight, dims[0], len(wregion), uses


def _iter_roles(iters, data_uses: set, weight_uses: set) -> str | None:
    """One letter per iter: ``R`` reduction, ``B`` batch (both operands), ``N`` column (weight
    only), ``M`` row (data only); None for another iter kind or without a reduction and a row."""
    roles = []
    for it in iters:
        if it.iter_type == tirx.IterVar.CommReduce:
            roles.append("R")
        elif it.iter_type != tirx.IterVar.DataPar:
            return None
        elif it.var in data_uses and it.var in weight_uses:
            roles.append("B")
        elif it.var in weight_uses:
            roles.append("N")
        else:
            roles.append("M")
    if "R" not in roles or "M" not in roles:
        return None
    return "".join(roles)


def analyze_contraction(sch: Schedule, block) -> Contraction | None:
    """The :class:`Contraction` view of ``block``, or None when it is not one."""
    stmt = sch.get(block)
    if len(stmt.writes) != 1 or len(stmt.reads) != 2 or stmt.init is None:
        return None
    loops = sch.get_loops(block)
    iters = list(stmt.iter_vars)
    if len(loops) != len(iters):
        return None
    extents = _loop_extents(sch, loops, iters)
    # every iter bound to its own loop, in order (the normal form dlight's analysis checks)
    if extents is None or not _trivially_bound(sch, block, loops):
        return None
    var_pos = {it.var: i for i, it in enumerate(iters)}
    out_idx = [r.min for r in stmt.writes[0].region]
    if not all(isinstance(e, tirx.Var) and e in var_pos for e in out_idx):
        return None
    column_var = out_idx[-1]
    operand = _weight_operand(stmt, column_var)
    if operand is None:
        return None
    weight, data, weight_dim, weight_rank, uses = operand
    roles = _iter_roles(iters, uses[data], uses[weight])
    if roles is None:
        return None
    # a symbolic image size or batch is served; symbolic channels or reductions are not
    if any(e is None and r not in "BM" for r, e in zip(roles, extents)):
        return None
    dtype = (
        str(stmt.writes[0].source.ty.dtype)
        if hasattr(stmt.writes[0].source.ty, "dtype")
        else "float32"
    )
    last_row = [it.var for it, r in zip(iters, roles) if r == "M"][-1]
    return Contraction(
        block,
        roles,
        extents,
        var_pos[column_var],
        data,
        weight,
        weight_dim,
        weight_rank,
        dtype,
        next(d for d, e in enumerate(out_idx) if e.same_as(last_row)),
        last_row.name,
        stmt.name_hint,
    )


def _trivially_bound(sch: Schedule, block, loops) -> bool:
    target = sch.get(block)
    found = []
    walk(sch.mod["main"].body, s_tir.SBlockRealize, found.append)
    realize = [r for r in found if r.block.same_as(target)]
    if len(realize) != 1 or len(realize[0].iter_values) != len(loops):
        return False
    return all(
        isinstance(value, tirx.Var) and value.same_as(sch.get(loop).loop_var)
        for value, loop in zip(realize[0].iter_values, loops)
    )


PREPROC_ATTR = "meta_schedule.layout_rewrite_preproc"


def is_layout_preproc(sch: Schedule, block) -> bool:
    """Whether ``block`` is a weight-packing stage (run at compile time, never scheduled)."""
    return PREPROC_ATTR in sch.get(block).annotations


def pick_lanes(extent: int, lanes: int) -> int | None:
    """The widest vector (``lanes``, half, quarter, at least 4) that divides ``extent``."""
    for candidate in (lanes, lanes // 2, lanes // 4):
        if candidate >= 4 and extent % candidate == 0:
            return candidate
    return None


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
) -> tuple[int, int]:
    """``(rows, cols)`` of the register tile.

    ``cols`` divides the number of column vectors; ``rows`` need not divide the innermost row
    extent (a predicate guards the last tile, whose idle rows count as lost work; for a symbolic
    extent, None, the loss is averaged over :data:`NOMINAL_ROWS`). The tile
    needs ``rows * cols`` accumulators, ``cols`` weight vectors and a broadcast register. A step of
    the reduction issues ``rows * cols`` multiply-adds (two per cycle) and ``rows + cols`` loads
    (two per cycle), streams ``cols`` weight vectors from L2 (:data:`_L2_BYTES_PER_CYCLE`), and cannot
    be shorter than the latency of one accumulator chain (:data:`_LATENCY_CHAINS`). The tile with
    the best throughput under this model wins, then the one with the fewest loads per step. A row of
    a symbolic extent costs :data:`_SYMBOLIC_ROW_LOADS` loads (its index is clamped, see
    :func:`unguard_rows`).
    Measured on AVX-512 (one core, time relative to PyTorch's oneDNN on direct convolutions): 8x2
    ~1.0, 14x2 best on 14-wide rows, 2x8 (weight-stream bound) 1.5, 4x2 (latency bound) 1.3;
    on a matmul whose weights are re-read from L2 per row tile, 8x2 1.5x faster than 4x4.
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
            row_loads = rows * (_SYMBOLIC_ROW_LOADS if rows_extent is None else 1)
            cycles = max(
                acc / 2,
                (row_loads + cols) / 2,
                _LATENCY_CHAINS / 2,
                cols * vector_bytes / _L2_BYTES_PER_CYCLE,
            )
            # a last, partial tile (rows not dividing the extent) computes padding rows
            used = _tile_use(rows_extent, rows)
            key = (round(acc / 2 / cycles * used, 3), -(rows + cols), -rows)
            if best_key is None or key > best_key:
                best, best_key = (rows, cols), key
    return best


@dataclass
class Tiling:
    lanes: int
    rows: int
    cols: int
    #: chunk of the innermost reduction loop (None: whole)
    reduce_chunk: int | None = None
    #: row tiles outside column blocks (the weights stay in L2; ``a`` is read once)
    rows_outer: bool = False


def choose_tiling(c: Contraction, info: CPUInfo) -> Tiling | None:
    lanes = pick_lanes(c.num_columns, info.lanes(c.dtype))
    if lanes is None:
        return None
    rows, cols = pick_tile(
        c.extents[rows_pos(c)],
        c.num_columns // lanes,
        info.vector_registers,
        lanes * 4,
        # the accumulator of a symbolic extent must stay under TVM's stack limit (see
        # _tile_accumulator)
        _MAX_STACK_BYTES - 1 if None in c.extents else None,
    )
    return Tiling(lanes, rows, cols, rows_outer=weight_bytes(c) <= info.l2_bytes // 2)


def weight_bytes(c: Contraction) -> int:
    """Bytes of ``w`` one batch of ``c`` reads (reduction x columns, float32)."""
    size = c.num_columns * 4
    for role, extent in zip(c.roles, c.extents):
        size *= extent if role == "R" else 1
    return size


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
        # GEMM blocking: a chunk of the reduction outermost (its rows of ``a`` stay in L2 while
        # every column block uses them), the tile accumulating in the output across chunks (LLVM
        # keeps it in registers within a chunk)
        r_out, r_in = sch.split(red[-1], [None, tiling.reduce_chunk])
        red = [*red[:-1], r_in]
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
    # column blocks outermost keep a block of weights in cache while every row tile uses it; when
    # all the weights fit in L2, row tiles outermost read ``a`` once instead of once per block
    spatial = [*n_other, n_outer, *m_loops[:-1], m_outer]
    if tiling.rows_outer:
        spatial = [*m_loops[:-1], m_outer, *n_other, n_outer]
    sch.reorder(*batch, *spatial, *red, m_inner, n_tile, n_lane)
    outer = sch.fuse(*batch, *spatial)
    sch.parallel(outer)
    local = sch.cache_write(c.block, 0, "global" if None in c.extents else "local")
    sch.reverse_compute_at(local, outer, preserve_unit_loops=True)
    if None in c.extents:
        _tile_accumulator(sch, c, rows, cols * lanes)
    sch.vectorize(n_lane)
    sch.unroll(n_tile)
    sch.unroll(m_inner)
    sch.decompose_reduction(c.block, red[0])
    return outer, local


def rows_pos(c: Contraction) -> int:
    """Loop position of the innermost row axis (the one the register tile splits)."""
    return c.roles.rindex("M")


def _tile_accumulator(sch: Schedule, c: Contraction, rows: int, block_cols: int) -> None:
    """Give the accumulator of a contraction of symbolic extent tile axes of its own.

    TIR compacts the accumulator to the region one step of the parallel loop touches, but with a
    symbolic extent it cannot bound that region by the tile: the guarded last tile of a symbolic
    row extent spans rows ``[t * rows, min(t * rows + rows, W))``, and it sized the buffer by the
    whole output (one stack array per parallel task: a segfault). Laid out as ``[..., W / rows,
    rows, ..., C / block_cols, block_cols]``, the tile is one point of the outer axes and all of the
    inner ones, so it compacts to exactly ``rows x block_cols`` (the padding rows of the last tile
    are never written back). The accumulator is a ``global`` buffer: TVM puts one under 1 KiB on
    the stack, where LLVM keeps it in registers; a ``local`` one becomes a heap workspace per step
    whose stores LLVM keeps in the reduction loop (3x slower).
    """
    dim = c.row_dim

    def index_map(*idx):
        *lead, col = idx
        lead = [*lead[:dim], lead[dim] // rows, lead[dim] % rows, *lead[dim + 1 :]]
        return (*lead, col // block_cols, col % block_cols)

    sch.transform_layout(
        c.block, ("write", 0), index_map, assume_injective_transform=True
    )


def unguard_rows(sch: Schedule, c: Contraction) -> Schedule:
    """``sch`` with the register tile of a symbolic row extent computed without guards.

    Splitting a symbolic row extent by the tile guards every row of every step of the reduction
    (a branch per multiply-add row, 3x slower than the static tile). The tile's padding rows of
    the last tile may as well be computed: they accumulate in their own slots of the tiled
    accumulator (:func:`_tile_accumulator`), which the guarded write-back never copies out, and
    they read the last real row (the row index clamped in the loads of ``a``), so they never read
    past the data. The init and update blocks of ``c`` lose their predicate; everything else is
    kept. Returns a fresh schedule of the result (the rule's last step)."""
    if c.extents[rows_pos(c)] is None:
        names = {f"{c.name}_init", f"{c.name}_update"}
        func = sch.mod["main"]
        body = tvm_ffi.structural_map(
            func.body,
            (
                s_tir.SBlockRealize,
                lambda r: _unguarded(r, c.row_var) if r.block.name_hint in names else r,
            ),
        )
        sch = Schedule(func.with_body(body), error_render_level="none")
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
    new_block = s_tir.SBlock(
        block.iter_vars,
        block.reads,
        block.writes,
        block.name_hint,
        body,
        block.init,
        block.alloc_buffers,
        block.match_buffers,
        block.annotations,
    )
    return s_tir.SBlockRealize(realize.iter_values, True, new_block)


def inline_epilogue(sch: Schedule, writer) -> list:
    """Inline the elementwise consumers of ``writer`` into it; returns the consumers left.

    Intermediate blocks of the epilogue are first inlined into their own consumers (a SiLU reads
    the bias add twice: ``y * sigmoid(y)``), so that one block, the last, reads ``writer``; that
    block is then inlined into ``writer`` (TIR inlines a consumer only into a sole producer), but
    only where it writes a buffer of the writer's shape: a consumer that reads part of the tile (the
    slice after a conv whose output channels were padded) would otherwise be run over the whole tile
    and write past the end of its smaller output."""
    changed = True
    while changed:
        changed = False
        pending, seen = list(sch.get_consumers(writer)), set()
        while pending:
            block = pending.pop()
            name = sch.get(block).name_hint
            if name in seen:
                continue
            seen.add(name)
            later = sch.get_consumers(block)
            if later and try_step(sch.compute_inline, block):
                changed = True
                break
            pending.extend(later)
    while True:
        consumers = sch.get_consumers(writer)
        if (
            len(consumers) != 1
            or not _same_output_shape(sch, writer, consumers[0])
            or not try_step(sch.reverse_compute_inline, consumers[0])
        ):
            return consumers


def _same_output_shape(sch: Schedule, writer, consumer) -> bool:
    """Whether ``consumer`` writes a buffer of the shape ``writer`` writes."""

    def shape(block):
        writes = sch.get(block).writes
        return list(writes[0].source.ty.shape) if len(writes) == 1 else None

    ours, theirs = shape(writer), shape(consumer)
    return (
        ours is not None
        and theirs is not None
        and len(ours) == len(theirs)
        and all(tvm_ffi.structural_equal(a, b) for a, b in zip(ours, theirs))
    )


def try_step(step, *args) -> bool:
    """Run a schedule step; False where TIR refuses it (the schedule is left as it was)."""
    try:
        step(*args)
    except Exception:  # noqa: BLE001 - TIR raises ScheduleError subclasses
        return False
    return True


def vectorize_writeback(sch: Schedule, writer, lanes: int) -> None:
    """Vectorize the innermost loop of a tile write-back (its extent is a multiple of ``lanes``)."""
    loops = sch.get_loops(writer)
    extent = static_int(sch.get(loops[-1]).extent)
    if extent is not None and extent % lanes == 0:
        _, inner = sch.split(loops[-1], [None, lanes])
        sch.vectorize(inner)


__all__ = [
    "Contraction",
    "Tiling",
    "analyze_contraction",
    "choose_tiling",
    "inline_epilogue",
    "is_layout_preproc",
    "pack_weight",
    "pick_lanes",
    "pick_tile",
    "schedule_contraction",
    "try_step",
    "unguard_rows",
    "vectorize_writeback",
]
