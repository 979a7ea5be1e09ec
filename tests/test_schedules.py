"""The CPU schedule rules (tvm_roialign.schedules): results equal a float64 reference for every conv
and matmul form a model brings (odd channels, strided, dilated, grouped, depthwise, 1x1, batched),
each rule recognizes what it should and declines the rest, and tiles come from the target."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from _targets import NATIVE as HOST
from tvm import relax
from tvm.s_tir.dlight.base.transform import ApplyDefaultSchedule

from tvm_roialign.pipeline import build
from tvm_roialign.schedules import (
    Conv2DNHWC,
    CPUDefault,
    DepthwiseConv2DNHWC,
    Elementwise,
    GroupedConv2DNHWC,
    Matmul,
    cpu_info,
)
from tvm_roialign.schedules.base import pick_lanes
from tvm_roialign.schedules.contraction_tiles import pick_tile

#: float32 results against a float64 reference: relative to the largest output
RTOL = 2e-5


def _conv_module(
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


def _torch_conv(x_nchw, weight_oihw, bias, stride, padding, dilation, groups):
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


def _run(mod, *arrays, target=HOST, **options):
    vm = relax.VirtualMachine(build(mod, target, **options).executable, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return out.numpy()


def _close(actual, expected):
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


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", list(CONVS))
def test_conv_matches_float64(case, layout, rng):
    n, h, w, c, o, k, s, p, d, g = CONVS[case]
    x_nchw = rng.standard_normal((n, c, h, w)).astype("float32")
    w_oihw = (rng.standard_normal((o, c // g, k, k)) * 0.3).astype("float32")
    bias = rng.standard_normal(o).astype("float32")
    expected = _torch_conv(x_nchw, w_oihw, bias, s, p, d, g)
    if layout == "NHWC":
        mod = _conv_module(
            (n, h, w, c), w_oihw.transpose(2, 3, 1, 0).copy(), bias, s, p, d, g, "NHWC"
        )
        out = _run(mod, x_nchw.transpose(0, 2, 3, 1).copy()).transpose(0, 3, 1, 2)
    else:
        mod = _conv_module((n, c, h, w), w_oihw, bias, s, p, d, g, "NCHW")
        out = _run(mod, x_nchw)
    _close(out, expected)


def _matmul_module(a_shape, weight, bias, transpose_b=False):
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


@pytest.mark.parametrize(
    "a_shape, k, n, transpose_b",
    [
        ((24, 40), 40, 32, False),  # dense
        ((30, 70), 70, 91, True),  # odd output (padded), linear's transposed weight
        ((3, 20, 16), 16, 48, False),  # batched rows, shared weight
        ((6, 1200), 1200, 64, False),  # long reduction
        ((300, 1200), 1200, 128, False),  # ``a`` over half of L2: reduction chunks
        ((222, 1200), 1200, 128, False),  # chunks, 37 row tiles (a prime): blocks of one tile
        ((784, 192), 192, 768, False),  # ConvNeXt's MLP input: a chunk would be all of it
        (
            (197, 96),
            96,
            48,
            True,
        ),  # a prime row count (ViT's 197 tokens): a partial last tile
    ],
)
def test_matmul_matches_float64(a_shape, k, n, transpose_b, rng):
    a = rng.standard_normal(a_shape).astype("float32")
    weight = (rng.standard_normal((k, n)) * 0.1).astype("float32")
    bias = rng.standard_normal(n).astype("float32")
    expected = np.maximum(a.astype("float64") @ weight + bias, 0)
    const = weight.T.copy() if transpose_b else weight
    out = _run(_matmul_module(a_shape, const, bias, transpose_b), a)
    _close(out, expected)


def test_batch_matmul_of_two_inputs(rng):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([4, 12, 20], "float32"))
    b = relax.Var("b", relax.TensorType([4, 20, 32], "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(a, b))
        bb.emit_func_output(out)
    x = rng.standard_normal((4, 12, 20)).astype("float32")
    y = rng.standard_normal((4, 20, 32)).astype("float32")
    _close(_run(bb.get(), x, y), x.astype("float64") @ y)


@pytest.mark.parametrize(
    "batch, m, k, n, transpose_b, scale",
    [
        (3, 197, 64, 197, False, False),  # ViT-B/16's q @ k^T: prime rows and columns
        (6, 49, 32, 49, True, True),  # a Swin window, k untransposed, a scale epilogue
        (2, 5, 8, 3, False, False),  # fewer columns than one vector
        (2, 17, 24, 36, False, True),  # columns a half-width vector divides, not a full one
    ],
)
def test_attention_matmul_with_ragged_columns(batch, m, k, n, transpose_b, scale, rng):
    """``b`` computed at run time, its columns padded and packed at each call
    (schedules.runtime_matmul): equal to float64, the padding columns never written."""
    bb = relax.BlockBuilder()
    b_shape = [batch, n, k] if transpose_b else [batch, k, n]
    a = relax.Var("a", relax.TensorType([batch, m, k], "float32"))
    b = relax.Var("b", relax.TensorType(b_shape, "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            rhs = relax.op.permute_dims(b, [0, 2, 1]) if transpose_b else b
            y = bb.emit(relax.op.matmul(a, rhs))
            if scale:
                y = bb.emit(relax.op.multiply(y, relax.const(0.125, "float32")))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    x = rng.standard_normal((batch, m, k)).astype("float32")
    y = rng.standard_normal(b_shape).astype("float32")
    rhs = y.astype("float64").transpose(0, 2, 1) if transpose_b else y.astype("float64")
    expected = x.astype("float64") @ rhs * (0.125 if scale else 1.0)
    _close(_run(bb.get(), x, y), expected)


def test_attention_matmul_tile_fits_every_target():
    """The padded tile of q @ k^T holds in the register file of AVX2, AVX-512 and NEON, its
    accumulator under TVM's 1 KiB stack bound (else a heap workspace per parallel step), and its
    width divides the padded columns."""
    from tvm_roialign.schedules.contraction_analysis import Contraction
    from tvm_roialign.schedules.runtime_matmul import padded_tiling
    from tvm_roialign.schedules.target_info import CPUInfo

    for bits, registers, arch in ((256, 16, "x86"), (512, 32, "x86"), (128, 32, "aarch64")):
        info = CPUInfo(bits, registers, True, 4, 32768, 1 << 20, arch)
        for m, n in ((197, 197), (49, 49), (50, 3)):
            c = Contraction(None, "BMNR", [12, m, n, 64], 2, 0, 1, 2, 3, "float32")
            tiling = padded_tiling(c, info)
            assert tiling.lanes == bits // 32
            assert tiling.rows * tiling.cols + tiling.cols + 1 <= registers
            assert tiling.rows * tiling.cols * bits // 8 < 1024
            assert tiling.rows <= m


def _row_module(shape, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("shape", [(2, 3, 197, 197), (4, 49, 49), (3, 5, 64)])
def test_softmax_row_by_row_matches_float64(shape, rng):
    """schedules.row_reduction: softmax (a ragged row: partial sums whose padding steps re-read
    the last element, which must count once; a vector multiple: vector partial sums) with a
    scale epilogue, against float64. Half the rows peak at their last element."""
    x = (rng.standard_normal(shape) * 4).astype("float32")
    x[..., ::2, -1] = 30.0

    def body(bb, v):
        y = bb.emit(relax.op.nn.softmax(v, axis=-1))
        return relax.op.multiply(y, relax.const(2.0, "float32"))

    x64 = x.astype("float64")
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    _close(_run(_row_module(shape, body), x), 2.0 * e / e.sum(-1, keepdims=True))


@pytest.mark.parametrize("shape", [(1, 197, 768), (2, 7, 7, 96), (3, 50)])
def test_layer_norm_row_by_row_matches_float64(shape, rng):
    x = (rng.standard_normal(shape) * 3 + 1).astype("float32")
    gamma = rng.standard_normal(shape[-1]).astype("float32")
    beta = rng.standard_normal(shape[-1]).astype("float32")

    def body(bb, v):
        return relax.op.nn.layer_norm(
            v, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-6
        )

    x64 = x.astype("float64")
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    expected = (x64 - mean) / np.sqrt(var + 1e-6) * gamma + beta
    _close(_run(_row_module(shape, body), x), expected)


def test_row_reduction_rule_takes_softmax_and_layer_norm_only(rng):
    from tvm_roialign.schedules import RowReduction

    rule = RowReduction()
    softmax = _fused_primfuncs(_row_module((4, 49, 49), lambda bb, v: relax.op.nn.softmax(v)))
    assert all(rule.apply(f, HOST, False) is not None for f in softmax.values())
    dense = _fused_primfuncs(
        _matmul_module((8, 16), rng.standard_normal((16, 32)).astype("float32"), np.zeros(32, "float32"))
    )
    assert all(rule.apply(f, HOST, False) is None for f in dense.values())
    weight = rng.standard_normal((3, 3, 16, 32)).astype("float32")
    conv = _fused_primfuncs(
        _conv_module((1, 8, 8, 16), weight, np.zeros(32, "float32"), 1, 1, 1, 1, "NHWC")
    )
    assert all(rule.apply(f, HOST, False) is None for f in conv.values())


def test_attention_kernels_build_for_aarch64():
    """q @ k^T (197 columns), softmax and layer norm over 197: the padded tile and the row
    rules take them for NEON too (cross build, not run)."""
    from _targets import AARCH64

    from tvm_roialign.schedules import RowReduction

    ones, zeros = np.ones(197, "float32"), np.zeros(197, "float32")
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([3, 197, 64], "float32"))
    b = relax.Var("b", relax.TensorType([3, 64, 197], "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.matmul(a, b)), axis=-1))
            y = relax.op.nn.layer_norm(y, relax.const(ones), relax.const(zeros), axes=[-1])
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    funcs = _fused_primfuncs(mod, AARCH64)
    taken = {
        name: (Matmul() if "matmul" in name else RowReduction()).apply(f, AARCH64, False)
        for name, f in funcs.items()
    }
    assert all(sch is not None for sch in taken.values()), taken
    assert build(mod, AARCH64).executable is not None


def _fused_primfuncs(mod, target=HOST):
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


def test_rules_pick_their_functions(rng):
    weight = rng.standard_normal((3, 3, 16, 32)).astype("float32")
    nhwc = _fused_primfuncs(
        _conv_module((1, 8, 8, 16), weight, np.zeros(32, "float32"), 1, 1, 1, 1, "NHWC")
    )
    (conv,) = nhwc.values()
    assert Conv2DNHWC().apply(conv, HOST, False) is not None
    assert Matmul().apply(conv, HOST, False) is None
    assert Elementwise().apply(conv, HOST, False) is None
    nchw = _fused_primfuncs(
        _conv_module(
            (1, 16, 8, 8),
            weight.transpose(3, 2, 0, 1).copy(),
            np.zeros(32, "float32"),
            1,
            1,
            1,
            1,
            "NCHW",
        )
    )
    (conv_nchw,) = nchw.values()
    assert Conv2DNHWC().apply(conv_nchw, HOST, False) is None
    assert CPUDefault().apply(conv_nchw, HOST, False) is not None
    dense = _fused_primfuncs(
        _matmul_module(
            (8, 16),
            rng.standard_normal((16, 32)).astype("float32"),
            np.zeros(32, "float32"),
        )
    )
    (mm,) = dense.values()
    assert Matmul().apply(mm, HOST, False) is not None
    assert Conv2DNHWC().apply(mm, HOST, False) is None


def _residual_conv_module(x_shape, weight, bias, stride):
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


@pytest.mark.parametrize(
    "x_shape, kernel, stride",
    [((1, 7, 7, 32), 1, 1), ((2, 14, 14, 16), 3, 1), ((1, 14, 14, 16), 1, 2)],
)
def test_narrow_maps_tile_merged_rows_with_the_epilogue_fused(x_shape, kernel, stride, rng):
    """A static conv's output pixels are one row axis (conv_rows): a 7- or 14-wide map fits the
    register tile, the epilogue (bias, residual, ReLU) stays in the tile's write-back (the only
    parallel loop of the function besides the padding's), and the result equals float64."""
    weight = (rng.standard_normal((kernel, kernel, x_shape[3], 48)) * 0.3).astype("float32")
    bias = rng.standard_normal(48).astype("float32")
    mod = _residual_conv_module(x_shape, weight, bias, stride)
    (conv,) = _fused_primfuncs(mod).values()
    scheduled = Conv2DNHWC().apply(conv, HOST, False)
    assert scheduled is not None
    script = scheduled.mod["main"].script()
    blocks = re.findall(r'T\.sblock\("(\w+)"', script)
    assert not any(b.startswith(("T_add", "compute")) for b in blocks), blocks
    x = rng.standard_normal(x_shape).astype("float32")
    conv_out = torch.nn.functional.conv2d(
        torch.from_numpy(x.transpose(0, 3, 1, 2)).double(),
        torch.from_numpy(weight.transpose(3, 2, 0, 1).copy()).double(),
        torch.from_numpy(bias).double(),
        stride,
        kernel // 2,
    ).numpy().transpose(0, 2, 3, 1)
    r = rng.standard_normal(conv_out.shape).astype("float32")
    _close(_run(mod, x, r), np.maximum(conv_out + r, 0))


