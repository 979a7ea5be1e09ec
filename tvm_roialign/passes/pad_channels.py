"""Pad the output channels of constant-weight conv2d / matmul to a multiple of the vector width.

A convolution with 91 output channels (a class count), 3 (anchors) or 364 (box deltas) cannot be cut
into whole vectors of 16 (or 8, or 4) channels, so the CPU schedules fall back to scalar code for it.
This pass gives the weight zero filters up to the next multiple of ``multiple`` and slices the
result back:

    conv2d(x, W[O])  ->  strided_slice(conv2d(x, concat(W, 0)[O']), C axis, 0, O)
    matmul(x, W[K, N])  ->  strided_slice(matmul(x, concat(W, 0)[K, N']), last axis, 0, N)

The extra channels are computed from zero weights and dropped, so the kept ones are bit-identical.
Only constant weights are padded (a weight computed at run time is left alone), only ungrouped
convolutions, and only when the padding adds at most ``max_growth`` of the work (1/2 by default; for
``multiple`` 16: 91 -> 96, 364 -> 368, 12 -> 16, and 3 -> 4, a quarter vector, rather than 16).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ._mutator import FunctionRewriter, is_op_call, rewrite_module


def padded_size(channels: int, multiple: int, max_growth: float = 0.5) -> int | None:
    """The padded channel count, or None when ``channels`` needs no (or too much) padding.

    Tries multiples of ``multiple``, then of its half and quarter (not below 4), and takes the first
    that adds at most ``max_growth`` of the channels.
    """
    for step in (multiple, multiple // 2, multiple // 4):
        if step < 4 and step != multiple:
            break
        size = -(-channels // step) * step
        if size == channels:
            return None
        if size <= channels * (1 + max_growth):
            return size
    return None


def _pad_axis(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, size - array.shape[axis])
    return np.pad(array, widths)


class _ChannelPadder(FunctionRewriter):
    multiple = 16
    max_growth = 0.5

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        if is_op_call(call, "relax.nn.conv2d"):
            return self._conv(call)
        if is_op_call(call, "relax.matmul"):
            return self._matmul(call)
        return call

    def _conv(self, call):
        weight = call.args[1]
        if not isinstance(weight, tvm.ir.expr.Constant) or int(call.attrs.groups) != 1:
            return call
        kernel_layout = str(call.attrs.kernel_layout)
        out_layout = str(call.attrs.out_layout or call.attrs.data_layout)
        if "O" not in kernel_layout or "C" not in out_layout:
            return call
        value = weight.value.numpy()
        o_axis = kernel_layout.index("O")
        channels = value.shape[o_axis]
        size = padded_size(channels, self.multiple, self.max_growth)
        if size is None:
            return call
        self.changed = True
        padded = self.builder_.emit(
            relax.Call(
                call.op,
                [call.args[0], relax.const(_pad_axis(value, o_axis, size))],
                call.attrs,
            )
        )
        return relax.op.strided_slice(
            padded, axes=[out_layout.index("C")], begin=[0], end=[channels]
        )

    def _matmul(self, call):
        weight = call.args[1]
        if not isinstance(weight, tvm.ir.expr.Constant):
            return call
        value = weight.value.numpy()
        if value.ndim < 2:
            return call
        channels = value.shape[-1]
        size = padded_size(channels, self.multiple, self.max_growth)
        if size is None:
            return call
        self.changed = True
        out_dtype = call.attrs.out_dtype
        padded = self.builder_.emit(
            relax.op.matmul(
                call.args[0],
                relax.const(_pad_axis(value, value.ndim - 1, size)),
                out_dtype=str(out_dtype) if out_dtype else None,
            )
        )
        ndim = (
            len(call.ty.shape.values)
            if isinstance(call.ty.shape, relax.ShapeExpr)
            else None
        )
        if ndim is None:
            return call
        return relax.op.strided_slice(
            padded, axes=[ndim - 1], begin=[0], end=[channels]
        )


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.PadChannels")
class PadChannels:  # pylint: disable=too-few-public-methods
    """Pad constant-weight conv2d / matmul output channels to a multiple of ``multiple``."""

    def __init__(self, multiple: int = 16, max_growth: float = 0.5):
        if multiple < 1:
            raise ValueError(
                f"multiple must be a positive channel count, got {multiple}"
            )
        self.multiple = int(multiple)
        self.max_growth = float(max_growth)

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_module(
            _ChannelPadder, mod, multiple=self.multiple, max_growth=self.max_growth
        )


__all__ = ["PadChannels", "padded_size"]
