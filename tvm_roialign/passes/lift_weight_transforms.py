"""Winograd-transformed weights computed when a library is loaded, not stored in it.

:class:`~tvm_roialign.passes.WinogradConv2D` replaces a 3x3 weight ``W`` by ``U = G W G^T``:
``(m+2)^2 / 9`` times its size (4x for ``F(4x4)``, 5.4x for ``F(5x5)``), which phase 6 then packs
in the layout the matrix product reads. Stored as such, they made the default Mask R-CNN library
1.66x its fp32 weights. With a :class:`WinogradWeights` record of the rewrite (the pass writes each
``U`` it makes into it), this pass, run in phase 6 after ``SplitLayoutRewritePreproc`` and before
the packing is folded, moves each such weight (the packing call on it, when it has one) out of
the public functions into one function, :data:`LOAD_WEIGHTS`, that computes it from the 3x3
weight (:func:`~tvm_roialign.topi.winograd.weight_transform`, then the packing) and returns them
all; every other public function takes them, in that order, after its own arguments. The library
stores the 3x3 weights only; a loader calls :data:`LOAD_WEIGHTS` once and passes its results on
every call (:class:`tvm_roialign.runtime.LoadedVM`; the C++ example does the same).

A transformed weight met in a private function, or one the record does not know, stays a
constant (stored as before). A module without recorded weights is returned unchanged.
"""

from __future__ import annotations

import hashlib

import numpy as np
import tvm
from tvm import relax, s_tir, te
from tvm.relax.expr_functor import PyExprMutator, mutator

from .._names import LOAD_WEIGHTS, WEIGHT_PARAM
from ..topi.winograd import WEIGHT_BLOCK, weight_transform, weight_transform_terms
from ._mutator import const_value, is_op_call


def _key(value: np.ndarray) -> tuple:
    return (value.shape, str(value.dtype), hashlib.blake2b(value.tobytes(), digest_size=16).digest())


class WinogradWeights:
    """What :class:`~tvm_roialign.passes.WinogradConv2D` made: for each transformed weight ``U``
    (by value), the 3x3 weight it came from and the tile, so that :class:`LiftWeightTransforms`
    can compute it again from them. One record per build."""

    def __init__(self):
        self._sources: dict[tuple, tuple[np.ndarray, int]] = {}
        self._shapes: set[tuple] = set()

    def record(self, transformed: np.ndarray, weight_hwio: np.ndarray, m: int) -> None:
        """``transformed`` is ``transform_weight(weight_hwio, m)``."""
        self._sources[_key(transformed)] = (np.ascontiguousarray(weight_hwio), int(m))
        self._shapes.add(transformed.shape)

    def source(self, expr) -> tuple[tuple, np.ndarray, int] | None:
        """``(its key, hwio weight, m)`` of the constant ``expr`` when it is a recorded ``U``,
        else None (the key, a hash of its value, tells equal weights apart from others)."""
        if not isinstance(expr, tvm.ir.expr.Constant) or not hasattr(expr.value, "shape"):
            return None
        if tuple(int(d) for d in expr.value.shape) not in self._shapes:
            return None
        value = const_value(expr)
        if value is None:
            return None
        key = _key(value)
        found = self._sources.get(key)
        return None if found is None else (key, *found)

    def __len__(self) -> int:
        return len(self._sources)


def _weight_func(points: int, channels: int, filters: int) -> tvm.tirx.PrimFunc:
    """The transform of a ``[9, C, K]`` weight, its ``(point, channel)`` loop parallel."""
    weight = te.placeholder((9, channels, filters), "float32", "weight")
    terms = te.placeholder((points, 9), "float64", "terms")
    out = weight_transform(weight, terms)
    func = te.create_prim_func([weight, terms, out]).without_attr("global_symbol")
    sch = s_tir.Schedule(func)
    block = sch.get_sblock(WEIGHT_BLOCK)
    point, channel, _ = sch.get_loops(block)
    sch.parallel(sch.fuse(point, channel))
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


class _Lifted:
    """The weights lifted so far: their computations in :data:`LOAD_WEIGHTS`, in order."""

    def __init__(self, builder: relax.BlockBuilder):
        self.builder = builder
        self.items: list[tuple] = []  # (key, tensor type, emit(bb) -> Expr)
        self.index: dict = {}
        self.funcs: dict = {}

    def add(self, key, ty, emit) -> int:
        if key not in self.index:
            self.index[key] = len(self.items)
            self.items.append((key, ty, emit))
        return self.index[key]

    def weight_call(self, hwio: np.ndarray, m: int, ty):
        """``call_tir`` of the weight transform of ``hwio`` (the function added once per shape)."""
        channels, filters = hwio.shape[2], hwio.shape[3]
        terms = weight_transform_terms(m)
        shape = (terms.shape[0], channels, filters)
        if shape not in self.funcs:
            self.funcs[shape] = self.builder.add_func(_weight_func(*shape), "winograd_weight_transform")
        flat = relax.const(np.ascontiguousarray(hwio.reshape(9, channels, filters)))
        return relax.call_tir(self.funcs[shape], [flat, relax.const(terms, "float64")], ty)


