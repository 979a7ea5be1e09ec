"""``relax.transform.FoldConstant``, run only where it can change something.

TVM 0.27's ``FoldConstant`` legalizes every operator call of a dataflow block to TIR before it
looks at the call's arguments (a ``create_prim_func`` per call), so a pass over a detector that has
nothing left to fold still costs about a second: 873 legalizations for Mask R-CNN, five such passes
in a build. What it changes, read from its source: a call whose arguments are all values the module
holds (constants, or variables bound to them; static shapes and numbers; a call without tensor
arguments, ``zeros(shape)``, too), folded when its output's shape is static; a variable bound to a
constant, whose uses it replaces by the constant; an operator's argument bound to a shape, replaced
by the shape. This pass looks for those first, in one walk over the bindings, and runs
``FoldConstant`` on the module only when it finds one (or a branch or inner function it does not
look into): a superset of what ``FoldConstant`` changes, so the result is ``FoldConstant``'s.
"""

from __future__ import annotations

import tvm
from tvm import relax

#: expressions a run computes (or that this walk does not look into); any other is a value the
#: module holds: a constant, a shape, a scalar, a string, a dtype, a function's name
_COMPUTED = (relax.Var, relax.Call, relax.TupleGetItem, relax.SeqExpr, relax.If, relax.Function)


def _static(expr, static_vars: set) -> bool:
    """Whether ``expr`` is a value the module holds (a variable only if bound to one)."""
    if isinstance(expr, relax.Tuple):
        return all(_static(field, static_vars) for field in expr.fields)
    if isinstance(expr, relax.Var):
        return expr in static_vars
    if isinstance(expr, relax.ShapeExpr):  # a shape of symbolic sizes is known only in a run
        return all(_static(value, static_vars) for value in expr.values)
    if tvm.ir.is_prim_expr(expr):  # a scalar: a number, or an expression of symbolic sizes
        return isinstance(expr, tvm.tirx.IntImm | tvm.tirx.FloatImm)
    return not isinstance(expr, _COMPUTED)


#: operators FoldConstant evaluates without legalizing them
_SPECIAL = ("relax.call_tir", "relax.tensor_to_shape", "relax.shape_to_tensor")


def _evaluable(op) -> bool:
    """Whether FoldConstant can evaluate a call of ``op``: one it legalizes, or one it knows."""
    if not isinstance(op, tvm.ir.Op):
        return False
    return op.name in _SPECIAL or op.get_attr("FLegalize") is not None


def _foldable(func: relax.Function) -> bool:
    """Whether ``func`` binds a variable to a constant (``FoldConstant`` replaces its uses by the
    constant), calls an operator with a variable bound to a shape (replaced by the shape), or
    calls an operator (or ``call_tir``) on values only; in a dataflow block or not (True too for
    what this walk does not look into: branches, inner functions)."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return True
    static_vars: set = set()
    shape_vars: set = set()
    for block in body.blocks:
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if isinstance(value, relax.If | relax.Function | relax.SeqExpr):
                return True
            if isinstance(value, relax.ShapeExpr):
                shape_vars.add(binding.var)
                if _static(value, static_vars):
                    static_vars.add(binding.var)
            elif isinstance(value, relax.Tuple):
                if _static(value, static_vars):
                    static_vars.add(binding.var)
            elif isinstance(value, relax.Call):
                if _evaluable(value.op) and (
                    all(_static(arg, static_vars) for arg in value.args)
                    or any(isinstance(arg, relax.Var) and arg in shape_vars for arg in value.args)
                ):
                    return True
            elif value is not None and not isinstance(value, _COMPUTED):
                return True
    return False


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.FoldConstantIfFoldable")
class FoldConstantIfFoldable:
    """``relax.transform.FoldConstant()`` on the module when one of its Relax functions has
    something it folds (see the module doc), else the module unchanged."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        functions = [f for f in mod.functions.values() if isinstance(f, relax.Function)]
        if any(_foldable(f) for f in functions):
            return relax.transform.FoldConstant()(mod)
        return mod


__all__ = ["FoldConstantIfFoldable"]
