"""The conv2d rules (NHWC conv2d, depthwise, grouped; tvm_roialign.schedules.contraction): results equal a
float64 reference for every conv form a model brings (odd channels, strided, dilated, 1x1, batched, symbolic
sizes, fused epilogues), their tiles come from the target and their weights are packed at compile time."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import tvm
from _schedules import (
    CONVS,
    ON_THREE_CPUS,
    RTOL,
    build_and_run,
    close_to,
    conv_module,
    fused_primfuncs,
    grouped_primfunc,
    residual_conv_module,
    squeeze_excitation_module,
    torch_conv,
)
from _targets import NATIVE as HOST
from tvm import relax

from tvm_roialign.pipeline import build
from tvm_roialign.schedules import Conv2DNHWC, DepthwiseConv2DNHWC, GroupedConv2DNHWC, cpu_info


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", list(CONVS))
def test_conv_matches_float64(case, layout, rng):
    n, h, w, c, o, k, s, p, d, g = CONVS[case]
    x_nchw = rng.standard_normal((n, c, h, w)).astype("float32")
    w_oihw = (rng.standard_normal((o, c // g, k, k)) * 0.3).astype("float32")
    bias = rng.standard_normal(o).astype("float32")
    expected = torch_conv(x_nchw, w_oihw, bias, s, p, d, g)
    if layout == "NHWC":
        mod = conv_module(
            (n, h, w, c), w_oihw.transpose(2, 3, 1, 0).copy(), bias, s, p, d, g, "NHWC"
        )
        out = build_and_run(mod, x_nchw.transpose(0, 2, 3, 1).copy()).transpose(0, 3, 1, 2)
    else:
        mod = conv_module((n, c, h, w), w_oihw, bias, s, p, d, g, "NCHW")
        out = build_and_run(mod, x_nchw)
    close_to(out, expected)


def _check_residual_conv(mod, x, weight, bias, stride, rng):
    """``residual_conv_module``'s result on NHWC ``x`` (and a random residual) against float64:
    ``relu(conv(x) + bias + r)``, the conv padded by half the kernel."""
    conv_out = torch.nn.functional.conv2d(
        torch.from_numpy(x.transpose(0, 3, 1, 2)).double(),
        torch.from_numpy(weight.transpose(3, 2, 0, 1).copy()).double(),
        torch.from_numpy(bias).double(),
        stride,
        weight.shape[0] // 2,
    ).numpy().transpose(0, 2, 3, 1)
    r = rng.standard_normal(conv_out.shape).astype("float32")
    close_to(build_and_run(mod, x, r), np.maximum(conv_out + r, 0))


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
    mod = residual_conv_module(x_shape, weight, bias, stride)
    (conv,) = fused_primfuncs(mod).values()
    scheduled = Conv2DNHWC().apply(conv, HOST, False)
    assert scheduled is not None
    script = scheduled.mod["main"].script()
    blocks = re.findall(r'T\.sblock\("(\w+)"', script)
    assert not any(b.startswith(("T_add", "compute")) for b in blocks), blocks
    _check_residual_conv(mod, rng.standard_normal(x_shape).astype("float32"), weight, bias, stride, rng)


def test_symbolic_batch_of_narrow_maps_tiles_merged_rows(rng):
    """A conv of static 14x14 maps and a symbolic batch (Mask R-CNN's mask head: one map per
    detection) also gets one row axis of 196 pixels (conv_rows), its epilogue in the tile's
    write-back, and equals float64 for batches of 3 and 1 (the last tile of each map partial)."""
    weight = (rng.standard_normal((3, 3, 16, 48)) * 0.3).astype("float32")
    bias = rng.standard_normal(48).astype("float32")
    mod = residual_conv_module((tvm.tirx.Var("n", "int64"), 14, 14, 16), weight, bias, 1)
    (conv,) = fused_primfuncs(mod).values()
    scheduled = Conv2DNHWC().apply(conv, HOST, False)
    assert scheduled is not None
    script = scheduled.mod["main"].script()
    assert "T.int64(196)" in script
    blocks = re.findall(r'T\.sblock\("(\w+)"', script)
    assert not any(b.startswith(("T_add", "compute")) for b in blocks), blocks  # epilogue fused
    for batch in (3, 1):
        x = rng.standard_normal((batch, 14, 14, 16)).astype("float32")
        _check_residual_conv(mod, x, weight, bias, 1, rng)


@pytest.mark.parametrize("kernel, stride", [(1, 1), (3, 1), (3, 2)])
def test_symbolic_maps_tile_merged_rows(kernel, stride, rng):
    """A conv of symbolic height and width also gets one row axis of ``H * W`` pixels (conv_rows):
    tiled on one image row, clamped, a symbolic resnet50's layer3 1x1 convs took 12.8 ms against
    the static build's 9.9 ms (6 calls at 1x3x320x480), and the whole model 1.09x its static
    build (0.98x merged). Epilogue in the tile's write-back; float64 at widths that no tile
    divides, a batch, and one-pixel rows."""
    weight = (rng.standard_normal((kernel, kernel, 16, 48)) * 0.3).astype("float32")
    bias = rng.standard_normal(48).astype("float32")
    n, h, w = (tvm.tirx.Var(name, "int64") for name in "nhw")
    mod = residual_conv_module((n, h, w, 16), weight, bias, stride)
    (conv,) = fused_primfuncs(mod).values()
    scheduled = Conv2DNHWC().apply(conv, HOST, False)
    assert scheduled is not None
    script = scheduled.mod["main"].script()
    # the tiles of the rows [n, h * w] (a stride's output extents are named: extent2 * extent3)
    assert re.search(r"\(h \* w|\(extent\d \* extent\d", script), script
    blocks = re.findall(r'T\.sblock\("(\w+)"', script)
    assert not any(b.startswith(("T_add", "compute")) for b in blocks), blocks  # epilogue fused
    for shape in ((1, 9, 13), (2, 16, 7), (1, 5, 1)):
        x = rng.standard_normal((*shape, 16)).astype("float32")
        _check_residual_conv(mod, x, weight, bias, stride, rng)


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
        mod = residual_conv_module((batch, 14, 14, 16), weight, bias, 1)
        (conv,) = fused_primfuncs(mod, target).values()
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
    mod = conv_module((1, 28, 28, 16), weight, bias, 1, 0, 1, 1, "NHWC")
    executable = build(mod, HOST).executable
    if HOST.kind.name == "llvm":
        assert "TVMBackendAllocWorkspace" not in executable.mod.imports[0].inspect_source("asm")
    x = rng.standard_normal((1, 28, 28, 16)).astype("float32")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = torch_conv(
        x.transpose(0, 3, 1, 2), weight.transpose(3, 2, 0, 1).copy(), bias, 1, 0, 1, 1
    ).transpose(0, 2, 3, 1)
    close_to(got, expected)


def test_constant_weights_are_packed_at_compile_time(rng):
    """The packed weight is a constant of the built module: no packing function is left."""
    weight = rng.standard_normal((3, 3, 16, 32)).astype("float32")
    mod = conv_module(
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


@ON_THREE_CPUS
def test_depthwise_tiles_come_from_the_target(config, rng):
    """The pixel tile fits the target's registers, a task's channels one cache line, a task's
    padded rows half of L2; the rule schedules MobileNet's depthwise conv for each target."""
    from tvm_roialign.schedules.contraction.depthwise import channel_chunk, row_chunk, width_tile

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
    (func,) = fused_primfuncs(
        conv_module((1, 28, 28, 96), weight, np.zeros(96, "float32"), 1, 1, 1, 96, "NHWC")
    ).values()
    target = tvm.target.Target(config)
    with target:
        assert DepthwiseConv2DNHWC().apply(func, target, False) is not None


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
    close_to(build_and_run(bb.get(), data), expected)


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
    mod = squeeze_excitation_module(x_shape, w1, b1, w2, b2, gate)
    funcs = fused_primfuncs(mod)
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
    close_to(build_and_run(mod, data), expected)


