"""Layout inference (``FRelaxInferLayout``) for ``relax.quantize`` and ``relax.dequantize``, which stock
TVM 0.27 leaves without one.

An ONNX QDQ model (ONNX Runtime's ``quantize_static``, NNCF) puts ``QuantizeLinear ->
DequantizeLinear`` on every activation: before each conv, around each residual add and pooling.
Without a layout rule, Relax's ``ConvertLayout`` gives these ops their initial layout: each feature
map a conv made NHWC is transposed back to NCHW for the pair and to NHWC again after it (resnet50
quantized by ONNX Runtime, profiled on an AMD Zen 3: 91 ms a run with those transposes, 39 ms
without).

The rule (:func:`infer_layout_qdq`): with one scale and zero point for the whole tensor (per-tensor,
how activations are quantized) the op is elementwise: the data and the output keep the layout the
data has now, the scale and zero point theirs (one element). Quantized per channel along ``axis``
(weights), the op keeps its initial layout, as without the rule. Registered on import of the
package (:func:`register`), reversible through :func:`tvm_roialign.unregister`.
"""

from __future__ import annotations

import math

from tvm import relax

from .. import _registry
from ._mutator import tensor_shape
from .layout import infer_layout_output, initial_layout, layout_decision

#: The ops this module gives a layout rule.
QDQ_OPS = ("relax.quantize", "relax.dequantize")


def _ndim(expr) -> int:
    ty = expr.ty
    return int(ty.ndim) if isinstance(ty, relax.TensorType) else -1


def _one_element(expr) -> bool:
    """Whether ``expr`` (a scale or zero point) is a tensor of one element, of static shape."""
    shape = tensor_shape(expr)
    return shape is not None and None not in shape and math.prod(shape) == 1


def infer_layout_qdq(call, desired_layouts, var_layout_map):
    """``FRelaxInferLayout`` of ``relax.quantize`` / ``relax.dequantize(x, scale, zero_point)``: per
    tensor, ``x`` and the output keep the layout ``x`` has now; per channel, the initial layout.
    ``desired_layouts`` is not consulted: the op follows its producer."""
    del desired_layouts  # an elementwise op follows its input
    data, *params = call.args
    initial = layout_decision(initial_layout(_ndim(data)))
    decision = var_layout_map.get(data) if isinstance(data, relax.Var) else None
    if decision is None or not hasattr(decision, "is_unknown_dim") or not all(map(_one_element, params)):
        decision = initial
    param_layouts = [layout_decision(initial_layout(_ndim(p))) for p in params]
    return infer_layout_output([decision, *param_layouts], [decision], call.attrs)


def register() -> None:
    """Register :func:`infer_layout_qdq` as the ops' ``FRelaxInferLayout`` (idempotent)."""
    for op in QDQ_OPS:
        _registry.set_op_attr(op, "FRelaxInferLayout", infer_layout_qdq)


__all__ = ["QDQ_OPS", "infer_layout_qdq", "register"]