def test_symbolic_batch_of_narrow_maps_tiles_merged_rows(rng):
    """A conv of static 14x14 maps and a symbolic batch (Mask R-CNN's mask head: one map per
    detection) also gets one row axis of 196 pixels (conv_rows), its epilogue in the tile's
    write-back, and equals float64 for batches of 3 and 1 (the last tile of each map partial)."""
    weight = (rng.standard_normal((3, 3, 16, 48)) * 0.3).astype("float32")
    bias = rng.standard_normal(48).astype("float32")
    mod = _residual_conv_module((tvm.tirx.Var("n", "int64"), 14, 14, 16), weight, bias, 1)
    (conv,) = _fused_primfuncs(mod).values()
    scheduled = Conv2DNHWC().apply(conv, HOST, False)
    assert scheduled is not None
    script = scheduled.mod["main"].script()
    assert "T.int64(196)" in script
    blocks = re.findall(r'T\.sblock\("(\w+)"', script)
    assert not any(b.startswith(("T_add", "compute")) for b in blocks), blocks  # epilogue fused
    for batch in (3, 1):
        x = rng.standard_normal((batch, 14, 14, 16)).astype("float32")
        conv_out = torch.nn.functional.conv2d(
            torch.from_numpy(x.transpose(0, 3, 1, 2)).double(),
            torch.from_numpy(weight.transpose(3, 2, 0, 1).copy()).double(),
            torch.from_numpy(bias).double(),
            1,
            1,
        ).numpy().transpose(0, 2, 3, 1)
        r = rng.standard_normal(conv_out.shape).astype("float32")
        _close(_run(mod, x, r), np.maximum(conv_out + r, 0))


