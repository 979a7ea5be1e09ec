"""An ONNX QDQ model's quantized convolutions and matmuls as int8 contractions, with the model's own
scales and zero points (no calibration).

A QDQ model (ONNX Runtime's ``quantize_static``, NNCF) quantizes a layer by placing
``DequantizeLinear`` on its weight and ``QuantizeLinear -> DequantizeLinear`` on its input; TVM's
importer keeps them as ``relax.quantize`` / ``relax.dequantize`` (float math: fake-quant). This pass
takes each ungrouped NHWC ``conv2d`` (the shapes :mod:`.int8_contractions` takes) and each 2-D
``matmul`` whose

* weight is ``dequantize(w, s_w, 0)`` (seen through ``permute_dims``), ``w`` an int8 constant, or
  the ``quantize`` of a float constant (NNCF keeps float weights), ``s_w`` per output channel or per
  tensor, the zero point 0;
* input is ``dequantize(quantize(y, s, z), s, z)`` (seen through ``permute_dims`` and ``reshape``,
  which commute with a per-tensor quantization), ``s`` and ``z`` per tensor, uint8 or int8,

and makes it a call of :func:`tvm_roialign.topi.int8_contraction.int8_contraction` reading ``y``:
the weight's int8 values as they are, the input quantized in the kernel's gather with ``s`` and
``z`` exactly as ``QuantizeLinear`` does (``x / s`` in fp32, half to even: ``ActivationQuant(divide=
True)``); int8 activations become uint8 exactly (``q + 128``, zero point ``z + 128``). The int32
products are exact, so the result is the QDQ graph's float value up to fp32 rounding of the sum.

Everything else stays as imported (fake-quant float): other consumers of the same ``dequantize``
(a residual add), the Q/DQ pairs around adds and pooling, weights with a nonzero zero point or beyond
the kernels' ``weight_limit`` (AVX2's: 64, which ONNX Runtime's ``reduce_range`` keeps to), grouped
and depthwise convs, a conv over few channels (an RGB stem). It must run before constant folding,
which would turn ``dequantize(int8 constant)`` into an fp32 weight.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..topi.int8_contraction import ActivationQuant
from ._contraction_spec import TAP_CHANNELS, conv_geometry, conv_weight, dims, is_f32, matmul_weight
from ._mutator import FunctionRewriter, const_value, is_op_call, rewrite_module
from .fold_permute_dims import FoldPermuteDims
from .int8_contractions import emit_int8_contraction

_LAYOUT_OPS = ("relax.permute_dims", "relax.reshape")
_QUANTIZED = {"uint8": 0, "int8": 128}  # the shift that makes the quantized values uint8


def _scalar_params(scale, zero):
    """``(scale, zero)`` as numbers when both are per-tensor (one element), else None."""
    if scale is None or zero is None or scale.size != 1 or zero.size != 1:
        return None
    value = float(scale.reshape(-1)[0])
    return (value, int(zero.reshape(-1)[0])) if np.isfinite(value) and value > 0 else None


def _per_channel(scale: np.ndarray, axis: int, ndim: int, channel_axis: int, channels: int):
    """The fp32 scale of each output channel, or None when the scale runs along another axis."""
    scale = scale.astype(np.float32).reshape(-1)
    if scale.size == 1:
        return np.full(channels, scale[0], np.float32)
    if axis % ndim != channel_axis or scale.size != channels:
        return None
    return scale


def _permuted_axis(axis: int, axes: list[int]) -> int:
    return axes.index(axis)


def _quantized_weight(weight: np.ndarray, scale: np.ndarray, axis: int) -> np.ndarray:
    """``QuantizeLinear`` of a float constant weight to int8 (zero point 0), as NNCF's graphs compute
    it: ``weight / scale`` in fp32, half to even, clipped."""
    shape = [1] * weight.ndim
    if scale.size > 1:
        shape[axis % weight.ndim] = -1
    per = scale.astype(np.float32).reshape(shape)
    return np.clip(np.rint(weight.astype(np.float32) / per), -128, 127).astype(np.int8)


def _peak(values: np.ndarray) -> int:
    return int(np.abs(values.astype(np.int32)).max(initial=0))


class _QDQRewriter(FunctionRewriter):
    """Each conv2d / matmul of the pattern (module docstring) as an int8 contraction; a layer whose
    int8 weights exceed ``weight_limit`` in magnitude stays as imported."""

    weight_limit = 127
    #: a predicate of a conv or matmul call: the layer stays as imported (float)
    keep_layer = None

    def _bound(self, expr):
        value = self.lookup(expr)
        return value if value is not None else expr

    def _const(self, expr):
        return const_value(self._bound(expr))

    def _weight_values(self, dq):
        """``(int8 values, scale, axis)`` of a weight's ``dequantize`` call, or None."""
        data, scale, zero = (self._const(a) for a in dq.args)
        if scale is None or zero is None or np.any(zero != 0):
            return None
        if data is None:  # NNCF: quantize(float constant) with the same parameters
            q = self._bound(dq.args[0])
            if not is_op_call(q, "relax.quantize") or str(q.attrs.out_dtype) != "int8":
                return None
            weight, q_scale, q_zero = (self._const(a) for a in q.args)
            if weight is None or q_scale is None or q_zero is None or np.any(q_zero != 0):
                return None
            if not (np.array_equal(q_scale, scale) and int(q.attrs.axis) == int(dq.attrs.axis)):
                return None
            data = _quantized_weight(weight, scale, int(q.attrs.axis))
        if data.dtype != np.int8 or _peak(data) > self.weight_limit:
            return None
        return data, scale, int(dq.attrs.axis) % data.ndim

    def weight(self, expr):
        """``(int8 weight in the consumer's layout, scale, its axis there)`` of a quantized constant
        weight seen through ``permute_dims``, or None."""
        axes_chain = []
        value = self._bound(expr)
        while is_op_call(value, "relax.permute_dims"):
            ndim = int(value.ty.ndim)
            axes = value.attrs.axes
            axes_chain.append([int(a) for a in axes] if axes is not None else list(range(ndim))[::-1])
            value = self._bound(value.args[0])
        if not is_op_call(value, "relax.dequantize"):
            return None
        found = self._weight_values(value)
        if found is None:
            return None
        data, scale, axis = found
        for axes in reversed(axes_chain):
            data, axis = np.transpose(data, axes), _permuted_axis(axis, axes)
        return data, scale, axis

    def activation(self, expr):
        """``(the layout calls between the input and its dequantize, the quantize's input,
        ActivationQuant)`` of ``dequantize(quantize(y, s, z), s, z)``, or None."""
        chain = []
        value = self._bound(expr)
        while any(is_op_call(value, name) for name in _LAYOUT_OPS):
            chain.append(value)
            value = self._bound(value.args[0])
        if not is_op_call(value, "relax.dequantize"):
            return None
        quantize = self._bound(value.args[0])
        if not is_op_call(quantize, "relax.quantize"):
            return None
        dtype = str(quantize.attrs.out_dtype)
        params = _scalar_params(*(self._const(a) for a in value.args[1:]))
        if dtype not in _QUANTIZED or params is None or not is_f32(quantize.args[0]):
            return None
        if params != _scalar_params(*(self._const(a) for a in quantize.args[1:])):
            return None
        scale, zero = params
        return chain, quantize.args[0], ActivationQuant(scale, zero + _QUANTIZED[dtype], divide=True)

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = self.visit_expr_post_order(call)
        conv = is_op_call(call, "relax.nn.conv2d")
        if not (conv or is_op_call(call, "relax.matmul")) or not is_f32(call):
            return call
        weight, activation = self.weight(call.args[1]), self.activation(call.args[0])
        if weight is None or activation is None:
            return call
        spec = _conv_spec(call, *weight) if conv else _matmul_spec(call, *weight)
        if spec is None or (self.keep_layer is not None and self.keep_layer(call)):
            return call
        chain, y, act = activation
        for layout_call in reversed(chain):  # the layout ops, now on the unquantized input
            y = self.builder_.emit(relax.Call(layout_call.op, [y, *layout_call.args[1:]], layout_call.attrs))
        self.changed = True
        return self._emit(y, spec, act)

    def _emit(self, x, spec, act: ActivationQuant):
        q, w_scale, rows, out_shape, geometry = spec
        return emit_int8_contraction(self.builder_, x, q, w_scale, act, rows, out_shape, geometry)