def test_image_padding_keeps_its_pixel_and_channel_loops(rng):
    """The zero padding of a 3-channel image (a classifier's first conv), whose 3 channels make
    no vector: its rows run in parallel with the pixel and channel loops kept (the channels
    unrolled), not one fused index divided by 3 and by the padded width at every element (three
    times the conv's own time); the conv equals float64 PyTorch."""
    weight = rng.standard_normal((3, 3, 3, 16)).astype("float32")
    bias = rng.standard_normal(16).astype("float32")
    mod = conv_module((1, 130, 20, 3), weight, bias, 2, 1, 1, 1, "NHWC")
    (conv,) = fused_primfuncs(mod).values()
    sch = Conv2DNHWC().apply(conv, HOST, False)
    assert sch is not None
    pad_loops = sch.get_loops(sch.get_sblock("pad_temp"))
    assert [int(sch.get(lp).extent) for lp in pad_loops][-2:] == [22, 3]
    assert sch.get(pad_loops[-1]).kind == tvm.tirx.ForKind.UNROLLED
    assert sch.get(pad_loops[0]).kind == tvm.tirx.ForKind.PARALLEL
    x = rng.standard_normal((1, 130, 20, 3)).astype("float32")
    expected = torch_conv(
        x.transpose(0, 3, 1, 2), weight.transpose(3, 2, 0, 1).copy(), bias, 2, 1, 1, 1
    ).transpose(0, 2, 3, 1)
    close_to(build_and_run(mod, x), expected)


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
            conv_module(x_shape, weight, bias, (1, 1), (0, 0), (1, 1), 1, "NHWC", relu=False)
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


