"""Gathers whose indices are constants inside the gathered axis: ``take`` in mode ``"clip"``.

An importer writes ``take(x, i, mode="fast")``, and TVM warns at the legalization of every such call
that it reads out of bounds on an index outside the axis. Where ``i`` is a constant whose values all
lie in ``[0, n)`` (``x[:, 0]``, the query / key / value split of an attention layer) clipping changes
nothing and costs nothing, and TVM has nothing to warn about. ONNX's ``Gather`` of a constant index
arrives as ``where(less(c, 0), c + n, c)``; with every ``c >= 0`` that is ``c``, and is taken as such.
A gather of computed indices keeps its mode, and its warning.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import FunctionRewriter, const_value, is_op_call, rewrite_module, tensor_shape


@mutator
class _ConstantTakes(FunctionRewriter):
    """``take(x, const, mode="fast")`` -> ``take(x, const, mode="clip")`` where every index is in
    bounds of a static axis."""

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not is_op_call(call, "relax.take") or call.attrs.mode != "fast":
            return call
        indices = self._constant_indices(call.args[1])
        shape = tensor_shape(call.args[0])
        if indices is None or shape is None:
            return call
        axis = 0 if call.attrs.axis is None else int(call.attrs.axis) % len(shape)
        extent = shape[axis] if call.attrs.axis is not None else None
        if call.attrs.axis is None and None not in shape:
            extent = 1
            for dim in shape:
                extent *= dim
        if extent is None or indices.size == 0 or indices.min() < 0 or indices.max() >= extent:
            return call
        self.changed = True
        return relax.op.take(call.args[0], relax.const(indices), call.attrs.axis, mode="clip")

    def _constant_indices(self, expr):
        """The indices ``expr`` stands for when they are known: a constant (or a variable bound to
        one), or ONNX's
        ``where(less(c, 0), _, c)`` of a constant ``c >= 0``; else None."""
        value = const_value(expr)
        if value is None:  # a variable bound to a constant (what the NumPy fold leaves)
            value = const_value(self.lookup(expr))
        if value is not None:
            return value
        where = self.lookup(expr)
        if not is_op_call(where, "relax.where"):
            return None
        cond, _, kept = where.args
        value = const_value(kept)
        less = self.lookup(cond)
        if value is None or value.size == 0 or value.min() < 0 or not is_op_call(less, "relax.less"):
            return None
        return value if less.args[0].same_as(kept) else None


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.BoundConstantTakes")
class BoundConstantTakes:  # pylint: disable=too-few-public-methods
    """Put the ``take`` calls whose constant indices are all inside the gathered axis in mode
    ``"clip"`` (same values). The module is returned unchanged (the same object) when there is none."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_ConstantTakes, mod)


__all__ = ["BoundConstantTakes"]