@pytest.mark.parametrize(
    "target",
    [
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"},
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu"},
        None,
    ],
    ids=["avx512", "aarch64", "host"],
)
def test_symbolic_batch_keeps_the_static_batchs_tile(target, rng):
    """Only the tiled row axis being static (196 merged pixels), a symbolic batch of maps gets the
    tile a static batch gets (its accumulator compacted to the tile, under the 1 KiB stack bound
    like every tile's: 7 x 2 vectors on AVX-512); built for each target (cross, not run)."""
    target = HOST if target is None else tvm.target.Target(target)
    weight = rng.standard_normal((3, 3, 16, 256)).astype("float32")
    bias = rng.standard_normal(256).astype("float32")
    tiles = []
    for batch in (tvm.tirx.Var("n", "int64"), 5):
        mod = _residual_conv_module((batch, 14, 14, 16), weight, bias, 1)
        (conv,) = _fused_primfuncs(mod, target).values()
        scheduled = Conv2DNHWC().apply(conv, target, False)
        assert scheduled is not None
        script = scheduled.mod["main"].script()
        # the accumulator a ``global`` tile, which TVM puts on the stack under 1 KiB (a ``local``
        # one became a heap workspace at every step)
        assert "conv2d_nhwc_intermediate_global" in script and 'scope="local"' not in script
        tiles.append(sorted(re.findall(r"T\.unroll\((T\.int64\(\d+\))\)", script)))
        assert build(mod, target).executable is not None
    assert tiles[0] == tiles[1], tiles