def _conv_spec(call, data: np.ndarray, scale: np.ndarray, axis: int):
    """``(int8 [K, N], scale [N], rows, out_shape, geometry)`` of a conv the pass takes, else None."""
    found = conv_weight(call, data) if data.ndim == 4 else None
    if found is None:
        return None
    hwio, out_shape = found
    layout = str(call.attrs.kernel_layout)
    w_scale = _per_channel(scale, axis, 4, layout.index("O"), data.shape[layout.index("O")])
    kh, kw, channels, outputs = hwio.shape
    if w_scale is None or (kh * kw > 1 and channels % TAP_CHANNELS):
        return None
    geometry = conv_geometry(call, hwio, out_shape)
    return hwio.reshape(kh * kw * channels, outputs), w_scale, geometry.rows, out_shape, geometry


def _matmul_spec(call, data: np.ndarray, scale: np.ndarray, axis: int):
    """The same for a matmul by a 2-D ``[K, N]`` weight, its scale per column or per tensor."""
    found = matmul_weight(call, data)
    if found is None or dims(call.args[0])[-1] != data.shape[0]:
        return None
    _, rows, out_shape = found
    w_scale = _per_channel(scale, axis, 2, 1, data.shape[1])
    return None if w_scale is None else (data, w_scale, rows, out_shape, None)


