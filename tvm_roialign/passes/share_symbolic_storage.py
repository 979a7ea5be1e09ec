"""Storage of symbolic size shared across sizes, after ``relax.transform.StaticPlanBlockMemory``.

``StaticPlanBlockMemory`` reuses a storage for a later tensor only where it can prove the sizes
equal; a storage of symbolic size (an image's height and width unknown until a run) is then reused
only by tensors of the very same size expression. A symbolic MobileNetV2 allocates 32 storages a
run where its static build, planned at known sizes, allocates 7: the VM's allocator hands each its
own memory, so every layer writes into memory the previous ones did not touch (out of cache), and
every storage is one more allocation a run.

This pass, run right after ``StaticPlanBlockMemory``, gives storages whose lifetimes do not overlap
one allocation: the size of the largest (``max`` of their size expressions, computed once a run
with the other shape values) allocated where the first of them was, each later one's tensors
carved out of it. A freed storage goes to the next one that starts (the last freed first: its
memory is the most likely still in cache).

Taken: storages allocated in a function's top-level bindings, of one dtype, scope and device, whose
size depends only on the function's parameters' symbolic sizes (defined on entry; a size computed
from a tensor's values inside the function is left alone), or on none: a static size that the plan
left apart is taken too. A storage's life ends at the last binding
that mentions it or any value made from it (a view, a tuple holding it: conservatively, any binding
whose value mentions one, except a kernel call writing into it); one that reaches the function's
result is never shared.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ._mutator import is_op_call, map_relax_functions

_ALLOC_STORAGE = "relax.memory.alloc_storage"
_ALLOC_TENSOR = "relax.memory.alloc_tensor"


def _vars_of(expr) -> set:
    return set(relax.analysis.free_vars(expr))


def _param_sizes(func: relax.Function) -> set:
    """The symbolic sizes of ``func``'s parameters (known on entry)."""
    sizes: set = set()
    for param in func.params:
        sizes |= set(relax.analysis.definable_tir_vars_in_type(param.ty))
    return sizes


class _Storage:
    """A storage allocation: its binding's var and position, its size, the last position it is read
    at, and what it may share an allocation with (device index, scope, dtype)."""

    def __init__(self, var, index: int, call, sizes: set):
        self.var, self.start, self.end = var, index, index
        shape = call.args[0]
        self.size = shape.values[0] if isinstance(shape, relax.ShapeExpr) and len(shape.values) == 1 else None
        self.kind = tuple(str(a) for a in call.args[1:])
        self.shared = self.size is not None and set(tirx.analysis.undefined_vars(self.size)) <= sizes


def _writes_only(value) -> bool:
    """Whether ``value`` is a kernel call (a ``GlobalVar`` or ``ExternFunc`` called on its inputs
    and the outputs it writes): its result holds none of its arguments."""
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar | relax.ExternFunc)


def _storages(bindings, sizes: set, result) -> list[_Storage]:
    """The storages of ``bindings`` (a function's top-level bindings, in order) with their lives;
    a storage read other than by ``alloc_tensor``, or reaching ``result``, is not shared."""
    storages: dict = {}
    owner: dict = {}  # a var -> the storages its value is made from
    for index, binding in enumerate(bindings):
        value = binding.value
        if is_op_call(value, _ALLOC_STORAGE):
            storages[binding.var] = _Storage(binding.var, index, value, sizes)
            owner[binding.var] = {storages[binding.var]}
            continue
        inputs = _vars_of(value)
        if not is_op_call(value, _ALLOC_TENSOR):
            for var in inputs & storages.keys():
                storages[var].shared = False  # the storage itself read elsewhere
        used: set = set()
        for var in inputs:
            used |= owner.get(var, set())
        for storage in used:
            storage.end = index
        if used and not _writes_only(value):
            owner[binding.var] = owner.get(binding.var, set()) | used
    for var in _vars_of(result):
        for storage in owner.get(var, set()):
            storage.shared = False
    return list(storages.values())


def _groups(storages: list[_Storage]) -> list[list[_Storage]]:
    """Storages in groups of non-overlapping lives: each to the group of its kind freed last
    before it starts, else a group of its own. Only groups of two or more."""
    groups: list[list[_Storage]] = []
    live: list[list[_Storage]] = []
    free: list[list[_Storage]] = []
    for storage in sorted((s for s in storages if s.shared), key=lambda s: s.start):
        for group in [g for g in live if g[-1].end < storage.start]:
            live.remove(group)
            free.append(group)
        free.sort(key=lambda g: g[-1].end)
        group = next((g for g in reversed(free) if g[0].kind == storage.kind), None)
        if group is None:
            group = []
            groups.append(group)
        else:
            free.remove(group)
        group.append(storage)
        live.append(group)
    return [g for g in groups if len(g) > 1]


def _largest(sizes: list, analyzer):
    """``max`` of ``sizes``, without those another is proven at least as large as."""
    kept: list = []
    for size in sizes:
        if any(analyzer.can_prove(k >= size) for k in kept):
            continue
        kept = [k for k in kept if not analyzer.can_prove(size >= k)] + [size]
    largest = kept[0]
    for size in kept[1:]:
        largest = tirx.max(largest, size)
    return largest


def _share(func: relax.Function) -> relax.Function:
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return func
    sizes = _param_sizes(func)
    groups = _groups(_storages([b for block in body.blocks for b in block.bindings], sizes, body.body))
    if not groups:
        return func
    analyzer = tvm.sym.Analyzer()
    for var in sizes:  # shapes are not negative
        analyzer.update(var, tvm.sym.ConstIntBound(0, tvm.sym.ConstIntBound.POS_INF))
    first: dict = {}  # the group's first storage -> the group's size
    replace: dict = {}  # a later storage -> the first
    for group in groups:
        first[group[0].var] = _largest([s.size for s in group], analyzer)
        for storage in group[1:]:
            replace[storage.var] = group[0].var
    blocks = []
    for block in body.blocks:
        bindings = []
        for binding in block.bindings:
            value = binding.value
            if binding.var in replace:
                continue
            if binding.var in first:
                value = relax.Call(value.op, [relax.ShapeExpr([first[binding.var]]), *value.args[1:]],
                                   value.attrs, value.ty_args)
            elif is_op_call(value, _ALLOC_TENSOR) and value.args[0] in replace:
                value = relax.Call(value.op, [replace[value.args[0]], *value.args[1:]], value.attrs,
                                   value.ty_args)
            bindings.append(relax.VarBinding(binding.var, value) if value is not binding.value else binding)
        kind = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
        blocks.append(kind(bindings))
    return relax.Function(func.params, relax.SeqExpr(blocks, body.body), func.ret_ty, func.is_pure,
                          func.attrs, func.span)


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.ShareSymbolicStorage")
class ShareSymbolicStorage:  # pylint: disable=too-few-public-methods
    """Storages of symbolic size with disjoint lives allocated once (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return map_relax_functions(mod, _share)

__all__ = ["ShareSymbolicStorage"]
