"""ONNX ``Clip`` as ``relax.clip``, so that it changes layout with the convolutions.

TVM 0.27's converter emits ``Clip`` as two TE kernels (``maximum``, ``minimum``) at import time:
already ``call_tir`` when ``ConvertLayout`` runs, they stay in the model's NCHW between two
transposes. In an NHWC build of an ONNX MobileNetV2 each of its 35 ReLU6 became such a kernel,
transposing its whole activation twice. With constant float bounds (a ReLU6, the usual export)
this converter emits ``relax.clip`` instead, which has a layout rule
(:mod:`tvm_roialign.passes.layout_clip`) and fuses into the convolution before it. A NaN bound
is no bound (ONNX Runtime's reading, as TVM's converter has it); other bounds (a tensor computed
by the graph, an integer clip) go to TVM's converter.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

_FLOAT = ("float16", "float32", "float64")


def _float_bound(value, unbounded: float) -> float:
    """A bound's value as a float (``unbounded`` for NaN: no bound)."""
    value = float(value)
    return unbounded if math.isnan(value) else value


def _bound(expr, unbounded: float) -> float | None:
    """The float value of an optional constant scalar bound (``unbounded`` when absent or NaN),
    or None when it is not a constant scalar."""
    if expr is None:
        return unbounded
    if not isinstance(expr, tvm.ir.expr.Constant) or not hasattr(expr.value, "numpy"):
        return None
    value = expr.value.numpy()
    return _float_bound(value.reshape(()), unbounded) if value.size == 1 else None


class ClipConverter(onnx_frontend.OnnxOpConverter):
    """``Clip`` with constant float bounds as ``relax.clip`` (see module); TVM's otherwise."""

    @classmethod
    def _clip(cls, bb, x, low: float, high: float):
        return bb.emit(relax.op.clip(x, low, high))

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if str(inputs[0].ty.dtype) not in _FLOAT:
            return onnx_frontend.Clip._impl_v1(bb, inputs, attr, params)
        # opset 6's attributes are float32
        low = _float_bound(np.float32(attr.get("min", -np.inf)), -math.inf)
        high = _float_bound(np.float32(attr.get("max", np.inf)), math.inf)
        return cls._clip(bb, inputs[0], low, high)

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return cls._impl_v13(bb, inputs, attr, params)

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        low = _bound(inputs[1] if len(inputs) > 1 else None, -math.inf)
        high = _bound(inputs[2] if len(inputs) > 2 else None, math.inf)
        if low is None or high is None or str(inputs[0].ty.dtype) not in _FLOAT:
            return onnx_frontend.Clip._impl_v13(bb, inputs, attr, params)
        return cls._clip(bb, inputs[0], low, high)


__all__ = ["ClipConverter"]
