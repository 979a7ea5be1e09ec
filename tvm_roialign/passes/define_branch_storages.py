"""Each branch of an ``If`` allocates the storages it uses, after ``StaticPlanBlockMemory``.

TVM 0.27's ``StaticPlanBlockMemory`` lets a branch reuse a storage token that the other branch
allocates: with equal-size tensors in both branches of an ``If`` (say an int8 conv's quantized input
in each), the ``else`` branch carves its tensor out of ``storage``, a variable bound only inside the
``then`` branch, and the VM dies (``StorageObj::AllocTensor`` on an undefined register) whenever
the ``else`` branch runs. This pass gives such a branch a ``alloc_storage`` of its own, the same
call bound to a new variable right before the first use, and rewrites the branch's uses.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._mutator import is_op_call, map_relax_functions

_ALLOC_STORAGE = "relax.memory.alloc_storage"


def _storage_allocations(func: relax.Function) -> dict:
    """Every ``alloc_storage`` binding of ``func``, at any depth: var -> the call."""
    found: dict = {}

    def walk(seq):
        for block in seq.blocks:
            for binding in block.bindings:
                value = getattr(binding, "value", None)
                if isinstance(value, relax.If):
                    walk(value.true_branch)
                    walk(value.false_branch)
                elif is_op_call(value, _ALLOC_STORAGE):
                    found[binding.var] = value

    if isinstance(func.body, relax.SeqExpr):
        walk(func.body)
    return found


def _scope(seq: relax.SeqExpr, defined: frozenset, allocations: dict, added: list) -> relax.SeqExpr:
    """``seq`` with a storage it reads but no enclosing binding defines allocated in it (each
    such allocation appended to ``added``)."""
    local, renamed, blocks = set(defined), {}, []
    for block in seq.blocks:
        bindings = []
        for binding in block.bindings:
            value = binding.value if isinstance(binding, relax.VarBinding) else None
            if isinstance(value, relax.If):
                value = relax.If(value.cond, _scope(value.true_branch, frozenset(local), allocations, added),
                                 _scope(value.false_branch, frozenset(local), allocations, added))
                binding = relax.VarBinding(binding.var, value)
            elif isinstance(value, relax.Call):
                args = []
                for arg in value.args:
                    if arg in allocations and arg not in local and arg not in renamed:
                        own = relax.Var(arg.name, arg.ty)
                        bindings.append(relax.VarBinding(own, allocations[arg]))
                        renamed[arg] = own
                        added.append(own)
                    args.append(renamed.get(arg, arg))
                if any(a is not b for a, b in zip(args, value.args)):
                    call = relax.Call(value.op, args, value.attrs, value.ty_args)
                    binding = relax.VarBinding(binding.var, call)
            bindings.append(binding)
            local.add(binding.var)
        kind = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
        blocks.append(kind(bindings))
    return relax.SeqExpr(blocks, seq.body)


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.DefineBranchStorages")
class DefineBranchStorages:  # pylint: disable=too-few-public-methods
    """A branch's storages allocated in the branch (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return map_relax_functions(mod, _define)


def _define(func: relax.Function) -> relax.Function:
    allocations = _storage_allocations(func) if isinstance(func.body, relax.SeqExpr) else {}
    if not allocations:
        return func
    added: list = []
    body = _scope(func.body, frozenset(func.params), allocations, added)
    if not added:
        return func
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)


__all__ = ["DefineBranchStorages"]
