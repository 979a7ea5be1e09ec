"""Move a unary elementwise activation ahead of the ``reshape`` it reads.

torch.export writes a transformer MLP's ``gelu(linear(x))`` on a ``[batch, tokens, features]``
input as ``reshape -> matmul -> add -> reshape -> gelu``: the reshape between the bias add and the
GELU ends ``FuseOps``'s group (a matmul takes elementwise and broadcast consumers only), so the
GELU becomes a pass of its own over the MLP's widest tensor instead of the matmul rule's
epilogue. An elementwise function commutes with a reshape, so ``act(reshape(x, s))`` becomes
``reshape(act(x), s)``; a reshape of a reshape becomes one reshape of the first input (the two
left by the move before the next matmul are then one, which the VM runs as a view). The values are
unchanged.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import FunctionRewriter, is_op_call, rewrite_module

#: unary elementwise ops (a function of each element alone, same shape and dtype) that move
_ACTIVATIONS = (
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.nn.relu",
    "relax.nn.silu",
    "relax.sigmoid",
    "relax.tanh",
    "relax.erf",
)


@mutator
class _HoistActivations(FunctionRewriter):
    """``act(reshape(x, s))`` -> ``reshape(act(x), s)``; ``reshape(reshape(x, s), t)`` ->
    ``reshape(x, t)``."""

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if len(call.args) < 1:
            return call
        source = self.lookup(call.args[0])
        if not (isinstance(source, relax.Call) and is_op_call(source, "relax.reshape")):
            return call
        if is_op_call(call, "relax.reshape"):
            self.changed = True
            return relax.op.reshape(source.args[0], call.args[1])
        if len(call.args) == 1 and any(is_op_call(call, name) for name in _ACTIVATIONS):
            self.changed = True
            moved = self.builder_.emit(relax.Call(call.op, [source.args[0]], call.attrs))
            return relax.op.reshape(moved, source.args[1])
        return call


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.HoistActivations")
class HoistActivations:  # pylint: disable=too-few-public-methods
    """Move every unary elementwise activation of a reshape ahead of it and merge chains of
    reshapes (see the module). The module is returned unchanged (the same object) when nothing
    matches."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_HoistActivations, mod)


__all__ = ["HoistActivations"]
