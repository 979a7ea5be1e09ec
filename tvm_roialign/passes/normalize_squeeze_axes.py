"""Give every ``squeeze`` explicit, non-negative axes.

TVM's layout inference for ``squeeze`` drops every axis it names from the layout: a negative axis
(``squeeze(x, axis=[-2])``, which torch.export produces for ``nn.MultiheadAttention``) ends
``relax.transform.ConvertLayout`` in ``std::bad_alloc``, and an axis whose extent is not 1 (the
importer writes ``x.squeeze()`` as a squeeze of every axis; the op leaves the others, the layout
rule does not) in "Cannot operate on an undefined bijective layout".
:class:`~.convert_layout.ConvertLayout` runs this pass first: a negative axis is counted from the
front, axes of a static extent other than 1 are left out, a ``squeeze`` without axes of an input of
static shape names its unit axes, and one with no axis left becomes its input. The values are
unchanged.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import FunctionRewriter, is_op_call, rewrite_module, tensor_shape


@mutator
class _SqueezeAxes(FunctionRewriter):
    """``squeeze(x, axis=[-k])`` -> ``squeeze(x, axis=[ndim - k])`` where the rank is known, the
    axes of a static extent other than 1 left out; ``squeeze(x)`` -> ``squeeze(x, axis=[unit
    axes])`` where the shape is known; ``x`` where no axis is left."""

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if not is_op_call(call, "relax.squeeze"):
            return call
        data = call.args[0]
        ty = data.ty
        ndim = int(ty.ndim) if isinstance(ty, relax.TensorType) else -1
        if ndim < 0:
            return call
        shape = tensor_shape(data) or [None] * ndim
        given = call.attrs.axis
        if given is None:
            if None in shape:
                return call
            axes = [axis for axis, dim in enumerate(shape) if dim == 1]
        else:
            # axes of a static extent other than 1 are not squeezed: they are left out
            axes = [int(a) % ndim for a in given]
            axes = [a for a in axes if shape[a] in (None, 1)]
            if axes == [int(a) for a in given]:
                return call
        self.changed = True
        return relax.op.squeeze(data, axes) if axes else data


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.NormalizeSqueezeAxes")
class NormalizeSqueezeAxes:  # pylint: disable=too-few-public-methods
    """Rewrite every ``squeeze`` of an input of known rank with the non-negative axes it squeezes:
    negative axes counted from the front, static extents other than 1 left out, no axes (of a
    static shape) made the unit axes. The module is returned unchanged (the same object) when
    nothing changes."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_SqueezeAxes, mod)


__all__ = ["NormalizeSqueezeAxes"]
