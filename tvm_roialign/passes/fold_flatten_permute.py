"""Fold the layout transpose in front of a flatten + dense layer into the dense layer's weight.

After ``ConvertLayout`` to NHWC, a box head that flattens pooled rois (``[K, PH, PW, C]``) for a dense
layer (torchvision's ``TwoMLPHead``: ``flatten(1)`` then ``fc6``) gets a ``permute_dims`` back to NCHW
right after RoIAlign, because ``reshape`` has no layout rule and the flatten order is NCHW's. When the
weight is a constant, that transpose can instead be applied once to the weight's rows:

    matmul(reshape(permute_dims(x, axes), [K, D]), W)  ==  matmul(reshape(x, [K, D]), W')

with ``W'`` the rows of ``W`` reordered to ``x``'s flatten order. The sums are the same, over ``D`` in
another order (so float results may differ in the last bits). ``W`` may be a constant or
``permute_dims`` of a constant (a ``linear`` before FoldConstant). Other graphs are left unchanged
(the same module object is returned).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import FunctionRewriter, is_op_call, rewrite_module, tensor_shape


@mutator
class _FlattenPermuteFolder(FunctionRewriter):
    def _constant_weight(self, expr):
        """The dense weight ``[D, O]`` as a NumPy array, or None."""
        if isinstance(expr, tvm.ir.expr.Constant):
            value = expr.value.numpy()
            return value if value.ndim == 2 else None
        bound = self.lookup(expr)
        if is_op_call(bound, "relax.permute_dims") and isinstance(
            bound.args[0], tvm.ir.expr.Constant
        ):
            value = bound.args[0].value.numpy()
            axes = bound.attrs.axes
            if value.ndim == 2 and (axes is None or [int(a) for a in axes] == [1, 0]):
                return value.T
        return None

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not is_op_call(call, "relax.matmul"):
            return call
        flat = self.lookup(call.args[0])
        weight = self._constant_weight(call.args[1])
        if weight is None or not is_op_call(flat, "relax.reshape"):
            return call
        permuted = self.lookup(flat.args[0])
        if not is_op_call(permuted, "relax.permute_dims"):
            return call
        source = permuted.args[0]
        source_shape = tensor_shape(source)
        flat_shape = tensor_shape(flat)
        if source_shape is None or flat_shape is None or len(flat_shape) != 2:
            return call
        ndim = len(source_shape)
        axes = permuted.attrs.axes
        axes = list(range(ndim))[::-1] if axes is None else [int(a) for a in axes]
        inner = source_shape[1:]
        if ndim < 3 or axes[0] != 0 or None in inner:
            return call
        depth = int(np.prod(inner))
        if flat_shape[1] != depth or weight.shape[0] != depth:
            return call
        # weight rows are in the permuted tensor's flatten order; reorder them to the source's
        permuted_dims = [source_shape[a] for a in axes[1:]]
        rows = weight.reshape(*permuted_dims, weight.shape[1])
        to_source = [axes[1:].index(a) for a in range(1, ndim)]
        new_weight = rows.transpose(*to_source, ndim - 1).reshape(
            depth, weight.shape[1]
        )
        self.changed = True
        new_flat = relax.op.reshape(source, flat.args[1])
        out_dtype = call.attrs.out_dtype
        return relax.op.matmul(
            new_flat,
            relax.const(np.ascontiguousarray(new_weight)),
            out_dtype=str(out_dtype) if out_dtype is not None else None,
        )


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.FoldFlattenPermute")
class FoldFlattenPermute:  # pylint: disable=too-few-public-methods
    """Move a transpose that feeds ``flatten -> matmul(constant)`` into the constant (see module)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_FlattenPermuteFolder, mod)


__all__ = ["FoldFlattenPermute"]
