"""What every schedule rule of the package shares: the guard, the schedule, block queries, steps.

:class:`Rule` is the one ``apply(func, target, tunable)`` of the package's dlight ``ScheduleRule``\\ s:
it returns None for anything that is not a TIR PrimFunc and for a target the rule does not serve
(dlight's ``is_target_available``: llvm for a CPU rule, a ``gpu`` key for a GPU rule), and hands the
rest to the rule's :meth:`Rule.schedule_func`, which by default opens a schedule of the function
(:func:`new_schedule`) and hands it to the rule's :meth:`Rule.schedule`.

:class:`CPURule` is the base of the model's CPU rules: a schedule step that TIR refuses (any
exception) means None, so that the next rule gets the untouched function, and a function whose
buffers have compound symbolic extents (``(h - 1) // 4 + 1``) is handed to the rule with a variable
of its own for each (:mod:`~tvm_roialign.schedules.symbolic_extents`): the rules' arithmetic on such extents
is exact only in that form.

The helpers: :func:`find_block`, :func:`find_main_reduction` and :func:`block_infos` (blocks by
name, kind or dlight's analysis),
:func:`static_int` and :func:`loop_extent` (static sizes), :func:`pick_lanes` and
:func:`largest_divisor_lanes` (vector widths), :func:`walk` (IR nodes of a type), :func:`try_step`
(a step TIR may refuse), :func:`is_layout_preproc` (weight-packing stages), and the epilogue steps
:func:`inline_epilogue` and :func:`vectorize_writeback`.
"""

from __future__ import annotations

import functools
import operator

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import Schedule
from tvm.s_tir.dlight import ScheduleRule
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline_contiguous_spatial
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule

from .symbolic_extents import name_symbolic_extents
from .vector_math import vectorize_math

#: block annotation of a weight-packing stage (MetaSchedule's layout rewrite, run at compile time)
PREPROC_ATTR = "meta_schedule.layout_rewrite_preproc"


def new_schedule(func: tirx.PrimFunc) -> Schedule:
    """A schedule of ``func`` whose errors are not rendered (the rules' TIR is large to print)."""
    return Schedule(func, error_render_level="none")


def static_int(value) -> int | None:
    """``value`` as a Python int when it is a constant (an int or ``IntImm``), else None."""
    return int(value) if isinstance(value, (int, tirx.IntImm)) else None


def loop_extent(sch: Schedule, loop) -> int | None:
    """The static extent of ``loop`` (None when symbolic)."""
    return static_int(sch.get(loop).extent)


def find_block(sch: Schedule, name: str):
    """The block named ``name`` of the function, or None when it has none."""
    try:
        return sch.get_sblock(name)
    except Exception:  # noqa: BLE001 - TIR raises when the name is not in the function
        return None


def find_main_reduction(sch: Schedule):
    """The single reduction block of the function (all others spatial), or None."""
    root = find_block(sch, "root")
    blocks = sch.get_child_blocks(root) if root is not None else []
    reductions = [
        b
        for b in blocks
        if any(it.iter_type == tirx.IterVar.CommReduce for it in sch.get(b).iter_vars)
    ]
    return reductions[0] if len(reductions) == 1 else None


def block_infos(sch: Schedule, injective_only: bool = False):
    """dlight's block infos of the function after inlining its contiguous spatial blocks, or None
    when dlight cannot analyse it (or, with ``injective_only``, when a block is not injective)."""
    infos = normalize_prim_func(sch)
    if infos is None or (injective_only and not all(info.is_injective() for info in infos)):
        return None
    return try_inline_contiguous_spatial(sch, infos)


def buffer_dtypes(func: tirx.PrimFunc) -> list[str]:
    """The dtypes of the buffer parameters of ``func``, in order."""
    return [
        str(param.ty.dtype) for param in func.params if isinstance(param.ty, tirx.BufferType)
    ]