def has_qdq(mod: tvm.IRModule) -> bool:
    """Whether ``mod`` holds ``relax.quantize`` (an imported QDQ model's activations)."""
    found = []

    def visit(expr):
        if is_op_call(expr, "relax.quantize"):
            found.append(expr)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function) and not found:
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def qdq_weight_peak(mod: tvm.IRModule) -> int:
    """The largest magnitude of an ONNX QDQ model's int8 weights: its int8 constants under
    ``dequantize`` and NNCF's ``quantize`` of float constants to int8 (0 where it has none). 127 or
    128 for 8-bit weights, 64 for ONNX Runtime's ``reduce_range`` (AVX2's kernels take those)."""
    peaks = [0]

    def visit(expr):
        if is_op_call(expr, "relax.dequantize"):
            data = const_value(expr.args[0])
            if data is not None and data.dtype == np.int8:
                peaks.append(_peak(data))
        elif is_op_call(expr, "relax.quantize") and str(expr.attrs.out_dtype) == "int8":
            weight, scale = const_value(expr.args[0]), const_value(expr.args[1])
            if weight is not None and scale is not None:
                peaks.append(_peak(_quantized_weight(weight, scale, int(expr.attrs.axis))))

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return max(peaks)


@tvm.transform.module_pass(opt_level=0, name="tvm_roialign.QDQContractions")
class QDQContractions:  # pylint: disable=too-few-public-methods
    """A QDQ model's quantized conv2d (NHWC) and matmul as int8 contractions (module docstring);
    the ``permute_dims`` pairs the rewrite leaves (NCHW Q/DQ between NHWC convs) folded.
    ``weight_limit``: the largest weight magnitude the target's kernels take exactly
    (:func:`~tvm_roialign.schedules.lowp.int8.int8_weight_limit`); a layer beyond it stays
    as imported, and so does a conv or matmul for which ``keep_layer(call)`` is true (those fp32 runs
    faster: a short reduction, on AVX2 the convs Winograd takes)."""

    def __init__(self, weight_limit: int = 127, keep_layer=None):
        self.weight_limit = weight_limit
        self.keep_layer = keep_layer

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        # the predicate becomes a class attribute: unbound
        keep = staticmethod(self.keep_layer) if self.keep_layer is not None else None
        new = rewrite_module(_QDQRewriter, mod, weight_limit=self.weight_limit, keep_layer=keep)
        return new if new is mod else FoldPermuteDims()(new)


__all__ = ["QDQContractions", "has_qdq", "qdq_weight_peak"]
