"""Evaluate weight-packing calls on constants with NumPy instead of building them.

After ``SplitLayoutRewritePreproc``, each packed weight is ``call_tir(f_weight_prepack, (const,))``
where the PrimFunc is one block ``out[g(v)] = in[v]`` over the input's shape, ``g`` an index map
of ``+ - * // %`` and constants. ``FoldConstant`` would compile and run every such function (about a
tenth of a second each, seconds for a ResNet-50); here ``g`` is evaluated on NumPy index grids and
the constant permuted directly. A call whose function has any other form is left for
``FoldConstant``.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.expr_functor import mutator

from ._mutator import ConstantFolder, const_value, is_op_call, rewrite_module

_BINARY = {
    tirx.Add: np.add,
    tirx.Sub: np.subtract,
    tirx.Mul: np.multiply,
    tirx.FloorDiv: np.floor_divide,
    tirx.FloorMod: np.mod,
}


def _evaluate(expr, env: dict):
    if isinstance(expr, tirx.IntImm):
        return np.int64(int(expr))
    if isinstance(expr, tirx.Var):
        for var, value in env.items():
            if var.same_as(expr):
                return value
        raise KeyError(expr)
    if isinstance(expr, tirx.Cast):
        return _evaluate(expr.value, env)
    for node_type, fn in _BINARY.items():
        if isinstance(expr, node_type):
            return fn(_evaluate(expr.a, env), _evaluate(expr.b, env))
    raise NotImplementedError(type(expr).__name__)


def _copy_block(func: tirx.PrimFunc):
    """The single non-root block of ``func`` and its realize, or None."""
    found = []
    tvm_ffi_walk(func.body, found)
    blocks = [r for r in found if r.block.name_hint != "root"]
    return blocks[0] if len(blocks) == 1 else None


def tvm_ffi_walk(root, found: list) -> None:
    import tvm_ffi

    tvm_ffi.structural_walk(root, (s_tir.SBlockRealize, found.append), order="post")


def evaluate_layout_rewrite(
    func: tirx.PrimFunc, value: np.ndarray
) -> np.ndarray | None:
    """``func`` (``out[g(v)] = in[v]``) applied to ``value``, or None if it has another form."""
    realize = _copy_block(func)
    if realize is None or len(func.params) != 2:
        return None
    block = realize.block
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not hasattr(store.value, "indices"):
        return None
    iters = [it.var for it in block.iter_vars]
    load = store.value
    if len(load.indices) != len(iters) or not all(
        isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(load.indices, iters)
    ):
        return None
    extents = [int(it.dom.extent) for it in block.iter_vars]
    if tuple(extents) != value.shape:
        return None
    out_shape = [int(d) for d in func.params[1].ty.shape]
    fast = _split_and_move(store.indices, iters, extents, out_shape)
    if fast is not None:
        return fast(value)
    grids = np.indices(extents, dtype=np.int64, sparse=True)
    env = dict(zip(iters, grids))
    try:
        index = [np.broadcast_to(_evaluate(e, env), extents) for e in store.indices]
    except (KeyError, NotImplementedError):
        return None
    out = np.zeros(out_shape, dtype=value.dtype)
    out[tuple(index)] = value
    return out


def _split_and_move(indices, iters, extents, out_shape):
    """A reshape + transpose for the packing map ``(v[d] // B, v[others]..., v[d] % B)``, the form
    the contraction schedules write, or None."""
    if len(indices) != len(iters) + 1:
        return None
    first, last = indices[0], indices[-1]
    if not (isinstance(first, tirx.FloorDiv) and isinstance(last, tirx.FloorMod)):
        return None
    if not (isinstance(first.a, tirx.Var) and first.a.same_as(last.a)):
        return None
    if not (isinstance(first.b, tirx.IntImm) and isinstance(last.b, tirx.IntImm)):
        return None
    block = int(first.b)
    if block != int(last.b):
        return None
    dims = [next((d for d, v in enumerate(iters) if v.same_as(first.a)), None)]
    for index in indices[1:-1]:
        dims.append(next((d for d, v in enumerate(iters) if v.same_as(index)), None))
    if (
        None in dims
        or sorted(dims) != list(range(len(iters)))
        or extents[dims[0]] % block
    ):
        return None
    split = dims[0]

    def apply(value):
        shape = list(value.shape)
        shape[split : split + 1] = [shape[split] // block, block]
        # axes of the split array: d < split -> d, split -> (split, split + 1), d > split -> d + 1
        axis = [d if d < split else d + 1 for d in range(len(iters))]
        order = [split] + [axis[d] for d in dims[1:]] + [split + 1]
        out = np.ascontiguousarray(value.reshape(shape).transpose(order))
        return out if list(out.shape) == out_shape else None

    return apply


@mutator
class _LayoutRewriteFolder(ConstantFolder):
    def fold(self, call):
        if not is_op_call(call, "relax.call_tir"):
            return None
        gvar, args = call.args[0], call.args[1]
        if not isinstance(args, relax.Tuple) or len(args.fields) != 1:
            return None
        func = self.mod[gvar] if gvar in self.mod.get_global_vars() else None
        value = const_value(args.fields[0]) if isinstance(func, tirx.PrimFunc) else None
        return None if value is None else evaluate_layout_rewrite(func, value)


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.FoldLayoutRewrite")
class FoldLayoutRewrite:  # pylint: disable=too-few-public-methods
    """Replace weight-packing calls on constants by their packed constants (see module)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_LayoutRewriteFolder, mod)


__all__ = ["FoldLayoutRewrite", "evaluate_layout_rewrite"]
