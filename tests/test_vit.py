"""A vision transformer through the command line with the defaults (torchvision's
``VisionTransformer``, small): ``compile`` converts it to NHWC and builds it, ``run`` equals eager
torch, and TVM prints no out-of-bounds warning for its constant gathers. Also the two graph passes
that make this so: negative ``squeeze`` axes before ConvertLayout, constant in-bounds ``take``."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

import tvm
from _cli import run_cli
from tvm import relax

from tvm_roialign.passes import BoundConstantTakes, ConvertLayout, desired_layouts
from tvm_roialign.testing import run_first

WARNING = "Fast mode segfaults"


def _module(shape, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(x))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    return run_first(tvm.compile(mod, "llvm"), x)


def test_squeeze_with_a_negative_axis_converts():
    """TVM's own ConvertLayout fails on it (``std::bad_alloc``); the package's converts it, same values."""
    mod = _module((3, 5, 1, 1, 8), lambda x: relax.op.squeeze(x, axis=[-2]))
    with pytest.raises(tvm.error.InternalError, match="bad_alloc"):
        relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod)
    converted = ConvertLayout(desired_layouts("NHWC"))(mod)
    x = np.random.default_rng(0).standard_normal((3, 5, 1, 1, 8)).astype("float32")
    np.testing.assert_array_equal(_run(converted, x), x[:, :, :, 0, :])


@pytest.mark.parametrize(
    ("indices", "mode"),
    [(np.int64(2), "clip"), (np.array([0, 3]), "clip"), (np.int64(4), "fast"), (np.int64(-1), "fast")],
)
def test_only_constant_indices_inside_the_axis_are_clipped(indices, mode):
    mod = _module((4, 3), lambda x: relax.op.take(x, relax.const(indices), axis=0))
    take = next(b.value for b in BoundConstantTakes()(mod)["main"].body.blocks[0].bindings)
    assert take.attrs.mode == mode


def test_onnx_gathers_of_a_constant_index_are_clipped():
    """TVM's ONNX importer writes ``Gather(x, c)`` as ``take(x, where(c < 0, c + n, c))``."""

    def gather(x, index):
        c = relax.const(np.array([index]), "int64")
        bb = relax.BlockBuilder.current()
        normalized = bb.emit(relax.op.where(bb.emit(relax.op.less(c, relax.const(0, "int64"))),
                                            bb.emit(relax.op.add(c, relax.const(4, "int64"))), c))
        return relax.op.take(x, normalized, axis=0)

    for index, mode in ((3, "clip"), (-1, "fast")):
        mod = BoundConstantTakes()(_module((4, 3), lambda x, i=index: gather(x, i)))
        take = mod["main"].body.blocks[0].bindings[-1].value
        assert take.attrs.mode == mode
        x = np.arange(12, dtype="float32").reshape(4, 3)
        np.testing.assert_array_equal(_run(mod, x), x[[index]])


class _ViT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from torchvision.models.vision_transformer import VisionTransformer

        torch.manual_seed(0)
        self.vit = VisionTransformer(
            image_size=32, patch_size=16, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
        ).eval()
        # torchvision starts the classifier at zero: give it weights so that the output depends on
        # every layer before it
        torch.nn.init.normal_(self.vit.heads.head.weight)
        torch.nn.init.normal_(self.vit.heads.head.bias)

    def forward(self, x):
        return self.vit(x)


def test_vit_compiles_with_the_defaults_and_equals_eager(tmp_path, capfd):
    model = _ViT().eval()
    x = torch.randn(1, 3, 32, 32)
    program = tmp_path / "vit.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(program))
    np.savez(tmp_path / "in.npz", x=x.numpy())
    capfd.readouterr()
    code, _out, err = run_cli(["compile", str(program), "-o", str(tmp_path / "vit.so")], capfd, quiet=False)
    assert code == 0, err
    assert WARNING not in err
    lib, inputs, outputs = (str(tmp_path / name) for name in ("vit.so", "in.npz", "out.npz"))
    code, _out, err = run_cli(["run", lib, "--inputs", inputs, "--outputs", outputs], capfd)
    assert code == 0, err
    with torch.no_grad():
        expected = model(x).numpy()
    assert np.abs(expected).max() > 0.1  # not the zero classifier torchvision starts with
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["output_0"], expected, rtol=1e-5, atol=1e-5)
