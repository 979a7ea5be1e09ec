"""A gather of one constant index along an axis as a slice of that axis.

The query / key / value split of an attention layer (``qkv[0]``, ``qkv[1]``, ``qkv[2]``) and
``x[:, 0]`` (a ViT's class token) arrive as ``take(x, i, axis)`` with a scalar constant ``i``.
TVM's ``take`` reads its index from a buffer, so ``AnnotateTIROpPattern`` calls it opaque: it
is never fused, and runs as a kernel of its own that copies the slice element by element. Where
``i`` is a scalar integer constant inside a static axis (after a negative one counted from the
end as ``mode="wrap"`` or ``"clip"`` would not: only ``0 <= i < n`` is rewritten), the same
values are ``squeeze(strided_slice(x, [axis], [i], [i + 1]), [axis])``: injective ops that fuse
with their consumer (the head split's reshape and transpose). Other gathers stay as they are.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import FunctionRewriter, const_value, is_op_call, rewrite_module, tensor_shape


@mutator
class _TakesAsSlices(FunctionRewriter):
    """``take(x, i, axis)`` -> ``squeeze(strided_slice(x, [axis], [i], [i + 1]), [axis])`` for a
    scalar integer constant ``i`` in ``[0, n)`` of a static axis."""

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not is_op_call(call, "relax.take") or call.attrs.axis is None:
            return call
        index = const_value(call.args[1])
        shape = tensor_shape(call.args[0])
        if index is None or index.ndim != 0 or index.dtype.kind not in "iu" or shape is None:
            return call
        axis = int(call.attrs.axis) % len(shape)
        i = int(index)
        if shape[axis] is None or not 0 <= i < shape[axis]:
            return call
        self.changed = True
        sliced = self.builder_.emit(relax.op.strided_slice(call.args[0], [axis], [i], [i + 1]))
        return relax.op.squeeze(sliced, [axis])


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.TakesAsSlices")
class TakesAsSlices:  # pylint: disable=too-few-public-methods
    """Rewrite every gather of one in-bounds constant index along a static axis as a slice (see
    the module). The module is returned unchanged (the same object) when nothing matches."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_TakesAsSlices, mod)


__all__ = ["TakesAsSlices"]
