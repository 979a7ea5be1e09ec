"""Symbolic image size and batch (an ONNX model with dynamic axes): the CPU rules tile, vectorize and
parallelize conv2d / matmul / pooling / elementwise functions whose height, width or batch are
symbolic, and the one build computes what a float64 torch reference does at every shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from _cli import run_cli
from _targets import NATIVE as HOST
from tvm import relax

from tvm_roialign.pipeline import build, cpu_schedule_pass, prepare_pipeline
from tvm_roialign.runtime import LoadedVM
from tvm_roialign.schedules import Conv2DNHWC, DepthwiseConv2DNHWC, default_rules
from tvm_roialign.schedules.symbolic_extents import compound_extents, name_symbolic_extents

#: float32 results against a float64 reference: relative to the largest output
RTOL = 2e-5
N, H, W = (tvm.tirx.Var(name, "int64") for name in "nhw")


def _module(x_shape, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(x_shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _rules():
    """The default rules (the conv rule tiles symbolic sizes by default)."""
    return default_rules()


def _scheduled(mod, **prepare):
    with HOST:
        scheduled = cpu_schedule_pass(_rules())(prepare_pipeline(HOST, **prepare)(mod))
    return {
        gv.name_hint: f for gv, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
    }


def _loop_kinds(func) -> set:
    kinds = set()
    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, lambda loop: kinds.add(loop.kind)))
    return kinds


def _assert_parallel_vectorized(func):
    kinds = _loop_kinds(func)
    assert tvm.tirx.ForKind.PARALLEL in kinds and tvm.tirx.ForKind.VECTORIZED in kinds, func.script()


def _compacted_allocations(func) -> list:
    """``(block name, buffer)`` of every buffer allocated below the root once TIR has placed and
    compacted the allocations, as the build does."""
    passes = tvm.s_tir.transform
    mod = tvm.IRModule({"main": func})
    for step in (
        passes.LowerInitBlock(),
        passes.PlanAndUpdateBufferAllocationLocation(),
        passes.ConvertBlocksToOpaque(),
        passes.CompactBufferAllocation(),
    ):
        mod = step(mod)
    found = []
    tvm_ffi.structural_walk(
        mod["main"].body,
        (tvm.s_tir.SBlock, lambda b: found.extend((b.name_hint, buf) for buf in b.alloc_buffers)),
    )
    return [(name, buf) for name, buf in found if name != "root"]


def _conv(weight, padding, stride=1):
    def body(bb, x):
        y = bb.emit(
            relax.op.nn.conv2d(
                x,
                relax.const(weight),
                strides=stride,
                padding=padding,
                data_layout="NHWC",
                kernel_layout="HWIO",
            )
        )
        return relax.op.nn.relu(y)

    return body


def _torch_conv(x_nhwc, weight_hwio, padding, stride=1):
    out = torch.nn.functional.conv2d(
        torch.from_numpy(x_nhwc).permute(0, 3, 1, 2).double(),
        torch.from_numpy(weight_hwio).permute(3, 2, 0, 1).double(),
        stride=stride,
        padding=padding,
    )
    return out.relu().permute(0, 2, 3, 1).numpy()


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=0, atol=RTOL * float(np.abs(expected).max()))


def _run_shapes(mod, shapes, reference, rng, **options):
    vm = relax.VirtualMachine(build(mod, HOST, rules=_rules(), **options).executable, tvm.cpu())
    for shape in shapes:
        data = rng.standard_normal(shape).astype("float32")
        _close(vm["main"](tvm.runtime.tensor(data)).numpy(), reference(data))


@pytest.mark.parametrize(
    "kernel, padding, stride",
    [(3, 1, 1), (1, 0, 1), (3, 1, 2), (1, 0, 2), (7, 3, 2)],
    ids=["3x3", "1x1", "3x3s2", "1x1s2", "7x7s2"],
)
def test_symbolic_conv_is_tiled_and_matches_float64(kernel, padding, stride, rng):
    weight = (rng.standard_normal((kernel, kernel, 16, 32)) * 0.3).astype("float32")
    mod = _module([N, H, W, 16], _conv(weight, padding, stride))
    (conv,) = [f for name, f in _scheduled(mod).items() if "conv2d" in name]
    _assert_parallel_vectorized(conv)
    # the register tile of the conv rule (unrolled rows, vectorized channels), not the fallback
    assert tvm.tirx.ForKind.UNROLLED in _loop_kinds(conv)
    _run_shapes(
        mod,
        [(1, 13, 29, 16), (2, 8, 7, 16)],
        lambda x: _torch_conv(x, weight, padding, stride),
        rng,
    )


def test_symbolic_conv_accumulates_in_a_register_tile(rng):
    """A conv whose image size is symbolic (an ONNX model exported with dynamic height and width)
    accumulates its register tile in a buffer of the tile's static size: TIR once sized it by the
    whole output, one stack array per parallel task, and the model segfaulted at 224x224."""
    weight = rng.standard_normal((3, 3, 8, 16)).astype("float32")
    mod = _module([1, H, W, 8], _conv(weight, 1))
    for func in _scheduled(mod).values():
        for name, buf in _compacted_allocations(func):
            shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in buf.ty.shape]
            assert None not in shape, f"{name} allocates {buf.name} of shape {buf.ty.shape}"
            assert int(np.prod(shape)) * 4 < 1024, f"{buf.name} {shape} is not a register tile"
    _run_shapes(mod, [(1, 96, 80, 8)], lambda x: _torch_conv(x, weight, 1), rng)


@pytest.mark.parametrize("stride", [1, 2])
def test_symbolic_depthwise_conv_is_vectorized_and_matches_float64(stride, rng):
    """A depthwise conv (MobileNet's) at a symbolic size: its taps over a vector of channels, the
    image rows in parallel (the fallback rule's row tile over a symbolic width ran 8-10x slower),
    the zero padding read through its bounds test, not a padded copy of the whole input (a pass
    writing it made a symbolic MobileNetV2 up to 1.27x its static build); images of one pixel
    (all padding) included."""
    channels = 48
    weight = rng.standard_normal((3, 3, 1, channels)).astype("float32")

    def body(bb, x):
        y = bb.emit(
            relax.op.nn.conv2d(
                x,
                relax.const(weight),
                strides=stride,
                padding=1,
                groups=channels,
                data_layout="NHWC",
                kernel_layout="HWIO",
            )
        )
        return relax.op.clip(y, 0.0, 6.0)

    def reference(x):
        out = torch.nn.functional.conv2d(
            torch.from_numpy(x).permute(0, 3, 1, 2).double(),
            torch.from_numpy(weight).permute(3, 2, 0, 1).double(),
            stride=stride,
            padding=1,
            groups=channels,
        )
        return out.clamp(0, 6).permute(0, 2, 3, 1).numpy()

    mod = _module([N, H, W, channels], body)
    (conv,) = [f for name, f in _scheduled(mod).items() if "conv2d" in name]
    _assert_parallel_vectorized(conv)
    blocks = []
    tvm_ffi.structural_walk(conv.body, (tvm.s_tir.SBlock, lambda b: blocks.append(b.name_hint)))
    assert not [b for b in blocks if "pad" in b], blocks
    with HOST:
        prepared = prepare_pipeline(HOST)(mod)
    (unscheduled,) = [f for gv, f in prepared.functions_items() if "conv2d" in gv.name_hint]
    assert DepthwiseConv2DNHWC().apply(unscheduled, HOST, False) is not None
    _run_shapes(mod, [(1, 13, 29, channels), (2, 8, 7, channels), (1, 1, 1, channels)], reference, rng)


def test_symbolic_matmul_is_tiled_and_matches_float64(rng):
    weight = rng.standard_normal((64, 48)).astype("float32")
    bias = rng.standard_normal(48).astype("float32")

    def body(bb, x):
        y = bb.emit(relax.op.matmul(x, relax.const(weight)))
        return relax.op.add(y, relax.const(bias))

    mod = _module([N, 64], body)
    (matmul,) = [f for name, f in _scheduled(mod).items() if "matmul" in name]
    _assert_parallel_vectorized(matmul)
    _run_shapes(mod, [(37, 64), (5, 64)], lambda x: x.astype("float64") @ weight + bias, rng)


def test_symbolic_pool_and_elementwise_are_parallel_vectorized(rng):
    def body(bb, x):
        y = bb.emit(relax.op.nn.relu(relax.op.add(x, relax.const(np.float32(0.5)))))
        return relax.op.nn.max_pool2d(y, pool_size=3, strides=2, padding=1, layout="NHWC")

    mod = _module([N, H, W, 32], body)
    funcs = _scheduled(mod)
    assert funcs
    for func in funcs.values():
        _assert_parallel_vectorized(func)

    def reference(x):
        y = torch.from_numpy(x).double().add(0.5).relu().permute(0, 3, 1, 2)
        return torch.nn.functional.max_pool2d(y, 3, 2, 1).permute(0, 2, 3, 1).numpy()

    _run_shapes(mod, [(1, 17, 22, 32), (2, 9, 9, 32)], reference, rng)


def test_symbolic_padding_runs_a_row_per_parallel_step(rng):
    """The zero padding of a 3-channel image (a stem conv's) at a symbolic size: one parallel step
    per padded row of every image, its columns a serial loop inside, the channels unrolled (one
    parallel step per pixel divided every index by the symbolic extents: twice the static time)."""
    weight = (rng.standard_normal((3, 3, 3, 32)) * 0.2).astype("float32")
    mod = _module([N, H, W, 3], _conv(weight, 1, 2))
    [func] = [f for name, f in _scheduled(mod).items() if "conv2d" in name]
    loops = []
    tvm_ffi.structural_walk(func.body, (tvm.tirx.For, loops.append), order="pre")
    parallel = [lp for lp in loops if lp.kind == tvm.tirx.ForKind.PARALLEL]
    # the padding's parallel loop is over n * (h + 2) rows, not n * (h + 2) * (w + 2) pixels

    def names(expr) -> set:
        found = set()
        tvm_ffi.structural_walk(expr, (tvm.tirx.Var, lambda v: found.add(v.name)))
        return found

    assert {"n", "h"} in [names(lp.extent) for lp in parallel], func.script()
    assert tvm.tirx.ForKind.UNROLLED in _loop_kinds(func)
    _run_shapes(mod, [(1, 17, 22, 3), (2, 9, 12, 3)],
                lambda x: _torch_conv(x, weight, 1, 2), rng)


def test_conv_rule_off_for_symbolic_sizes_leaves_them_to_the_fallback(rng):
    weight = (rng.standard_normal((3, 3, 16, 32)) * 0.3).astype("float32")
    mod = _module([N, H, W, 16], _conv(weight, 1, 2))
    with HOST:
        prepared = prepare_pipeline(HOST)(mod)
    (conv,) = [f for gv, f in prepared.functions_items() if "conv2d" in gv.name_hint]
    assert Conv2DNHWC(symbolic=False).apply(conv, HOST, False) is None
    assert Conv2DNHWC().apply(conv, HOST, False) is not None


def _stem_then_conv(stem, weight):
    """A stride-2 stem and a stride-2 pool before a 3x3 conv, as in a ResNet: the conv's extents
    are ``(h - 1) // 4 + 1``, not a plain variable, and Relax passes ``h`` and ``w`` as scalars."""

    def body(bb, x):
        y = bb.emit(
            relax.op.nn.conv2d(
                x, relax.const(stem), strides=2, padding=3, data_layout="NHWC", kernel_layout="HWIO"
            )
        )
        y = bb.emit(relax.op.nn.max_pool2d(relax.op.nn.relu(y), 3, 2, 1, layout="NHWC"))
        return _conv(weight, 1)(bb, y)

    return body


def _torch_stem_then_conv(x, stem, weight):
    y = _torch_conv(x, stem, 3, 2)
    y = torch.from_numpy(y).permute(0, 3, 1, 2)
    y = torch.nn.functional.max_pool2d(y, 3, 2, 1).permute(0, 2, 3, 1).numpy()
    return _torch_conv(y, weight, 1)


def test_conv_of_compound_symbolic_extents_matches_float64(rng):
    """The conv after a stem and a pool sees extents ``(h - 1) // 4 + 1``. Tiled on them as they
    were, its write-back covered other tiles' outputs (TIR could not tell the extents' sign, and
    every 64-channel conv of a symbolic resnet18 was wrong, by up to 100 on random data); each
    compound extent now gets a variable of its own before the rules schedule the kernel."""
    stem = (rng.standard_normal((7, 7, 3, 64)) * 0.2).astype("float32")
    weight = (rng.standard_normal((3, 3, 64, 64)) * 0.1).astype("float32")
    mod = _module([N, H, W, 3], _stem_then_conv(stem, weight))
    convs = [f for name, f in _scheduled(mod, winograd=0).items() if "conv2d" in name]
    assert len(convs) == 2
    for conv in convs:
        assert tvm.tirx.ForKind.UNROLLED in _loop_kinds(conv), conv.script()
    _run_shapes(
        mod,
        [(1, 64, 80, 3), (1, 37, 45, 3), (2, 50, 33, 3)],
        lambda x: _torch_stem_then_conv(x, stem, weight),
        rng,
        winograd=0,
    )


@pytest.mark.parametrize("tile", [4, 5], ids=["F4", "F5"])
def test_winograd_at_symbolic_sizes_matches_float64(tile, rng):
    """The 3x3 conv after a stem and a pool (extents ``(h - 1) // 4 + 1``) as Winograd F(4x4, 3x3)
    at a symbolic size: transforms whose tiles are axes (no division by a symbolic count), a
    product over ``N * tiles`` rows. A symbolic resnet18 ran 1.3x its static build without it.
    Sizes not a multiple of the tile, a batch, and images smaller than one tile; F(5x5) too."""
    stem = (rng.standard_normal((7, 7, 3, 64)) * 0.2).astype("float32")
    weight = (rng.standard_normal((3, 3, 64, 64)) * 0.1).astype("float32")
    mod = _module([N, H, W, 3], _stem_then_conv(stem, weight))
    funcs = _scheduled(mod, winograd=tile)
    names = sorted(funcs)
    assert any("winograd_input_transform" in n for n in names), names
    assert any("winograd_output_transform" in n for n in names), names
    assert len([n for n in names if "conv2d" in n]) == 1, names  # the stem alone
    assert not any("reshape" in n for n in names), names  # the product's rows are a view
    for name, func in funcs.items():
        if "winograd" in name:
            _assert_parallel_vectorized(func)
    _run_shapes(
        mod,
        [(1, 64, 80, 3), (1, 37, 45, 3), (2, 50, 33, 3), (1, 9, 5, 3)],
        lambda x: _torch_stem_then_conv(x, stem, weight),
        rng,
        winograd=tile,
    )


def test_winograd_at_symbolic_sizes_decides_at_the_reference_side(rng):
    """One library serves every size, so whether a symbolic conv is worth Winograd is decided at
    its size for the reference image side: a layer of few tiles there stays a direct conv."""
    from tvm_roialign.passes import WinogradConv2D

    weight = rng.standard_normal((3, 3, 64, 64)).astype("float32")
    mod = _module([1, H, W, 64], _conv(weight, 1))
    # 16x16 -> 16 tiles of 4x4 (fewer than 32): direct; 64x64 -> 256 tiles: Winograd
    assert WinogradConv2D(reference_side=16)(mod).same_as(mod)
    rewritten = WinogradConv2D(reference_side=64)(mod)
    assert not rewritten.same_as(mod)
    assert "R.nn.conv2d" not in rewritten.script()


def test_winograd_at_a_symbolic_batch_judges_it_at_the_reference_side(rng):
    """A symbolic batch is taken at the reference side as the height and width are, so a symbolic
    batch's few-tile convs are Winograd too. Judged as a batch of one instead, resnet18's symbolic
    build ran 1.44x its static build at 1x3x320x480 (layer3 direct, where the static build takes
    Winograd), against 1.01x."""
    from tvm_roialign.passes import WinogradConv2D

    weight = rng.standard_normal((3, 3, 64, 64)).astype("float32")
    # 16x16: 16 tiles of 4x4 an image (fewer than 32)
    assert "R.nn.conv2d" in WinogradConv2D()(_module([1, 16, 16, 64], _conv(weight, 1))).script()
    assert "R.nn.conv2d" not in WinogradConv2D()(_module([N, 16, 16, 64], _conv(weight, 1))).script()


def test_compound_extents_get_variables_bound_from_the_buffers():
    zeros = np.zeros
    mod = _module([N, H, W, 3], _stem_then_conv(zeros((7, 7, 3, 64), "f4"), zeros((3, 3, 64, 64), "f4")))
    with HOST:
        prepared = prepare_pipeline(HOST, winograd=0)(mod)
    (conv,) = [
        f
        for gv, f in prepared.functions_items()
        if "conv2d" in gv.name_hint and "h" not in {str(d) for d in f.params[0].ty.shape}
    ]
    assert compound_extents(conv), conv.script()
    named = name_symbolic_extents(conv)
    assert not compound_extents(named)
    buffers = [p for p in named.params if isinstance(p.ty, tvm.tirx.buffer.BufferType)]
    images = [p.ty.shape for p in buffers if not isinstance(p.ty.shape[0], tvm.tirx.IntImm)]
    spatial = {str(d) for shape in images for d in shape[1:3]}
    assert spatial == {"extent0", "extent1"}, spatial
    assert name_symbolic_extents(named) is None


class _TinyCNN(torch.nn.Module):
    """A small classifier of the ResNet kind: stem, a residual 3x3 block, a strided 1x1, pooling."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.down = torch.nn.Conv2d(16, 32, 1, stride=2)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        y = torch.relu(y + self.conv(y))
        y = torch.nn.functional.max_pool2d(torch.relu(self.down(y)), 3, 2, 1)
        return self.fc(y.mean((2, 3)))


def test_dynamic_onnx_cnn_compiles_once_and_matches_eager_at_two_shapes(tmp_path, capsys):
    """``tvm-roialign compile`` of an ONNX model with dynamic batch, height and width: one library,
    equal to eager at two shapes, and its summary line says which kernels the rules served."""

    torch.manual_seed(0)
    model = _TinyCNN().eval()
    path = tmp_path / "tiny_dyn.onnx"
    torch.onnx.export(
        model,
        (torch.zeros(1, 3, 32, 32),),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["x"],
        dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}},
    )
    lib = tmp_path / "tiny_dyn.so"
    code, out, err = run_cli(["compile", str(path), "-o", str(lib)], capsys)
    assert code == 0, err
    (line,) = [text for text in out.splitlines() if text.startswith("symbolic shapes:")]
    # the input's NCHW -> NHWC transpose (3 channels) is scalar and falls back; every conv,
    # strided ones included, is tiled
    fell_back = line.partition("fell back")[2]
    assert "transpose" in fell_back and "conv2d" not in fell_back, line
    vm = LoadedVM(tvm.runtime.load_module(str(lib)), tvm.cpu())
    for shape in [(1, 3, 37, 45), (2, 3, 24, 24)]:
        data = np.random.default_rng(1).standard_normal(shape).astype("float32")
        with torch.no_grad():
            expected = model(torch.from_numpy(data)).numpy()
        got = vm["main"](tvm.runtime.tensor(data)).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
