"""Fold pairs of ``permute_dims``: a pair that composes to the identity disappears, any other pair
becomes one ``permute_dims``, and an identity ``permute_dims`` is dropped.

ConvertLayout leaves such pairs where two converted regions meet (``NHWC -> NCHW -> NHWC``); this
pass is the cleanup it runs after itself (:class:`~.convert_layout.ConvertLayout`).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import FunctionRewriter, is_op_call, rewrite_module


@mutator
class _PermuteDimsFolder(FunctionRewriter):
    """Folds ``permute_dims(permute_dims(x, a), b)`` into ``x`` or one ``permute_dims``, and
    ``permute_dims(x, identity)`` into ``x``."""

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not _is_permute(call):
            return call
        ndim = int(call.ty.ndim)
        if ndim < 0:
            return call
        if _axes(call, ndim) == list(range(ndim)):  # an identity permute_dims
            self.changed = True
            return call.args[0]
        inner = self.lookup(call.args[0])
        if inner is None or not _is_permute(inner):
            return call
        first, second = _axes(inner, ndim), _axes(call, ndim)
        composed = [first[i] for i in second]
        self.changed = True
        if composed == list(range(ndim)):
            return inner.args[0]
        return relax.op.permute_dims(inner.args[0], composed)


def _is_permute(expr) -> bool:
    return is_op_call(expr, "relax.permute_dims")


def _axes(call, ndim: int) -> list[int]:
    axes = call.attrs.axes
    if axes is None:
        return list(range(ndim - 1, -1, -1))
    return [int(a) % ndim for a in axes]


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.FoldPermuteDims")
class FoldPermuteDims:  # pylint: disable=too-few-public-methods
    """Remove ``permute_dims`` pairs that cancel (and identity ``permute_dims``); merge the other
    pairs into one ``permute_dims``.

    The module is returned unchanged (the same object) when no pair is found.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_PermuteDimsFolder, mod)


__all__ = ["FoldPermuteDims"]
