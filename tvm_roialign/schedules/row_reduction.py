"""Rule: functions that reduce each row of a tensor over its last axis and write the row back
(softmax, layer norm: a transformer's ``softmax(q @ k^T)`` and every layer norm), with the
epilogue fused after them.

The fallback runs each reduction as its own pass over the whole tensor, one scalar chain per row,
and recomputes the intermediate elementwise stages (softmax's ``exp``, twice, through the C
library) in every consumer. Here each row is one step of a parallel loop:

* every elementwise stage is inlined into its consumers, except one that calls a transcendental
  function (softmax's ``exp``), which is computed once per row into a row buffer;
* the reductions (max, sum, the variance's sum of squares) and that buffer are computed at the
  row, before the output row is written;
* each reduction is cut into a vector's width of partial accumulators (``rfactor``), summed at
  the end of the row: one vector of them, and the row's loops vectorized, when the row's length
  is a multiple of the target's vector (a layer norm's channels); otherwise (softmax over 197
  or 49 tokens) as many independent scalar chains, the reduction first made harmless past the
  row's end (its loads clamped to the last element, a sum adding 0 there:
  :func:`_padding_safe`), so that the last partial step runs unguarded;
* ``exp`` and ``erf`` as arithmetic (:mod:`~tvm_roialign.schedules.vector_math`), which LLVM vectorizes.

The partial sums change the order of the additions, not what is added: results stay within
float32 rounding of the reference (the tests compare with float64).

Only static extents; anything else is left to the next rule.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import Schedule

from .base import CPURule, block_with_body, find_block, loop_extent, new_schedule, pick_lanes, try_step, walk
from .target_info import cpu_info
from .vector_math import ALL_OPS

#: TIR ops whose stage is kept as a row buffer (computed once, read by several consumers)
_TRANSCENDENTAL = ("tirx.exp", "tirx.erf", "tirx.sigmoid", "tirx.tanh", "tirx.log")


def _calls_transcendental(stmt) -> bool:
    found = []
    walk(stmt.body, tvm.ir.expr.Call, lambda c: found.append(str(getattr(c.op, "name", ""))))
    return any(name in _TRANSCENDENTAL for name in found)


def _is_reduction(stmt) -> bool:
    return any(it.iter_type == tirx.IterVar.CommReduce for it in stmt.iter_vars)


def _row_reduction(stmt, rows: int) -> bool:
    """A block that reduces over one (last) iter and writes one value per row: its spatial
    iters are the ``rows`` leading ones."""
    kinds = [it.iter_type for it in stmt.iter_vars]
    return (
        len(stmt.writes) == 1
        and len(kinds) == rows + 1
        and kinds[-1] == tirx.IterVar.CommReduce
        and all(k == tirx.IterVar.DataPar for k in kinds[:-1])
    )


def _padding_safe(sch: Schedule, length: int) -> Schedule | None:
    """A fresh schedule of the function with each row reduction's step ``k`` made harmless past
    the row's end: its loads read ``min(k, length - 1)``, and a sum adds ``0`` there (a max or
    min may see the last element twice). Within the row nothing changes; the reduction may
    then be split by a vector that does not divide the row (the padding steps of its last
    vector run unguarded). None for another reducer."""
    failed = []

    def rewrite(block):
        if block.init is None or not isinstance(block.body, tirx.BufferStore):
            return block
        k = block.iter_vars[-1]
        if k.iter_type != tirx.IterVar.CommReduce:
            return block
        store = block.body
        value = store.value
        if not isinstance(value, (tirx.Add, tirx.Max, tirx.Min)):
            failed.append(block.name_hint)
            return block
        acc, term = value.a, value.b
        if not (isinstance(acc, tvm.ir.expr.TensorLoad) and acc.source.same_as(store.buffer)):
            failed.append(block.name_hint)
            return block
        last = tirx.IntImm(str(k.var.ty), length - 1)
        clamped = tirx.Min(k.var, last)
        term = tvm_ffi.structural_map(
            term, (tirx.Var, lambda v: clamped if v.same_as(k.var) else v)
        )
        if isinstance(value, tirx.Add):
            zero = tirx.const(0, str(term.ty))
            term = tirx.Select(k.var < tirx.IntImm(str(k.var.ty), length), term, zero)
        new_value = type(value)(acc, term)
        return block_with_body(block, tirx.BufferStore(store.buffer, new_value, store.indices))

    func = sch.mod["main"]
    body = tvm_ffi.structural_map(func.body, (s_tir.SBlock, rewrite))
    if failed:
        return None
    return new_schedule(func.with_body(body))


class RowReduction(CPURule):
    """Softmax, layer norm and their epilogue, row by row (see module docstring)."""

    vector_ops = ALL_OPS

    def schedule(self, sch: Schedule, func, target):
        root = find_block(sch, "root")
        if root is None:
            return None
        blocks = sch.get_child_blocks(root)
        if not any(_is_reduction(sch.get(b)) for b in blocks):
            return None
        outputs = sch.get_output_blocks(root)
        if len(outputs) != 1 or _is_reduction(sch.get(outputs[0])):
            return None
        output = outputs[0]
        out_name = sch.get(output).name_hint
        out_loops = sch.get_loops(output)
        extents = [loop_extent(sch, lp) for lp in out_loops]
        if len(out_loops) < 2 or None in extents:
            return None
        rows = len(out_loops) - 1
        length = extents[-1]
        # every reduction reduces a row of the output's shape
        reductions = [b for b in blocks if _is_reduction(sch.get(b))]
        if not all(_row_reduction(sch.get(b), rows) for b in reductions):
            return None
        for b in reductions:
            r_extent = sch.get(b).iter_vars[-1].dom.extent
            if not isinstance(r_extent, tirx.IntImm) or int(r_extent) != length:
                return None
        # inline the elementwise stages (not the output, not a transcendental row buffer; a
        # stage TIR does not inline stays a row buffer too)
        for b in blocks:
            stmt = sch.get(b)
            if stmt.name_hint == out_name or _is_reduction(stmt):
                continue
            if _calls_transcendental(stmt) and len(sch.get_consumers(b)) > 1:
                continue
            try_step(sch.compute_inline, b)
        lanes = cpu_info(target).lanes()
        vec = pick_lanes(length, lanes)
        if vec is None:
            # a ragged row: reductions whose padding steps change nothing
            sch = _padding_safe(sch, length)
            if sch is None:
                return None
            root = find_block(sch, "root")
            output = sch.get_sblock(out_name)
        # partial accumulators of each reduction (on its own loop nest, before it moves)
        parts = []
        for b in [b for b in sch.get_child_blocks(root) if _is_reduction(sch.get(b))]:
            rf = self._split_reduction(sch, b, vec or lanes)
            if rf is not None:
                parts.append(sch.get(rf).name_hint)
        out_loops = sch.get_loops(output)
        row = sch.fuse(*out_loops[:-1]) if rows > 1 else out_loops[0]
        sch.parallel(row)
        self._row_stages(sch, out_name, output, row, parts, vec)
        return sch

    @staticmethod
    def _row_stages(sch: Schedule, out_name: str, output, row, parts: list, vec: int | None) -> None:
        """Every stage of a row under the row loop (last producer first): the partial
        accumulators innermost, one vector of them per step of the row, and the elementwise
        stages and the output vectorized where ``vec`` lanes divide the row."""
        # the row's stages under the row loop, last producer first
        staged = [
            b
            for b in sch.get_child_blocks(find_block(sch, "root"))
            if sch.get(b).name_hint != out_name
        ]
        for b in reversed(staged):
            sch.compute_at(b, row, preserve_unit_loops=True)
        for b in staged:
            stmt = sch.get(b)
            inner = sch.get_loops(b)[-1]
            if stmt.name_hint in parts:
                # the partial accumulators (the block's first iter: rfactor's axis 0)
                # innermost, one vector of them per step of the row
                loops = sch.get_loops(b)
                part, steps = loops[1], loops[-1]
                sch.reorder(steps, part)
                if vec is not None:
                    sch.vectorize(part)
                else:
                    sch.unroll(part)
                sch.decompose_reduction(b, steps)
            elif _is_reduction(stmt):
                continue
            elif vec is not None:
                _, v = sch.split(inner, [None, vec])
                sch.vectorize(v)
        if vec is not None:
            _, v = sch.split(sch.get_loops(output)[-1], [None, vec])
            sch.vectorize(v)

    @staticmethod
    def _split_reduction(sch: Schedule, block, factor: int):
        """The block of ``factor`` partial accumulators of a row reduction (``rfactor``), its
        reduction loop outside the accumulators; None where TIR refuses (one chain)."""
        loop = sch.get_loops(block)[-1]
        _, inner = sch.split(loop, [None, factor])
        try:
            rf = sch.rfactor(inner, 0)
        except Exception:  # noqa: BLE001 - a reduction rfactor cannot split
            return None
        return rf


__all__ = ["RowReduction"]