def test_conv_accumulator_is_not_a_heap_workspace(rng):
    """A static 1x1 conv's register tile lives on the stack: the built kernel calls no
    ``TVMBackendAllocWorkspace`` (a ``local`` accumulator became one at every step of the
    parallel loop, a third of the time of a 1x1 conv of 16 input channels), and equals float64
    PyTorch."""
    weight = rng.standard_normal((1, 1, 16, 96)).astype("float32")
    bias = rng.standard_normal(96).astype("float32")
    mod = _conv_module((1, 28, 28, 16), weight, bias, 1, 0, 1, 1, "NHWC")
    executable = build(mod, HOST).executable
    if HOST.kind.name == "llvm":
        assert "TVMBackendAllocWorkspace" not in executable.mod.imports[0].inspect_source("asm")
    x = rng.standard_normal((1, 28, 28, 16)).astype("float32")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = _torch_conv(
        x.transpose(0, 3, 1, 2), weight.transpose(3, 2, 0, 1).copy(), bias, 1, 0, 1, 1
    ).transpose(0, 2, 3, 1)
    _close(got, expected)


def test_constant_weights_are_packed_at_compile_time(rng):
    """The packed weight is a constant of the built module: no packing function is left."""
    weight = rng.standard_normal((3, 3, 16, 32)).astype("float32")
    mod = _conv_module(
        (1, 8, 8, 16), weight, np.zeros(32, "float32"), 1, 1, 1, 1, "NHWC"
    )
    from tvm_roialign.pipeline import cpu_pipeline

    lowered = cpu_pipeline(HOST)(mod)
    names = [
        gv.name_hint
        for gv, f in lowered.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    ]
    assert any(name.endswith("_prepacked") for name in names), names
    assert not any("weight_prepack" in name for name in names), names


#: an AVX2, an AVX-512 and an AArch64 target, for the tests of tiles derived from the target
_ON_THREE_CPUS = pytest.mark.parametrize(
    "config",
    [
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell", "num-cores": 2},
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512", "num-cores": 16},
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 4},
    ],
    ids=["avx2", "avx512", "neon"],
)


@pytest.mark.parametrize(
    "mcpu",
    ["haswell", "znver3", "skylake-avx512", "sapphirerapids", "znver4", "neoverse-n1"],
)
def test_register_tile_stays_on_the_stack(mcpu, rng):
    """On every target family (AVX2 of Intel and AMD, AVX-512 of Intel and of Zen 4, AArch64) the
    fp32 register tile fits the register file and its accumulator is under TVM's stack bound (a
    ``global`` buffer of 1 KiB or more is a heap workspace at every parallel step: AVX-512's
    6 x 4 zmm are 1.5 KiB), static or symbolic rows; a 1x1 conv built for the target (cross, not
    run) calls no ``TVMBackendAllocWorkspace``."""
    from tvm_roialign.schedules.contraction_analysis import Contraction
    from tvm_roialign.schedules.contraction_tiles import choose_tiling

    triple = "aarch64-linux-gnu" if mcpu.startswith("neoverse") else "x86_64-linux-gnu"
    target = tvm.target.Target({"kind": "llvm", "mtriple": triple, "mcpu": mcpu})
    info = cpu_info(target)
    for rows, columns in [(3136, 64), (784, 96), (196, 256), (14, 512), (None, 256), (49, 2048)]:
        c = Contraction(None, "MNR", [rows, columns, 256], 1, 0, 1, 1, 2, "float32")
        tiling = choose_tiling(c, info)
        assert tiling.lanes == min(info.lanes(), 16)
        assert tiling.rows * tiling.cols + tiling.cols + 1 <= info.vector_registers
        assert tiling.rows * tiling.cols * tiling.lanes * 4 < 1024, (rows, columns, tiling)
    # the largest tiles within both bounds: 14 accumulators of 256-bit AVX2, 24 of 128-bit NEON,
    # 15 of 512-bit AVX-512 (the stack's 1023 bytes), where the columns allow
    c = Contraction(None, "MNR", [3136, 256, 256], 1, 0, 1, 1, 2, "float32")
    tiling = choose_tiling(c, info)
    assert tiling.rows * tiling.cols >= {128: 24, 256: 12, 512: 14}[info.vector_bits], tiling
    weight = rng.standard_normal((1, 1, 16, 256)).astype("float32")
    mod = _conv_module((1, 14, 14, 16), weight, np.zeros(256, "float32"), 1, 0, 1, 1, "NHWC")
    asm = build(mod, target).executable.mod.imports[0].inspect_source("asm")
    assert "TVMBackendAllocWorkspace" not in asm


