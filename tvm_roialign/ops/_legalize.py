"""What the ops' registrations share: struct-info helpers, attribute conversion, and the
legalization of a call to ``call_tir`` of a PrimFunc built by the strategy of the call's target.

The target is resolved once per call (:func:`call_target`): the call's ``vdevice``, else the
current target, else the host's llvm; it is then passed to the compute. A call with a ``vdevice``
gets a PrimFunc marked with its ``target`` and named after it (``roi_align_nchw_cuda``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import ClassVar

import tvm
import tvm_ffi
from tvm import relax, te, tirx

from .. import _registry
from ..strategies import host_target, select_strategy
from ..strategies.base import without_global_symbol
from ..topi._args import data_dims, output_shape

__all__ = [
    "FreshDims",
    "add_prim_func",
    "call_target",
    "call_vdevice",
    "checkable",
    "checkable_shapes",
    "data_channels",
    "dict_attrs_values",
    "infer_pooled_type",
    "legalize_with_strategy",
    "pooled_output_type",
    "register_op",
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
    """Replace composite symbolic dimensions (``K0 + K1``) by one fresh variable each, which a
    PrimFunc can bind from its buffer's shape."""

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
    """The target a call is legalized for: its vdevice's, else the current one, else the host's
    (the one place the legalizations read the current target)."""
    vdevice = call_vdevice(call)
    if vdevice is not None:
        return vdevice.target
    return tvm.target.Target.current(allow_none=True) or host_target()


def add_prim_func(bb: relax.BlockBuilder, call, func, name: str, target) -> relax.GlobalVar:
    """Add ``func`` for ``call``; with a ``vdevice`` marked with ``target`` and named after it."""
    if call_vdevice(call) is not None:
        func = func.with_attr("target", target)
        name = f"{name}_{target.kind.name}"
    return bb.add_func(func, name)


def legalize_with_strategy(
    bb: relax.BlockBuilder,
    call: relax.Call,
    *,
    compute: Callable,
    layout: str,
    inputs: Sequence[tuple[relax.Expr, str]] | None = None,
    attrs=None,
    func_attrs: dict | None = None,
) -> relax.Call:
    """``call_tir`` of the PrimFunc of ``compute(*placeholders, target=target)`` (the op's TE
    compute with its attributes bound) built by the strategy of :func:`call_target`.

    ``inputs``: ``[(expr, argument name)]`` in ``compute``'s order (default: ``data``, ``rois``);
    ``layout`` and ``func_attrs`` go on the PrimFunc for the schedule rules; ``attrs`` to a
    strategy's own kernel. The PrimFunc is named ``<op>_<layout>``. ValueError for an input of
    unknown shape or a target no strategy serves.
    """
    op_name = call.op.name.rsplit(".", 1)[-1]
    if inputs is None:
        inputs = [(call.args[0], "data"), (call.args[1], "rois")]
    fresh = FreshDims()
    placeholders = []
    for expr, arg_name in inputs:
        shape, _, dtype = tensor_info(expr, arg_name)
        if shape is None:
            raise ValueError(f"{op_name} needs {arg_name} of known rank and shape to legalize")
        tensor_name = arg_name.replace("[", "_").replace("]", "")  # features[0] -> features_0
        placeholders.append(te.placeholder(fresh(shape), dtype, tensor_name))
    strategy, target = select_strategy(call_target(call))
    bound = functools.partial(compute, target=target)
    func = without_global_symbol(
        strategy.build(bound, placeholders, target, layout, attrs, func_attrs)
    )
    gvar = add_prim_func(bb, call, func, f"{op_name}_{layout.lower()}", target)
    return relax.call_tir(gvar, list(call.args), call.ty)


def register_op(op_name: str, infer_struct_info, legalize, *, stock: bool = False) -> None:
    """Our ``FInferType`` and ``FLegalize`` for ``op_name`` (idempotent, reversible); an op of our
    own (not ``stock``) is registered first and marked pure."""
    if not stock:
        _registry.get_or_register_op(op_name)
    _registry.set_op_attr(op_name, "FInferType", infer_struct_info)
    if not stock:
        _registry.set_op_attr(op_name, "FPurity", True)
    _registry.set_op_attr(op_name, "FLegalize", legalize)


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


def checkable(shape, ndim: int, rank: int):
    """``shape``, else Nones for its unknown dimensions (``rank`` of them where ``ndim`` is -1)."""
    if shape is not None:
        return shape
    return [None] * (rank if ndim == -1 else ndim)


def checkable_shapes(call):
    """``((data shape or None, data shape to check, dtype), (the same for rois))`` of
    ``call.args[:2]`` (:func:`checkable`), for the ops' argument checks."""
    data_shape, data_ndim, data_dtype = tensor_info(call.args[0], "data")
    rois_shape, rois_ndim, rois_dtype = tensor_info(call.args[1], "rois")
    return (
        (data_shape, checkable(data_shape, data_ndim, 4), data_dtype),
        (rois_shape, checkable(rois_shape, rois_ndim, 2), rois_dtype),
    )


def pooled_output_type(call, rois_shape, pooled, channels, layout, dtype):
    """The output type of a RoIAlign-like call, on ``call.args[0]``'s vdevice: ``[K, C, PH, PW]``
    / ``[K, PH, PW, C]``, rank 4 where the rois' shape or ``channels`` is unknown (None)."""
    vdevice = call.args[0].ty.vdevice
    if rois_shape is None or channels is None:
        return relax.TensorType(ndim=4, dtype=dtype, vdevice=vdevice)
    shape = output_shape(rois_shape[0], channels, pooled, layout)
    return relax.TensorType(list(shape), dtype, vdevice=vdevice)


def infer_pooled_type(call, layout, check):
    """The output type of a ``(data, rois)`` call: ``check(data shape, data dtype, rois shape,
    rois dtype)`` (None for unknown dimensions) raises for bad arguments and returns ``((PH, PW),
    output channels or None)``."""
    (_, check_data, dtype), (rois_shape, check_rois, rois_dtype) = checkable_shapes(call)
    pooled, channels = check(check_data, dtype, check_rois, rois_dtype)
    return pooled_output_type(call, rois_shape, pooled, channels, layout, dtype)


def data_channels(data_shape, layout):
    """The channel count of a data shape (None where unknown)."""
    return data_dims(data_shape, layout)[1]
