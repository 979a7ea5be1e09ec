"""``relax.vision.quantized_roi_align`` (uint8 / int8 data quantized per tensor, float32 rois):
against torchvision's quantized ``roi_align`` (requantized output) and the float64 reference of the
dequantized map (float32 output), on the Relax path and the CPU strategies' PrimFuncs; argument
errors; registration.

Tolerances (``conftest.TOLERANCE``): the requantized output equals torchvision's except where the
exact average of ``q - zero_point`` lies within :data:`NEAR_HALF` quanta of ``n + 0.5`` (the
float32 sums, ours on ``q - zero_point`` and torchvision's on ``(q - zero_point) * scale``, then
round either way), and there by ``TOLERANCE[dtype]`` = 1 quantum; the float32 output is held to
``TOLERANCE["float32"]``.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
import torchvision
import tvm
from _roi_tester import PRIM_PATHS, RELAX_TARGETS
from tvm import relax, te

import tvm_roialign
from tvm_roialign import _registry
from tvm_roialign.ops.quantized_roi_align import OP_NAME
from tvm_roialign.strategies import STRATEGIES
from tvm_roialign.testing import roi_align_ref, single_op_module

#: Quanta from ``n + 0.5`` within which the exact average may round either way (the float32
#: rounding of a sum of at most a few thousand terms of magnitude <= 255 is far below it).
NEAR_HALF = 1e-3
SCALE = 0.03
ZERO_POINTS = {"uint8": 120, "int8": -7}
TORCH_QDTYPES = {"uint8": torch.quint8, "int8": torch.qint8}
POOLED = (3, 2)
SPATIAL_SCALE = 0.5
#: boxes in image pixels (spatial_scale 0.5): integer and half-pixel corners (samples on pixel
#: boundaries), tiny, straddling the border, inverted
BOXES = [[1, 1, 9, 7], [0.5, 2.5, 6, 10], [3, 3, 3.5, 10.5], [0, 0, 12, 10], [-4, -3, 30, 25],
         [7, 7, 2, 3], [4.25, 1.75, 19.5, 16.25]]
PATHS = ("relax", "x86-te", "generic-llvm", "arm-on-host", "gpu-unbound")
CASES = list(itertools.product(("NCHW", "NHWC"), (2, -1), (False, True)))


def _quantized(dtype, num_batch=1, shape=(16, 11, 13)):
    """``(torch quantized tensor, its integers as NumPy)`` of N(0, 1) data."""
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((num_batch, *shape)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates its quantized tensors
        qt = torch.quantize_per_tensor(x.float(), SCALE, ZERO_POINTS[dtype], TORCH_QDTYPES[dtype])
    return qt, qt.int_repr().numpy()


def _rois(num_batch):
    batch = np.arange(len(BOXES)) % num_batch
    return np.concatenate([batch[:, None], np.array(BOXES)], 1).astype("float32")


def _run(path, layout, sampling_ratio, aligned, dtype, out_dtype, q, rois):
    """The op's output (NCHW) on NCHW integers ``q``."""
    zp = ZERO_POINTS[dtype]
    data = q if layout == "NCHW" else np.ascontiguousarray(q.transpose(0, 2, 3, 1))
    kwargs = {"scale": SCALE, "zero_point": zp, "spatial_scale": SPATIAL_SCALE,
              "sampling_ratio": sampling_ratio, "aligned": aligned, "out_dtype": out_dtype}
    if path == "relax":
        mod = single_op_module(
            lambda d, r: tvm_roialign.quantized_roi_align(d, r, POOLED, layout=layout, **kwargs),
            data=(data.shape, dtype), rois=(rois.shape, "float32"))
        vm = relax.VirtualMachine(tvm.compile(mod, target=RELAX_TARGETS["relax"]), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(data), tvm.runtime.tensor(rois)).numpy()
    else:
        inputs = [te.placeholder(data.shape, dtype, "data"),
                  te.placeholder(rois.shape, "float32", "rois")]

        def compute(d, r):
            return tvm_roialign.topi.quantized_roi_align(
                d, r, POOLED, SCALE, zp, SPATIAL_SCALE, sampling_ratio, aligned, layout, out_dtype)

        func, target = PRIM_PATHS[path](compute, inputs, layout, None)
        lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                          target=target)
        channels = q.shape[1]
        shape = ((len(rois), channels, *POOLED) if layout == "NCHW"
                 else (len(rois), *POOLED, channels))
        out_t = tvm.runtime.tensor(np.zeros(shape, out_dtype))
        lib["main"](tvm.runtime.tensor(data), tvm.runtime.tensor(rois), out_t)
        out = out_t.numpy()
    assert out.dtype == np.dtype(out_dtype)
    return out if layout == "NCHW" else out.transpose(0, 3, 1, 2)