@_ON_THREE_CPUS
def test_depthwise_tiles_come_from_the_target(config, rng):
    """The pixel tile fits the target's registers, a task's channels one cache line, a task's
    padded rows half of L2; the rule schedules MobileNet's depthwise conv for each target."""
    from tvm_roialign.schedules.depthwise import channel_chunk, row_chunk, width_tile

    info = cpu_info(tvm.target.Target(config))
    lanes = info.lanes()
    for width, kernel in [(112, 3), (56, 5), (14, 3), (7, 5), (13, 3)]:
        tw = width_tile(width, kernel, info.vector_registers)
        assert width % tw == 0 and tw + kernel + 2 <= info.vector_registers
        assert tw >= min(7, width) or width == 13
    assert channel_chunk(144, lanes, 4) == 16 and channel_chunk(72, 8, 4) == 8
    rows = row_chunk(56, 58 * 16 * 4, 3, 1, 9, info)
    assert 56 % rows == 0 and (rows + 2) * 58 * 16 * 4 <= info.l2_bytes // 2
    assert 9 * (56 // rows) >= min(4 * info.num_cores, 9 * 56)
    weight = rng.standard_normal((3, 3, 1, 96)).astype("float32")
    (func,) = _fused_primfuncs(
        _conv_module((1, 28, 28, 96), weight, np.zeros(96, "float32"), 1, 1, 1, 96, "NHWC")
    ).values()
    target = tvm.target.Target(config)
    with target:
        assert DepthwiseConv2DNHWC().apply(func, target, False) is not None


@_ON_THREE_CPUS
def test_reduction_chunks_come_from_the_target(config, rng):
    """A long reduction's chunks (Goto's order): the chunk divides the reduction, its panel of
    packed weights and a tile's rows of ``a`` fit in L1, a row block (whole row tiles) over a chunk
    fits in half of L2; the matmul rule schedules a chunked matmul for each target, which builds."""
    from tvm_roialign.schedules.matmul import _row_blocks

    target = tvm.target.Target(config)
    info = cpu_info(target)
    lanes = info.lanes()
    # fc6 of a box head (1000 and 1002 rows), the chunked case of test_matmul_matches_float64
    for rows_extent, k, rows, cols in [(1000, 12544, 5, 2), (1002, 12544, 6, 2), (300, 1200, 6, 2)]:
        chunk, tiles = _row_blocks(k, rows_extent, rows, cols * lanes, info)
        assert k % chunk == 0 and chunk >= 32
        assert chunk * (cols * lanes + rows) * 4 <= info.l1_bytes
        assert (rows_extent // rows) % tiles == 0
        assert tiles * rows * chunk * 4 <= info.l2_bytes // 2
    weight = (rng.standard_normal((1200, 128)) * 0.1).astype("float32")
    mod = _matmul_module((300, 1200), weight, np.zeros(128, "float32"))
    funcs = _fused_primfuncs(mod, target)
    with target:
        taken = [Matmul().apply(f, target, False) for name, f in funcs.items() if "matmul" in name]
    assert taken and all(sch is not None for sch in taken)
    assert build(mod, target).executable is not None


def test_tiles_fit_the_register_file():
    for rows_extent, vectors in [(1000, 64), (14, 16), (128, 4), (7, 1), (13, 3)]:
        for registers in (16, 32):
            rows, cols = pick_tile(rows_extent, vectors, registers)
            assert rows <= max(rows_extent, 1) and vectors % cols == 0
            assert rows * cols + cols + 1 <= registers
    # 32 registers: a tile of most of them (six rows of four vectors, as SGEMM kernels use)
    rows, cols = pick_tile(128, 16, 32)
    assert rows * cols >= 24
    assert (
        pick_lanes(96, 16) == 16
        and pick_lanes(91, 16) is None
        and pick_lanes(12, 16) == 4
    )


@pytest.mark.parametrize(
    "config, bits, registers",
    [
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu"}, 128, 16),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}, 256, 16),
        (
            {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"},
            512,
            32,
        ),
        (
            {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"},
            128,
            32,
        ),
    ],
)
def test_cpu_info_from_the_target(config, bits, registers):
    info = cpu_info(tvm.target.Target({**config, "num-cores": 3}))
    assert (info.vector_bits, info.vector_registers, info.num_cores) == (
        bits,
        registers,
        3,
    )
    assert info.lanes("float32") == bits // 32


def test_cpu_info_cache_is_bounded_and_keyed_by_the_targets_fields():
    """One entry per (triple, cpu, features, cores), however the target is spelled; at most a
    bounded number of entries."""
    from tvm_roialign.schedules.target_info import _cpu_info_by_fields

    config = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"}
    first = cpu_info(tvm.target.Target({**config, "num-cores": 5}))
    before = _cpu_info_by_fields.cache_info()
    again = cpu_info(tvm.target.Target({**config, "num-cores": 5, "keys": ["cpu", "other"]}))
    assert again is first and _cpu_info_by_fields.cache_info().hits == before.hits + 1
    assert cpu_info(tvm.target.Target({**config, "num-cores": 6})).num_cores == 6
    for cores in range(1, 80):
        cpu_info(tvm.target.Target({**config, "num-cores": cores}))
    assert _cpu_info_by_fields.cache_info().currsize <= _cpu_info_by_fields.cache_info().maxsize


def test_scheduled_functions_are_not_touched(rng):
    """A PrimFunc marked tirx.is_scheduled (RoIAlign's strategies) passes through unchanged."""
    weight = rng.standard_normal((1, 1, 16, 16)).astype("float32")
    funcs = _fused_primfuncs(
        _conv_module((1, 4, 4, 16), weight, np.zeros(16, "float32"), 1, 0, 1, 1, "NHWC")
    )
    ((name, func),) = funcs.items()
    marked = func.with_attr("tirx.is_scheduled", True)
    mod = tvm.IRModule({name: marked})
    with HOST:
        out = ApplyDefaultSchedule(Conv2DNHWC(), CPUDefault())(mod)
    tvm.ir.assert_structural_equal(out[name], marked)


def test_conv_with_a_silu_epilogue(rng):
    """The bias add is read twice (``y * sigmoid(y)``): inlined into the tile write-back as one."""
    weight = (rng.standard_normal((3, 3, 16, 32)) * 0.2).astype("float32")
    bias = rng.standard_normal(32).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 7, 9, 16], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x,
                    relax.const(weight),
                    padding=1,
                    data_layout="NHWC",
                    kernel_layout="HWIO",
                )
            )
            y = bb.emit(relax.op.add(y, relax.const(bias)))
            out = bb.emit_output(relax.op.multiply(y, relax.op.sigmoid(y)))
        bb.emit_func_output(out)
    data = rng.standard_normal((1, 7, 9, 16)).astype("float32")
    y = torch.nn.functional.conv2d(
        torch.from_numpy(data).permute(0, 3, 1, 2).double(),
        torch.from_numpy(weight).permute(3, 2, 0, 1).double(),
        torch.from_numpy(bias).double(),
        padding=1,
    )
    expected = torch.nn.functional.silu(y).permute(0, 2, 3, 1).numpy()
    _close(_run(bb.get(), data), expected)


def _squeeze_excitation_module(x_shape, w1, b1, w2, b2, gate):
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


@pytest.mark.parametrize("gate", ["sigmoid", "hardsigmoid"])
@pytest.mark.parametrize("x_shape", [(1, 14, 14, 48), (2, 7, 5, 20)])
def test_squeeze_excitation_matches_float64(x_shape, gate, rng):
    """The gate (a 1x1 conv on the pooled 1 x 1 map, its bias and sigmoid) is the conv rule's: the
    sigmoid computed once per channel in the tile's write-back, not per pixel of the broadcast
    multiply after it (the fallback rule's scalar library call per element of the activation)."""
    c, r = x_shape[-1], 8
    w1 = (rng.standard_normal((1, 1, c, r)) * 0.3).astype("float32")
    b1 = rng.standard_normal(r).astype("float32")
    w2 = (rng.standard_normal((1, 1, r, c)) * 0.3).astype("float32")
    b2 = rng.standard_normal(c).astype("float32")
    mod = _squeeze_excitation_module(x_shape, w1, b1, w2, b2, gate)
    funcs = _fused_primfuncs(mod)
    convs = [f for name, f in funcs.items() if name.startswith("fused_conv2d")]
    assert len(convs) == 2
    for f in convs:
        assert Conv2DNHWC().apply(f, HOST, False) is not None
    data = rng.standard_normal(x_shape).astype("float32")
    x = torch.from_numpy(data).double()
    pooled = x.mean(dim=(1, 2))
    y = pooled @ torch.from_numpy(w1[0, 0]).double() + torch.from_numpy(b1).double()
    y = torch.nn.functional.silu(y)
    g = y @ torch.from_numpy(w2[0, 0]).double() + torch.from_numpy(b2).double()
    g = torch.sigmoid(g) if gate == "sigmoid" else torch.nn.functional.hardsigmoid(g)
    expected = (x * g[:, None, None, :]).numpy()
    _close(_run(mod, data), expected)


def _parallel_loops(func) -> list[int]:
    found = []

    def visit(loop):
        if loop.kind == tvm.tirx.ForKind.PARALLEL:
            found.append(int(loop.extent))

    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, visit))
    return found


