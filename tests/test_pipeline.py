"""The whole-model CPU pipeline (tvm_roialign.pipeline): same results as TVM's unoptimised build and
PyTorch on small models, each graph rewrite's structure (batch-norm folding, channel padding,
Winograd), the named-pipeline lookup, an AArch64 cross build, and RoIAlign's scheduled kernels
passing through untouched."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import tvm
from _targets import NATIVE as HOST
from tvm import relax

from tvm_roialign.frontend import from_exported_program
from tvm_roialign.passes import (
    ConvertLayout,
    FoldBatchNorm,
    PadChannels,
    WinogradConv2D,
)
from tvm_roialign.passes.winograd import choose_tile, transform_weight, winograd_matrices
from tvm_roialign.pipeline import (
    PIPELINE_NAME,
    bind_symbolic_vars,
    build,
    cpu_pipeline,
    symbolic_vars,
)
from tvm_roialign.testing import op_calls as _ops
from tvm_roialign.testing import run_executable

AARCH64 = tvm.target.Target(
    {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}
)
NHWC = {"relax.nn.conv2d": ["NHWC", "default"]}


def _import(model, *args, layout="NHWC"):
    with torch.no_grad():
        mod = from_exported_program(
            torch.export.export(model.eval(), args), keep_params_as_input=False
        )
    mod = relax.transform.FoldConstant()(mod)
    return ConvertLayout(NHWC)(mod) if layout == "NHWC" else mod


def _run(executable, *arrays) -> list:
    """Every output of ``main``, as a list (one for a tensor result)."""
    out = run_executable(executable, *arrays)
    return out if isinstance(out, list) else [out]


def _close(actual, expected, rel=3e-5):
    scale = max(float(np.abs(expected).max()), 1e-6)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rel * scale)


class _Net(torch.nn.Module):
    """Conv + batch-norm + ReLU, a residual block with a strided 1x1 shortcut, grouped, depthwise
    and dilated convs, 3x3 convs wide enough for Winograd, odd channel counts, pooling and a
    linear head with 91 outputs."""

    def __init__(self):
        super().__init__()
        c = torch.nn.Conv2d
        self.stem = torch.nn.Sequential(
            c(3, 64, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU()
        )
        self.wino = torch.nn.Sequential(
            c(64, 64, 3, 1, 1), torch.nn.ReLU(), c(64, 80, 3, 1, 1)
        )
        self.short = c(64, 80, 1, 1, 0)
        self.down = torch.nn.Sequential(
            c(80, 96, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(96)
        )
        self.group = c(96, 96, 3, 1, 1, groups=4)
        self.depth = c(96, 96, 3, 1, 2, dilation=2, groups=96)
        self.odd = c(96, 13, 1)
        self.head = torch.nn.Linear(13 * 4 * 4, 91)
        torch.manual_seed(0)
        for bn in (self.stem[1], self.down[1]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.wino(x) + self.short(x))
        x = torch.relu(self.depth(torch.relu(self.group(self.down(x)))))
        x = torch.nn.functional.adaptive_avg_pool2d(self.odd(x), 4)
        return self.head(x.flatten(1))


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(2, 3, 32, 30)
    with torch.no_grad():
        expected = model(x).numpy()
    return model, x, expected


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_pipeline_matches_torch_and_the_unoptimised_build(net, layout):
    model, x, expected = net
    mod = _import(model, x, layout=layout)
    (ours,) = _run(build(mod, HOST).executable, x.numpy())
    (plain,) = _run(tvm.compile(mod, target=HOST), x.numpy())
    _close(ours, expected)
    _close(ours, plain)


@pytest.mark.parametrize(
    "options",
    [
        {"winograd": 0},
        {"winograd": 2},
        {"fold_batch_norm": False, "pad_channels": False},
        {"pack_weights": False},
    ],
)
def test_pipeline_options_keep_results(net, options):
    model, x, expected = net
    (ours,) = _run(build(_import(model, x), HOST, **options).executable, x.numpy())
    _close(ours, expected)


def test_named_pipeline(net):
    model, x, expected = net
    assert PIPELINE_NAME in relax.pipeline.PIPELINE_MAP
    mod = _import(model, x)
    (out,) = _run(
        tvm.compile(mod, target=HOST, relax_pipeline=PIPELINE_NAME), x.numpy()
    )
    _close(out, expected)
    assert isinstance(relax.get_pipeline(PIPELINE_NAME), tvm.transform.Pass)


def test_named_pipeline_is_registered_by_a_plain_import_and_removed_by_unregister():
    """``relax_pipeline="tvm_roialign_cpu"`` right after ``import tvm_roialign`` (no other module
    of the package imported), in a fresh process; ``unregister()`` takes it away again."""
    code = textwrap.dedent(
        """
        import sys
        import numpy as np, tvm
        from tvm import relax
        import tvm_roialign
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType([4, 16], "float32"))
        with bb.function("main", [x]):
            bb.emit_func_output(bb.emit(relax.op.add(x, x)))
        exe = tvm.compile(bb.get(), target=tvm.target.Target({"kind": "llvm"}),
                          relax_pipeline="tvm_roialign_cpu")
        a = np.arange(64, dtype="float32").reshape(4, 16)
        out = relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(a)).numpy()
        np.testing.assert_array_equal(out, a + a)
        tvm_roialign.unregister()
        assert "tvm_roialign_cpu" not in relax.pipeline.PIPELINE_MAP
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_aarch64_cross_build(net):
    """Compile only (this machine cannot run it): every rule must hold for a 128-bit NEON target."""
    model, x, _ = net
    build(_import(model, x), AARCH64)
    lowered = cpu_pipeline(AARCH64)(_import(model, x))
    names = [
        gv.name_hint
        for gv, f in lowered.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    ]
    assert any("winograd" in n for n in names) and any(
        "prepacked" in n for n in names
    ), names


