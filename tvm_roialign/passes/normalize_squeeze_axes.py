"""Write the negative axes of ``squeeze`` as non-negative ones.

TVM's layout inference for ``squeeze`` indexes its layout with the axis as given, so a negative axis
(``squeeze(x, axis=[-2])``, which torch.export produces for ``nn.MultiheadAttention``) ends
``relax.transform.ConvertLayout`` in ``std::bad_alloc``. :class:`~.convert_layout.ConvertLayout`
runs this pass first; the values are unchanged.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import FunctionRewriter, is_op_call, rewrite_module


@mutator
class _SqueezeAxes(FunctionRewriter):
    """``squeeze(x, axis=[-k])`` -> ``squeeze(x, axis=[ndim - k])`` where the rank is known."""

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not is_op_call(call, "relax.squeeze") or call.attrs.axis is None:
            return call
        axes = [int(a) for a in call.attrs.axis]
        ty = call.args[0].ty
        ndim = int(ty.ndim) if isinstance(ty, relax.TensorType) else -1
        if ndim < 0 or all(a >= 0 for a in axes):
            return call
        self.changed = True
        return relax.op.squeeze(call.args[0], [a % ndim for a in axes])


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.NormalizeSqueezeAxes")
class NormalizeSqueezeAxes:  # pylint: disable=too-few-public-methods
    """Rewrite every ``squeeze`` with a negative axis (of an input of known rank) with the same axis
    counted from the front. The module is returned unchanged (the same object) when there is none."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_SqueezeAxes, mod)


__all__ = ["NormalizeSqueezeAxes"]
