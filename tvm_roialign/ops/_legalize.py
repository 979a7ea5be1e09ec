"""One legalization for the RoIAlign-like ops: the call becomes ``call_tir`` of a PrimFunc that the
strategy of the call's target computes and schedules.

The target is the call's own ``vdevice`` (its output's, else its arguments'), as TVM's
``BackendDispatcher`` finds it, so that a heterogeneous module gets one strategy per device; else the
current target (``tvm.target.Target.current()``, set by ``tvm.compile`` and by a ``with target:``
block around ``LegalizeOps``); else this machine's generic llvm. A call with a ``vdevice`` gets a
PrimFunc marked with its ``target`` and named after it (``roi_align_nchw_cuda``), as TVM's own
legalization does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar

import tvm
import tvm_ffi
from tvm import relax, te, tirx

from ..strategies import host_target, select_strategy
from ..strategies.base import without_global_symbol

__all__ = [
    "FreshDims",
    "call_target",
    "call_vdevice",
    "checkable_shapes",
    "dict_attrs_values",
    "legalize_with_strategy",
    "tensor_info",
]


def tensor_info(expr, name: str):
    """``(shape values or None, ndim, dtype)`` of a tensor-typed Relax expression."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType):
        raise TypeError(f"{name} must be a tensor, got {ty}")
    shape = None if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr) else list(
        ty.shape.values
    )
    return shape, int(ty.ndim), str(ty.dtype)


class FreshDims:
    """Replace composite symbolic dimensions (``K0 + K1``) by fresh variables.

    A PrimFunc can only take its symbolic sizes from buffer shapes; a dimension such as
    ``K0 + K1`` (rois concatenated from two inputs) defines neither variable. A fresh variable
    per distinct composite dimension is bound from the buffer's shape at run time instead.
    """

    def __init__(self):
        self._seen: list[tuple[tirx.PrimExpr, tirx.Var]] = []

    def __call__(self, shape):
        return [self._dim(d) for d in shape]

    def _dim(self, dim):
        if isinstance(dim, (int, tirx.IntImm, tirx.Var)):
            return dim
        for expr, var in self._seen:
            if tvm_ffi.structural_equal(expr, dim):
                return var
        var = tirx.Var(f"dim{len(self._seen)}", "int64")
        self._seen.append((dim, var))
        return var


def call_vdevice(call) -> relax.VDevice | None:
    """The virtual device of a call: its output's, else the first argument's that has one."""
    for ty in (call.ty, *(arg.ty for arg in call.args)):
        if isinstance(ty, relax.TensorType) and ty.vdevice is not None:
            return ty.vdevice
    return None


def call_target(call) -> tvm.target.Target:
    """The target a call is legalized for: its vdevice's, else the current one, else the host's."""
    vdevice = call_vdevice(call)
    if vdevice is not None:
        return vdevice.target
    return tvm.target.Target.current(allow_none=True) or host_target()


def legalize_with_strategy(
    bb: relax.BlockBuilder,
    call: relax.Call,
    *,
    name: str,
    inputs: Sequence[tuple[relax.Expr, str]],
    compute: Callable,
    layout: str,
    attrs=None,
    func_attrs: dict | None = None,
) -> relax.Call:
    """``call_tir`` of the PrimFunc of ``compute(*placeholders)`` built by the call's strategy.

    Parameters
    ----------
    name : str
        Name of the PrimFunc added to the module (the target kind is appended for a call with a
        vdevice).
    inputs : [(expr, argument name)]
        The call's tensor arguments, in the order ``compute`` takes them.
    compute : callable
        ``(*te.Tensor) -> te.Tensor``, the op's TE compute with its attributes bound.
    layout : str
        The op's layout (recorded on the PrimFunc for the schedule rules).
    attrs : optional
        The op's attributes, for a strategy-specific kernel (``Strategy.kernel``).
    func_attrs : dict, optional
        More PrimFunc attributes for the schedule rules (e.g. ``roi_align.gathered_channels``).

    Raises
    ------
    ValueError
        An input of unknown rank or shape; a target no strategy serves.
    """
    op_name = call.op.name.rsplit(".", 1)[-1]
    fresh = FreshDims()
    placeholders = []
    for expr, arg_name in inputs:
        shape, _, dtype = tensor_info(expr, arg_name)
        if shape is None:
            raise ValueError(f"{op_name} needs {arg_name} of known rank and shape to legalize")
        tensor_name = arg_name.replace("[", "_").replace("]", "")  # features[0] -> features_0
        placeholders.append(te.placeholder(fresh(shape), dtype, tensor_name))
    strategy, target = select_strategy(call_target(call))
    func = without_global_symbol(
        strategy.build(compute, placeholders, target, layout, attrs, func_attrs)
    )
    if call_vdevice(call) is not None:
        func = func.with_attr("target", target)
        name = f"{name}_{target.kind.name}"
    gvar = bb.add_func(func, name)
    return relax.call_tir(gvar, list(call.args), call.ty)


def dict_attrs_values(attrs, op_name: str) -> dict:
    """The fields of an ``ir.DictAttrs`` as a dict (also one built with ``__dict__=``); ValueError
    for a call without attributes."""
    if attrs is None:
        raise ValueError(f"{op_name} needs its attributes (pooled_size, spatial_scale, ...)")
    values = dict(attrs.items())
    if set(values) == {"__dict__"}:  # built with make_node("ir.DictAttrs", __dict__={...})
        values = dict(values["__dict__"].items())
    return values


class DictAttrsFields:
    """For a frozen dataclass of an op's attributes carried as an ``ir.DictAttrs`` whose keys are the
    field names: :meth:`from_call` and :meth:`to_attrs` from the fields, so the ops of the family
    spell and convert their attributes one way. A field without a default is required; a tuple
    field holds ints; the others take the type of their default."""

    OP_NAME: ClassVar[str]

    @classmethod
    def from_call(cls, call):
        values = dict_attrs_values(call.attrs, cls.OP_NAME)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in values:
                if f.default is dataclasses.MISSING:
                    raise ValueError(f"{cls.OP_NAME} attributes lack {f.name!r}")
                continue
            kwargs[f.name] = _field_value(f, values[f.name])
        return cls(**kwargs)

    def to_attrs(self) -> tvm.ir.Attrs:
        items = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            items[f.name] = [int(v) for v in value] if isinstance(value, tuple) else value
        return tvm.ir.make_node("ir.DictAttrs", **items)


def _field_value(f, value):
    if f.default is dataclasses.MISSING:  # the pooled size: a pair of ints
        return tuple(int(v) for v in value)
    kind = type(f.default)
    return kind(str(value)) if kind is str else kind(value)


def checkable_shapes(call):
    """``((data shape or None, data shape to check, dtype), (the same for rois))`` of
    ``call.args[:2]``: the shape to check has None for unknown dimensions (rank 4 / 2 where the
    rank is unknown), for the ops' argument checks."""
    data_shape, data_ndim, data_dtype = tensor_info(call.args[0], "data")
    rois_shape, rois_ndim, rois_dtype = tensor_info(call.args[1], "rois")
    check_data = data_shape if data_shape is not None else [None] * (4 if data_ndim == -1 else data_ndim)
    check_rois = rois_shape if rois_shape is not None else [None] * (2 if rois_ndim == -1 else rois_ndim)
    return (data_shape, check_data, data_dtype), (rois_shape, check_rois, rois_dtype)
