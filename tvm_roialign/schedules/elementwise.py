"""Rule: functions made only of spatial (injective) blocks: elementwise ops, broadcasts, padding,
slices, concatenation, layout transforms; a transpose that moves the innermost axis is tiled by
:mod:`~tvm_roialign.schedules.transpose`.

Producers are inlined into their consumers where TIR allows it; each remaining block is fused into
one loop, cut into vectors of the target's width (when the innermost axis is a multiple of it, so
that the vector is contiguous), and run in parallel. A block whose innermost axis is not a multiple
of the vector width runs in parallel without vectors.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir import Schedule

from .base import CPURule, block_infos, is_layout_preproc, loop_extent, pick_lanes, try_step, walk
from .target_info import cpu_info
from .transpose import schedule_transpose_block
from .vector_math import ALL_OPS

#: below this many elements a loop runs serially (a parallel launch costs more than the work)
_MIN_PARALLEL = 4096
#: outer iterations (rows of the innermost axis) that keep every thread busy on their own
_MIN_ROWS = 64


def _is_parallel(sch: Schedule, loop) -> bool:
    return sch.get(loop).kind == tirx.ForKind.PARALLEL


def schedule_injective_block(sch: Schedule, block, lanes: int) -> None:
    """Fuse the loops of a spatial ``block``, vectorize by ``lanes`` (or fewer) and parallelize."""
    loops = sch.get_loops(block)
    if not loops or any(_is_parallel(sch, lp) for lp in loops):
        return
    extents = [loop_extent(sch, lp) for lp in loops]
    if None in extents:
        _schedule_symbolic_block(sch, loops, extents, lanes)
        return
    total = 1
    for extent in extents:
        total *= extent
    vec = pick_lanes(extents[-1], lanes)
    if vec is not None and len(loops) > 1 and total // extents[-1] >= _MIN_ROWS:
        # the innermost axis kept apart from the fused outer ones: its vectors index the
        # buffers by ``outer * vec + lane``, which a layout copy (the reshapes and transposes
        # around attention) reads as contiguous vectors; through one fused index TIR cannot
        # prove them contiguous and gathers lane by lane
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        _, inner = sch.split(loops[-1], [None, vec])
        sch.vectorize(inner)
        if total >= _MIN_PARALLEL:
            sch.parallel(outer)
        return
    if vec is None and len(loops) > 2 and total // (extents[-1] * extents[-2]) >= _MIN_ROWS:
        # no vector (a few channels: the zero padding of a conv's 3-channel image): the two
        # innermost loops stay loops, the rest one parallel loop. Fused into one index they cost
        # a division by each extent per element (and a padding's bounds test on the quotients);
        # kept, their indices and bounds are counters, the innermost unrolled when it is short
        outer = sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]
        if extents[-1] <= lanes:
            sch.unroll(loops[-1])
        if total >= _MIN_PARALLEL:
            sch.parallel(outer)
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if vec is not None:
        outer, inner = sch.split(fused, [None, vec])
        sch.vectorize(inner)
    else:
        outer = fused
    if total >= _MIN_PARALLEL:
        sch.parallel(outer)


def _schedule_symbolic_block(sch: Schedule, loops, extents, lanes: int) -> None:
    """A spatial block with symbolic extents (image size, batch): the loops before the last
    symbolic one fused and parallel (an image's rows: one parallel step per row, as a static
    block of the same shape gets), the last symbolic one (its columns) a serial loop inside, and
    the static inner ones (channels) fused and vectorized, or unrolled when they are a few
    (a 3-channel image's padding). Fused into one parallel index with the columns, every element
    would divide by the symbolic extents (the zero padding of MobileNetV2's stem ran 2x slower
    than at a static size). Fusing the static ones into the symbolic extent as well would make TIR
    split it by ``(w + 6) * 3`` and fail to prove that divisible when the buffers are compacted."""
    last = max(i for i, e in enumerate(extents) if e is None)
    outer, inner = loops[:last], loops[last + 1 :]
    if outer:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    else:
        sch.parallel(loops[last])  # a single symbolic axis: it is the parallel one
    if not inner:
        return
    fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    static = 1
    for extent in extents[last + 1 :]:
        static *= extent
    vec = pick_lanes(extents[-1], lanes)
    if vec is not None:
        _, vector = sch.split(fused, [None, vec])
        sch.vectorize(vector)
    elif static <= lanes:
        sch.unroll(fused)


def schedule_rest(sch: Schedule, lanes: int) -> None:
    """Schedule every top-level spatial block not yet under a parallel loop."""
    root = sch.get_sblock("root")
    for block in sch.get_child_blocks(root):
        stmt = sch.get(block)
        if is_layout_preproc(sch, block) or any(
            it.iter_type != tirx.IterVar.DataPar for it in stmt.iter_vars
        ):
            continue
        schedule_injective_block(sch, block, lanes)


def _has_condition(stmt) -> bool:
    found = []
    walk(
        stmt.body,
        tvm.ir.expr.Call,
        lambda node: found.append(str(getattr(node.op, "name", ""))),
    )
    return any(name.endswith("if_then_else") for name in found)


def schedule_producers(sch: Schedule, block, lanes: int, inline_padding: bool = False) -> None:
    """Inline plain-copy producers of ``block``; give conditional ones (padding) their own pass,
    or with ``inline_padding`` inline them too where they can be (``block`` then reads the zero
    padding through the bounds test in its loads); what cannot be inlined gets its own pass."""
    for producer in sch.get_producers(block):
        if is_layout_preproc(sch, producer):
            continue
        inlinable = inline_padding or not _has_condition(sch.get(producer))
        if inlinable and try_step(sch.compute_inline, producer):
            continue
        schedule_injective_block(sch, producer, lanes)


class Elementwise(CPURule):
    """Parallel, vectorized schedule of functions without reductions; ``exp``, ``sigmoid`` and
    ``erf`` as vectorizable arithmetic (the GELU a transformer's MLP leaves outside its matmul)."""

    vector_ops = ALL_OPS

    def schedule(self, sch, func, target):
        infos = block_infos(sch, injective_only=True)
        if infos is None:
            return None
        cpu = cpu_info(target)
        lanes = cpu.lanes()
        for info in infos:
            if not schedule_transpose_block(sch, info.block_rv, cpu):
                schedule_injective_block(sch, info.block_rv, lanes)
        return sch


__all__ = ["Elementwise", "schedule_injective_block", "schedule_producers", "schedule_rest"]
