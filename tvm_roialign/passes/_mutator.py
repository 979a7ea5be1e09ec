"""What the folding passes share: a mutator over every Relax function of a module that reports
whether it changed anything, and a driver that returns the module unchanged when it did not."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator


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


def rewrite_module(rewriter_cls, mod: tvm.IRModule) -> tvm.IRModule:
    """Run ``rewriter_cls`` over ``mod``; the same module object when nothing matched."""
    rewriter = rewriter_cls(mod)
    new_mod = rewriter.transform()
    return new_mod if rewriter.changed else mod
