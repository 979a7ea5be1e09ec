"""What the rewriting passes share: a mutator over every Relax function of a module that reports
whether it changed anything, a driver that returns the module unchanged when it did not, the base of
the passes that replace calls by constants they compute (:class:`ConstantFolder`), and the few
queries on Relax expressions they all make."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator


class FunctionRewriter(PyExprMutator):
    """Rewrites every Relax function of ``mod``; subclasses set ``changed`` when they rewrite."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.changed = False

    def transform(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions_items():
            if isinstance(func, relax.Function):
                new_func = self.visit_expr(func)
                if not new_func.same_as(func):
                    self.builder_.update_func(gvar, relax.analysis.remove_all_unused(new_func))
        return self.builder_.get()

    def lookup(self, expr):
        """The value bound to ``expr`` when it is a Var of the current function, else None."""
        return self.lookup_binding(expr) if isinstance(expr, relax.Var) else None


class ConstantFolder(FunctionRewriter):
    """Replaces every operator call whose value :meth:`fold` computes by that constant (calls are
    visited after their arguments, so chains of foldable calls fold from the inside out)."""

    def fold(self, call: relax.Call) -> np.ndarray | None:
        """The value of ``call`` (an operator call), or None to keep the call."""
        raise NotImplementedError

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        value = self.fold(call)
        if value is None:
            return call
        self.changed = True
        return relax.const(value, str(value.dtype))

    # a variable bound to a constant is the constant where it is used (as FoldConstant makes
    # it): the calls it feeds see it, and no FoldConstant is needed after this pass to do so
    def visit_var_(self, var):  # pylint: disable=arguments-renamed
        return self._inlined(super().visit_var_(var))

    def visit_dataflow_var_(self, var):  # pylint: disable=arguments-renamed
        return self._inlined(super().visit_dataflow_var_(var))

    def _inlined(self, var):
        value = self.lookup(var)
        if value is not None and const_value(value) is not None:  # a tensor constant
            self.changed = True
            return value
        return var


def map_relax_functions(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    """``mod`` with each Relax function replaced by ``rewrite(function)``; the same module object
    when ``rewrite`` returns every function itself."""
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new = rewrite(func)
            if new is not func:
                updates[gv] = new
    if not updates:
        return mod
    mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
    for gv, func in updates.items():
        mod[gv] = func
    return mod


def rewrite_module(rewriter_cls, mod: tvm.IRModule, **attrs) -> tvm.IRModule:
    """Run ``rewriter_cls`` over ``mod``; the same module object when nothing matched.

    With ``attrs`` (a pass's parameters), ``rewriter_cls`` is an undecorated
    :class:`FunctionRewriter` subclass: it runs as a mutator subclass with those class attributes.
    """
    if attrs:
        name = rewriter_cls.__name__.lstrip("_")
        rewriter_cls = mutator(type(name, (rewriter_cls,), attrs))
    rewriter = rewriter_cls(mod)
    new_mod = rewriter.transform()
    return new_mod if rewriter.changed else mod


def is_op_call(expr, name: str) -> bool:
    """Whether ``expr`` is a call of the Relax operator ``name`` (e.g. ``"relax.matmul"``)."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def const_value(expr) -> np.ndarray | None:
    """The NumPy value of ``expr`` when it is a constant, else None."""
    value = expr.value if isinstance(expr, tvm.ir.expr.Constant) else None
    return value.numpy() if hasattr(value, "numpy") else None  # not a scalar immediate


def tensor_shape(expr) -> list[int | None] | None:
    """The shape of the tensor ``expr`` (None for a symbolic dimension), or None when its rank is
    unknown or it is not a tensor."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [int(dim) if isinstance(dim, tvm.tirx.IntImm) else None for dim in ty.shape.values]
