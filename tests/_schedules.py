"""What the schedule rule tests share (tests/test_schedules_*.py): the modules they build (a conv, a
matmul, a row reduction...), float64 and PyTorch references, a build-and-run on the host, the targets
whose tiles they compare."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from _targets import NATIVE as HOST
from tvm import relax

from tvm_roialign.pipeline import build
from tvm_roialign.testing import run_first

#: float32 results against a float64 reference: relative to the largest output
RTOL = 2e-5


def conv_module(
    x_shape, weight, bias, stride, padding, dilation, groups, layout, relu=True
):
    kernel_layout = "HWIO" if layout == "NHWC" else "OIHW"
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(x_shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x,
                    relax.const(weight),
                    strides=stride,
                    padding=padding,
                    dilation=dilation,
                    groups=groups,
                    data_layout=layout,
                    kernel_layout=kernel_layout,
                )
            )
            shape = [1, 1, 1, -1] if layout == "NHWC" else [1, -1, 1, 1]
            y = bb.emit(relax.op.add(y, relax.const(bias.reshape(shape))))
            if relu:
                y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def torch_conv(x_nchw, weight_oihw, bias, stride, padding, dilation, groups):
    out = torch.nn.functional.conv2d(
        torch.from_numpy(x_nchw).double(),
        torch.from_numpy(weight_oihw).double(),
        torch.from_numpy(bias).double(),
        stride,
        padding,
        dilation,
        groups,
    )
    return torch.relu(out).numpy()


def build_and_run(mod, *arrays, target=HOST, **options):
    return run_first(build(mod, target, **options).executable, *arrays)


def close_to(actual, expected):
    scale = max(float(np.abs(expected).max()), 1e-6)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=RTOL * scale)


# (N, H, W, C, O, kernel, stride, padding, dilation, groups)
CONVS = {
    "3x3": (1, 9, 10, 16, 32, 3, 1, 1, 1, 1),
    "3x3-odd-out": (2, 7, 6, 8, 13, 3, 1, 1, 1, 1),
    "1x1": (1, 6, 8, 24, 48, 1, 1, 0, 1, 1),
    "1x1-strided": (1, 8, 8, 16, 32, 1, 2, 0, 1, 1),
    "3x3-strided": (1, 9, 9, 8, 16, 3, 2, 1, 1, 1),
    "7x7-stem": (1, 12, 12, 3, 16, 7, 2, 3, 1, 1),
    "dilated": (1, 10, 10, 8, 16, 3, 1, 2, 2, 1),
    "grouped": (1, 6, 6, 16, 32, 3, 1, 1, 1, 4),
    # ResNeXt 32x4d's first stage: 4 channels per group, fewer than a vector's lanes
    "grouped-4-per-group": (1, 5, 14, 64, 64, 3, 1, 1, 1, 16),
    # 32 channels per group (two 16-lane vectors), a width no vector count divides
    "grouped-32-per-group": (1, 4, 7, 64, 64, 3, 1, 1, 1, 2),
    # 12 channels per group (not a multiple of the lanes), 24 strided
    "grouped-12-per-group": (1, 5, 6, 36, 36, 3, 1, 1, 1, 3),
    "grouped-24-strided": (2, 7, 5, 48, 48, 3, 2, 1, 1, 2),
    # 2 channels per group: below the narrowest vector, left to the fallback
    "grouped-2-per-group": (1, 5, 5, 8, 8, 3, 1, 1, 1, 4),
    "depthwise": (1, 6, 6, 16, 16, 3, 1, 1, 1, 16),
    # depthwise: rows in several chunks, a width the pixel tile divides (8 of 40)
    "depthwise-wide": (1, 20, 40, 48, 48, 3, 1, 1, 1, 48),
    # depthwise 5x5 strided (EfficientNet), two images, channels in 8-lane chunks
    "depthwise-5x5-strided": (2, 11, 9, 24, 24, 5, 2, 2, 1, 24),
    # depthwise dilated, a prime width (one pixel per tile), no padding
    "depthwise-dilated": (1, 9, 13, 16, 16, 3, 1, 2, 2, 16),
    "depthwise-unpadded": (1, 8, 8, 32, 32, 3, 1, 0, 1, 32),
    "odd-in": (1, 5, 5, 3, 5, 3, 1, 0, 1, 1),
    # a row extent the register tile does not divide (its padding rows computed unguarded)
    "wide-ragged": (1, 3, 50, 16, 64, 3, 1, 1, 1, 1),
}


def matmul_module(a_shape, weight, bias, transpose_b=False):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(list(a_shape), "float32"))
    with bb.function("main", [a]):
        with bb.dataflow():
            w = relax.const(weight)
            if transpose_b:
                w = bb.emit(relax.op.permute_dims(w))
            y = bb.emit(relax.op.matmul(a, w))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(bias))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def row_module(shape, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def fused_primfuncs(mod, target=HOST):
    with target:
        mod = tvm.transform.Sequential(
            [
                relax.transform.LegalizeOps(),
                relax.transform.AnnotateTIROpPattern(),
                relax.transform.FoldConstant(),
                relax.transform.FuseOps(),
                relax.transform.FuseTIR(),
                relax.transform.AttachAttrLayoutFreeBuffers(),
            ]
        )(mod)
    return {
        gv.name_hint: f
        for gv, f in mod.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    }


def residual_conv_module(x_shape, weight, bias, stride):
    """``relu(conv2d(x, weight, stride) + bias + r)``, NHWC / HWIO, ``r`` an input."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(x_shape), "float32"))
    n, h, w, _ = x_shape
    pad = weight.shape[0] // 2
    out_hw = [(side + 2 * pad - weight.shape[0]) // stride + 1 for side in (h, w)]
    r = relax.Var("r", relax.TensorType([n, *out_hw, weight.shape[3]], "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x, relax.const(weight), strides=stride, padding=pad,
                    data_layout="NHWC", kernel_layout="HWIO",
                )
            )
            y = bb.emit(relax.op.add(relax.op.add(y, relax.const(bias)), r))
            out = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
        bb.emit_func_output(out)
    return bb.get()


#: an AVX2, an AVX-512 and an AArch64 target, for the tests of tiles derived from the target
ON_THREE_CPUS = pytest.mark.parametrize(
    "config",
    [
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell", "num-cores": 2},
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512", "num-cores": 16},
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 4},
    ],
    ids=["avx2", "avx512", "neon"],
)


