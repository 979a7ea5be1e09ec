"""A small ONNX QDQ model for the QDQ tests (tests/test_qdq.py), quantized by ONNX Runtime, and a
float64 NumPy evaluation of a QDQ graph (the reference the builds are held to).

The net: a 3x3 stride-2 conv over the RGB input (an RGB stem: stays fake-quant float), a 1x1 conv,
a 3x3 conv whose output adds back the block's input (a residual), global average pooling and a
linear layer; random weights (seed 0). ``quantize_static`` (QDQ, per-channel int8 weights, uint8 or
int8 activations, calibrated on four random inputs) quantizes it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

SHAPE = (1, 3, 32, 32)


def _net():
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 32, 3, stride=2, padding=1)
            self.a = torch.nn.Conv2d(32, 32, 1)
            self.b = torch.nn.Conv2d(32, 32, 3, padding=1)
            self.fc = torch.nn.Linear(32, 10)

        def forward(self, x):
            y = torch.relu(self.stem(x))
            y = torch.relu(self.b(torch.relu(self.a(y))) + y)
            return self.fc(y.mean((2, 3)))

    torch.manual_seed(0)
    return Net().eval()


def qdq_model(folder, activations: str = "uint8", reduce_range: bool = False) -> str:
    """The net exported to ONNX (opset 17) and quantized by ONNX Runtime in ``folder``: its path.
    ``reduce_range``: weights within +-64 (ONNX Runtime's option for CPUs without VNNI, whose u8 x s8
    kernels add pairs of products in saturating int16)."""
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from tvm_roialign.bench.onnxruntime_peer import quantizer_workdir

    name = f"net_{activations}{'_reduce_range' if reduce_range else ''}.onnx"
    path, prepared, out = (str(Path(folder).resolve() / n) for n in ("net.onnx", "net.pre.onnx", name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_net(), (torch.zeros(SHAPE),), path, dynamo=False, opset_version=17,
                          input_names=["x"])
    rng = np.random.default_rng(0)
    feeds = iter([{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    act = QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8
    with quantizer_workdir():  # its scratch files, not in the working directory
        quant_pre_process(path, prepared)
        quantize_static(prepared, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        reduce_range=reduce_range, activation_type=act, weight_type=QuantType.QInt8)
    return out


def inputs(count: int = 3) -> list[np.ndarray]:
    """Test inputs (seed 1, not the calibration's)."""
    rng = np.random.default_rng(1)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def _per_axis(value: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    if value.size == 1:
        return value.reshape(())
    shape = [1] * ndim
    shape[axis] = -1
    return value.reshape(shape)


def _quantize(x, scale, zero, axis=1):
    info = np.iinfo(zero.dtype)
    q = np.rint(x / _per_axis(scale.astype(np.float64), axis, x.ndim)) + _per_axis(zero, axis, x.ndim)
    return np.clip(q, info.min, info.max)


def _dequantize(q, scale, zero, axis=1):
    zero = _per_axis(zero.astype(np.float64), axis, q.ndim)
    return (q.astype(np.float64) - zero) * _per_axis(scale.astype(np.float64), axis, q.ndim)


def _conv(x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0), group=1, **_):
    assert group == 1
    n = x.shape[0]
    o, _, kh, kw = w.shape
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (x.shape[2] - kh) // strides[0] + 1
    ow = (x.shape[3] - kw) // strides[1] + 1
    out = np.zeros((n, o, oh, ow))
    for dy in range(kh):
        for dx in range(kw):
            patch = x[:, :, dy:dy + strides[0] * oh:strides[0], dx:dx + strides[1] * ow:strides[1]]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, dy, dx])
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def _gemm(a, b, c=None, transA=0, transB=0, alpha=1.0, beta=1.0):
    a, b = (a.T if transA else a), (b.T if transB else b)
    out = alpha * (a @ b)
    return out if c is None else out + beta * c


_OPS = {
    "QuantizeLinear": _quantize,
    "DequantizeLinear": _dequantize,
    "Conv": _conv,
    "Gemm": _gemm,
    "Add": np.add,
    "Relu": lambda x: np.maximum(x, 0),
    "ReduceMean": lambda x, axes, keepdims=1: x.mean(tuple(axes), keepdims=bool(keepdims)),
}


def evaluate_float64(path: str, x: np.ndarray) -> np.ndarray:
    """The QDQ graph at ``path`` on ``x``, every float in float64 (QuantizeLinear: ``x / scale``
    rounded half to even, saturated): its first output."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    values[model.graph.input[0].name] = x.astype(np.float64)
    for node in model.graph.node:
        if node.op_type == "Constant":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        attrs.pop("kernel_shape", None)
        attrs.pop("dilations", None)  # all 1 in the net
        args = [values[name] for name in node.input if name]
        values[node.output[0]] = _OPS[node.op_type](*args, **attrs)
    return values[model.graph.output[0].name]


def output_scale(path: str) -> float:
    """The scale of the graph's last ``DequantizeLinear`` (the output's quantum)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    last = model.graph.node[-1]
    assert last.op_type == "DequantizeLinear"
    scales = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return float(scales[last.input[1]])