@pytest.mark.parametrize(
    "config",
    [
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 2},
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512", "num-cores": 8},
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 4},
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver3", "num-cores": 1},
    ],
)
def test_tiny_contractions_run_serially(config, rng):
    """A squeeze-excitation's FC on the pooled map has too few multiply-adds to pay for a
    parallel launch: its tiles run serially, its broadcast multiply over the activation in
    parallel; a pointwise conv on a feature map stays parallel (serial for a one-core target)."""
    target = tvm.target.Target(config)
    c = 48
    mod = _squeeze_excitation_module(
        (1, 14, 14, c),
        rng.standard_normal((1, 1, c, 8)).astype("float32"),
        rng.standard_normal(8).astype("float32"),
        rng.standard_normal((1, 1, 8, c)).astype("float32"),
        rng.standard_normal(c).astype("float32"),
        "sigmoid",
    )
    gate = next(f for n, f in _fused_primfuncs(mod, target).items() if "multiply1" in n)
    with target:
        scheduled = Conv2DNHWC().apply(gate, target, False).mod["main"]
    multi = cpu_info(target).num_cores > 1
    # only the broadcast multiply's pass over the 14 x 14 pixels (the elementwise rule's)
    assert _parallel_loops(scheduled) == [14 * 14]
    pointwise = _fused_primfuncs(
        _conv_module((1, 28, 28, 64), rng.standard_normal((1, 1, 64, 64)).astype("float32"),
                     np.zeros(64, "float32"), 1, 0, 1, 1, "NHWC"),
        target,
    )
    (conv,) = pointwise.values()
    with target:
        scheduled = Conv2DNHWC().apply(conv, target, False).mod["main"]
    assert bool(_parallel_loops(scheduled)) == multi