def squeeze_excitation_module(x_shape, w1, b1, w2, b2, gate):
    """EfficientNet's / MobileNetV3's squeeze-excitation on an NHWC activation: mean over the
    pixels, 1x1 conv + SiLU (ReLU for MobileNetV3), 1x1 conv + ``gate``, times the activation."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(x_shape), "float32"))
    conv = dict(data_layout="NHWC", kernel_layout="HWIO")
    with bb.function("main", [x]):
        with bb.dataflow():
            m = bb.emit(relax.op.mean(x, axis=[1, 2], keepdims=True))
            y = bb.emit(relax.op.nn.conv2d(m, relax.const(w1), **conv))
            y = bb.emit(relax.op.add(y, relax.const(b1)))
            y = bb.emit(relax.op.multiply(y, relax.op.sigmoid(y)))
            g = bb.emit(relax.op.nn.conv2d(y, relax.const(w2), **conv))
            g = bb.emit(relax.op.add(g, relax.const(b2)))
            if gate == "sigmoid":
                g = bb.emit(relax.op.sigmoid(g))
            else:  # hardsigmoid as torch.export leaves it: clip(g + 3, 0, 6) / 6
                g = relax.op.clip(relax.op.add(g, relax.const(3.0)), 0, 6)
                g = bb.emit(relax.op.divide(g, relax.const(6.0)))
            out = bb.emit_output(relax.op.multiply(g, x))
        bb.emit_func_output(out)
    return bb.get()


def parallel_loops(func) -> list[int]:
    found = []

    def visit(loop):
        if loop.kind == tvm.tirx.ForKind.PARALLEL:
            found.append(int(loop.extent))

    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, visit))
    return found


def grouped_primfunc(rng, channels, groups, x_shape=(1, 6, 6)):
    weight = rng.standard_normal((3, 3, channels // groups, channels)).astype("float32")
    mod = conv_module(
        (*x_shape, channels), weight, np.zeros(channels, "float32"), 1, 1, 1, groups, "NHWC"
    )
    (func,) = fused_primfuncs(mod).values()
    return func