@mutator
class _Rewriter(PyExprMutator):
    """Replaces, in one public function, the recorded weights (or the packing calls on them) by
    the function's new parameters."""

    def __init__(self, mod, record: WinogradWeights, lifted: _Lifted):
        super().__init__(mod)
        self.record = record
        self.lifted = lifted
        self.used: dict[int, relax.Var] = {}

    def _param(self, index: int, ty) -> relax.Var:
        if index not in self.used:
            self.used[index] = relax.Var(f"{WEIGHT_PARAM}{index}", ty)
        return self.used[index]

    def _lift_weight(self, const) -> relax.Var | None:
        source = self.record.source(const)
        if source is None:
            return None
        key, hwio, m = source
        ty = const.ty
        index = self.lifted.add(("weight", key), ty, lambda: self.lifted.weight_call(hwio, m, ty))
        return self._param(index, ty)

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        packed = self._packing_of_recorded(call)
        if packed is not None:
            return packed
        return self.visit_expr_post_order(call)

    def _packing_of_recorded(self, call) -> relax.Var | None:
        """A ``call_tir`` whose only argument is a recorded weight (its packing) as a parameter."""
        if not is_op_call(call, "relax.call_tir"):
            return None
        args = call.args[1]
        if not isinstance(args, relax.Tuple) or len(args.fields) != 1:
            return None
        source = self.record.source(args.fields[0])
        if source is None:
            return None
        key, hwio, m = source
        gvar, inner_ty, ty = call.args[0], args.fields[0].ty, call.ty

        def emit():
            weight = self.lifted.builder.emit(self.lifted.weight_call(hwio, m, inner_ty))
            return relax.call_tir(gvar, [weight], ty)

        return self._param(self.lifted.add(("packed", gvar.name_hint, key), ty, emit), ty)

    def visit_generic_const_(self, const):  # pylint: disable=arguments-renamed
        param = self._lift_weight(const)
        return const if param is None else param


@mutator
class _CallsWithWeights(PyExprMutator):
    """Points a function's calls of the public functions at their new GlobalVars, passing its own
    weight parameters on (a detector's ``detect_photo`` calls ``detect``; both take them)."""

    def __init__(self, mod, renamed: dict, weights: list):
        super().__init__(mod)
        self.renamed = renamed
        self.weights = weights

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if isinstance(call.op, tvm.ir.GlobalVar) and call.op.name_hint in self.renamed:
            callee = self.renamed[call.op.name_hint]
            return relax.Call(callee, [*call.args, *self.weights], call.attrs, call.ty_args)
        return call


def _public(func) -> bool:
    return isinstance(func, relax.Function) and func.attrs is not None and "global_symbol" in func.attrs


def _calls_public_from_private(mod: tvm.IRModule, public: dict) -> bool:
    """Whether a private Relax function calls a public one (it would have to pass the weights)."""
    names = {gvar.name_hint for gvar in public}
    found = []

    def visit(expr):
        if isinstance(expr, tvm.ir.GlobalVar) and expr.name_hint in names:
            found.append(expr)

    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and gvar not in public:
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def lift_weight_transforms(mod: tvm.IRModule, record: WinogradWeights) -> tvm.IRModule:
    """:class:`LiftWeightTransforms` on ``mod`` (the same module when nothing is lifted)."""
    if not len(record):
        return mod
    public = {gvar: func for gvar, func in mod.functions_items() if _public(func)}
    if any(gvar.name_hint == LOAD_WEIGHTS for gvar in public):
        raise ValueError(f"the module already has a function named {LOAD_WEIGHTS!r}")
    if _calls_public_from_private(mod, public):
        return mod
    builder = relax.BlockBuilder(mod)
    lifted = _Lifted(builder)
    bodies = {}
    for gvar, func in public.items():
        rewriter = _Rewriter(mod, record, lifted)
        bodies[gvar] = (rewriter.visit_expr(func).body, rewriter.used)
    if not lifted.items:
        return mod
    with builder.function(LOAD_WEIGHTS, [], {"global_symbol": LOAD_WEIGHTS}):
        with builder.dataflow():
            outputs = [builder.emit(emit()) for _key_, _ty, emit in lifted.items]
            result = builder.emit_output(relax.Tuple(outputs))
        builder.emit_func_output(result)
    # every public function takes all the weights (a loader passes the same list to each), under
    # a new GlobalVar: a GlobalVar carries its function's type, which calls are checked against
    functions = {gvar: func for gvar, func in builder.get().functions_items() if gvar not in public}
    renamed, weights = {}, {}
    for gvar, func in public.items():
        body, used = bodies[gvar]
        params = [
            used[i] if i in used else relax.Var(f"{WEIGHT_PARAM}{i}", ty)
            for i, (_key_, ty, _emit) in enumerate(lifted.items)
        ]
        new = relax.Function([*func.params, *params], body, func.ret_ty, func.is_pure, func.attrs)
        renamed[gvar.name_hint] = relax.GlobalVar(gvar.name_hint)
        relax.expr._update_type(renamed[gvar.name_hint], new.ty)  # pylint: disable=protected-access
        weights[gvar.name_hint] = params
        functions[renamed[gvar.name_hint]] = new
    out = tvm.IRModule(functions, attrs=mod.attrs)
    for name, gvar in renamed.items():
        out[gvar] = _CallsWithWeights(out, renamed, weights[name]).visit_expr(out[gvar])
    return relax.transform.DeadCodeElimination()(out)


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.LiftWeightTransforms")
class LiftWeightTransforms:  # pylint: disable=too-few-public-methods
    """Move the Winograd weights of ``record`` (and their packing) into :data:`LOAD_WEIGHTS`,
    computed from the 3x3 weights when the library is loaded (see module)."""

    def __init__(self, record: WinogradWeights):
        self.record = record

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return lift_weight_transforms(mod, self.record)


__all__ = ["LOAD_WEIGHTS", "LiftWeightTransforms", "WinogradWeights", "lift_weight_transforms"]