@pytest.mark.parametrize("shape", [(1, 7, 7, 1280), (2, 5, 3, 12)])
def test_global_mean_divides_in_its_write_back(shape, rng):
    """A global average pool (the squeeze-excitation's, the classifier head's): the division by
    the count is inlined into the fallback's tile write-back, one parallel loop in all."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(x, axis=[1, 2], keepdims=True))
        bb.emit_func_output(out)
    mod = bb.get()
    (func,) = _fused_primfuncs(mod).values()
    with HOST:
        scheduled = CPUDefault().apply(func, HOST, False).mod["main"]
    assert len(_parallel_loops(scheduled)) == 1
    data = rng.standard_normal(shape).astype("float32")
    _close(_run(mod, data), data.astype("float64").mean(axis=(1, 2), keepdims=True))


def test_image_padding_keeps_its_pixel_and_channel_loops(rng):
    """The zero padding of a 3-channel image (a classifier's first conv), whose 3 channels make
    no vector: its rows run in parallel with the pixel and channel loops kept (the channels
    unrolled), not one fused index divided by 3 and by the padded width at every element (three
    times the conv's own time); the conv equals float64 PyTorch."""
    weight = rng.standard_normal((3, 3, 3, 16)).astype("float32")
    bias = rng.standard_normal(16).astype("float32")
    mod = _conv_module((1, 130, 20, 3), weight, bias, 2, 1, 1, 1, "NHWC")
    (conv,) = _fused_primfuncs(mod).values()
    sch = Conv2DNHWC().apply(conv, HOST, False)
    assert sch is not None
    pad_loops = sch.get_loops(sch.get_sblock("pad_temp"))
    assert [int(sch.get(lp).extent) for lp in pad_loops][-2:] == [22, 3]
    assert sch.get(pad_loops[-1]).kind == tvm.tirx.ForKind.UNROLLED
    assert sch.get(pad_loops[0]).kind == tvm.tirx.ForKind.PARALLEL
    x = rng.standard_normal((1, 130, 20, 3)).astype("float32")
    expected = _torch_conv(
        x.transpose(0, 3, 1, 2), weight.transpose(3, 2, 0, 1).copy(), bias, 2, 1, 1, 1
    ).transpose(0, 2, 3, 1)
    _close(_run(mod, x), expected)


def test_padded_conv_slice_stays_inside_its_output(rng):
    """A conv whose output channels PadChannels padded (3 -> 4) is sliced back before its bias
    add: the add must not be run over the padded tile, or it writes past the end of its smaller
    output (a heap corruption that crashed Mask R-CNN's RPN head). The output is a view into a
    larger buffer whose tail is checked."""
    from tvm.s_tir import dlight  # noqa: F401 - ApplyDefaultSchedule's rules package

    from tvm_roialign.pipeline import prepare_pipeline

    # the shape of Mask R-CNN's RPN objectness conv at the first FPN level (512x512 photo)
    x_shape, out_channels = (1, 128, 128, 256), 3
    weight = rng.standard_normal((1, 1, 256, out_channels)).astype("float32")
    bias = rng.standard_normal(out_channels).astype("float32")
    with HOST:
        prepared = prepare_pipeline(HOST, layout=None, winograd=0)(
            _conv_module(x_shape, weight, bias, (1, 1), (0, 0), (1, 1), 1, "NHWC", relu=False)
        )
    (name,) = [
        gv.name_hint
        for gv, f in prepared.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and "strided_slice" in gv.name_hint
    ]
    sch = Conv2DNHWC().apply(prepared[name].with_attr("global_symbol", "main"), HOST, False)
    assert sch is not None
    lib = tvm.compile(sch.mod, target=HOST)
    params = prepared[name].params
    padded = [int(d) for d in params[1].ty.shape]
    x = rng.standard_normal(x_shape).astype("float32")
    w = np.zeros(padded, "float32")
    w[..., :out_channels] = weight
    b = bias.reshape(1, 1, 1, -1)
    guard = 64
    size = 128 * 128 * out_channels
    storage = torch.full((size + guard,), 12345.0)
    out = storage[:size].view(1, 128, 128, out_channels)
    lib["main"](
        tvm.runtime.tensor(x), tvm.runtime.tensor(w), tvm.runtime.tensor(b), tvm.runtime.from_dlpack(out)
    )
    assert (storage[-guard:] == 12345.0).all(), "the kernel wrote past the end of its output"
    expected = np.einsum("nhwc,co->nhwo", x.astype("float64"), weight[0, 0].astype("float64")) + bias
    np.testing.assert_allclose(out.numpy(), expected, rtol=RTOL, atol=RTOL * np.abs(expected).max())


def test_symbolic_conv_runs_and_keeps_no_whole_output_local_buffer(rng):
    """A conv whose image size is symbolic (an ONNX model exported with dynamic height and width)
    is scheduled without a ``local`` accumulator of the output's symbolic shape: TIR sized it by
    the whole output, one stack array per parallel task, and the model segfaulted at 224x224 (the
    tile's own accumulator: tests/test_symbolic_shapes.py)."""
    h, w = tvm.tirx.Var("h", "int64"), tvm.tirx.Var("w", "int64")
    weight = rng.standard_normal((3, 3, 8, 16)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, h, w, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x, relax.const(weight), padding=(1, 1), data_layout="NHWC", kernel_layout="HWIO"
                )
            )
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    from tvm_roialign.pipeline import cpu_schedule_pass, prepare_pipeline

    with HOST:
        scheduled = cpu_schedule_pass()(prepare_pipeline(HOST)(bb.get()))
    texts = [f.script() for _gv, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert texts and not any('scope="local"' in text for text in texts)
    vm = relax.VirtualMachine(build(bb.get(), HOST).executable, tvm.cpu())
    data = rng.standard_normal((1, 96, 80, 8)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(data)).numpy()
    expected = torch.nn.functional.conv2d(
        torch.from_numpy(data).permute(0, 3, 1, 2).double(),
        torch.from_numpy(weight).permute(3, 2, 0, 1).double(),
        padding=1,
    ).relu().permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=RTOL * np.abs(expected).max())


def _grouped_primfunc(rng, channels, groups, x_shape=(1, 6, 6)):
    weight = rng.standard_normal((3, 3, channels // groups, channels)).astype("float32")
    mod = _conv_module(
        (*x_shape, channels), weight, np.zeros(channels, "float32"), 1, 1, 1, groups, "NHWC"
    )
    (func,) = _fused_primfuncs(mod).values()
    return func


def test_grouped_rule_takes_grouped_convs_only(rng):
    """Grouped NHWC convs of 4 or more channels per group go to the grouped rule (a tile whose
    vector lanes divide the channels of a group); depthwise, plain and 2-per-group ones do not."""
    lanes = cpu_info(HOST).lanes()
    grouped = _grouped_primfunc(rng, 128, 32)
    sch = GroupedConv2DNHWC().apply(grouped, HOST, False)
    assert sch is not None
    text = sch.mod["main"].script()
    assert "T.vectorized" in text and "T.parallel" in text
    assert Conv2DNHWC().apply(grouped, HOST, False) is None
    assert DepthwiseConv2DNHWC().apply(grouped, HOST, False) is None
    wide = GroupedConv2DNHWC().apply(_grouped_primfunc(rng, 64, 2), HOST, False)
    assert f"T.vectorized(T.int64({lanes}))" in wide.mod["main"].script()
    for channels, groups in ((16, 16), (8, 4)):
        assert GroupedConv2DNHWC().apply(_grouped_primfunc(rng, channels, groups), HOST, False) is None
    plain = _grouped_primfunc(rng, 16, 1)
    assert GroupedConv2DNHWC().apply(plain, HOST, False) is None


def test_symbolic_grouped_conv_matches_torch(rng):
    """A grouped conv of symbolic height and width is tiled without a ``local`` accumulator of the
    output's symbolic shape and equals eager torch."""
    h, w = tvm.tirx.Var("h", "int64"), tvm.tirx.Var("w", "int64")
    weight = rng.standard_normal((3, 3, 4, 32)).astype("float32")
    bias = rng.standard_normal(32).astype("float32")
    mod = _conv_module((1, h, w, 32), weight, bias, 1, 1, 1, 8, "NHWC")
    from tvm_roialign.pipeline import cpu_schedule_pass, prepare_pipeline

    with HOST:
        scheduled = cpu_schedule_pass()(prepare_pipeline(HOST)(mod))
    prims = {gv: f for gv, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    compacted = tvm.transform.Sequential(
        [
            tvm.s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            tvm.s_tir.transform.ConvertBlocksToOpaque(),
            tvm.s_tir.transform.CompactBufferAllocation(),
        ]
    )(tvm.IRModule(prims))
    local = [
        line
        for _gv, f in compacted.functions_items()
        for line in f.script().splitlines()
        if 'scope="local"' in line and "alloc_buffer" in line
    ]
    # the accumulator is one tile: static, whatever the image size
    assert local and not any(re.search(r"\b[hw]\b", line) for line in local), local
    data = rng.standard_normal((1, 11, 13, 32)).astype("float32")
    got = _run(mod, data)
    expected = torch.nn.functional.conv2d(
        torch.from_numpy(data).permute(0, 3, 1, 2).double(),
        torch.from_numpy(weight).permute(3, 2, 0, 1).double(),
        torch.from_numpy(bias).double(),
        padding=1,
        groups=8,
    ).relu().permute(0, 2, 3, 1).numpy()
    _close(got, expected)
