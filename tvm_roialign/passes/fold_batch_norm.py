"""Fold an inference batch-norm into the convolution in front of it.

``batch_norm(conv2d(x, W), gamma, beta, mean, var)[0]`` with constant ``W`` and batch-norm
parameters becomes ``conv2d(x, W * s) + (beta - mean * s)`` with ``s = gamma / sqrt(var + eps)``
applied along the kernel layout's ``O`` axis, and the bias broadcast along the output layout's ``C``
axis (any layout: NCHW/OIHW, NHWC/HWIO, ...). The new constants are computed in float64 and cast
to the weight's dtype. The bias add then fuses into the convolution's epilogue (one pass over the
output instead of two). A convolution whose result has other users, or a batch-norm over another
axis, is left alone; so is anything else (the same module object is returned when nothing matched).
TVM's ``FoldBatchnormToConv2D`` handles OIHW only.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import mutator

from ._mutator import FunctionRewriter, const_value, is_op_call, rewrite_module


def count_uses(func: relax.Function) -> dict:
    """How many times each Relax Var is used as an operand in ``func``."""
    counts: dict = {}

    def visit(expr):
        if isinstance(expr, relax.Call):
            operands = list(expr.args)
        elif isinstance(expr, relax.Tuple):
            operands = list(expr.fields)
        elif isinstance(expr, relax.TupleGetItem):
            operands = [expr.tuple_value]
        else:
            operands = []
        for operand in operands:
            if isinstance(operand, relax.Var):
                counts[operand] = counts.get(operand, 0) + 1

    relax.analysis.post_order_visit(func.body, visit)
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.Var):
                counts[binding.value] = counts.get(binding.value, 0) + 1
    body = func.body.body
    if isinstance(body, relax.Var):
        counts[body] = counts.get(body, 0) + 1
    return counts


@mutator
class _BatchNormFolder(FunctionRewriter):
    def visit_function_(self, func):  # pylint: disable=arguments-renamed
        self.uses = count_uses(func)
        return super().visit_function_(func)

    def visit_tuple_getitem_(self, op):  # pylint: disable=arguments-renamed
        op = self.visit_expr_post_order(op)
        if op.index != 0:
            return op
        bn = self.lookup(op.tuple_value)
        if not is_op_call(bn, "relax.nn.batch_norm"):
            return op
        conv = self.lookup(bn.args[0])
        if not is_op_call(conv, "relax.nn.conv2d") or self.uses.get(bn.args[0], 0) != 1:
            return op
        weight = const_value(conv.args[1])
        params = [const_value(a) for a in bn.args[1:5]]
        if weight is None or any(p is None for p in params):
            return op
        gamma, beta, mean, var = (p.astype("float64") for p in params)
        attrs = conv.attrs
        kernel_layout = str(attrs.kernel_layout)
        out_layout = str(attrs.out_layout or attrs.data_layout)
        channel_axis = out_layout.index("C") if "C" in out_layout else -1
        if (
            "O" not in kernel_layout
            or int(bn.attrs.axis) % len(out_layout) != channel_axis
        ):
            return op
        if not bool(bn.attrs.scale):
            gamma = np.ones_like(gamma)
        if not bool(bn.attrs.center):
            beta = np.zeros_like(beta)
        scale = gamma / np.sqrt(var + float(bn.attrs.epsilon))
        shift = beta - mean * scale
        o_axis = kernel_layout.index("O")
        wshape = [1] * weight.ndim
        wshape[o_axis] = -1
        new_weight = (weight.astype("float64") * scale.reshape(wshape)).astype(
            weight.dtype
        )
        bshape = [1] * len(out_layout)
        bshape[channel_axis] = -1
        out_dtype = str(conv.ty.dtype)
        self.changed = True
        new_conv = self.builder_.emit(
            relax.Call(
                conv.op, [conv.args[0], relax.const(new_weight)], attrs, conv.ty_args
            )
        )
        return relax.op.add(
            new_conv, relax.const(shift.reshape(bshape).astype(out_dtype))
        )


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.FoldBatchNorm")
class FoldBatchNorm:  # pylint: disable=too-few-public-methods
    """Fold inference batch-norms into the constant-weight convolutions before them (see module)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(_BatchNormFolder, mod)


__all__ = ["FoldBatchNorm", "count_uses"]