def _exact_average(q, dtype, rois, sampling_ratio, aligned):
    """The float64 average of ``q - zero_point`` (geometry rounded in float32, as the op's)."""
    return roi_align_ref(q.astype(np.float64) - ZERO_POINTS[dtype], rois, POOLED, SPATIAL_SCALE,
                         sampling_ratio, aligned, "NCHW", "avg", half_pixel=aligned,
                         coord_dtype="float32")


def _check_requantized(out, expected, average, tol_quanta):
    """``out`` equals ``expected`` except where ``average`` is within :data:`NEAR_HALF` of a .5
    boundary, and there within ``tol_quanta``; returns the number of such differing elements."""
    diff = out.astype(np.int64) - expected.astype(np.int64)
    near_half = np.abs(np.abs(average - np.floor(average)) - 0.5) <= NEAR_HALF
    assert not diff[~near_half].any(), np.argwhere((diff != 0) & ~near_half)[:5]
    assert np.abs(diff).max(initial=0) <= tol_quanta
    return int((diff != 0).sum())


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("layout, sampling_ratio, aligned", CASES)
def test_matches_torchvision_quantized(layout, sampling_ratio, aligned, dtype, tol):
    """Requantized output against ``torchvision.ops.roi_align`` on a quantized tensor (one image:
    torchvision's quantized kernel takes one; its rois must be quantized too, in the data's
    quantized dtype: scale 0.25 holds every corner of :data:`BOXES` exactly)."""
    qt, q = _quantized(dtype)
    rois = _rois(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qrois = torch.quantize_per_tensor(torch.from_numpy(rois), 0.25,
                                          64 if dtype == "uint8" else 0, TORCH_QDTYPES[dtype])
        assert np.array_equal(qrois.dequantize().numpy(), rois)
        expected = torchvision.ops.roi_align(qt, qrois, POOLED, SPATIAL_SCALE, sampling_ratio,
                                             aligned).int_repr().numpy()
    out = _run("relax", layout, sampling_ratio, aligned, dtype, dtype, q, rois)
    average = _exact_average(q, dtype, rois, sampling_ratio, aligned)
    differing = _check_requantized(out, expected, average, tol[dtype])
    assert differing <= 0.1 * out.size  # (0 to 29 of 672 in these cases, of 14 to 78 at n + 0.5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout, sampling_ratio, aligned", CASES[::3])
def test_matches_float64_reference(path, layout, sampling_ratio, aligned, tol):
    """Two images, every CPU path: the float32 output against the float64 reference of the
    dequantized map, the requantized one against its round-half-even (within one quantum at .5)."""
    _, q = _quantized("uint8", num_batch=2)
    rois = _rois(2)
    average = _exact_average(q, "uint8", rois, sampling_ratio, aligned)
    out = _run(path, layout, sampling_ratio, aligned, "uint8", "float32", q, rois)
    np.testing.assert_allclose(out, average * SCALE, rtol=tol["float32"], atol=tol["float32"])
    requantized = _run(path, layout, sampling_ratio, aligned, "uint8", "uint8", q, rois)
    expected = np.clip(np.round(average) + ZERO_POINTS["uint8"], 0, 255)
    _check_requantized(requantized, expected, average, tol["uint8"])


def test_saturates_and_rounds_half_to_even(tol):
    """Averages of exactly n + 0.5 round to even; past the range they saturate."""
    q = np.zeros((1, 4, 2, 2), "uint8")
    q[0, 0] = [[0, 1], [0, 1]]  # column average 0.5 -> 0 (zero point 0)
    q[0, 1] = [[1, 2], [1, 2]]  # 1.5 -> 2
    q[0, 2] = [[2, 3], [2, 3]]  # 2.5 -> 2
    q[0, 3] = 255
    mod = single_op_module(
        lambda d, r: tvm_roialign.quantized_roi_align(d, r, 1, sampling_ratio=1, scale=1.0,
                                                      zero_point=0, aligned=True),
        data=(q.shape, "uint8"), rois=((1, 5), "float32"))
    vm = relax.VirtualMachine(tvm.compile(mod, target=RELAX_TARGETS["relax"]), tvm.cpu())
    rois = np.array([[0, 0, 0, 2, 2]], "float32")  # one sample at (0.5, 0.5)
    out = vm["main"](tvm.runtime.tensor(q), tvm.runtime.tensor(rois)).numpy()
    assert out[0, :, 0, 0].tolist() == [0, 2, 2, 255]


def test_nhwc_cpu_kernel_is_vectorized_over_channels():
    """The x86 strategy's NHWC PrimFunc loads channel vectors (the RoIAlign schedule rule)."""
    inputs = [te.placeholder((1, 11, 13, 64), "uint8", "data"),
              te.placeholder((7, 5), "float32", "rois")]

    def compute(d, r):
        return tvm_roialign.topi.quantized_roi_align(d, r, POOLED, SCALE, 3, 1.0, 2, True, "NHWC",
                                                     "uint8")

    func = STRATEGIES["x86"].build(compute, inputs, tvm.target.Target({"kind": "llvm", "mcpu": "znver3"}),
                                   "NHWC")
    assert "T.vectorized" in func.script()


def _call(data_shape=(1, 4, 8, 8), dtype="uint8", rois_dtype="float32", **kwargs):
    args = {"scale": 0.1, "zero_point": 3, **kwargs}
    single_op_module(lambda d, r: tvm_roialign.quantized_roi_align(d, r, 2, **args),
                     data=(data_shape, dtype), rois=((3, 5), rois_dtype))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"dtype": "float32"}, TypeError, r"data dtype must be one of \('uint8', 'int8'\)"),
        ({"rois_dtype": "float16"}, TypeError, r"rois dtype \(float16\) must be float32 for data dtype"),
        ({"scale": 0.0}, ValueError, "scale must be a positive finite float"),
        ({"scale": float("nan")}, ValueError, "scale must be a positive finite float"),
        ({"zero_point": 256}, ValueError, r"zero_point must be an int in \[0, 255\]"),
        ({"zero_point": -1}, ValueError, r"zero_point must be an int in \[0, 255\]"),
        ({"dtype": "int8", "zero_point": 128}, ValueError, r"zero_point must be an int in \[-128"),
        ({"zero_point": 1.5}, ValueError, "zero_point must be an int"),
        ({"layout": "HWCN"}, ValueError, "layout must be one of"),
        ({"out_dtype": "int8"}, ValueError, "out_dtype must be 'uint8' or 'float32'"),
        ({"data_shape": (1, 4, 8)}, ValueError, r"data must be 4-D \[N, C, H, W\]"),
        ({"spatial_scale": -1.0}, ValueError, "spatial_scale must be a positive finite float"),
    ],
)
def test_bad_input_raises_one_line_error(kwargs, error, match):
    with pytest.raises(error, match=match) as info:
        _call(**kwargs)
    assert "\n" not in str(info.value)


def test_unregister_removes_the_op_attributes():
    assert _registry.get_op_attr(OP_NAME, "FLegalize") is not None
    with tvm_roialign.stock_tvm():
        for key in ("FLegalize", "FInferType", "FRelaxInferLayout"):
            assert _registry.get_op_attr(OP_NAME, key) is None, key
    assert _registry.get_op_attr(OP_NAME, "FLegalize") is not None


def test_convert_layout_keeps_out_dtype():
    mod = single_op_module(
        lambda d, r: tvm_roialign.quantized_roi_align(d, r, 2, scale=0.1, zero_point=3,
                                                      out_dtype="float32"),
        data=([1, 8, 6, 6], "uint8"), rois=([3, 5], "float32"))
    converted = relax.transform.ConvertLayout({OP_NAME: ["NHWC", "default"]})(mod)
    (call,) = [b.value for b in converted["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and b.value.op.name == OP_NAME]
    assert str(call.attrs["layout"]) == "NHWC"
    assert str(call.ty.dtype) == "float32"
    assert [int(v) for v in call.ty.shape.values] == [3, 2, 2, 8]
