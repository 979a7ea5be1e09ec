"""Convolutions and matmuls with constant weights as bf16 contractions (``precision="bf16"``).

Each ungrouped NHWC ``conv2d`` (1x1, or larger over a multiple of :data:`TAP_CHANNELS` input
channels) and each 2-D ``matmul`` of a constant weight, in float32, becomes a call of
:func:`tvm_roialign.topi.bf16_contraction.bf16_contraction` (its channels static; its batch and image
size, so the GEMM's row count, may be symbolic, as in an any-size detector): the weight is rounded
to bf16 and packed into the pair layout here, once, at compile time; the activations are rounded to bf16
inside the kernel, the products accumulated in fp32 and the result is fp32, so every other op of
the model (bias, residual adds, RoIAlign, NMS, post-processing) stays as it was:

    conv2d(x, W)      ->  call_tir(bf16_conv2d, x, pack(W))            # im2col'd x, [N, H, W, O]
    matmul(x, W[K, N]) -> call_tir(bf16_matmul, reshape(x, [M, K]), pack(W))

The schedule rule :class:`tvm_roialign.schedules.BF16Contraction` runs them on AMX tiles; the
pipeline applies this pass only for a target that has them.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax

from ..topi.bf16_contraction import ConvGeometry, bf16_contraction, pack_weight_vnni
from ._mutator import FunctionRewriter, const_value, is_op_call, rewrite_module, tensor_shape

#: a conv with a kernel larger than 1x1 is taken when its input channels are a multiple of this:
#: each kernel tap's channels then fill whole vectors of the gather (an RGB stem is left in fp32)
TAP_CHANNELS = 16


def _is_f32(expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32"


def _dims(expr) -> list | None:
    """The shape of the tensor ``expr`` as ints and (symbolic) PrimExprs, or None when its rank is
    unknown or its last dimension (the channels) is not static."""
    shape = tensor_shape(expr)
    if shape is None or shape[-1] is None:
        return None
    return [s if s is not None else d for s, d in zip(shape, expr.ty.shape.values)]


class _BF16Rewriter(FunctionRewriter):
    keep_fp32 = None  # the pass's keep_fp32

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        new = None
        if is_op_call(call, "relax.nn.conv2d"):
            new = self._conv(call)
        elif is_op_call(call, "relax.matmul"):
            new = self._matmul(call)
        return call if new is None else new

    def _emit(self, name: str, x, weight: np.ndarray, rows, out_shape, geometry=None):
        if self.keep_fp32 is not None and self.keep_fp32(weight):
            return None
        self.changed = True
        packed = relax.const(pack_weight_vnni(weight))
        compute = functools.partial(
            bf16_contraction,
            rows=rows,
            reduction=int(weight.shape[0]),
            out_shape=list(out_shape),
            geometry=geometry,
        )
        return self.builder_.call_te(compute, x, packed, primfunc_name_hint=name)

    def _conv(self, call):
        attrs = call.attrs
        x, weight = call.args
        value = const_value(weight)
        in_shape, out_shape = _dims(x), _dims(call)
        if (
            value is None
            or int(attrs.groups) != 1
            or str(attrs.data_layout) != "NHWC"
            or str(attrs.out_layout or attrs.data_layout) != "NHWC"
            or not (_is_f32(x) and _is_f32(call))
            or in_shape is None
            or out_shape is None
        ):
            return None
        layout = str(attrs.kernel_layout)
        if sorted(layout) != sorted("OIHW"):
            return None
        hwio = np.transpose(value, [layout.index(c) for c in "HWIO"])
        kh, kw, channels, outputs = hwio.shape
        if channels != in_shape[3] or (kh * kw > 1 and channels % TAP_CHANNELS):
            return None
        geometry = ConvGeometry(
            *out_shape[:3],
            kh,
            kw,
            channels,
            tuple(int(s) for s in attrs.strides),
            (int(attrs.padding[0]), int(attrs.padding[1])),
            tuple(int(d) for d in attrs.dilation),
        )
        matrix = hwio.reshape(kh * kw * channels, outputs)
        return self._emit("bf16_conv2d", x, matrix, geometry.rows, out_shape, geometry)

    def _matmul(self, call):
        x, weight = call.args
        value = const_value(weight)
        in_shape, out_shape = _dims(x), _dims(call)
        if (
            value is None
            or value.ndim != 2
            or not (_is_f32(x) and _is_f32(call))
            or in_shape is None
            or out_shape is None
            or len(in_shape) < 2
        ):
            return None
        rows = functools.reduce(lambda a, b: a * b, in_shape[:-1])
        flat = x if len(in_shape) == 2 else self.builder_.emit(
            relax.op.reshape(x, [rows, in_shape[-1]])
        )
        return self._emit("bf16_matmul", flat, value.astype(np.float32), rows, out_shape)


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.BF16Contractions")
class BF16Contractions:  # pylint: disable=too-few-public-methods
    """Constant-weight conv2d (NHWC) and matmul as bf16 contractions (see module docstring).

    ``keep_fp32``: None, or called with each candidate's weight as a ``[K, N]`` matrix (one
    column per output channel); True leaves that call in fp32."""

    def __init__(self, keep_fp32=None):
        self.keep_fp32 = keep_fp32

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(
            _BF16Rewriter, mod, keep_fp32=staticmethod(self.keep_fp32) if self.keep_fp32 else None
        )


__all__ = ["BF16Contractions"]