def test_fold_batch_norm_structure(net):
    model, x, expected = net
    mod = relax.transform.FoldConstant()(
        _import(model, x)
    )  # weights after ConvertLayout
    assert len(_ops(mod, "relax.nn.batch_norm")) == 2
    folded = FoldBatchNorm()(mod)
    assert not _ops(folded, "relax.nn.batch_norm")
    assert len(_ops(folded, "relax.nn.conv2d")) == len(_ops(mod, "relax.nn.conv2d"))
    (out,) = _run(tvm.compile(folded, target=HOST), x.numpy())
    _close(out, expected)
    assert FoldBatchNorm()(folded).same_as(
        folded
    )  # nothing left to fold: the same module


def _one_conv(weight_const: bool, out_channels=91, in_channels=8):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 6, 6, in_channels], "float32"))
    params = [x]
    if weight_const:
        w = relax.const(
            np.random.default_rng(0)
            .standard_normal((1, 1, in_channels, out_channels))
            .astype("float32")
        )
    else:
        w = relax.Var(
            "w", relax.TensorType([1, 1, in_channels, out_channels], "float32")
        )
        params.append(w)
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="HWIO")
            )
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_pad_channels_structure():
    mod = _one_conv(weight_const=True)
    padded = PadChannels(multiple=16)(mod)
    (conv,) = _ops(padded, "relax.nn.conv2d")
    assert [int(v) for v in conv.args[1].ty.shape] == [1, 1, 8, 96]
    (sliced,) = _ops(padded, "relax.strided_slice")
    assert [int(v) for v in padded["main"].ret_ty.shape] == [1, 6, 6, 91]
    assert sliced is not None
    x = np.random.default_rng(1).standard_normal((1, 6, 6, 8)).astype("float32")
    (a,) = _run(tvm.compile(mod, target=HOST), x)
    (b,) = _run(tvm.compile(padded, target=HOST), x)
    np.testing.assert_array_equal(a, b)  # zero filters, then a slice: bit-identical


def test_pad_channels_leaves_non_constant_weights_and_round_counts():
    runtime_weight = _one_conv(weight_const=False)
    assert PadChannels(16)(runtime_weight).same_as(runtime_weight)
    already = _one_conv(weight_const=True, out_channels=64)
    assert PadChannels(16)(already).same_as(already)
    from tvm_roialign.passes.pad_channels import padded_size

    assert [padded_size(c, 16) for c in (91, 364, 12, 3, 64, 200)] == [
        96,
        368,
        16,
        4,
        None,
        208,
    ]
    with pytest.raises(ValueError, match="multiple"):
        PadChannels(0)