def pick_lanes(extent: int, lanes: int) -> int | None:
    """The widest vector (``lanes``, half, quarter, at least 4) that divides ``extent``."""
    for candidate in (lanes, lanes // 2, lanes // 4):
        if candidate >= 4 and extent % candidate == 0:
            return candidate
    return None


def largest_divisor_lanes(extent: int | None, max_lanes: int) -> int:
    """The largest power of two <= ``max_lanes`` that divides ``extent`` (1 if none or symbolic)."""
    if extent is None:
        return 1
    lanes = 1
    while lanes * 2 <= max_lanes and extent % (lanes * 2) == 0:
        lanes *= 2
    return lanes


def walk(root, node_type, callback) -> None:
    """Call ``callback`` on every node of type ``node_type`` under ``root``."""
    tvm_ffi.structural_walk(root, (node_type, callback), order="post")


def try_step(step, *args) -> bool:
    """Run a schedule step; False where TIR refuses it (the schedule is left as it was)."""
    try:
        step(*args)
    except Exception:  # noqa: BLE001 - TIR raises ScheduleError subclasses
        return False
    return True


def is_layout_preproc(sch: Schedule, block) -> bool:
    """Whether ``block`` is a weight-packing stage (run at compile time, never scheduled)."""
    return PREPROC_ATTR in sch.get(block).annotations


def inline_epilogue(sch: Schedule, writer) -> list:
    """Inline the elementwise consumers of ``writer`` into it; returns the consumers left.

    Intermediate blocks of the epilogue are first inlined into their own consumers (a SiLU reads
    the bias add twice: ``y * sigmoid(y)``), so that one block, the last, reads ``writer``; that
    block is then inlined into ``writer`` (TIR inlines a consumer only into a sole producer), but
    only where it writes a buffer of the writer's shape: a consumer that reads part of the tile (the
    slice after a conv whose output channels were padded) would otherwise be run over the whole tile
    and write past the end of its smaller output.

    Sole consumers of the writer's shape are inlined into it first: a squeeze-excitation gate
    (``sigmoid(fc + bias) * x``, ``x`` a whole activation) keeps its bias and sigmoid at the
    gate's ``C`` values, computed once in the tile's write-back, instead of being inlined into
    the broadcast multiply and recomputed for every pixel of ``x``."""
    _inline_sole_consumers(sch, writer)
    while inline_one_intermediate(sch, writer):
        pass
    return _inline_sole_consumers(sch, writer)


def _inline_sole_consumers(sch: Schedule, writer) -> list:
    """Inline the consumer of ``writer`` into it while there is one, writing ``writer``'s shape;
    returns the consumers left."""
    while True:
        consumers = sch.get_consumers(writer)
        if (
            len(consumers) != 1
            or not same_output_shape(sch, writer, consumers[0])
            or not try_step(sch.reverse_compute_inline, consumers[0])
        ):
            return consumers


def inline_one_intermediate(sch: Schedule, writer) -> bool:
    """Inline one block downstream of ``writer`` that has consumers of its own; False if none."""
    pending, seen = list(sch.get_consumers(writer)), set()
    while pending:
        block = pending.pop()
        name = sch.get(block).name_hint
        if name in seen:
            continue
        seen.add(name)
        later = sch.get_consumers(block)
        if later and try_step(sch.compute_inline, block):
            return True
        pending.extend(later)
    return False


def same_output_shape(sch: Schedule, writer, consumer) -> bool:
    """Whether ``consumer`` writes a buffer of the shape ``writer`` writes, or, for static shapes,
    one of as many elements (provably, a symbolic batch being the same factor of both) with the same
    static last axis (a conv's output with its height and width merged into one axis,
    :mod:`~tvm_roialign.schedules.contraction.conv_rows`, read by a consumer that writes ``[N, H, W, C]``)."""

    def shape(block):
        writes = sch.get(block).writes
        return list(writes[0].source.ty.shape) if len(writes) == 1 else None

    ours, theirs = shape(writer), shape(consumer)
    if ours is None or theirs is None:
        return False
    if len(ours) == len(theirs):
        return all(tvm_ffi.structural_equal(a, b) for a, b in zip(ours, theirs))
    last = static_int(ours[-1])
    if last is None or last != static_int(theirs[-1]):
        return False
    # a symbolic batch (Mask R-CNN's mask head, one map per detection) is a factor of both sizes
    size = functools.partial(functools.reduce, operator.mul)
    return bool(tvm.sym.Analyzer().can_prove_equal(size(ours), size(theirs)))


def vectorize_writeback(sch: Schedule, writer, lanes: int) -> None:
    """Vectorize the innermost loop of a tile write-back (its extent is a multiple of ``lanes``)."""
    loops = sch.get_loops(writer)
    extent = loop_extent(sch, loops[-1])
    if extent is not None and extent % lanes == 0:
        _, inner = sch.split(loops[-1], [None, lanes])
        sch.vectorize(inner)


class Rule(ScheduleRule):
    """The guard every rule of the package shares (see the module docstring); subclasses mix in
    dlight's ``CPUScheduleRule`` or ``GPUScheduleRule`` for the targets they serve and implement
    :meth:`schedule` (or :meth:`schedule_func`)."""

    def apply(self, func, target, tunable=False):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        return self.schedule_func(func, target)

    def schedule_func(self, func: tirx.PrimFunc, target) -> Schedule | None:
        """A schedule of ``func`` for ``target``, or None: :meth:`schedule` of a fresh schedule."""
        return self.schedule(new_schedule(func), func, target)

    def schedule(self, sch: Schedule, func: tirx.PrimFunc, target) -> Schedule | None:
        """Schedule ``sch`` (a fresh schedule of ``func``) for ``target``; None when ``func`` is
        not of this rule's kind."""
        raise NotImplementedError


class CPURule(Rule, CPUScheduleRule):
    """A rule of the model's llvm PrimFuncs: symbolic extents named, a refused step means None.

    The float32 functions named in a rule's ``vector_ops`` (``exp``, ``sigmoid``, ``erf``) are
    rewritten, in what it schedules, into arithmetic LLVM vectorizes
    (:func:`~tvm_roialign.schedules.vector_math.vectorize_math`) where the rule vectorizes them: the
    contraction rules' epilogues carry a model's activations (SiLU, sigmoid gates, GELU), the elementwise rule
    the rest (a GELU outside its matmul). Not in the fallback rule, whose reductions (a softmax)
    keep the exponentials in scalar loops, where the C library's call is as fast."""

    vector_ops: frozenset = frozenset()

    def schedule_func(self, func, target):
        func = name_symbolic_extents(func) or func
        try:
            sch = super().schedule_func(func, target)
            if sch is None or not self.vector_ops:
                return sch
            scheduled = sch.mod["main"]
            rewritten = vectorize_math(scheduled, self.vector_ops)
            return sch if rewritten.same_as(scheduled) else new_schedule(rewritten)
        except Exception:  # noqa: BLE001 - any failed step: let the next rule try
            return None


def block_with_body(block, body):
    """``block`` (an ``SBlock``) with ``body`` in place of its own, every other field kept."""
    return s_tir.SBlock(
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


__all__ = [
    "PREPROC_ATTR",
    "CPURule",
    "Rule",
    "block_infos",
    "block_with_body",
    "buffer_dtypes",
    "find_block",
    "find_main_reduction",
    "inline_epilogue",
    "inline_one_intermediate",
    "is_layout_preproc",
    "largest_divisor_lanes",
    "loop_extent",
    "new_schedule",
    "pick_lanes",
    "same_output_shape",
    "static_int",
    "try_step",
    "vectorize_writeback",
    "walk",
]
