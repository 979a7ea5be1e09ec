"""Fold layout and arithmetic ops on constants with NumPy.

A model imported with its weights as constants, then moved to another layout, holds every weight
as ``permute_dims(constant)``; a decomposed batch-norm holds ``sqrt``, ``divide``, ``multiply`` of
constants; torch.roll gathers at ``(arange(n) + shift) % n``; swin_t's attention masks are
``slice_scatter`` of slices into ``full`` tensors. ``relax.transform.FoldConstant`` legalizes, compiles and
runs each such call (about a tenth of a second each: seconds for a ResNet; ``arange`` of scalars it
leaves alone, and so the gather its indices feed; ``slice_scatter`` legalizes to a gather that makes
TVM warn of out-of-bounds indices). The ops below are evaluated here with NumPy instead, in the
constant's own dtype (IEEE-rounded like the compiled code); anything else is left for
``FoldConstant``.
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
    if name == "relax.full":
        shape, fill = _static_shape(args[0]), const_value(args[1])
        return None if shape is None or fill is None else np.full(shape, fill, str(call.attrs.dtype))
    if name in ("relax.zeros", "relax.ones"):
        shape = _static_shape(args[0])
        make = np.zeros if name == "relax.zeros" else np.ones
        return None if shape is None else make(shape, str(call.attrs.dtype))
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
    if name == "relax.slice_scatter":
        return _slice_scatter(call, x, consts[1] if len(consts) > 1 else None)
    if name == "relax.strided_slice":
        return _strided_slice(call, x)
    if name == "relax.broadcast_to":
        shape = _static_shape(args[1])
        return None if shape is None else np.ascontiguousarray(np.broadcast_to(x, shape))
    return None


def _strided_slice(call, x) -> np.ndarray | None:
    """``x[begin:end:stride]`` on the call's axes (NumPy's clamping, as TVM's), forward strides."""
    parts = []
    for arg in call.args[1:]:
        values = [_scalar(v) for v in arg] if isinstance(arg, relax.Tuple) else None
        if values is None or None in values:
            return None
        parts.append(values)
    axes, begin, end = parts[:3]
    strides = parts[3] if len(parts) > 3 else [1] * len(axes)
    if min(strides, default=1) < 1:
        return None
    index = [slice(None)] * x.ndim
    for axis, b, e, step in zip(axes, begin, end, strides):
        index[axis % x.ndim] = slice(b, e, step)
    return np.ascontiguousarray(x[tuple(index)])


def _slice_scatter(call, x, src) -> np.ndarray | None:
    """``x`` with ``x[..., start:end:step, ...] = src`` along the call's axis (constants only)."""
    bounds = [_scalar(a) for a in call.args[2:5]]
    if src is None or None in bounds or src.dtype != x.dtype or min(bounds) < 0 or bounds[2] == 0:
        return None
    index = [slice(None)] * x.ndim
    index[int(call.attrs.axis) % x.ndim] = slice(*bounds)
    out = x.copy()
    if out[tuple(index)].shape != src.shape:
        return None
    out[tuple(index)] = src
    return out


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