@pytest.mark.parametrize("tile", [2, 4, 5, 6])
def test_winograd_matrices_compute_a_correlation(tile):
    at, g, bt = winograd_matrices(tile)
    rng = np.random.default_rng(tile)
    d, w = rng.standard_normal((tile + 2, tile + 2)), rng.standard_normal((3, 3))
    y = at @ ((g @ w @ g.T) * (bt @ d @ bt.T)) @ at.T
    expected = [
        [np.sum(d[i : i + 3, j : j + 3] * w) for j in range(tile)] for i in range(tile)
    ]
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    u = transform_weight(w.reshape(3, 3, 1, 1).astype("float32"), tile)
    np.testing.assert_allclose(
        u[:, 0, 0].reshape(tile + 2, tile + 2), g @ w @ g.T, rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("tile", [2, 4, 5, (4, 5)])
def test_winograd_rewrite_structure_and_accuracy(tile):
    """Odd output sizes (the last tile cropped), padding, and the float64 direct conv as reference.
    With the candidates (4, 5), the 11x9 output keeps F(4x4): its 3 x 3 tiles of 36 products (324)
    against F(5x5)'s 3 x 2 tiles of 49 (294, 91%)."""
    rng = np.random.default_rng(3)
    weight = (rng.standard_normal((3, 3, 64, 64)) * 0.1).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 11, 9, 64], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x,
                    relax.const(weight),
                    padding=[1, 0, 1, 2],
                    data_layout="NHWC",
                    kernel_layout="HWIO",
                )
            )
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    # 2 images of 3 x 3 tiles (tile 4) are fewer than the default min_tiles: a direct conv
    assert _ops(WinogradConv2D(tile=4)(mod), "relax.nn.conv2d")
    rewritten = WinogradConv2D(tile=tile, min_tiles=0)(mod)
    assert not _ops(rewritten, "relax.nn.conv2d")
    (mm,) = _ops(rewritten, "relax.matmul")
    chosen = 4 if tile == (4, 5) else tile
    assert [int(v) for v in mm.args[1].ty.shape] == [(chosen + 2) ** 2, 64, 64]
    data = rng.standard_normal((2, 11, 9, 64)).astype("float32")
    expected = (
        torch.nn.functional.conv2d(
            torch.nn.functional.pad(
                torch.from_numpy(data).permute(0, 3, 1, 2).double(), (0, 2, 1, 1)
            ),
            torch.from_numpy(weight).permute(3, 2, 0, 1).double(),
        )
        .permute(0, 2, 3, 1)
        .numpy()
    )
    (out,) = _run(build(mod, HOST, winograd=tile).executable, data)
    assert out.shape == expected.shape == (2, 11, 9, 64)
    _close(out, expected, rel=1e-5 if tile == 2 else 3e-5 if tile == 4 else 5e-5)


def test_winograd_leaves_other_convs():
    strided = _one_conv(weight_const=True, out_channels=64, in_channels=64)
    assert WinogradConv2D()(strided).same_as(strided)  # 1x1
    with pytest.raises(ValueError, match="tile"):
        WinogradConv2D(tile=3)
    with pytest.raises(ValueError, match="tile"):
        WinogradConv2D(tile=(4, 7))


def test_winograd_tile_choice_counts_the_transformed_products():
    """A larger tile is taken when it needs at most 85% of the smaller one's transformed products:
    14x14 (the mask head): F(4x4) 4 x 4 tiles of 36 (576), F(5x5) 3 x 3 of 49 (441, 77%), F(6x6)
    3 x 3 of 64 (576); 128x128: F(5x5) 26 x 26 of 49 (33124) is 90% of F(4x4)'s 32 x 32 of 36
    (36864); 32x32: F(5x5) 49 tiles of 49 (2401) against F(4x4)'s 64 of 36 (2304)."""
    same = [1, 1, 1, 1]
    assert choose_tile((4, 5), 1, 14, 14, same) == (5, 3, 3)
    assert choose_tile((5, 4), 100, 14, 14, same) == (5, 3, 3)
    assert choose_tile((4, 5), 1, 128, 128, same) == (4, 32, 32)
    assert choose_tile((4, 5), 1, 32, 32, same) == (4, 8, 8)
    assert choose_tile((6, 4), 100, 14, 14, same) == (4, 4, 4)
    assert choose_tile((2,), 1, 14, 14, same) == (2, 7, 7)