def test_grouped_rule_takes_grouped_convs_only(rng):
    """Grouped NHWC convs of 4 or more channels per group go to the grouped rule (a tile whose
    vector lanes divide the channels of a group); depthwise, plain and 2-per-group ones do not."""
    lanes = cpu_info(HOST).lanes()
    grouped = grouped_primfunc(rng, 128, 32)
    sch = GroupedConv2DNHWC().apply(grouped, HOST, False)
    assert sch is not None
    text = sch.mod["main"].script()
    assert "T.vectorized" in text and "T.parallel" in text
    assert Conv2DNHWC().apply(grouped, HOST, False) is None
    assert DepthwiseConv2DNHWC().apply(grouped, HOST, False) is None
    wide = GroupedConv2DNHWC().apply(grouped_primfunc(rng, 64, 2), HOST, False)
    assert f"T.vectorized(T.int64({lanes}))" in wide.mod["main"].script()
    for channels, groups in ((16, 16), (8, 4)):
        assert GroupedConv2DNHWC().apply(grouped_primfunc(rng, channels, groups), HOST, False) is None
    plain = grouped_primfunc(rng, 16, 1)
    assert GroupedConv2DNHWC().apply(plain, HOST, False) is None


def test_symbolic_grouped_conv_matches_torch(rng):
    """A grouped conv of symbolic height and width is tiled without a ``local`` accumulator of the
    output's symbolic shape and equals eager torch."""
    h, w = tvm.tirx.Var("h", "int64"), tvm.tirx.Var("w", "int64")
    weight = rng.standard_normal((3, 3, 4, 32)).astype("float32")
    bias = rng.standard_normal(32).astype("float32")
    mod = conv_module((1, h, w, 32), weight, bias, 1, 1, 1, 8, "NHWC")
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
    got = build_and_run(mod, data)
    expected = torch.nn.functional.conv2d(
        torch.from_numpy(data).permute(0, 3, 1, 2).double(),
        torch.from_numpy(weight).permute(3, 2, 0, 1).double(),
        torch.from_numpy(bias).double(),
        padding=1,
        groups=8,
    ).relu().permute(0, 2, 3, 1).numpy()
    close_to(got, expected)
