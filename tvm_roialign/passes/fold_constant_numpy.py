"""Fold layout and arithmetic ops on constants with NumPy.

A model imported with its weights as constants, then moved to another layout, holds every weight
as ``permute_dims(constant)``; a decomposed batch-norm holds ``sqrt``, ``divide``, ``multiply`` of
constants; torch.roll gathers at ``(arange(n) + shift) % n``. ``relax.transform.FoldConstant``
legalizes, compiles and runs each such call (about a tenth of a second each: seconds for a ResNet;
``arange`` of scalars it leaves alone, and so the gather its indices feed). The ops below are
evaluated here with NumPy instead, in the constant's own dtype (IEEE-rounded like the compiled
code); anything else is left for ``FoldConstant``.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import ConstantFolder, const_value, rewrite_module

_BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.mod": np.fmod,
    "relax.floor_mod": np.mod,
}
_UNARY = {"relax.sqrt": np.sqrt, "relax.negative": np.negative, "relax.exp": np.exp}


def _axes(value) -> list[int] | None:
    return None if value is None else [int(a) for a in value]


def _static_shape(expr) -> list[int] | None:
    if not isinstance(expr, relax.ShapeExpr):
        return None
    try:
        return [int(v) for v in expr.values]
    except (TypeError, ValueError):
        return None


def _bound(expr, lookup):
    if isinstance(expr, relax.Var):
        value = lookup(expr)
        if value is not None:
            return value
    return expr


def _scalar(expr) -> int | float | None:
    """The number a static scalar argument (an immediate, or a PrimValue of one) stands for."""
    imm = (tvm.tirx.IntImm, tvm.tirx.FloatImm)
    if not isinstance(expr, imm):
        expr = getattr(expr, "value", None)
    return expr.value if isinstance(expr, imm) else None


def _arange(call) -> np.ndarray | None:
    """``arange(start, end, step)`` of static scalars (torch.roll's indices), else None."""
    bounds = [_scalar(a) for a in call.args]
    if len(bounds) != 3 or None in bounds:
        return None
    return np.arange(*bounds, dtype=str(call.attrs.dtype))


def evaluate(call, lookup=lambda expr: None) -> np.ndarray | None:
    """The value of ``call`` when it is one of the ops above on constants, else None
    (``lookup`` gives the value bound to a variable, if any)."""
    name = call.op.name
    if name == "relax.arange":
        return _arange(call)
    args = [_bound(a, lookup) for a in call.args]
    consts = [const_value(a) for a in args]
    if name in _BINARY and len(args) == 2 and all(c is not None for c in consts):
        a, b = consts
        if a.dtype != b.dtype or (name.endswith("mod") and not b.all()):
            return None
        return _BINARY[name](a, b).astype(a.dtype)
    if consts[0] is None:
        return None
    x = consts[0]
    if name in _UNARY:
        return _UNARY[name](x).astype(x.dtype)
    if name == "relax.permute_dims":
        return np.ascontiguousarray(np.transpose(x, _axes(call.attrs.axes)))
    if name == "relax.reshape":
        shape = _static_shape(args[1])
        return None if shape is None else x.reshape(shape)
    if name == "relax.expand_dims":
        return np.expand_dims(x, tuple(_axes(call.attrs.axis)))
    if name == "relax.squeeze":
        axes = _axes(call.attrs.axis)
        return np.squeeze(x, tuple(axes)) if axes is not None else np.squeeze(x)
    if name == "relax.astype":
        return x.astype(str(call.attrs.dtype))
    return None


@mutator
class _NumPyFolder(ConstantFolder):
    def fold(self, call):
        try:
            return evaluate(call, self.lookup)
        except (ValueError, TypeError, AttributeError):
            return None


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.FoldConstantNumPy")
class FoldConstantNumPy:  # pylint: disable=too-few-public-methods
    """Evaluate layout and arithmetic ops on constants with NumPy (see module)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_NumPyFolder, mod)


__all__ = ["FoldConstantNumPy", "evaluate"]