def test_bind_symbolic_vars():
    bb = relax.BlockBuilder()
    k = tvm.tirx.Var("num_rois", "int64")
    x = relax.Var("x", relax.TensorType([k, 16], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(out)
    mod = bb.get()
    assert symbolic_vars(mod) == ["num_rois"]
    bound = bind_symbolic_vars(mod, {"num_rois": 24})
    assert [int(v) for v in bound["main"].params[0].ty.shape] == [24, 16]
    with pytest.raises(ValueError, match="no symbolic dimension 'rois'"):
        bind_symbolic_vars(mod, {"rois": 3})


def test_roi_align_kernels_pass_through_untouched():
    """RoIAlign's strategy kernels (marked tirx.is_scheduled) reach the build as they were."""
    from tvm_roialign.testing import build_roi_align_module

    mod = build_roi_align_module((1, 16, 12, 12), 5, (3, 3), 0.5, 2, False, "NHWC")
    with HOST:
        legalized = tvm.transform.Sequential(
            [
                relax.transform.LegalizeOps(),
                relax.transform.AnnotateTIROpPattern(),
                relax.transform.FuseOps(),
                relax.transform.FuseTIR(),
            ]
        )(mod)
    before = {
        gv.name_hint: f
        for gv, f in legalized.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    }
    scheduled = {
        n: f
        for n, f in before.items()
        if f.attrs is not None and f.attrs.get("tirx.is_scheduled")
    }
    assert scheduled
    from tvm_roialign.pipeline import cpu_schedule_pass

    with HOST:
        after = cpu_schedule_pass()(
            relax.transform.AttachAttrLayoutFreeBuffers()(legalized)
        )
    # AttachAttrLayoutFreeBuffers may re-add a function under a new name (roi_align_nhwc1) with its
    # layout_free_buffers attribute: match the kernels by their layout and compare them without it
    kernels = {
        f.attrs["roi_align.layout"]: f
        for _gv, f in after.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and f.attrs.get("tirx.is_scheduled")
    }
    assert len(kernels) == len(scheduled)
    for func in scheduled.values():
        kernel = kernels[func.attrs["roi_align.layout"]]
        if "layout_free_buffers" in kernel.attrs and "layout_free_buffers" not in func.attrs:
            kernel = kernel.without_attr("layout_free_buffers")
        tvm.ir.assert_structural_equal(kernel, func)


def test_fold_constant_numpy_matches_fold_constant(rng):
    from tvm_roialign.passes import FoldConstantNumPy

    value = rng.standard_normal((2, 3, 4)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 6], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(relax.const(value), [2, 0, 1]))
            t = bb.emit(relax.op.reshape(t, [4, 6]))
            s = bb.emit(relax.op.sqrt(relax.op.multiply(t, t)))
            out = bb.emit_output(
                relax.op.add(x, relax.op.divide(s, relax.const(np.float32(2))))
            )
        bb.emit_func_output(out)
    mod = bb.get()
    folded = FoldConstantNumPy()(mod)
    assert not _ops(folded, "relax.permute_dims") and not _ops(folded, "relax.sqrt")
    data = rng.standard_normal((4, 6)).astype("float32")
    (ours,) = _run(tvm.compile(folded, target=HOST), data)
    (theirs,) = _run(
        tvm.compile(relax.transform.FoldConstant()(mod), target=HOST), data
    )
    np.testing.assert_array_equal(ours, theirs)
    runtime = _one_conv(weight_const=False)
    assert FoldConstantNumPy()(runtime).same_as(runtime)


def _packed_weight(mod):
    """The constant weight operand of the conv kernel's call in ``mod``'s main."""
    values = {
        b.var: b.value for block in mod["main"].body.blocks for b in block.bindings
    }
    (call,) = [c for c in _ops(mod, "relax.call_tir") if len(c.args[1].fields) == 2]
    weight = call.args[1].fields[1]
    weight = values.get(weight, weight)
    return weight.value.numpy()


@pytest.mark.parametrize("out_channels", [64, 48])
def test_weight_packing_folds_like_fold_constant(out_channels, rng):
    """The NumPy evaluation of the packing stages equals TVM running them."""
    from tvm.s_tir.dlight.base.transform import ApplyDefaultSchedule

    from tvm_roialign.passes import FoldLayoutRewrite
    from tvm_roialign.schedules import Conv2DNHWC

    mod = _one_conv(weight_const=True, out_channels=out_channels, in_channels=16)
    with HOST:
        mod = tvm.transform.Sequential(
            [
                relax.transform.LegalizeOps(),
                relax.transform.AnnotateTIROpPattern(),
                relax.transform.FuseOps(),
                relax.transform.FuseTIR(),
                relax.transform.AttachAttrLayoutFreeBuffers(),
                ApplyDefaultSchedule(Conv2DNHWC()),
                relax.transform.SplitLayoutRewritePreproc(),
            ]
        )(mod)
    ours = FoldLayoutRewrite()(mod)
    with HOST:
        theirs = relax.transform.FoldConstant()(mod)
    packed = [_packed_weight(m) for m in (ours, theirs)]
    block = packed[0].shape[-1]
    assert packed[0].shape == (out_channels // block, 1, 1, 16, block)
    np.testing.assert_array_equal(*packed)
